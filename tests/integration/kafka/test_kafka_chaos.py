"""The Kafka kill -9 campaign, short: 2 rounds on a real 3-broker local cluster.

``make chaos-kafka`` runs 20 rounds; this runs the same driver (``bench.chaos.kafka_campaign``)
and the campaign's independent checker: an idempotent ``acks=all`` confluent-kafka producer
and a consumer group while partition leaders are killed, then every acknowledged record
stored once at the offset it was acknowledged at, delivered, each key in order.
"""

from __future__ import annotations

from pathlib import Path

from bench.chaos import kafka_campaign


async def test_two_leader_kills_under_kafka_clients_lose_duplicate_and_reorder_nothing(
    tmp_path: Path,
) -> None:
    settings = kafka_campaign.Settings(rounds=2, seed=1)
    report = await kafka_campaign.KafkaCampaign(tmp_path, settings).run()

    counts = report["counts"]
    assert counts["acknowledged"] > 0
    for kind in ("lost", "duplicated", "gaps", "order_violations", "offsets_reused", "undelivered"):
        assert counts[kind] == 0, (kind, report["examples"].get(kind))
    assert counts["corrupt"] == 0, report["examples"].get("corrupt")
    assert report["rounds_not_recovered"] == 0, report["recovery_s"]
