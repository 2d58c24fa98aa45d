# Live fuzzing of a running broker (issue 14 §5, docs/reliability.md): mutated frames from
# atheris (or a seeded random mutator without it) while a producer runs alongside.
#   make fuzz                       FUZZ_SECONDS=300; report in bench/results/fuzz.json
# `make test` runs 10 s of it (tests/integration/test_fuzz_live.py).
FUZZ_SECONDS ?= 300
.PHONY: fuzz

fuzz: setup
	$(PY) -m bench.fuzz --seconds $(FUZZ_SECONDS)
