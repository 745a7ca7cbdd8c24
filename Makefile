# The README's two commands are `make demo` and `make test`; the rest run the local stack.
PY ?= python3.11
VENV := .venv
PYTHON := $(VENV)/bin/python
# Debian's chromium, driven by Playwright in tests/test_web_ui.py (Playwright never downloads a browser),
# and Debian's docker-compose, which checks docker-compose.yml (these machines run no Docker engine).
CHROMIUM := /usr/bin/chromium
COMPOSE := /usr/bin/docker-compose

.PHONY: install demo test check lint types up down status bench record chaos soak sim load week resume retries eval

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PYTHON) -m devstack.demo

test: lint types $(CHROMIUM) $(COMPOSE)
	$(PYTHON) -m pytest -q

# The loop for every commit (under two minutes): lint, types, the replay of the recorded histories,
# the gate's property tests and the unit tests that need no server.
CHECK_TESTS := tests/test_replay.py tests/test_db.py tests/test_render.py tests/test_redact.py tests/test_keys.py \
  tests/test_decision_nonces.py tests/test_codec.py tests/test_targets.py tests/test_packaging.py tests/test_bytecode.py \
  tests/test_localstripe_server.py tests/test_liveness.py tests/test_http_session.py tests/test_ports.py \
  tests/test_bad_input.py::test_any_call_gets_a_structured_answer \
  tests/test_bad_input.py::test_a_refund_call_is_valid_only_with_positive_integer_cents_and_known_fields \
  tests/test_chaos.py::test_a_run_with_fewer_faults_than_asked_fails \
  tests/test_chaos.py::test_a_task_awaiting_a_person_is_at_rest_only_when_nothing_of_its_own_can_run_before_the_stop \
  tests/test_chaos.py::test_a_timeout_is_explained_only_by_a_kill_of_its_own_window_and_worker
check: lint types
	$(PYTHON) -m pytest -q $(CHECK_TESTS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

types: $(VENV)/.installed
	$(VENV)/bin/mypy

# Runs only when $(CHROMIUM) does not exist. If it cannot be installed, the suite still runs and
# tests/test_web_ui.py fails saying chromium is missing.
$(CHROMIUM):
	-DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
	  || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

# Runs only when docker-compose is missing; tests/test_compose.py says so if it still is.
$(COMPOSE):
	-DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose \
	  || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose)

# STACK_ARGS: other ports or data folder (`make up STACK_ARGS="--data-dir=/tmp/s --temporal-port=7300"`);
# tests/test_readme.py runs the README's `make up`, `make status` and `make down` so, on free ports.
up: $(VENV)/.installed
	@METRICS_PORT=$${METRICS_PORT:-9464} $(PYTHON) -m devstack up --worker $(STACK_ARGS)

down: $(VENV)/.installed
	@$(PYTHON) -m devstack down $(filter --data-dir=%,$(STACK_ARGS))

status: $(VENV)/.installed
	@$(PYTHON) -m devstack status $(filter --data-dir=%,$(STACK_ARGS))

bench: $(VENV)/.installed
	$(PYTHON) -m devstack.bench

# Exactly-once under chaos (300 tickets, both edge modes, SQLite ledger): workers SIGKILLed and paused at
# random and at the product's crash points, both paused at once, the Temporal server and the provider
# restarted, refund POSTs held past the processing window, provider faults; the judge's table at the end.
chaos: $(VENV)/.installed
	$(PYTHON) -m devstack.chaos

# The soak: 10,000 refund tickets in all (SOAK_TICKETS=5000 per edge mode) through the same chaos on a
# PostgreSQL ledger (a database of its own on 127.0.0.1:5432, its connections cut during the run too),
# two workers, every fault kind on; about an hour on two cores. SOAK_TICKETS and SOAK_ARGS tune it.
SOAK_TICKETS ?= 5000
soak: $(VENV)/.installed
	$(PYTHON) -m devstack.chaos --tickets $(SOAK_TICKETS) --mode both --ledger postgres --faults all $(SOAK_ARGS)

# The deterministic simulation of the effect protocol, every variant (tests/test_simulator.py runs it).
sim: $(VENV)/.installed
	$(PYTHON) -m devstack.sim $(SIM_ARGS)

# The harness beside bare Temporal; LOAD_ARGS=--profile adds where the worker's CPU goes (py-spy).
load: $(VENV)/.installed
	$(PYTHON) -m devstack.load $(LOAD_ARGS)

# A Sundry week: 4,200 tickets of a realistic mix, timed beside bare Temporal's, judged on the provider's records.
week: $(VENV)/.installed
	$(PYTHON) -m devstack.week $(WEEK_ARGS)

# SIGKILL a worker mid-refund 50 times per mode: kill -> the refund running again, from the histories.
# RESUME_ARGS="--mode survivor --load 300": the same while 300 other tickets run on the same workers.
resume: $(VENV)/.installed
	$(PYTHON) -m devstack.resume $(RESUME_ARGS)

# Retries made on purpose beside 300 tasks at once: how late a retry (a crashed step's resume) starts.
retries: $(VENV)/.installed
	$(PYTHON) -m devstack.retry_probe $(RETRY_ARGS)

# Tickets x provider conditions x model backends, graded on the world; exit 1 when a run outside
# the naive baseline pays twice, loses its task or tells the customer something false.
eval: $(VENV)/.installed
	$(PYTHON) -m devstack.eval $(EVAL_ARGS)

# Re-record the replay corpus on purpose (see tests/histories/README.md).
record: $(VENV)/.installed
	$(PYTHON) -m tests.record
