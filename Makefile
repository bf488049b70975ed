# The two front-door commands: `make run` (the main job, embedded log, no servers)
# and `make test` (installs what it needs, starts real Kafka itself, runs every test).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench typecheck build clean

# setup.py compiles streams/core with mypyc (POOLLEDGER_COMPILE=0: plain Python), so an edit
# to the core re-installs (streams/core/__init__.py refuses a build older than its sources).
$(STAMP): pyproject.toml setup.py $(wildcard streams/core/*.py)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

build: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/poolledger run $(ARGS)

test: $(STAMP)
	$(PY) -m compose.monitoring install  # gmond, Prometheus, carbon-cache (apt, when missing)
	$(PY) -m pytest $(PYTEST_ARGS)

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build streams/core/_compiled.json
	rm -f streams/core/*.so poolledger_core__mypyc*.so
