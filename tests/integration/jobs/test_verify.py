"""The verify job on real Spark over real MinIO: a healthy topic passes; each kind of
damage fails with a finding that names the object key and the offset."""

from __future__ import annotations

import json
from typing import Any

from headrace.objectstore.interface import ObjectStore
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest, SegmentObject
from tests.integration.jobs.jobrun import run_job
from tests.integration.jobs.topicdata import manifest, write_partition

TOPIC = "default/audit"


def _errors(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def _put_manifest(store: ObjectStore, cluster_id: str, m: Manifest) -> None:
    store.put(layout.manifest_key(layout.partition_prefix(cluster_id, TOPIC, 0)), m.to_json())


def test_healthy_topic_passes_and_the_report_is_stored(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    for p in range(2):
        write_partition(store, cluster_id, TOPIC, p, objects=3)
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 0, report
    assert report["ok"] and report["findings"] == []
    assert report["summary"]["objects"] == 6 and report["summary"]["records"] == 60
    stored = json.loads(store.get(report["reportKey"]))
    assert stored["summary"] == report["summary"]


def test_topic_without_objects_is_an_empty_successful_report(
    spark: Any, store_url: str, cluster_id: str
) -> None:
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 0
    assert report["ok"] and report["partitions"] == [] and report["findings"] == []


def test_flipped_byte_is_a_crc_mismatch_naming_object_and_offset(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=3)
    seg = manifest(store, cluster_id, TOPIC, 0).segments[1]  # offsets 10..19, 2 batches
    data = bytearray(store.get(seg.key))
    second_batch = len(data) // 2
    data[second_batch + 70] ^= 0x01  # inside the record section of the batch at offset 15
    store.put(seg.key, bytes(data))
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 1
    [finding] = _errors(report)
    assert finding["kind"] == "crc-mismatch"
    assert (finding["key"], finding["offset"], finding["position"]) == (seg.key, 15, second_batch)


def test_missing_object(spark: Any, store: ObjectStore, store_url: str, cluster_id: str) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=3)
    seg = manifest(store, cluster_id, TOPIC, 0).segments[2]
    store.delete(seg.key)
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 1
    [finding] = _errors(report)
    assert (finding["kind"], finding["key"], finding["offset"]) == ("missing-object", seg.key, 20)


def test_manifest_listing_an_object_that_was_never_there(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    end = write_partition(store, cluster_id, TOPIC, 0, objects=2)
    m = manifest(store, cluster_id, TOPIC, 0)
    ghost_key = layout.segment_key(layout.partition_prefix(cluster_id, TOPIC, 0), end, end + 9)
    _put_manifest(store, cluster_id, m.with_segment(SegmentObject(end, end + 9, 500, ghost_key, 0)))
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 1
    [finding] = _errors(report)
    assert (finding["kind"], finding["key"], finding["offset"]) == (
        "missing-object",
        ghost_key,
        end,
    )


def test_overlapping_object(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=3)
    m = manifest(store, cluster_id, TOPIC, 0)
    first, second = m.segments[0], m.segments[1]
    # an object holding 5..14, as a leader cutting at other batch boundaries would
    data = (
        store.get(first.key)[len(store.get(first.key)) // 2 :]
        + store.get(second.key)[: len(store.get(second.key)) // 2]
    )
    key = layout.segment_key(layout.partition_prefix(cluster_id, TOPIC, 0), 5, 14)
    store.put(key, data)
    _put_manifest(store, cluster_id, m.with_segment(SegmentObject(5, 14, len(data), key, 0)))
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 1
    kinds = {(f["kind"], f["key"], f["offset"]) for f in _errors(report)}
    assert ("overlap", key, 5) in kinds


def test_offset_gap(spark: Any, store: ObjectStore, store_url: str, cluster_id: str) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=3)
    m = manifest(store, cluster_id, TOPIC, 0)
    middle = m.segments[1]
    store.delete(middle.key)
    _put_manifest(
        store, cluster_id, Manifest(tuple(s for s in m.segments if s != middle), m.epoch, 9)
    )
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 1
    [finding] = _errors(report)
    assert (finding["kind"], finding["key"], finding["offset"]) == (
        "offset-gap",
        m.segments[2].key,
        10,
    )


def test_unparseable_manifest_is_a_clear_error(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=1)
    key = layout.manifest_key(layout.partition_prefix(cluster_id, TOPIC, 0))
    store.put(key, b"{not json")
    status, report = run_job(spark, "verify", store_url, cluster_id, TOPIC)
    assert status == 1
    [finding] = _errors(report)
    assert finding["kind"] == "manifest-invalid" and finding["key"] == key
    assert "not valid JSON" in finding["message"]


async def test_stored_range_against_a_real_brokers_high_watermark(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str, tmp_path: Any
) -> None:
    import asyncio

    from headrace.client import Producer
    from headrace.jobs.brokers import fetch_range
    from headrace.records import batch as rb
    from headrace.testing.procs import BrokerProcess
    from headrace.testing.reading import create_topic
    from headrace.tiered.tier import PartitionTier
    from tests.integration.jobs.topicdata import stamped

    topic = "default/checked"
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        await create_topic(broker.bootstrap, topic, 1)
        async with Producer(broker.bootstrap, acks="leader", linger_ms=1) as producer:
            for i in range(0, 1000, 100):
                await producer.send_many(
                    topic, [b"r%d" % n for n in range(i, i + 100)], partition=0
                )
                await producer.flush()
        # the store holds what an uploader would have: the broker's batches 0..999
        data = await asyncio.to_thread(fetch_range, broker.bootstrap, topic, 0, 0, 1000)
        tier = PartitionTier(store, layout.partition_prefix(cluster_id, topic, 0))
        tier.upload(data, 0)
        args = ("--bootstrap", broker.bootstrap)
        status, report = await asyncio.to_thread(
            run_job, spark, "verify", store_url, cluster_id, topic, *args
        )
        assert status == 0 and report["findings"] == [], report
        # an object past the leader's high watermark (records the leader never committed)
        ghost = tier.upload(stamped(rb.encode([b"x"] * 5, timestamp_ms=1), 1000), 0)
        tier.close()
        status, report = await asyncio.to_thread(
            run_job, spark, "verify", store_url, cluster_id, topic, *args
        )
        assert status == 1
        [finding] = _errors(report)
        assert (finding["kind"], finding["key"], finding["offset"]) == (
            "beyond-high-watermark",
            ghost.key,
            1000,
        )
    finally:
        broker.stop()
