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

# The operator fault campaign (docs/reliability.md, "The operator campaign"): on the
# Kubernetes test bed, two operator replicas under keyed acks=all load and a consuming
# cohort; kill -9 of the Lease holder mid-transition, a frozen holder, a deleted and
# re-applied BrokerCluster, random spec edits; the same checker plus the control plane's.
#   make chaos-operator                            30 rounds, a random seed (printed);
#                                                  report in bench/results/chaos-operator.json
#   make chaos-operator CHAOS_OPERATOR_ROUNDS=5 CHAOS_SEED=7
# `make test` runs a short version (e2e/tests/operator/test_chaos_operator_e2e.py).
CHAOS_OPERATOR_ROUNDS ?= 30
.PHONY: chaos-operator

chaos-operator: setup testbed
	$(PY) -m bench.chaos.operator --rounds $(CHAOS_OPERATOR_ROUNDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))
