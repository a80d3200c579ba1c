# Set-up and the two everyday commands. `make test` and `make demo` create .venv and
# install on first use (and again when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# On a machine without an NVIDIA GPU take the CPU build of torch (a local wheel here),
# never the multi-GB CUDA download that a bare `pip install torch` would pick.
TORCH_SPEC := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: install test demo bench train lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,train,store]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(PY) scripts/evaluate.py

bench: $(STAMP)
	$(PY) scripts/bench.py

train: $(STAMP)
	$(PY) scripts/train.py fit --config configs/default.yaml

lint: $(STAMP)
	$(PY) -m ruff check gae training tests scripts
	$(PY) -m mypy

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
