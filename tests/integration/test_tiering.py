"""Tiered storage through a real broker process and a real MinIO server.

The broker uploads to MinIO as it would in production (``--object-store
s3://...``); the test reads the manifest straight from the bucket to check
what the broker claims.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.client.cluster import ClusterClient
from headrace.client.connection import ClientConnection
from headrace.errors import CorruptSegmentObject, OffsetOutOfRange
from headrace.objectstore.minio_store import MinioStore
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.testing import procs, waiting
from headrace.testing.minio import MinioServer
from headrace.testing.procs import BrokerProcess, run_headrace
from headrace.testing.reading import create_topic, read_partition
from headrace.tiered import layout
from headrace.tiered.layout import partition_prefix
from headrace.tiered.manifest import Manifest
from headrace.tiered.tier import PartitionTier
from tests.integration.objectstore import servers
from tests.integration.tiered.batches import run

BUCKET = "tiering"
TOPIC = "default/tiered"


@pytest.fixture
def minio(tmp_path: Path) -> Iterator[MinioServer]:
    server = MinioServer(servers.minio_binary(), tmp_path / "minio")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def broker(tmp_path: Path, minio: MinioServer) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path / "data",
        extra_args=[
            "--object-store",
            f"s3://{minio.endpoint}/{BUCKET}?create_bucket=1",
            "--cluster-id",
            "t",
            "--segment-bytes",
            str(64 * 1024),
            "--retention-check-interval-ms",
            "200",
            "--tier-delete-grace-ms",
            "1000",
        ],
        env={
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": minio.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": minio.secret_key,
        },
    )
    b.start()
    yield b
    b.stop()


def creation_id_of(b: BrokerProcess, topic: str = TOPIC) -> str:
    """The creation id the broker gave ``topic``: its objects' prefix."""
    return str(b.get_json(f"/v1/topics/{topic}")["creation_id"])


def tier_of(minio: MinioServer, b: BrokerProcess) -> PartitionTier:
    """Partition 0's tier, under the creation id the broker gave the topic."""
    prefix = partition_prefix("t", TOPIC, 0, creation_id_of(b))
    return PartitionTier(MinioStore(minio.settings(BUCKET)), prefix)


def manifest(minio: MinioServer, b: BrokerProcess) -> Manifest:
    return tier_of(minio, b).manifest(refresh=True)


def describe(b: BrokerProcess) -> dict[str, int]:
    doc = b.get_json(f"/v1/topics/{TOPIC}")
    return dict(doc["partition_details"][0])  # type: ignore[index]


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    waiting.until(predicate, timeout, what, poll_s=0.1)


async def produce(b: BrokerProcess, first: int, count: int) -> None:
    async with Producer(b.bootstrap, acks="leader", linger_ms=1) as producer:
        for i in range(first, first + count, 100):
            await producer.send_many(
                TOPIC,
                [f"r{n:07d}".encode() * 10 for n in range(i, min(i + 100, first + count))],
                partition=0,
            )
            await producer.flush()  # small batches: segments roll every few of them


async def test_minio_outage_keeps_local_segments_until_uploaded_and_leaves_no_gap(
    broker: BrokerProcess, minio: MinioServer
) -> None:
    await create_topic(
        broker.bootstrap, TOPIC, 1, {"local_retention_bytes": 128 * 1024, "upload_interval_ms": 300}
    )
    await produce(broker, 0, 3000)
    wait_for(lambda: manifest(minio, broker).checkpoint == 2999, 20, "first records uploaded")
    wait_for(lambda: describe(broker)["log_start_offset"] > 0, 20, "retention after upload")

    minio.stop()
    stored_before = 2999
    await produce(broker, 3000, 6000)  # many segments roll while nothing can be uploaded
    await asyncio.sleep(2.0)  # ten retention rounds
    part = describe(broker)
    assert part["log_end_offset"] == 9000
    assert part["log_start_offset"] <= stored_before + 1, (
        f"retention deleted {part['log_start_offset']} > {stored_before + 1}: records that are"
        " in no object were removed from disk"
    )

    minio.start()
    wait_for(
        lambda: manifest(minio, broker).checkpoint == 8999, 60, "uploads resumed after the outage"
    )
    final = manifest(minio, broker)
    assert final.gaps() == () and final.start_offset == 0, final
    wait_for(
        lambda: describe(broker)["log_start_offset"] > stored_before + 1,
        20,
        "retention resumed once the segments are stored",
    )
    # Read from 0: the early offsets come from MinIO, the rest from the broker's disk.
    records = await read_partition(broker.bootstrap, TOPIC, 0)
    assert [r.offset for r in records] == list(range(9000))
    assert [r.value for r in records] == [f"r{n:07d}".encode() * 10 for n in range(9000)]


async def test_topics_list_counts_the_records_in_the_object_store_too(
    broker: BrokerProcess, minio: MinioServer
) -> None:
    await create_topic(
        broker.bootstrap, TOPIC, 1, {"local_retention_bytes": 128 * 1024, "upload_interval_ms": 300}
    )
    await produce(broker, 0, 3000)
    wait_for(lambda: manifest(minio, broker).checkpoint == 2999, 20, "records uploaded")
    wait_for(lambda: describe(broker)["log_start_offset"] > 0, 20, "retention after upload")
    listing = procs.run_headrace("topics", "list", "--bootstrap", broker.bootstrap, timeout=60)
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.decode().splitlines() if TOPIC in line)
    assert row.split()[-1] == "3000", row  # every record is still readable, from one tier


async def test_corrupt_segment_object_is_reported_with_its_key_and_not_delivered(
    broker: BrokerProcess, minio: MinioServer
) -> None:
    await create_topic(
        broker.bootstrap, TOPIC, 1, {"local_retention_bytes": 64 * 1024, "upload_interval_ms": 300}
    )
    await produce(broker, 0, 4000)
    wait_for(lambda: manifest(minio, broker).checkpoint == 3999, 20, "records uploaded")
    wait_for(lambda: describe(broker)["log_start_offset"] > 0, 20, "local copy of offset 0 gone")
    first = manifest(minio, broker).segments[0]
    store = MinioStore(minio.settings(BUCKET))
    data = bytearray(store.get(first.key))
    data[len(data) // 2] ^= 0x40
    store.put(first.key, bytes(data))

    cluster = ClusterClient(broker.bootstrap)
    try:
        conn = await cluster.bootstrap_connection()
        with pytest.raises(CorruptSegmentObject) as raised:
            await read_until_error(conn)
        assert first.key in str(raised.value), raised.value
    finally:
        await cluster.close()


async def read_until_error(conn: ClientConnection) -> None:
    """Fetch from offset 0 on; every batch that arrives must be intact."""
    offset = 0
    for _ in range(1000):
        req = msg.FetchRequest(TOPIC, 0, offset, 64 * 1024, 0, msg.Isolation.COMMITTED)
        frame = await conn.request(Op.FETCH, req.encode())
        _, body = msg.FetchResponseHeader.decode(frame.body)
        for pos, header in rb.scan(body):
            assert rb.crc_ok(body, header, pos), "a corrupt batch was delivered"
            offset = header.next_offset


async def test_deleting_a_tiered_topic_removes_its_objects(
    broker: BrokerProcess, minio: MinioServer
) -> None:
    await create_topic(broker.bootstrap, TOPIC, 1, {"upload_interval_ms": 300})
    await produce(broker, 0, 500)
    wait_for(lambda: manifest(minio, broker).checkpoint == 499, 20, "records uploaded")
    store = MinioStore(minio.settings(BUCKET))
    prefix = tier_of(minio, broker).prefix
    assert any(True for _ in store.list(prefix))
    assert await asyncio.to_thread(delete_topic, broker) == 200
    wait_for(lambda: not any(True for _ in store.list(prefix)), 20, "objects deleted")


def delete_topic(b: BrokerProcess) -> int:
    req = urllib.request.Request(f"{b.admin_url}/v1/topics/{TOPIC}", method="DELETE")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(resp.status)


async def test_a_tail_lost_locally_but_stored_is_restored_before_new_appends(
    broker: BrokerProcess, minio: MinioServer
) -> None:
    """A power loss can take an uploaded but unsynced tail from the local log: the
    broker copies it back from the store instead of giving its offsets to new records."""
    await create_topic(broker.bootstrap, TOPIC, 1, {"upload_interval_ms": 300})
    await produce(broker, 0, 3000)
    wait_for(lambda: manifest(minio, broker).checkpoint == 2999, 20, "records uploaded")
    broker.stop()
    segments = sorted((broker.data_dir / "topics" / TOPIC / "0").glob("*.log"))
    last = segments[-1]
    with open(last, "r+b") as fh:  # what an unsynced page cache loses: the file's tail
        fh.truncate(last.stat().st_size // 2)
    broker.start()
    wait_for(lambda: describe(broker)["log_end_offset"] == 3000, 20, "tail restored")
    await produce(broker, 3000, 100)
    records = await read_partition(broker.bootstrap, TOPIC, 0)
    assert [r.offset for r in records] == list(range(3100))
    assert [r.value for r in records] == [f"r{n:07d}".encode() * 10 for n in range(3100)]


async def first_offset(b: BrokerProcess) -> int:
    """The offset a fresh consumer starts from (``earliest``): the log start a fetch
    answer carries, asked at the log end so that no record has to exist."""
    end = describe(b)["log_end_offset"]
    cluster = ClusterClient(b.bootstrap)
    try:
        await cluster.start()
        conn = await cluster.connection_for(TOPIC, 0)
        req = msg.FetchRequest(TOPIC, 0, end, 1024, 0, msg.Isolation.UNCOMMITTED)
        frame = await conn.request(Op.FETCH, req.encode())
        return msg.FetchResponseHeader.decode(frame.body)[0].log_start_offset
    finally:
        await cluster.close()


class ListedObjectsWatch:
    """Reads the manifest over and over while the broker works, from a thread: every
    segment object it lists must exist (one missing is re-checked against a fresh
    manifest, since retention may have removed it since), and it remembers every key
    ever listed."""

    def __init__(self, minio: MinioServer, creation_id: str) -> None:
        self.store = MinioStore(minio.settings(BUCKET))
        self.prefix = partition_prefix("t", TOPIC, 0, creation_id)
        self.tier = PartitionTier(self.store, self.prefix)
        self.ever_listed: set[str] = set()
        self.violations: list[str] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ListedObjectsWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            listed = self.tier.manifest(refresh=True).segments
            self.ever_listed.update(s.key for s in listed)
            for seg in listed:
                if not self.store.exists(seg.key) and self.tier.manifest(refresh=True).find(
                    seg.key
                ):
                    self.violations.append(seg.key)
            self.rounds += 1

    def segment_objects(self) -> list[str]:
        return [o.key for o in self.store.list(self.prefix) if o.key.endswith(".log")]


async def test_retention_covers_the_tier_moves_the_log_start_and_bounds_the_objects(
    broker: BrokerProcess, minio: MinioServer
) -> None:
    retention_ms = 2000
    await create_topic(
        broker.bootstrap,
        TOPIC,
        1,
        {
            "retention_ms": retention_ms,
            "local_retention_bytes": 64 * 1024,
            "upload_interval_ms": 200,
        },
    )
    periods = 6
    per_tick = 100
    produced = 0
    samples: list[tuple[int, int]] = []  # (segment objects stored, first offset) per period
    with ListedObjectsWatch(minio, creation_id_of(broker)) as watch:
        async with Producer(broker.bootstrap, acks="leader", linger_ms=1) as producer:
            started = time.monotonic()
            for period in range(1, periods + 1):
                # a steady rate: 100 records every 100 ms (pacing, not synchronisation)
                while time.monotonic() < started + period * retention_ms / 1000:
                    await producer.send_many(
                        TOPIC,
                        [f"r{n:07d}".encode() * 10 for n in range(produced, produced + per_tick)],
                        partition=0,
                    )
                    await producer.flush()
                    produced += per_tick
                    await asyncio.sleep(0.1)
                samples.append((len(watch.segment_objects()), await first_offset(broker)))
        wait_for(lambda: watch.rounds > 3, 30, "the watch looked at the final manifests")
    assert watch.violations == [], f"listed objects missing from the store: {watch.violations}"
    counts = [count for count, _ in samples]
    firsts = [first for _, first in samples]
    # the first offset a fresh consumer gets moves with retention, period after period
    assert firsts[1] > 0 and firsts[-1] > firsts[2] > firsts[1], samples
    # objects are deleted as fast as they come: the count levels off instead of growing
    # with the log (the watch saw every object ever listed)
    assert len(watch.ever_listed) > 2 * counts[-1], (len(watch.ever_listed), samples)
    assert counts[-1] <= 2 * max(counts[1:3]) + 4, samples
    # what a consumer reads from its first offset runs to the end with no gap
    for _ in range(5):
        first = await first_offset(broker)
        try:
            records = await read_partition_from(broker.bootstrap, first)
        except OffsetOutOfRange:
            continue  # retention moved the start while the read ran: read again
        break
    assert [r.offset for r in records] == list(range(first, produced))
    assert records[-1].value == f"r{produced - 1:07d}".encode() * 10
    # a fresh cohort member starts at the moved log start too, and follows it to the end
    delivered: list[int] = []
    async with Consumer(broker.bootstrap, TOPIC, "fresh", start="earliest") as consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not delivered or delivered[-1] < produced - 1:
            assert loop.time() < deadline, f"the member stalled at {delivered[-1:]}"
            for batch in await consumer.getmany(timeout_s=0.5):
                delivered.extend(batch.offsets())
                consumer.ack_batch(batch)
    assert delivered[0] >= firsts[-1] > 0
    assert all(b > a for a, b in itertools.pairwise(delivered))


async def read_partition_from(bootstrap: str, first: int) -> list[rb.Record]:
    cluster = ClusterClient(bootstrap)
    records: list[rb.Record] = []
    try:
        await cluster.start()
        conn = await cluster.connection_for(TOPIC, 0)
        offset = first
        while True:
            req = msg.FetchRequest(TOPIC, 0, offset, 4 * 1024 * 1024, 0, msg.Isolation.COMMITTED)
            frame = await conn.request(Op.FETCH, req.encode())
            head, data = msg.FetchResponseHeader.decode(frame.body)
            for pos, header in rb.scan(data):
                records.extend(rb.decode(bytes(data[pos : pos + header.size])).records(offset))
                offset = header.next_offset
            if not data or offset >= head.high_watermark:
                break
    finally:
        await cluster.close()
    return records


def sweep(minio: MinioServer, topic: str, *flags: str) -> dict[str, object]:
    """``headrace tier sweep`` against the test's bucket, as an operator runs it."""
    done = run_headrace(
        "tier",
        "sweep",
        topic,
        "--store",
        f"s3://{minio.endpoint}/{BUCKET}",
        "--cluster",
        "t",
        "--grace-seconds",
        str(SWEEP_GRACE_S),
        "--json",
        *flags,
        env={
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": minio.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": minio.secret_key,
        },
    )
    assert done.returncode == 0, done.stderr.decode()
    return dict(json.loads(done.stdout))


SWEEP_GRACE_S = 2


def plant_orphans(store: MinioStore, live: Manifest, creation_id: str) -> list[str]:
    """One orphan of each kind, with the bytes such a writer leaves: returns their keys.
    The deleted topic's remains are of the legacy layout (a topic with no creation id)."""
    prefix = partition_prefix("t", TOPIC, 0, creation_id)
    first, second = live.segments[0], live.segments[1]
    planted: dict[str, bytes] = {}
    # a failed upload: objects put, the manifest put never came
    failed = run(10**6, [50, 50])
    planted[layout.segment_key(prefix, 10**6, 10**6 + 99)] = failed
    # a fenced upload: a deposed leader cut the stored range at other batch boundaries
    # and lost the conditional manifest write to the new leader
    planted[layout.segment_key(prefix, first.base, first.base + 9)] = run(first.base, [10])
    # a compaction's leftovers: the merged object of two listed ones, never swapped in
    merged = store.get(first.key) + store.get(second.key)
    planted[layout.segment_key(prefix, first.base, second.last)] = merged
    # a deleted topic's remains: the broker died after deleting the manifest
    gone = partition_prefix("t", "default/gone", 0)
    planted[layout.segment_key(gone, 0, 99)] = run(0, [100])
    planted[gone + "cursors.json"] = b'{"cursors": {"c": 100}, "epoch": 1}'
    for key, data in planted.items():
        store.put(key, data)
        if key.endswith(layout.SEGMENT_SUFFIX):
            store.put(layout.index_key_for(key), b"index of " + key.encode())
    return sorted([*planted, *(layout.index_key_for(k) for k in planted if k.endswith(".log"))])


async def test_the_sweep_removes_orphans_of_every_kind_and_nothing_else_under_load(
    broker: BrokerProcess, minio: MinioServer
) -> None:
    await create_topic(
        broker.bootstrap,
        TOPIC,
        1,
        {"local_retention_bytes": 64 * 1024, "upload_interval_ms": 200},
    )
    await produce(broker, 0, 3000)
    wait_for(lambda: manifest(minio, broker).checkpoint == 2999, 20, "first records uploaded")
    store = MinioStore(minio.settings(BUCKET))
    incarnation = creation_id_of(broker)
    planted = plant_orphans(store, manifest(minio, broker), incarnation)
    wait_for(
        lambda: all(
            time.time() * 1000 - (store.stat(k).modified_ms or 0) > SWEEP_GRACE_S * 1000
            for k in planted
        ),
        30,
        "planted objects older than the grace period",
    )

    def keys(topic: str) -> set[str]:
        creation_id = incarnation if topic == TOPIC else ""
        return {o.key for o in store.list(partition_prefix("t", topic, 0, creation_id))}

    before = keys(TOPIC) | keys("default/gone")
    dry = sweep(minio, TOPIC, "--creation-id", incarnation)
    assert dry["applied"] is False and dry["deleted"] == []
    assert keys(TOPIC) | keys("default/gone") >= before  # a dry run deletes nothing

    # the sweep runs while the broker uploads new records and a reader reads stored ones
    produced = 3000
    reads = 0

    async def load() -> None:
        nonlocal produced, reads
        while True:
            await produce(broker, produced, 300)
            produced += 300
            records = await read_partition(broker.bootstrap, TOPIC, 0)
            assert [r.offset for r in records] == list(range(len(records)))
            reads += 1

    loader = asyncio.create_task(load())
    try:
        applied = await asyncio.to_thread(
            sweep, minio, TOPIC, "--creation-id", incarnation, "--apply"
        )
        gone = await asyncio.to_thread(sweep, minio, "default/gone", "--apply")
    finally:
        loader.cancel()
        await asyncio.gather(loader, return_exceptions=True)
    assert reads >= 1
    deleted = sorted([*applied["deleted"], *gone["deleted"]])  # type: ignore[list-item]
    assert deleted == planted
    after = keys(TOPIC) | keys("default/gone")
    assert not after & set(planted)
    # nothing else went: every object there before is there still, but the orphans
    assert before - set(planted) <= after
    final = manifest(minio, broker)
    for seg in final.segments:
        assert store.exists(seg.key), seg.key
    print(
        f"objects before the sweep: {len(before)} ({len(planted)} planted orphans);"
        f" after: {len(after)} (uploads went on: {len(after - before)} new)"
    )
    # every acknowledged record gets uploaded; a produce the cancelled loader had in flight
    # may have stored some records past ``produced`` too
    wait_for(
        lambda: manifest(minio, broker).checkpoint >= produced - 1, 30, "the last records stored"
    )
    records = await read_partition(broker.bootstrap, TOPIC, 0)
    assert len(records) >= produced
    assert [r.offset for r in records] == list(range(len(records)))
