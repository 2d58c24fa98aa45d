# Live fuzzing of a running broker (issue 14 §5, docs/reliability.md): mutated frames from
# atheris (or a seeded random mutator without it) while a producer runs alongside, at each
# listener in turn: the native protocol for FUZZ_SECONDS, then the Kafka listener for
# FUZZ_KAFKA_COUNT inputs (headers, framing, record batches; aiokafka producing alongside).
#   make fuzz        reports in bench/results/fuzz.json and bench/results/fuzz-kafka.json
# `make test` runs 10 s of each (tests/integration/test_fuzz_live.py).
FUZZ_SECONDS ?= 300
FUZZ_KAFKA_COUNT ?= 10000
.PHONY: fuzz

fuzz: setup
	$(PY) -m bench.fuzz --seconds $(FUZZ_SECONDS)
	$(PY) -m bench.fuzz --protocol kafka --count $(FUZZ_KAFKA_COUNT)
