# One Makefile for people and CI. `make demo` and `make test` each set up .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-all e2e lint bench ui clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stormlake demo

# Two workers: most end-to-end tests wait on subprocesses, the daemon and PostgreSQL.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n 2 $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -n 2 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check pipeline assets resources tests

bench: $(STAMP)
	$(BIN)/stormlake bench

ui: $(STAMP)
	$(BIN)/stormlake ui

clean:
	-$(BIN)/stormlake db stop
	rm -rf .stormlake
