"""The Kafka peers bench's report: one row per server, client and replication factor, and
headrace's figures as fractions of Kafka's for the same client and RF only."""

from __future__ import annotations

from typing import Any

from bench import kafka_peers


def row(system: str, client: str, replicas: int, rate: float, cpu: float) -> dict[str, Any]:
    load = {"busy_cores_before": 0.1}
    return {
        "system": system,
        "version": "1",
        "client": client,
        "replicas": replicas,
        "produce": {
            "records_per_s": rate,
            "mb_per_s": rate / 1024,
            "latency_ms": {"p50": 1, "p99": 2},
            "cpu": {"server_cpu_s_per_m": cpu},
        },
        "consume": {
            "records_per_s": rate,
            "mb_per_s": 1.0,
            "group_join_ms": 3,
            "cpu": {"server_cpu_s_per_m": cpu},
        },
        "produce_load": load,
        "consume_load": load,
    }


def test_ratios_pair_the_same_client_and_replication_factor_only() -> None:
    rows = [
        row("headrace", "java", 3, 300.0, 10.0),
        row("kafka", "java", 3, 100.0, 40.0),
        row("headrace", "rdkafka", 1, 50.0, 1.0),
        row("kafka", "rdkafka", 3, 999.0, 99.0),
    ]
    assert kafka_peers.ratio_lines(rows) == [
        "- Kafka's Java perf tools, RF 3: 3.00x Kafka's records/s, 0.25x its server CPU per record"
    ]


def test_the_table_has_a_line_per_row_and_names_a_failed_server() -> None:
    doc = {
        "settings": {
            "records": 10,
            "record_bytes": 1,
            "warmup_records": 2,
            "server_warmup_records": 3,
            "partitions": 3,
            "throughput": -1,
            "brokers": 3,
        },
        "client": {"version": "4", "java": "17", "librdkafka": "2"},
        "run_utc": "now",
        "seconds": 1,
        "rows": [row("headrace", "java", 1, 10.0, 1.0), row("headrace", "rdkafka", 3, 10.0, 1.0)],
        "failed": {"kafka": "RuntimeError: it did not start"},
    }
    table = kafka_peers.markdown(doc)
    assert "| headrace 1 | java | 1 |" in table
    assert "| headrace 1 | rdkafka | 3 |" in table
    assert "| kafka | failed: RuntimeError: it did not start |" in table
