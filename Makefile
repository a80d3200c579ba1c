# Set-up and the two everyday commands. `make test` and `make demo` create .venv and
# install on first use (and again when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# On a machine without an NVIDIA GPU take the CPU build of torch (a local wheel here),
# never the multi-GB CUDA download that a bare `pip install torch` would pick.
TORCH_SPEC := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: install test test-slow demo report bench train docs lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev,train,store,docs,mcp,text]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# the heavy versions (many threads and runs, long soaks) of checks the default suite makes in short
test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# the head-to-head in short (meant to take under 2 minutes): 5 report seeds, 3 tuning seeds, six settings
demo: $(STAMP)
	$(PY) scripts/evaluate.py --seeds 5 --tuning-seeds 3 --out results/demo \
		--settings '[permute,shift,none,multimodal,classification_2_permute,moons_permute]' \
		--contestants '[jm,jm_adaptive,jm_prototypes,jm_recommended,knn,knn_scoped,knn_best,knn_adwin]'

# the whole protocol of docs/protocol.md, refreshing docs/head_to_head.md, its sections of docs/ and the README's headline
report: $(STAMP)
	$(PY) scripts/evaluate.py --readme docs/head_to_head.md

bench: $(STAMP)
	$(PY) scripts/bench.py

train: $(STAMP)
	$(PY) scripts/train.py fit --config configs/default.yaml

# the docs site, strict (a broken link, a missing page or reference fails it), into site/; docs/mkdocs.yml says why
# the config is read from standard input
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean -f - < docs/mkdocs.yml

lint: $(STAMP)
	$(PY) -m ruff check gae training tests scripts
	$(PY) -m mypy

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache site
