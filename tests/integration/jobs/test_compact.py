"""The compact job on real Spark over real MinIO."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import pytest

from headrace.jobs import compact
from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered import layout
from headrace.tiered.tier import PartitionTier
from tests.integration.jobs.jobrun import run_job
from tests.integration.jobs.topicdata import checksum, manifest, stamped, write_partition

TOPIC = "default/events"


def _rows(
    spark: Any, store_url: str, cluster_id: str
) -> list[tuple[int, int, bytes | None, bytes]]:
    df = (
        spark.read.format("headrace")
        .option("store", store_url)
        .option("cluster", cluster_id)
        .option("topic", TOPIC)
        .load()
    )
    return [(r.partition, r.offset, r.key, r.value) for r in df.collect()]


def test_many_small_segments_become_few_with_the_same_records_while_producing_and_reading(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    end = write_partition(store, cluster_id, TOPIC, 0, objects=200, keys=[b"a", b"b", b"c"])
    write_partition(store, cluster_id, TOPIC, 1, objects=20)
    before = checksum(_rows(spark, store_url, cluster_id))
    segment_bytes = manifest(store, cluster_id, TOPIC, 0).segments[0].size

    prefix = layout.partition_prefix(cluster_id, TOPIC, 0)
    stop = threading.Event()
    produced: list[int] = [end]
    seen_rounds: list[list[int]] = []
    failures: list[BaseException] = []

    def produce() -> None:
        # the partition's leader keeps uploading new objects at the tail
        tier = PartitionTier(store, prefix)
        try:
            while not stop.is_set():
                o = produced[-1]
                frame = stamped(rb.encode([b"late-%d" % o], timestamp_ms=1), o)
                tier.upload(frame, 0)
                produced.append(o + 1)
        except BaseException as exc:
            failures.append(exc)
        finally:
            tier.close()

    def consume() -> None:
        # a tiered reader from offset 0 (the broker's read path), round after round
        try:
            while not stop.is_set():
                tier = PartitionTier(store, prefix)
                offsets: list[int] = []
                offset = 0
                limit = produced[-1]
                while offset < limit:
                    for _, h in rb.scan(tier.read(offset, 1 << 20)):
                        offsets.extend(range(h.base_offset, h.next_offset))
                        offset = h.next_offset
                tier.close()
                seen_rounds.append(offsets)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        status, report = run_job(
            spark,
            "compact",
            store_url,
            cluster_id,
            TOPIC,
            "--target-bytes",
            str(segment_bytes * 50),
            "--grace-seconds",
            "1",
            "--verify",
        )
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert status == 0, report
    p0 = report["partitions"][0]
    assert p0["outcome"] == "compacted" and p0["segmentsBefore"] >= 200
    # 200 objects of 50 become 4; what the producer added during the run stays as it was
    assert len(manifest(store, cluster_id, TOPIC, 0).segments) <= 4 + len(produced)
    assert manifest(store, cluster_id, TOPIC, 0).gaps() == ()
    assert p0["verification"]["ok"] and report["ok"]
    for key in p0["deleted"]:
        assert not store.exists(key)
    # every read round saw each offset once, in order, with no gap
    assert seen_rounds
    for offsets in seen_rounds:
        assert offsets == list(range(len(offsets)))
    after = [r for r in _rows(spark, store_url, cluster_id) if not (r[0] == 0 and r[1] >= end)]
    assert checksum(after) == before


def test_key_compacted_topic_keeps_exactly_the_last_value_per_key(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    keys = [b"k%d" % i for i in range(7)]
    end = write_partition(store, cluster_id, TOPIC, 0, objects=12, keys=keys)
    last = {keys[o % len(keys)]: f"p0-o{o}".encode() for o in range(end)}
    status, report = run_job(
        spark,
        "compact",
        store_url,
        cluster_id,
        TOPIC,
        "--keep-last-per-key",
        "--grace-seconds",
        "0",
        "--verify",
    )
    assert status == 0, report
    assert report["partitions"][0]["recordsRemoved"] == end - len(keys)
    rows = _rows(spark, store_url, cluster_id)
    assert {k: v for _, _, k, v in rows} == last
    assert len(rows) == len(keys)
    [seg] = manifest(store, cluster_id, TOPIC, 0).segments
    assert seg.compacted and (seg.base, seg.last) == (0, end - 1)
    # the broker's tiered read path follows the holes: from offset 0 it gets the kept records
    tier = PartitionTier(store, layout.partition_prefix(cluster_id, TOPIC, 0))
    offsets = [
        o for _, h in rb.scan(tier.read(0, 1 << 20)) for o in range(h.base_offset, h.next_offset)
    ]
    tier.close()
    assert offsets == sorted(o for _, o, _, _ in rows)


def test_unparseable_manifest_fails_clearly_and_deletes_nothing(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=5)
    prefix = layout.partition_prefix(cluster_id, TOPIC, 0)
    keys_before = sorted(i.key for i in store.list(prefix))
    store.put(layout.manifest_key(prefix), b'{"format": 1, "version": 1}')
    status, report = run_job(spark, "compact", store_url, cluster_id, TOPIC, "--grace-seconds", "0")
    assert status == 2
    [failed] = report["failed"]
    assert layout.manifest_key(prefix) in failed["error"] and "epoch" in failed["error"]
    assert sorted(i.key for i in store.list(prefix)) == keys_before


def test_topic_without_objects_compacts_to_an_empty_successful_report(
    spark: Any, store_url: str, cluster_id: str
) -> None:
    status, report = run_job(spark, "compact", store_url, cluster_id, TOPIC)
    assert status == 0 and report["ok"] and report["partitions"] == []


@pytest.mark.parametrize("policy", ["delete"])
def test_second_run_finds_nothing_to_do(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str, policy: str
) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=6)
    args = ("--grace-seconds", "0")
    assert run_job(spark, "compact", store_url, cluster_id, TOPIC, *args)[0] == 0
    status, report = run_job(spark, "compact", store_url, cluster_id, TOPIC, *args)
    assert status == 0 and report["partitions"][0]["outcome"] == "unchanged"


def test_a_second_compaction_of_a_partition_is_refused_while_one_holds_it(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    write_partition(store, cluster_id, TOPIC, 0, objects=4)
    prefix = layout.partition_prefix(cluster_id, TOPIC, 0)
    lock = prefix + compact.LOCK_NAME
    before = manifest(store, cluster_id, TOPIC, 0)
    held = {"owner": "other-job", "startedMs": int(time.time() * 1000)}
    assert store.put_if_version(lock, json.dumps(held).encode(), None)
    status, report = run_job(spark, "compact", store_url, cluster_id, TOPIC, "--grace-seconds", "0")
    assert status == 2
    [failed] = report["failed"]
    assert "CompactionRefused" in failed["error"] and "other-job" in failed["error"]
    assert manifest(store, cluster_id, TOPIC, 0) == before
    # a lock left by a job that died long ago is taken over
    store.put(lock, json.dumps({"owner": "dead-job", "startedMs": 0}).encode())
    status, report = run_job(spark, "compact", store_url, cluster_id, TOPIC, "--grace-seconds", "0")
    assert status == 0 and report["partitions"][0]["outcome"] == "compacted"
    assert not store.exists(lock)


def test_object_store_down_fails_with_a_clear_reason(spark: Any, cluster_id: str) -> None:
    from headrace.testing.procs import free_port

    url = f"s3://127.0.0.1:{free_port()}/nothing-here"
    status, report = run_job(spark, "compact", url, cluster_id, TOPIC)
    assert status == 2 and not report["ok"]
    assert "ObjectStoreUnavailable" in report["error"] and url in report["error"]


def _write_keyed(
    store: ObjectStore, cluster_id: str, partition: int, now_ms: int, seed: int
) -> list[tuple[int, int, bytes | None, bytes, int]]:
    """A keyed partition in 10 objects as a producer of a compact topic leaves it:
    random keys (some records without one), some values empty (tombstones), old
    and recent timestamps, every codec, some batches with headers; returns
    (partition, offset, key, value, timestamp) of every record."""
    rng = random.Random(seed)
    tier = PartitionTier(store, layout.partition_prefix(cluster_id, TOPIC, partition))
    written: list[tuple[int, int, bytes | None, bytes, int]] = []
    codecs = [rb.COMPRESSION_NONE, rb.COMPRESSION_ZLIB, rb.COMPRESSION_LZ4, rb.COMPRESSION_ZSTD]
    offset = 0
    try:
        for _ in range(10):
            frames = []
            for _ in range(4):
                n = rng.randint(1, 30)
                keys = [
                    None if rng.random() < 0.05 else b"k%d" % rng.randrange(40) for _ in range(n)
                ]
                values = [
                    b"" if rng.random() < 0.15 else b"p%d-o%d" % (partition, offset + i)
                    for i in range(n)
                ]
                # old records: their tombstones are past the delete retention (1 h)
                stamps = [now_ms - rng.choice([2, 0]) * 3_600_000 + i for i in range(n)]
                headers = [[("h", b"%d" % i)] for i in range(n)] if rng.random() < 0.3 else None
                frame = rb.encode(
                    values,
                    keys=keys,
                    headers=headers,
                    timestamps=stamps,
                    compression=rng.choice(codecs),
                )
                frames.append(stamped(frame, offset, 1))
                written.extend(
                    (partition, offset + i, k, v, t)
                    for i, (k, v, t) in enumerate(zip(keys, values, stamps, strict=True))
                )
                offset += n
            tier.upload(b"".join(frames), 1)
    finally:
        tier.close()
    return written


def _last_per_key(
    written: list[tuple[int, int, bytes | None, bytes, int]], cutoff_ms: int
) -> list[tuple[int, int, bytes | None, bytes]]:
    """The reference model: a dict of each key's last record, records without a
    key kept, tombstones older than the cutoff dropped."""
    last: dict[tuple[int, bytes], int] = {}
    for p, o, k, _, _ in written:
        if k is not None:
            last[(p, k)] = o
    return [
        (p, o, k, v)
        for p, o, k, v, t in written
        if (k is None or last[(p, k)] == o) and not (k is not None and v == b"" and t < cutoff_ms)
    ]


def test_key_compaction_keeps_what_a_dict_of_last_per_key_keeps(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    now_ms = int(time.time() * 1000)
    written = [
        *_write_keyed(store, cluster_id, 0, now_ms, 1),
        *_write_keyed(store, cluster_id, 1, now_ms, 2),
    ]
    status, report = run_job(
        spark,
        "compact",
        store_url,
        cluster_id,
        TOPIC,
        "--keep-last-per-key",
        "--delete-retention-ms",
        "3600000",
        "--grace-seconds",
        "0",
        "--verify",
    )
    assert status == 0, report
    # the job's clock read after ours: its cutoff is at least ours (no record is within a second of it)
    expected = _last_per_key(written, now_ms - 3_600_000)
    rows = _rows(spark, store_url, cluster_id)
    assert checksum(rows) == checksum(expected)
    assert len(rows) == len(expected)
    assert report["summary"]["recordsRemoved"] == len(written) - len(expected)
    for partition in (0, 1):
        [seg] = manifest(store, cluster_id, TOPIC, partition).segments
        assert seg.compacted
        # a consumer starting at any offset, kept or dropped, reads on from the next kept one
        kept = [o for p, o, _, _ in expected if p == partition]
        tier = PartitionTier(store, layout.partition_prefix(cluster_id, TOPIC, partition))
        try:
            for start in range(0, seg.last + 1, 7):
                data = tier.read(start, 1 << 20)
                got = [
                    r.offset
                    for pos, h in rb.scan(data)
                    for r in rb.decode(data[pos : pos + h.size]).records(start)
                ]
                assert got == [o for o in kept if o >= start]
        finally:
            tier.close()
