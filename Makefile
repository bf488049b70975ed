# The two front-door commands: `make run` (the main job, embedded log, no servers)
# and `make test` (installs what it needs, starts real Kafka itself, runs every test).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/poolledger run $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
