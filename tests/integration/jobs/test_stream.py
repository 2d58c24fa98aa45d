"""``spark.readStream.format("headrace")`` over a topic whose leader keeps uploading."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered import layout
from headrace.tiered.tier import PartitionTier
from tests.integration.jobs.topicdata import stamped, write_partition

TOPIC = "default/live"


def _run_until_caught_up(
    spark: Any, store_url: str, cluster_id: str, checkpoint: Path, seen: list[tuple[int, int]]
) -> None:
    """One query run (trigger availableNow) from the checkpoint; rows go to ``seen``."""
    df = (
        spark.readStream.format("headrace")
        .option("store", store_url)
        .option("cluster", cluster_id)
        .option("topic", TOPIC)
        .load()
    )

    def collect(batch_df: Any, _batch_id: int) -> None:
        seen.extend(
            (r.partition, r.offset) for r in batch_df.select("partition", "offset").collect()
        )

    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)


def test_every_record_once_across_a_restart_from_the_checkpoint(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str, tmp_path: Path
) -> None:
    ends = [write_partition(store, cluster_id, TOPIC, p, objects=3) for p in range(2)]
    seen: list[tuple[int, int]] = []
    checkpoint = tmp_path / "checkpoint"

    # the leader of partition 0 keeps uploading while the first run goes
    stop = threading.Event()
    uploaded = [ends[0]]

    def produce() -> None:
        tier = PartitionTier(store, layout.partition_prefix(cluster_id, TOPIC, 0))
        try:
            while not stop.is_set() and uploaded[-1] < ends[0] + 200:
                o = uploaded[-1]
                tier.upload(stamped(rb.encode([b"x%d" % o, b"y"], timestamp_ms=1), o), 0)
                uploaded.append(o + 2)
        finally:
            tier.close()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        _run_until_caught_up(spark, store_url, cluster_id, checkpoint, seen)
    finally:
        stop.set()
        producer.join()
    first_run = len(seen)
    assert first_run >= sum(ends)

    # more records after the first run, then a restart from the checkpoint
    tier = PartitionTier(store, layout.partition_prefix(cluster_id, TOPIC, 1))
    tier.upload(stamped(rb.encode([b"late"] * 5, timestamp_ms=1), ends[1]), 0)
    tier.close()
    _run_until_caught_up(spark, store_url, cluster_id, checkpoint, seen)

    expected = [(0, o) for o in range(uploaded[-1])] + [(1, o) for o in range(ends[1] + 5)]
    assert len(seen) > first_run
    assert sorted(seen) == expected  # every record, once
