"""Smoke tests of the Kafka/NATS comparison's own code (no timing asserted, no JVM, no NATS):
the tables and ratios, the tool-output parsers, the failover arithmetic, and the headrace
worker path the replicated scenario uses (several server pids, the stored-count check)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from bench import peerbench, peerreport, peerservers
from headrace.testing import procs


def _produce_row(system: str, client: str, rate: float, **more: Any) -> dict[str, Any]:
    family = "batch" if client in ("send_many", "ProducerPerformance") else "per-record"
    row = {
        "system": system,
        "family": family,
        "client": client,
        "acks": "1",
        "partitions": 1,
        "value_bytes": 100,
        "records_per_s": rate,
        "cpu": {"server_cores": 0.5, "client_cores": 1.0},
        "busy_cores_before": 0.1,
        **more,
    }
    peerbench.per_million(row)
    return row


def _doc() -> dict[str, Any]:
    produce = [
        _produce_row("headrace", "send_many", 4_000_000),
        _produce_row("headrace", "send", 800_000),
        _produce_row("kafka", "ProducerPerformance", 800_000),
        _produce_row("kafka-default-flush", "ProducerPerformance", 1_000_000),
        _produce_row("kafka", "confluent-kafka", 400_000),
        _produce_row("kafka", "aiokafka", 100_000),
        {**_produce_row("nats", "nats-py publish_async", 200_000), "acks": "stored"},
        {**_produce_row("nats", "nats bench js pub async", 400_000), "acks": "stored"},
    ]
    latency = [
        {"system": s, "rate": 1000, "busy_cores_before": 0.0,
         "latency_ms": {"p50": p, "p99": 2 * p, "p99_9": 3 * p, "max": 4 * p}}
        for s, p in (("headrace", 1.0), ("kafka", 4.0))
    ]  # fmt: skip
    failover = [
        {"system": "headrace", "first_ack_after_kill_s": 0.5, "failed_sends": 0},
        {"system": "kafka", "first_ack_after_kill_s": 9.5, "failed_sends": 0},
    ]
    return {
        "run_utc": "2026-11-24T07:30:00Z",
        "versions": {"kafka": "4.3.1", "nats_server": "v2.15.2", "clients": {}},
        "scenarios": {
            "produce": {"rows": produce},
            "latency": {"rows": latency},
            "failover": {"rows": failover},
        },
    }


def test_the_tables_carry_a_ratio_for_every_peer(tmp_path: Path) -> None:
    text = peerreport.markdown(_doc())
    # batch: 4M / 0.8M; per-record: 0.8M over confluent, aiokafka and NATS
    assert "| 1 | 1 | 100 B | 4.000M | 0.800M | 5.00x | 1.000M | 4.00x | 0.400M | 10.00x |" in text
    assert "| 0.800M | 0.400M | 0.100M | 0.200M | 2.00x | 8.00x | 4.00x |" in text
    # server CPU per million records: 0.5 cores at 4M/s is 0.125 s
    assert "| 0.12 | 0.62 | 0.50 | 1.25 | 5.00x | 10.00x |" in text
    assert "| 1,000 | 1.0 | 2.0 | 3.0 | 4.0 | 4.0 | 8.0 | 12.0 | 16.0 | 4.00x |" in text
    assert "Kafka / headrace: 19.00x." in text
    assert "compares servers" in text and "compares client APIs" in text

    page = tmp_path / "benchmarks.md"
    page.write_text(f"a\n{peerreport.START_MARKER}\nold\n{peerreport.END_MARKER}\nb\n")
    assert peerreport.update_docs(page, text)
    assert "old" not in page.read_text() and page.read_text().endswith("b\n")
    peerreport.plot(_doc(), tmp_path / "peers.png")
    assert (tmp_path / "peers.png").stat().st_size > 0


def test_every_table_has_as_many_columns_as_its_header() -> None:
    lines = peerreport.markdown(_doc()).splitlines()
    tables = 0
    for header, rule in itertools.pairwise(lines):
        if header.startswith("|") and rule.startswith("|-"):
            tables += 1
            assert header.count("|") == rule.count("|"), header
    assert tables >= 4


def test_a_scenario_that_stopped_early_says_so_with_the_tools_last_words() -> None:
    doc = _doc()
    doc["scenarios"]["produce"]["failed"] = (
        "RuntimeError: nats exited with 1:\nstarting\nnats: error: maximum_bytes exceeded\n"
    )
    text = peerreport.markdown(doc)
    assert "produce scenario stopped early (nats: error: maximum\\_bytes exceeded)" in text
    assert "4.000M" in text  # the rows measured before the failure are still shown


def test_failover_counts_from_the_first_record_sent_after_the_kill() -> None:
    killed = 100.0
    # the record in flight at the kill is acknowledged by the old leader 1 ms later:
    # it must not count as "producing works again"
    acked = [(99.0, 99.5), (99.99, 100.001), (100.001, 103.2), (103.2, 103.21)]
    gap = peerbench._failover_gap({"acked_at": acked, "errors": [], "error_count": 0}, killed)
    assert gap["first_ack_after_kill_s"] == 3.2
    assert gap["acked_before_kill"] == 1 and gap["acked_after_kill"] == 3
    assert gap["longest_ack_gap_s"] == 3.199


def test_consumer_performance_output_is_parsed() -> None:
    out = (
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,"
        " rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n"
        "2026-11-24 07:00:00:000, 2026-11-24 07:00:10:000, 953.6743, 95.3674, 10000000,"
        " 1000000.0000, 3000, 7000, 136.2392, 1428571.4286\n"
    )
    assert peerbench._consumer_performance(out) == {
        "records": 10_000_000,
        "records_per_s": 1_000_000.0,
        "fetch_records_per_s": 1428571.4286,
    }


def test_the_headrace_worker_meters_several_servers_and_the_count_is_checked(
    tmp_path: Path,
) -> None:
    broker = procs.BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        broker.create_topic("smoke", 2)
        result = peerbench._hr(
            "hr_produce",
            {
                "server_pids": [broker.pid, broker.pid],
                "bootstrap": broker.bootstrap,
                "topic": "smoke",
                "value_bytes": 100,
                "api": "send",
                "acks": "all",
                "warmup_s": 0.1,
                "duration_s": 0.3,
            },
            timeout=60,
        )
        assert set(result["cpu"]) >= {"server_cores", "client_cores", "foreign_cores"}
        assert not any(k.startswith("server0") for k in result["cpu"])
        stored = peerbench._stored_hr(broker, "smoke")
        peerbench.check_stored("headrace", "smoke", result["total_sent"], stored)
        with pytest.raises(RuntimeError, match="sent"):
            peerbench.check_stored("headrace", "smoke", result["total_sent"] + 1, stored)
    finally:
        broker.kill9()


def test_a_kafka_cluster_id_never_starts_with_a_dash() -> None:
    # 0xf8 encodes to a leading "-" in URL-safe base64: Kafka's storage tool read that id
    # as an option and failed one start in 64
    draws = iter([b"\xf8" + bytes(15), b"\xf8" + bytes(15), bytes(16)])
    assert peerservers.kafka_cluster_id(lambda: next(draws)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert all(not peerservers.kafka_cluster_id().startswith("-") for _ in range(500))
