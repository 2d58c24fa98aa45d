# headrace — developer entry points. `make run` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
DATA_DIR ?= var/standalone

.PHONY: setup run test lint typecheck unit integration bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[broker,testbed,dev]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/headrace broker --standalone --data-dir $(DATA_DIR) --port 9092 --admin-port 9644 --announce

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q tests/integration

test: lint typecheck
	$(BIN)/pytest -q tests $(TEST_E2E_PATHS)

bench: setup
	bash bench/setup-peers.sh
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) var build dist

-include mk/*.mk
