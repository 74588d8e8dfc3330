# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

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

bench: $(STAMP)
	$(PY) bench/reference.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
