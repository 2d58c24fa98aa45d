"""``spark.readStream.format("headrace")`` over a topic whose leader keeps uploading."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.slow  # a streaming query's first start costs tens of seconds on 2 busy cores
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


@pytest.mark.slow
async def test_stream_reads_the_stored_part_and_the_brokers_tail_once_across_a_restart(
    spark: Any,
    store: ObjectStore,
    store_url: str,
    cluster_id: str,
    tmp_path: Path,
) -> None:
    """A real broker holds the whole log; the object store holds its first part (as
    the broker's uploader would have stored it: the same batches). The stream reads
    the stored part from the objects and the rest from the broker, each record once,
    across a restart from its checkpoint."""
    import asyncio

    from headrace.client import Producer
    from headrace.jobs.brokers import fetch_range
    from headrace.jobs.source import HeadraceStreamReader
    from headrace.testing.procs import BrokerProcess
    from headrace.testing.reading import create_topic

    topic = "default/tail"
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        await create_topic(broker.bootstrap, topic, 2)

        async def produce(first: int, count: int) -> None:
            async with Producer(broker.bootstrap, acks="leader", linger_ms=1) as producer:
                for p in range(2):
                    for i in range(first, first + count, 50):
                        values = [b"p%d-%06d" % (p, n) for n in range(i, i + 50)]
                        await producer.send_many(topic, values, partition=p)
                        await producer.flush()

        await produce(0, 1000)
        # partition 0's first 600 offsets are in the store, in the broker's own batches
        stored = await asyncio.to_thread(fetch_range, broker.bootstrap, topic, 0, 0, 600)
        tier = PartitionTier(store, layout.partition_prefix(cluster_id, topic, 0))
        tier.upload(stored, 0)
        tier.close()

        options = {
            "store": store_url,
            "cluster": cluster_id,
            "topic": topic,
            "bootstrap": broker.bootstrap,
        }
        reader = HeadraceStreamReader(options)  # as Spark's driver calls it (no event loop)
        start = await asyncio.to_thread(reader.initialOffset)
        end = await asyncio.to_thread(reader.latestOffset, start, None)
        assert (start, end) == ({"0": 0, "1": 0}, {"0": 1000, "1": 1000})
        planned = await asyncio.to_thread(reader.partitions, start, end)
        kinds = sorted((type(s).__name__, s.partition, s.start, s.end) for s in planned)
        assert kinds == [
            ("BrokerSplit", 0, 600, 1000),
            ("BrokerSplit", 1, 0, 1000),
            ("ObjectSplit", 0, 0, 600),
        ]

        seen: list[bytes] = []

        def run() -> None:
            df = spark.readStream.format("headrace")
            for k, v in options.items():
                df = df.option(k, v)

            def collect(batch_df: Any, _id: int) -> None:
                seen.extend(r.value for r in batch_df.select("value").collect())

            q = (
                df.load()
                .writeStream.foreachBatch(collect)
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination(240)

        await asyncio.to_thread(run)
        assert len(seen) == 2000
        await produce(1000, 500)
        await asyncio.to_thread(run)
        expected = sorted(b"p%d-%06d" % (p, n) for p in range(2) for n in range(1500))
        assert sorted(seen) == expected  # every record once, across the restart
    finally:
        broker.stop()
