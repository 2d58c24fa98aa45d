# headrace — developer entry points. `make run` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
DATA_DIR ?= var/standalone
LOCAL_DIR ?= var/local

.PHONY: setup run run-standalone test check lint typecheck unit integration bench generate clean

# hatch_build.py compiles the C extension (broker/headrace/**/*.c) into the source tree
$(VENV)/.installed: pyproject.toml hatch_build.py $(wildcard broker/headrace/*/*.c)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[broker,operator,testbed,tiered,compression,jobs,dev]'
	touch $@

setup: $(VENV)/.installed

# A 3-broker local cluster (controller + brokers on 127.0.0.2-4) with a demo topic;
# one Ctrl-C stops it and exits. `make run-standalone` runs a single standalone broker.
# LOCAL_ARGS passes options to `headrace local up` (e.g. --port-base 19092, --object-store minio).
LOCAL_ARGS ?=
run: setup
	-$(BIN)/headrace local down --dir $(LOCAL_DIR) 2>/dev/null
	mkdir -p $(LOCAL_DIR)
	$(BIN)/headrace local up --dir $(LOCAL_DIR) --brokers 3 $(LOCAL_ARGS) > $(LOCAL_DIR).bootstrap
	$(BIN)/headrace apply -f examples/local/demo-topic.yaml --dir $(LOCAL_DIR)
	@# One shell: the trap is set before "Ctrl-C here stops the cluster" is printed (a Ctrl-C
	@# between two recipe lines would end make and leave the cluster running). `sleep &
	@# wait`: a trap runs as soon as the signal arrives (not when a foreground sleep ends),
	@# and it exits, so one Ctrl-C (or a TERM) stops the cluster and make.
	@trap '$(BIN)/headrace local down --dir $(LOCAL_DIR); kill $$! 2>/dev/null; exit 0' INT TERM; \
	  B=$$(cat $(LOCAL_DIR).bootstrap); C=$$($(PY) -c 'import json,sys; print(json.load(open(sys.argv[1]))["controller_url"])' $(LOCAL_DIR)/local.json); \
	  printf '%s\n' "" "headrace local cluster is up (dashboard: $$C/)" "Try, in another shell:" \
	  "  export HEADRACE_BOOTSTRAP=$$B HEADRACE_CONTROLLER=$$C" \
	  "  seq 1 10 | .venv/bin/headrace produce demo --acks all" \
	  "  .venv/bin/headrace consume demo --cohort readers --from-beginning --count 10" \
	  "  .venv/bin/headrace cohorts describe readers" \
	  "  .venv/bin/headrace cluster health" \
	  "  .venv/bin/headrace local status --dir $(LOCAL_DIR)" "" "Ctrl-C here stops the cluster."; \
	  while true; do sleep 3600 & wait $$!; done

run-standalone: setup
	$(BIN)/headrace broker --standalone --data-dir $(DATA_DIR) --port 9092 --admin-port 9644 --announce

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q tests/integration

test: lint typecheck
	$(BIN)/pytest -q --durations=40 tests $(TEST_E2E_PATHS)
	$(MAKE) --no-print-directory test-real-node

# The fast lane (a few minutes; .ci/check): lint, import contracts, mypy and the unit tests,
# no processes, sockets or clusters. `make test` runs all of it and the rest.
check: lint typecheck unit

# crds/, the Helm chart's copy charts/headrace/crds/ and docs/crd-reference.md from the
# models in operator/headrace/resources (unit tests fail while the committed files are stale)
generate: setup
	$(PY) -m headrace.cli.generate crds/ docs/crd-reference.md charts/headrace/crds/

bench: setup
	bash bench/setup-peers.sh
	$(PY) -m bench.run
	$(PY) -m bench.unload
	$(PY) -m bench.repartition
	$(PY) -m bench.compression
	bash bench/peers/build.sh
	$(PY) -m bench.peerbench

clean:
	rm -rf $(VENV) var build dist

-include mk/*.mk
