# One Makefile for people and CI. `make demo` and `make test` each set up .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
PIP_VERSION := 26.3

.PHONY: demo test test-all e2e lint bench ui clean browser broker lock bytecode

# The environment is requirements.lock, exactly (every package pinned, every file's hash checked),
# then the project itself without dependencies: a new checkout gets the set the tests ran on.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# The project's modules compiled ahead (only those changed since): with PYTHONDONTWRITEBYTECODE
# set, Python would otherwise compile them again in every process that imports them, and each
# backfill starts several (its daemon's code server, each run).
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 assets pipeline resources tests

# Writes requirements.lock again from pyproject.toml's pins (the project and its dev extra), for
# every platform, with hashes. Versions already in the lock stay unless a pin moves them;
# `make lock UPGRADE=1` takes the newest release of every package that is not pinned.
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --extra dev --universal --generate-hashes --python-version 3.11 \
		--custom-compile-command "make lock" $(if $(UPGRADE),--upgrade) -o requirements.lock

demo: $(STAMP) bytecode
	$(BIN)/stormlake demo

# Headless Chromium for the UI test: installed from Debian when missing and run as root,
# otherwise a one-line message says what to install.
browser:
	@bash tests/ensure_browser.sh

# redis-server, the broker of the Celery worker tests: the same way as Chromium.
broker:
	@bash tests/ensure_redis.sh

# Two pytest-xdist workers a core: the suite's processes wait on Dagster's daemon, its runs and
# PostgreSQL about as much as they compute, so two a core keep the cores busy. The long end-to-end
# tests are collected first (tests/conftest.py) and a worker that runs out of tests takes half of
# what waits for another (worksteal), so no long test waits at the end behind another.
# At most 8: each end-to-end test runs a daemon, a code server and runs of its own.
# The tests start an embedded PostgreSQL; set STORMLAKE_TEST_PG_DSN to use a server of yours.
TEST_WORKERS ?= $(shell n=$$(( 2 * $$(nproc 2>/dev/null || echo 1) )); echo $$(( n > 8 ? 8 : n )))
test: $(STAMP) bytecode browser broker
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-all: $(STAMP) bytecode browser broker
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check pipeline assets resources tests

bench: $(STAMP) bytecode
	$(BIN)/stormlake bench

ui: $(STAMP) bytecode
	$(BIN)/stormlake ui

clean:
	-$(BIN)/stormlake db stop
	rm -rf .stormlake
