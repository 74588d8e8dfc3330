# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean frameworks docs mutate

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first, pinned, so that the package's `torch>=2.1`
	# requirement is already met and pip never resolves a multi-GB CUDA build.
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/which_grpo_am_i_running.py
	$(PY) -m pytest examples/test_minitrainer_conformance.py -n 2 -q -rx -p no:cacheprovider
	$(PY) examples/explain_one_failure.py

test: $(STAMP)
	$(PY) -m pytest -n auto

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --strict
	$(VENV)/bin/lint-imports  # the layers of docs/architecture.md ([tool.importlinter])

# The frameworks tier: verl 0.9.1, TRL 1.16.0 and OpenRLHF 0.11.2 in their own venv.
# CPU torch first; then the pinned support packages; the package itself; the three
# framework wheels with --no-deps, verified against their sha256 (--require-hashes).
FW_VENV := .venv-frameworks
FW_PY := $(FW_VENV)/bin/python
FW_DIR := pytest_polgrad/frameworks
FW_STAMP := $(FW_VENV)/.installed
PIP_Q := --quiet --disable-pip-version-check

$(FW_STAMP): pyproject.toml $(FW_DIR)/support.txt $(FW_DIR)/requirements.txt
	$(PYTHON) -m venv $(FW_VENV)
	$(FW_PY) -m pip install $(PIP_Q) torch==2.13.0
	$(FW_PY) -m pip install $(PIP_Q) -r $(FW_DIR)/support.txt
	$(FW_PY) -m pip install $(PIP_Q) --no-deps -e .
	$(FW_PY) -m pip install $(PIP_Q) --no-deps --require-hashes -r $(FW_DIR)/requirements.txt
	touch $(FW_STAMP)

frameworks: $(FW_STAMP)
	$(FW_PY) -m pytest tests/frameworks -n 2 -q -p no:cacheprovider --polgrad-max-examples=20

# The documentation site: generated blocks checked first (a stale table or a claim naming
# a missing test fails, a page the index does not link fails), then mkdocs --strict (a broken
# link or anchor, a page missing from the nav fails; tests/docs/test_docs_site.py shows it).
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) tools/generate_docs.py --check
	$(PY) -m pytest tests/docs/test_docs_site.py -q -p no:cacheprovider  # a broken link fails
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Mutation testing by hand (never in CI): cosmic-ray over tools/mutate.toml's modules, each
# in its own copy of the tree (build/mutate/), with a targeted test command per module.
# MODULES="polgrad_reference/aggregate.py" limits it; MUTATE_ARGS="--max-mutants 50" samples.
MUTATE_STAMP := $(VENV)/.mutate-installed

$(MUTATE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[mutate]'
	touch $(MUTATE_STAMP)

mutate: $(MUTATE_STAMP)
	$(PY) tools/mutate.py $(MODULES) $(MUTATE_ARGS)

bench: $(STAMP)
	$(PY) bench/reference.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
