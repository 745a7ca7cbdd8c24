# The README's two commands are `make demo` and `make test`; the rest run the local stack.
PY ?= python3.11
VENV := .venv
PYTHON := $(VENV)/bin/python

.PHONY: install demo test up down status bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PYTHON) demo.py

test: $(VENV)/.installed
	$(PYTHON) -m pytest -q

up: $(VENV)/.installed
	@$(PYTHON) -m devstack up --worker

down: $(VENV)/.installed
	@$(PYTHON) -m devstack down

status: $(VENV)/.installed
	@$(PYTHON) -m devstack status || true

bench: $(VENV)/.installed
	@if [ -f bench.py ]; then $(PYTHON) bench.py; else echo "bench.py is not written yet"; fi
