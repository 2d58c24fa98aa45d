# Kafka's own tools and clients in other languages against the Kafka listener (docs/kafka.md,
# "Tested clients and tools"), from tests/integration/kafka/test_kafka_peers.py.
#   make kafka-peers-build  Kafka's jars (Maven Central), the franz-go program (Go module proxy),
#                           kcat (Debian) and Spark's Kafka connector (Maven Central, for
#                           test_kafka_spark.py) into ~/.cache/headrace; idempotent
#   make kafka-peers        every peer test, Kafka's perf tools included (~1.5 min)
# `make test` runs them all but the perf tools (~1 min).
#   make kafka-cluster-kills  test_kafka_cluster.py alone (in `make test` too): a group on a
#                           3-broker local cluster with a partition leader and then the
#                           group's coordinator killed -9
#   make chaos-kafka        the Kafka kill -9 campaign (bench/chaos/kafka_campaign.py): an
#                           idempotent confluent-kafka producer and a group while leaders are
#                           killed, 20 rounds; report in bench/results/chaos-kafka.json
#   make chaos-kafka CHAOS_KAFKA_ROUNDS=50 CHAOS_SEED=7
# `make test` runs a 2-round version (tests/integration/kafka/test_kafka_chaos.py).
#   make kafka-kgo-suite    franz-go's own pkg/kgo test suite against a standalone broker's
#                           Kafka listener (tests/integration/kafka/kgo_suite.py; ~3 min,
#                           not in `make test`); go test -json and a summary in var/kgo-suite/
#   make kafka-kgo-suite KGO_SERVER=kafka KGO_RUN='TestTxnEtl|TestGroupETL'   the same against
#                           Kafka (one node, the bench's jars), or only the tests named
.PHONY: kafka-peers kafka-peers-build kafka-cluster-kills chaos-kafka kafka-kgo-suite
KGO_SERVER ?= headrace
KGO_RUN ?=
CHAOS_KAFKA_ROUNDS ?= 20

kafka-peers-build:
	bash tests/integration/kafka/peers/build.sh

kafka-peers: setup kafka-peers-build
	HEADRACE_KAFKA_PEERS_ALL=1 $(BIN)/pytest -q tests/integration/kafka/test_kafka_peers.py

kafka-cluster-kills: setup
	$(BIN)/pytest -q tests/integration/kafka/test_kafka_cluster.py

chaos-kafka: setup
	$(PY) -m bench.chaos.kafka_campaign --rounds $(CHAOS_KAFKA_ROUNDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

kafka-kgo-suite: setup
	$(PY) -m tests.integration.kafka.kgo_suite --server $(KGO_SERVER) $(if $(KGO_RUN),--run '$(KGO_RUN)')
