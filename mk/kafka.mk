# Kafka's own tools and clients in other languages against the Kafka listener (docs/kafka.md,
# "Tested clients and tools"), from tests/integration/kafka/test_kafka_peers.py.
#   make kafka-peers-build  Kafka's jars (Maven Central), the franz-go program (Go module proxy)
#                           and kcat (Debian) into ~/.cache/headrace; idempotent
#   make kafka-peers        every peer test, Kafka's perf tools included (~1.5 min)
# `make test` runs them all but the perf tools (~1 min).
#   make kafka-cluster-kills  a group on a 3-broker local cluster with a partition leader and
#                           then the group's coordinator killed -9 (test_kafka_cluster.py)
.PHONY: kafka-peers kafka-peers-build kafka-cluster-kills

kafka-peers-build:
	bash tests/integration/kafka/peers/build.sh

kafka-peers: setup kafka-peers-build
	HEADRACE_KAFKA_PEERS_ALL=1 $(BIN)/pytest -q tests/integration/kafka/test_kafka_peers.py

kafka-cluster-kills: setup
	HEADRACE_KAFKA_CLUSTER_KILLS=1 $(BIN)/pytest -q tests/integration/kafka/test_kafka_cluster.py
