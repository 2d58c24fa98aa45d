"""A topic snapshot taken from a real broker under keyed load, against a real MinIO.

The broker uploads and runs retention in the tier as in production; the snapshot is
cut at the partitions' high watermarks taken at one moment, written, restored into a
new incarnation's prefix, and retention then runs past it on the source: the
snapshot's objects stay, and the restore reads the same records at the same offsets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.client.cluster import ClusterClient
from headrace.jobs.snapshot import check_objects, read_cursors, restore_snapshot, take_snapshot
from headrace.jobs.topics import TopicRef, read_manifest
from headrace.objectstore.minio_store import MinioStore
from headrace.protocol import messages as msg
from headrace.protocol.coordination import ClusterTopology, PartitionPlacement, TopicPlacement
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.testing.minio import MinioServer
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic
from headrace.tiered import layout
from headrace.tiered.manifest import SealedState
from headrace.tiered.snapshots import Snapshot, SnapshotNotReady
from headrace.tiered.tier import PartitionTier
from tests.integration.localcluster import until
from tests.integration.objectstore import servers

BUCKET = "snapshots"
TOPIC = "default/orders"
PARTITIONS = 2
RESTORED = TopicRef("t", "default/orders-restored", "7d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c4d")


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
            str(32 * 1024),
            "--retention-check-interval-ms",
            "200",
            "--tier-delete-grace-ms",
            "500",
        ],
        env={
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": minio.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": minio.secret_key,
        },
    )
    b.start()
    yield b
    b.stop()


def high_watermarks(b: BrokerProcess) -> dict[int, int]:
    doc = b.get_json(f"/v1/topics/{TOPIC}")
    return {int(p["partition"]): int(p["high_watermark"]) for p in doc["partition_details"]}  # type: ignore[index,union-attr]


def records(tier: PartitionTier, start: int, end: int) -> list[tuple[int, bytes | None, bytes]]:
    """(offset, key, value) of every record the tier holds from ``start`` to ``end``."""
    out: list[tuple[int, bytes | None, bytes]] = []
    offset = start
    while offset <= end:
        data = tier.read(offset, 1 << 20)
        for pos, h in rb.scan(data):
            for r in rb.decode(data[pos : pos + h.size]).records(h.base_offset):
                if offset <= r.offset <= end:
                    out.append((r.offset, r.key, r.value))
            offset = max(offset, h.next_offset)
    return out


async def keyed_load(b: BrokerProcess, stop: asyncio.Event) -> int:
    """Keyed records at a steady pace until ``stop``; returns how many were acknowledged."""
    sent = 0
    async with Producer(b.bootstrap, acks="leader", linger_ms=2) as producer:
        while not stop.is_set():
            for n in range(sent, sent + 50):
                await producer.send(TOPIC, b"v%07d" % n * 8, key=b"k%03d" % (n % 97))
            await producer.flush()
            sent += 50
            await asyncio.sleep(0.02)  # pacing the load, not synchronisation
    return sent


async def test_a_snapshot_under_keyed_load_survives_retention_and_restores_the_same_records(
    broker: BrokerProcess, minio: MinioServer, tmp_path: Path
) -> None:
    await create_topic(
        broker.bootstrap,
        TOPIC,
        PARTITIONS,
        {"retention_ms": 6000, "local_retention_bytes": 32 * 1024, "upload_interval_ms": 200},
    )
    store = MinioStore(minio.settings(BUCKET))
    source = TopicRef("t", TOPIC, str(broker.get_json(f"/v1/topics/{TOPIC}")["creation_id"]))
    stop = asyncio.Event()
    load = asyncio.create_task(keyed_load(broker, stop))
    try:
        await until(
            lambda: min(high_watermarks(broker).values()) > 2000, "load on every partition", 60
        )
        # a cohort consumes a while and acks: the uploader copies its cursors to the store
        acked: dict[int, int] = {}
        async with Consumer(broker.bootstrap, TOPIC, "billing", start="earliest") as consumer:
            deadline = time.monotonic() + 30
            while sum(acked.values()) < 500:
                assert time.monotonic() < deadline, f"the cohort got only {acked}"
                for batch in await consumer.getmany(timeout_s=0.5):
                    consumer.ack_batch(batch)
                    acked[batch.partition] = batch.offsets()[-1] + 1
        await until(
            lambda: all(
                read_cursors(store, source.partition_prefix(p)).get("billing") == at
                for p, at in acked.items()
            ),
            "the cohort's cursors in the store",
            30,
        )

        # the cut: every partition's high watermark at one moment; produce goes on
        cuts = {p: hw - 1 for p, hw in high_watermarks(broker).items()}
        snap: Snapshot | None = None
        deadline = time.monotonic() + 30
        while snap is None:
            try:
                snap = take_snapshot(
                    store, source, "under-load", range(PARTITIONS), now_ms=0, cuts=cuts
                )
            except SnapshotNotReady:
                assert time.monotonic() < deadline, "the uploader never stored the cut"
                await asyncio.sleep(0.2)  # the next upload round (a retry, not a wait on it)
        assert [p.cut for p in snap.partitions] == [cuts[p] for p in range(PARTITIONS)]
        assert {p.partition: p.cursors.get("billing") for p in snap.partitions} == {
            p: acked.get(p) for p in range(PARTITIONS)
        }
        taken = {
            p.partition: records(
                PartitionTier(store, source.partition_prefix(p.partition)), p.start, p.cut
            )
            for p in snap.partitions
        }
        for p in snap.partitions:
            assert [o for o, _, _ in taken[p.partition]] == list(range(p.start, p.cut + 1))
            assert all(key is not None for _, key, _ in taken[p.partition])

        restore = restore_snapshot(store, snap, RESTORED, now_ms=0)
        assert restore.next_offsets == {p: cuts[p] + 1 for p in range(PARTITIONS)}

        # retention runs past the snapshot on the source: every snapshot object leaves
        # the manifest
        def stored_start(partition: int) -> int:
            prefix = source.partition_prefix(partition)
            return read_manifest(store, layout.manifest_key(prefix)).start_offset or 0

        def past_snapshot() -> bool:
            return all(stored_start(p.partition) > p.objects[-1].last for p in snap.partitions)

        await until(past_snapshot, "retention trimming the snapshot's objects", 60)
        trimmed_to = {p.partition: stored_start(p.partition) for p in snap.partitions}
    finally:
        stop.set()
        await load

    # objects trimmed after the snapshot's are deleted (after the grace period): the
    # snapshot's, trimmed before them, had their turn and were kept
    def unpinned_trimmed_left() -> list[str]:
        pinned = snap.pinned()
        left = []
        for p, start in trimmed_to.items():
            for info in store.list(source.partition_prefix(p)):
                found = layout.parse_segment_key(info.key)
                if found is not None and found.last < start and info.key not in pinned:
                    left.append(info.key)
        return left

    await until(lambda: not unpinned_trimmed_left(), "retention's deletes", 30)
    assert check_objects(store, snap) == []

    # the restore holds the same records at the same offsets, and the cursors to resume at
    for p in snap.partitions:
        prefix = RESTORED.partition_prefix(p.partition)
        assert records(PartitionTier(store, prefix), p.start, p.cut) == taken[p.partition]
        sealed = SealedState.from_json(store.get(layout.sealed_key(prefix)))
        assert sealed.next_offset == p.cut + 1
        assert sealed.cursors.get("billing") == acked.get(p.partition)

    # a broker given the restored topic at incarnation 1 (as a controller would place it)
    # opens it from the restore: a consumer reads the same records at the same offsets,
    # and the cohort resumes at its cursors
    restored = BrokerProcess(
        tmp_path / "restored" / "data",
        mode="cluster",
        broker_id=0,
        extra_args=["--object-store", f"s3://{minio.endpoint}/{BUCKET}", "--cluster-id", "t"],
        env={
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": minio.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": minio.secret_key,
        },
    )
    restored.data_dir.parent.mkdir(parents=True)
    restored.start()
    try:
        placement = TopicPlacement(
            RESTORED.topic,
            PARTITIONS,
            1,
            1,
            {},
            [
                PartitionPlacement(p, [0], 0, 1, [0], moves=1, start_offset=None)
                for p in range(PARTITIONS)
            ],
            creation_id=RESTORED.creation_id,
        )
        endpoint = BrokerEndpoint(0, "127.0.0.1", restored.port, restored.admin_port)
        restored.post_json(
            "/v1/topology", ClusterTopology(1, "t", [endpoint], [placement]).to_json()
        )

        def reopened() -> bool:
            doc = restored.get_json(f"/v1/topics/{RESTORED.topic}")
            ends = {int(d["partition"]): int(d["high_watermark"]) for d in doc["partition_details"]}  # type: ignore[index,union-attr]
            return ends == {p: cuts[p] + 1 for p in range(PARTITIONS)}

        await until(reopened, "the restored topic reopened at its cuts", 30)
        for p in snap.partitions:
            fetched = await fetch_from(restored.bootstrap, RESTORED.topic, p.partition, p.start)
            assert [(r.offset, r.key, r.value) for r in fetched] == taken[p.partition]
        resumed: dict[int, int] = {}
        async with Consumer(restored.bootstrap, RESTORED.topic, "billing") as consumer:
            deadline = time.monotonic() + 30
            while not set(acked) <= set(resumed):
                assert time.monotonic() < deadline, f"the cohort resumed only {resumed}"
                for batch in await consumer.getmany(timeout_s=0.5):
                    resumed.setdefault(batch.partition, batch.offsets()[0])
        assert {p: resumed[p] for p in acked} == acked
    finally:
        restored.stop()


async def fetch_from(bootstrap: str, topic: str, partition: int, first: int) -> list[rb.Record]:
    """Every committed record of the partition from ``first``, fetched from its leader."""
    cluster = ClusterClient(bootstrap)
    out: list[rb.Record] = []
    try:
        await cluster.start()
        conn = await cluster.connection_for(topic, partition)
        offset = first
        while True:
            req = msg.FetchRequest(topic, partition, offset, 4 << 20, 0, msg.Isolation.COMMITTED)
            frame = await conn.request(Op.FETCH, req.encode())
            head, data = msg.FetchResponseHeader.decode(frame.body)
            for pos, header in rb.scan(data):
                out.extend(rb.decode(bytes(data[pos : pos + header.size])).records(offset))
                offset = header.next_offset
            if not data or offset >= head.high_watermark:
                return out
    finally:
        await cluster.close()
