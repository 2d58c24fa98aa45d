# The comparison with Kafka and NATS JetStream (docs/benchmarks.md, "Against Kafka and NATS").
#   make peers              build Kafka (Maven jars) and NATS (Go modules) into ~/.cache/headrace
#   make bench-peers        the full comparison (~25 min on 2 cores), then bench-kafka-peers;
#                           rewrites docs/benchmarks.md
#   make bench-peers-quick  one small configuration of each scenario (~5 min); docs untouched
#   make bench-repl         RF=3 acks=all against RF=1 on one local cluster, back to back
#                           (issue 16 §7; ~2 min; python -m bench.replbench --help for more)
#   make bench-kafka-peers  the same Kafka clients (Kafka's Java perf tools, librdkafka), two
#                           servers: headrace's Kafka listener and Kafka (KRaft), 3 brokers
#                           each, acks=all, RF 1 and RF 3 (~8 min); rewrites its table in
#                           docs/benchmarks.md. Sizes: e.g.
#                           KAFKA_PEERS_ARGS="--records 1000000 --record-size 100"
.PHONY: peers bench-deps bench-peers bench-peers-quick bench-repl bench-kafka-peers
KAFKA_PEERS_ARGS ?=

# the peers' Python clients (confluent-kafka, aiokafka, nats-py): pyproject's `bench` extra, on
# top of what `make setup` installed (pip keeps the other extras)
$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install -q -e '.[bench]'
	touch $@

bench-deps: $(VENV)/.bench-installed

peers:
	bash bench/peers/build.sh

bench-peers: bench-deps peers
	$(PY) -m bench.peerbench
	$(PY) -m bench.kafka_peers $(KAFKA_PEERS_ARGS)

bench-peers-quick: bench-deps peers
	$(PY) -m bench.peerbench --quick

bench-repl: setup
	$(PY) -m bench.replbench --rounds 3

# Kafka's jars only (no NATS, so no Go toolchain); confluent-kafka (dev deps) runs Kafka's admin
bench-kafka-peers: setup
	bash bench/peers/build.sh kafka
	$(PY) -m bench.kafka_peers $(KAFKA_PEERS_ARGS)

bench: bench-deps
