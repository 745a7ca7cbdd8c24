# The README's two commands are `make demo` and `make test`; the rest run the local stack.
PY ?= python3.11
VENV := .venv
PYTHON := $(VENV)/bin/python
# Debian's chromium, driven by Playwright in tests/test_web_ui.py (Playwright never downloads a browser).
CHROMIUM := /usr/bin/chromium

.PHONY: install demo test up down status bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PYTHON) demo.py

test: $(VENV)/.installed $(CHROMIUM)
	$(PYTHON) -m pytest -q

# Runs only when $(CHROMIUM) does not exist. If it cannot be installed, the suite still runs and
# tests/test_web_ui.py fails saying chromium is missing.
$(CHROMIUM):
	-DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
	  || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

up: $(VENV)/.installed
	@$(PYTHON) -m devstack up --worker

down: $(VENV)/.installed
	@$(PYTHON) -m devstack down

status: $(VENV)/.installed
	@$(PYTHON) -m devstack status || true

bench: $(VENV)/.installed
	@if [ -f bench.py ]; then $(PYTHON) bench.py; else echo "bench.py is not written yet"; fi
