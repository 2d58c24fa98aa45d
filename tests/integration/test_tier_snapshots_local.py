"""TopicSnapshot, TopicRestore and TopicSnapshotSchedule through ``headrace apply -f`` on
a local cluster with MinIO.

The snapshot is taken while a keyed producer runs; the restore creates a new topic
through the controller (held while the restore is written, then placed at incarnation 1):
a consumer of the new topic reads the same records at the same offsets, on every
replica's leader, and the cohort resumes at the cursors it had. ``headrace get`` shows
their statuses. A schedule run by the local controller, on a clock it runs faster than
real time, takes snapshots and keeps the newest ``keep``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.cli import controller_client
from headrace.client import Consumer, Producer
from headrace.control.documents import restored_topic
from headrace.control.model import RestoreStage
from headrace.jobs.snapshot import read_cursors, restore_snapshot
from headrace.jobs.topics import TopicRef
from headrace.testing.reading import read_partition
from headrace.tiered import pins
from tests.integration.localcluster import (
    LocalCluster,
    running_cluster,
    store_of,
    topic_manifest,
    until,
)
from tests.integration.test_unload import online
from tests.integration.tiered.test_restore_rerun import Died, DyingStore

NAME = "orders"
TOPIC = f"default/{NAME}"
RESTORED = "default/orders-restored"
PARTITIONS = 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "local", brokers=2, object_store="minio") as c:
        yield c


SNAPSHOT = """apiVersion: headrace.dev/v1alpha1
kind: TopicSnapshot
metadata: {name: s1}
spec:
  topicRef: {name: orders}
"""
RESTORE = """apiVersion: headrace.dev/v1alpha1
kind: TopicRestore
metadata: {name: copy}
spec:
  snapshotRef: {name: s1}
  topic: orders-restored
"""


def apply(c: LocalCluster, manifest: str) -> subprocess.CompletedProcess[bytes]:
    """``headrace apply -f`` against the local cluster's directory (its store and controller)."""
    path = c.dir / f"manifest-{time.monotonic_ns()}.yaml"
    path.write_text(manifest)
    return c.cli("apply", "-f", str(path), "--dir", str(c.dir))


async def keyed_load(c: LocalCluster, stop: asyncio.Event) -> None:
    sent = 0
    async with Producer(c.bootstrap, acks="all", linger_ms=2) as producer:
        while not stop.is_set():
            for n in range(sent, sent + 50):
                await producer.send(TOPIC, b"v%07d" % n, key=b"k%03d" % (n % 97))
            await producer.flush()
            sent += 50
            await asyncio.sleep(0.02)  # pacing the load, not synchronisation


async def test_snapshot_under_load_then_restore_into_a_new_topic(cluster: LocalCluster) -> None:
    manifest = topic_manifest(NAME, PARTITIONS, 2, 1, upload_interval_s=1, segment_bytes=32768)
    assert cluster.apply(manifest).returncode == 0
    await until(lambda: online(cluster, TOPIC, PARTITIONS), "topic online", 30)
    store = store_of(cluster)
    source = TopicRef("local", TOPIC, cluster.creation_id(TOPIC))
    stop = asyncio.Event()
    load = asyncio.create_task(keyed_load(cluster, stop))
    try:
        acked: dict[int, int] = {}
        async with Consumer(cluster.bootstrap, TOPIC, "billing", start="earliest") as consumer:
            deadline = time.monotonic() + 60
            while len(acked) < PARTITIONS or sum(acked.values()) < 600:
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
        # under load: the producer keeps going while the snapshot is cut and written
        taken = await asyncio.to_thread(apply, cluster, SNAPSHOT)
        assert b"topicsnapshot default/s1 taken" in taken.stdout
    finally:
        stop.set()
        await load
    snap = pins.read_snapshot(store, source.prefix, "s1")
    assert {p.partition: p.cursors.get("billing") for p in snap.partitions} == acked
    shown = get(cluster, "topicsnapshot", "s1")
    assert shown["status"]["phase"] == "Ready"
    assert ready_of(shown)["status"] == "True"
    assert (shown["status"]["key"], shown["status"]["objects"]) == (snap.key, snap.objects)
    assert shown["status"]["creationId"] == source.creation_id
    assert {p["partition"]: p["cut"] for p in shown["status"]["partitions"]} == {
        p.partition: p.cut for p in snap.partitions
    }

    done = await asyncio.to_thread(apply, cluster, RESTORE)
    assert b"topicrestore default/copy restored default/orders-restored" in done.stdout
    shown = get(cluster, "topicrestore", "copy")
    assert shown["status"]["phase"] == "Ready"
    assert ready_of(shown)["status"] == "True"
    verification = shown["status"]["verification"]
    assert verification["outcome"] == "Verified"
    assert store.exists(verification["reportKey"])
    assert shown["status"]["creationId"] == cluster.creation_id(RESTORED)
    table = cluster.cli("get", "topicrestores", "--dir", str(cluster.dir)).stdout.decode()
    assert table.split("\n")[0].split() == [
        "NAME",
        "SNAPSHOT",
        "TOPIC",
        "PHASE",
        "VERIFIED",
        "READY",
        "REASON",
        "AGE",
    ]
    assert table.split("\n")[1].split()[:6] == [
        "copy",
        "s1",
        "orders-restored",
        "Ready",
        "Verified",
        "True",
    ]
    again = await asyncio.to_thread(apply, cluster, SNAPSHOT + "---\n" + RESTORE)
    assert b"topicsnapshot default/s1 unchanged" in again.stdout
    assert b"topicrestore default/copy unchanged" in again.stdout
    assert cluster.creation_id(RESTORED) not in ("", source.creation_id)
    await until(lambda: online(cluster, RESTORED, PARTITIONS), "restored topic online", 30)

    for part in snap.partitions:
        original = [
            (r.offset, r.key, r.value)
            for r in await read_partition(cluster.bootstrap, TOPIC, part.partition)
            if r.offset <= part.cut
        ]
        assert [o for o, _, _ in original] == list(range(part.cut + 1))
        restored = [
            (r.offset, r.key, r.value)
            for r in await read_partition(cluster.bootstrap, RESTORED, part.partition)
        ]
        assert restored == original
    resumed: dict[int, int] = {}
    async with Consumer(cluster.bootstrap, RESTORED, "billing") as consumer:
        deadline = time.monotonic() + 30
        while not set(acked) <= set(resumed):
            assert time.monotonic() < deadline, f"the cohort resumed only {resumed}"
            for batch in await consumer.getmany(timeout_s=0.5):
                resumed.setdefault(batch.partition, batch.offsets()[0])
    assert {p: resumed[p] for p in acked} == acked

    # the same through the tier commands, after the load stopped: the cut is the log end
    directory = str(cluster.dir)
    out = (
        await asyncio.to_thread(cluster.cli, "tier", "snapshot", NAME, "s2", "--dir", directory)
    ).stdout
    assert b"snapshot s2 of default/orders" in out
    second = pins.read_snapshot(store, source.prefix, "s2")
    out = (
        await asyncio.to_thread(
            cluster.cli, "tier", "restore", NAME, "s2", "--to", "second", "--dir", directory
        )
    ).stdout
    assert b"restored default/second" in out
    for part in second.partitions:
        records = await read_partition(cluster.bootstrap, "default/second", part.partition)
        assert [r.offset for r in records] == list(range(part.cut + 1))

    # deleting the snapshot releases its objects (nothing else changes)
    deleted = await asyncio.to_thread(apply_delete, cluster, SNAPSHOT)
    assert b"topicsnapshot default/s1 deleted" in deleted.stdout
    assert [s.name for s in pins.read_snapshots(store, source.prefix)] == ["s2"]


def get(c: LocalCluster, kind: str, name: str) -> dict[str, Any]:
    """``headrace get KIND NAME -o json``: the resource as local mode keeps it."""
    out = c.cli("get", kind, name, "-o", "json", "--dir", str(c.dir)).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def ready_of(doc: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in doc["status"]["conditions"] if c["type"] == "Ready")


def apply_delete(c: LocalCluster, manifest: str) -> subprocess.CompletedProcess[bytes]:
    path = c.dir / f"manifest-{time.monotonic_ns()}.yaml"
    path.write_text(manifest)
    return c.cli("delete", "-f", str(path), "--dir", str(c.dir))


COPY = """apiVersion: headrace.dev/v1alpha1
kind: TopicRestore
metadata: {name: again}
spec:
  snapshotRef: {name: s1}
  topic: copy
"""


async def test_a_restore_that_died_after_writing_a_manifest_is_finished_by_applying_it_again(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path / "local", brokers=1, object_store="minio") as c:
        manifest = topic_manifest(NAME, PARTITIONS, 1, 1, upload_interval_s=1)
        assert c.apply(manifest).returncode == 0
        await until(lambda: online(c, TOPIC, PARTITIONS), "topic online", 30)
        async with Producer(c.bootstrap, acks="all") as producer:
            for n in range(300):
                await producer.send(TOPIC, b"v%05d" % n, key=b"k%03d" % (n % 31))
        await asyncio.to_thread(c.cli, "tier", "snapshot", NAME, "s1", "--dir", str(c.dir))
        source = TopicRef("local", TOPIC, c.creation_id(TOPIC))
        snap = pins.read_snapshot(store_of(c), source.prefix, "s1")
        assert sum(p.cut + 1 for p in snap.partitions) == 300

        # the first run: the Topic applied pending, then the process dies once the first
        # partition's manifest is written (before its sealed state, before the release)
        def applied(name: str) -> dict[str, Any]:
            topics = controller_client.request_json("GET", f"{c.controller_url}/v1/topics")
            return next(t for t in topics["topics"] if t["metadata"]["name"] == name)  # type: ignore[no-any-return]

        spec = applied(NAME)["spec"]
        pending = restored_topic(
            "default", "copy", spec, PARTITIONS, RestoreStage.PENDING, snap.key
        )
        assert c.apply(json.dumps(pending)).returncode == 0
        uid = applied("copy")["metadata"]["uid"]
        settings = store_of(c).settings
        dying = DyingStore(settings)
        dying.arm(manifests=1)
        with pytest.raises(Died):
            restore_snapshot(dying, snap, TopicRef("local", "default/copy", uid), now_ms=1)
        dying.close()

        done = await asyncio.to_thread(apply, c, COPY)
        assert b"default/copy is pending, finishing its restore" in done.stdout
        assert b"verified the restore with Spark" in done.stdout
        assert b"topicrestore default/again restored default/copy" in done.stdout
        await until(lambda: online(c, "default/copy", PARTITIONS), "restored topic online", 30)
        assert c.creation_id("default/copy") == uid
        for part in snap.partitions:
            original = [
                (r.offset, r.key, r.value)
                for r in await read_partition(c.bootstrap, TOPIC, part.partition)
            ]
            copied = [
                (r.offset, r.key, r.value)
                for r in await read_partition(c.bootstrap, "default/copy", part.partition)
            ]
            assert copied == original and len(copied) == part.cut + 1
        again = await asyncio.to_thread(apply, c, COPY)
        assert b"topicrestore default/again unchanged" in again.stdout


#: schedule minutes per real second in the schedule test: a minutely schedule fires
#: about every 2 s instead of every 60 s
SCHEDULE_CLOCK_RATE = 30
SCHEDULE = """apiVersion: headrace.dev/v1alpha1
kind: TopicSnapshotSchedule
metadata: {name: minutely}
spec:
  topicRef: {name: orders}
  schedule: "* * * * *"
  keep: 1
"""


async def test_a_schedule_takes_snapshots_on_its_cron_and_keeps_the_newest(
    tmp_path: Path,
) -> None:
    up = ("--schedule-clock-rate", str(SCHEDULE_CLOCK_RATE))
    with running_cluster(tmp_path / "local", *up, brokers=1, object_store="minio") as c:
        manifest = topic_manifest(NAME, 1, 1, 1, upload_interval_s=1)
        assert c.apply(manifest).returncode == 0
        await until(lambda: online(c, TOPIC, 1), "topic online", 30)
        async with Producer(c.bootstrap, acks="all") as producer:
            for n in range(50):
                await producer.send(TOPIC, b"v%05d" % n)
        applied = await asyncio.to_thread(apply, c, SCHEDULE)
        assert b"topicsnapshotschedule default/minutely applied" in applied.stdout
        store = store_of(c)
        source = TopicRef("local", TOPIC, c.creation_id(TOPIC))

        def taken() -> list[str]:
            return sorted(s.name for s in pins.read_snapshots(store, source.prefix))

        def schedule_status() -> dict[str, Any]:
            return get(c, "topicsnapshotschedule", "minutely").get("status") or {}

        seen: set[str] = set()

        def two_taken() -> bool:
            seen.update(taken())
            return len(seen) >= 2

        # each snapshot is a `headrace apply` process: slow on a loaded machine
        await until(two_taken, "two snapshots taken", 120)
        # suspended, it takes no more: what it has settles to the newest one kept
        suspended = SCHEDULE.replace("keep: 1", "keep: 1\n  suspend: true")
        assert b"minutely configured" in (await asyncio.to_thread(apply, c, suspended)).stdout

        def one_kept() -> bool:
            seen.update(taken())
            kept = [k["name"] for k in schedule_status().get("kept", [])]
            out = c.cli("get", "topicsnapshots", "-o", "json", "--dir", str(c.dir)).stdout
            resources = sorted(d["metadata"]["name"] for d in json.loads(out)["items"])
            # none pending, none being deleted: the store and the resources agree
            return len(kept) == 1 and taken() == kept == resources

        await until(one_kept, "the newest snapshot kept, the older ones deleted", 120)
        status = schedule_status()
        kept = [k["name"] for k in status["kept"]]
        assert all(name.startswith("minutely-") for name in seen)
        # the ones deleted are the older ones
        assert all(old < min(kept) for old in seen - set(kept))
        assert status["lastScheduleTime"]
        assert ready_of({"status": status})["reason"] == "Suspended"
        for name in kept:
            snapshot = get(c, "topicsnapshot", name)
            assert snapshot["status"]["phase"] == "Ready"
            assert snapshot["metadata"]["labels"] == {
                "headrace.dev/topic-snapshot-schedule": "minutely"
            }
