"""A restore that dies after writing some or all of its manifests, run again, against a
real MinIO: it finishes with what an uninterrupted restore writes (the same objects, the
same manifests, the same offsets and cursors), without failing and without a duplicate;
a restore of another snapshot into that pending target is refused instead of mixing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from headrace.jobs.snapshot import (
    restore_snapshot,
    take_snapshot,
    verify_restore,
)
from headrace.jobs.topics import TopicRef
from headrace.objectstore import minio_store
from headrace.testing.minio import MinioServer
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest, SealedState
from headrace.tiered.snapshots import RestoreOfAnotherSnapshot, Snapshot
from headrace.tiered.tier import PartitionTier
from tests.integration.objectstore.servers import new_bucket
from tests.integration.tiered.batches import run

SOURCE = TopicRef("it", "default/orders", "3f1d7a52-0c1e-4b8e-9a55-1d2c3b4a5e6f")
CLEAN = TopicRef("it", "default/orders-clean", "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d")
RERUN = TopicRef("it", "default/orders-rerun", "9b2e6c10-7d4f-4e3a-8c21-0a1b2c3d4e5f")
PARTITIONS = 3
NOW_MS = 1_800_000_000_000


class Died(Exception):
    """The restore's process ends here (a kill, an evicted pod)."""


class DyingStore(minio_store.MinioStore):
    """A real MinioStore whose process "dies" right after its ``manifests``-th manifest
    is written (or right after the sealed state that follows it, ``after_sealed``)."""

    manifests: int | None = None
    after_sealed: bool = False
    _written = 0

    def arm(self, manifests: int | None, after_sealed: bool = False) -> None:
        self.manifests, self.after_sealed, self._written = manifests, after_sealed, 0

    def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        written = super().put_if_version(key, data, version)
        if written and key.endswith(layout.MANIFEST_NAME):
            self._written += 1
            if self._written == self.manifests and not self.after_sealed:
                raise Died(key)
        return written

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        sealed_after_the_last = key.endswith(layout.SEALED_NAME) and self._written == self.manifests
        if self.after_sealed and sealed_after_the_last:
            raise Died(key)


@pytest.fixture
def store(minio: MinioServer) -> Iterator[DyingStore]:
    s = DyingStore(minio.settings(new_bucket()))
    yield s
    s.close()


def snapshot_of_three_partitions(store: DyingStore) -> Snapshot:
    """Partitions of 3, 2 and 1 objects (batches of 5 and 7), cut inside the last object
    of the first two, with a cohort's cursors."""
    for partition in range(PARTITIONS):
        tier = PartitionTier(store, SOURCE.partition_prefix(partition))
        for n in range(PARTITIONS - partition):
            tier.upload(run(n * 12, [5, 7]), epoch=1)
        tier.close()
        cursors = {"cursors": {"billing": 3 + partition, "audit": 1}, "epoch": 1}
        store.put(SOURCE.partition_prefix(partition) + "cursors.json", json.dumps(cursors).encode())
    cuts = {0: 28, 1: 16, 2: 11}  # 28 and 16 end the first batch of an object
    return take_snapshot(store, SOURCE, "nightly", range(PARTITIONS), now_ms=NOW_MS, cuts=cuts)


def restored(store: DyingStore, target: TopicRef) -> dict[int, tuple[object, ...]]:
    """Per partition, what a restore left under ``target``, with its own prefix taken out:
    the manifest (objects' ranges and sizes, epoch, version, start), the sealed state's
    offset and cursors, and every other object's name and bytes."""
    out: dict[int, tuple[object, ...]] = {}
    for partition in range(PARTITIONS):
        prefix = target.partition_prefix(partition)
        manifest = Manifest.from_json(store.get(layout.manifest_key(prefix)))
        sealed = SealedState.from_json(store.get(layout.sealed_key(prefix)))
        documents = (layout.manifest_key(prefix), layout.sealed_key(prefix))
        objects = {
            info.key.removeprefix(prefix): store.get(info.key)
            for info in store.list(prefix)
            if info.key not in documents
        }
        out[partition] = (
            [(s.base, s.last, s.size, s.key.removeprefix(prefix)) for s in manifest.segments],
            (manifest.epoch, manifest.version, manifest.retained_from),
            (sealed.last_committed_offset, sealed.cursors, sealed.moves, sealed.verified),
            objects,
        )
    return out


@pytest.mark.parametrize(
    ("manifests", "after_sealed"),
    [(1, False), (2, True), (PARTITIONS, False), (PARTITIONS, True)],
    ids=["after-1-manifest", "after-2-sealed", "after-all-manifests", "after-all-sealed"],
)
def test_a_restore_that_died_after_writing_manifests_finishes_the_same_when_run_again(
    store: DyingStore, manifests: int, after_sealed: bool
) -> None:
    snap = snapshot_of_three_partitions(store)
    clean = restore_snapshot(store, snap, CLEAN, now_ms=NOW_MS)
    expected = restored(store, CLEAN)

    store.arm(manifests, after_sealed)
    with pytest.raises(Died):
        restore_snapshot(store, snap, RERUN, now_ms=NOW_MS)
    store.arm(None)
    again = restore_snapshot(store, snap, RERUN, now_ms=NOW_MS + 60_000)

    assert (again.next_offsets, again.objects, again.bytes) == (
        clean.next_offsets,
        clean.objects,
        clean.bytes,
    )
    assert again.next_offsets == {0: 29, 1: 17, 2: 12}
    assert restored(store, RERUN) == expected
    assert verify_restore(store, RERUN, range(PARTITIONS)) == []
    # a third run changes nothing either
    restore_snapshot(store, snap, RERUN, now_ms=NOW_MS + 120_000)
    assert restored(store, RERUN) == expected


def test_a_restore_of_another_snapshot_into_a_pending_target_is_refused_naming_both(
    store: DyingStore,
) -> None:
    snap = snapshot_of_three_partitions(store)
    later = take_snapshot(
        store, SOURCE, "hourly", range(PARTITIONS), now_ms=NOW_MS, cuts={0: 28, 1: 23, 2: 11}
    )
    # partition 0 is cut alike in both: its manifest from the first would pass for the second's
    clean = restore_snapshot(store, snap, CLEAN, now_ms=NOW_MS)
    expected = restored(store, CLEAN)
    store.arm(1)
    with pytest.raises(Died):
        restore_snapshot(store, snap, RERUN, now_ms=NOW_MS)
    store.arm(None)
    left = {info.key: store.get(info.key) for info in store.list(RERUN.prefix)}

    with pytest.raises(RestoreOfAnotherSnapshot) as refused:
        restore_snapshot(store, later, RERUN, now_ms=NOW_MS)
    assert (refused.value.holds, refused.value.asked) == (snap.key, later.key)
    assert "nightly" in refused.value.message and "hourly" in refused.value.message
    # it wrote nothing: the pending target is still the first restore's, which finishes
    assert {info.key: store.get(info.key) for info in store.list(RERUN.prefix)} == left
    again = restore_snapshot(store, snap, RERUN, now_ms=NOW_MS)
    assert again.next_offsets == clean.next_offsets
    assert restored(store, RERUN) == expected
