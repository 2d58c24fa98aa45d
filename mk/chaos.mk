# The fault campaign (issue 14 §1, docs/reliability.md): a 3-broker local cluster under keyed
# acks=all load and a consuming cohort, one kill -9 per round, an independent checker at the end.
#   make chaos                      100 rounds, a random seed (printed); report in bench/results/chaos.json
#   make chaos CHAOS_ROUNDS=20 CHAOS_SEED=7
#   make chaos-repartition          the repartition target alone (grow under a double kill,
#                                   shrink under a controller kill, shrink then grow back), 40 rounds
# `make test` runs a 6-round version (tests/integration/test_chaos.py).
CHAOS_ROUNDS ?= 100
CHAOS_SEED ?=
.PHONY: chaos chaos-repartition

chaos: setup
	$(PY) -m bench.chaos --rounds $(CHAOS_ROUNDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

CHAOS_REPARTITION_ROUNDS ?= 40
chaos-repartition: setup
	$(PY) -m bench.chaos --targets repartition --rounds $(CHAOS_REPARTITION_ROUNDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) --out bench/results/chaos-repartition.json
