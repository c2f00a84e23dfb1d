# `make run` sets up .venv and runs the main job; `make test` sets up .venv and runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench docs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

# The main job: check every example under the config defaults and every preset.
run: $(STAMP)
	$(VENV)/bin/linnet check examples

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/check_speed.py

docs: $(STAMP)
	$(PY) -m linnet.semantics.codes > docs/diagnostics.md

clean:
	rm -rf $(VENV)
