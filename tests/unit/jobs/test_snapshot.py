"""Snapshots and restores over a DirectoryStore (no broker): taking one, the pins that
retention, compaction, the orphan sweep and topic deletion honour, and a restore that
reads the same records at the same offsets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headrace.errors import CorruptSegmentObject
from headrace.jobs import compact
from headrace.jobs.snapshot import (
    RESTORE_CLAIM_NAME,
    RestoreNotVerified,
    RestoreRefused,
    SnapshotNotFound,
    find_snapshot,
    restore_snapshot,
    restore_verified,
    take_once,
    take_snapshot,
    take_when_stored,
    verify_restore,
)
from headrace.jobs.sweep import sweep_topic
from headrace.jobs.topics import TopicRef
from headrace.objectstore.directory import DirectoryStore
from headrace.records import batch as rb
from headrace.tiered import layout, pins
from headrace.tiered.manifest import SealedState
from headrace.tiered.snapshots import (
    RestoreOfAnotherSnapshot,
    SnapshotExists,
    SnapshotNotReady,
    refuse_another_snapshot,
)
from headrace.tiered.tier import PartitionTier
from tests.unit.tiered.tiered_batches import run

NOW_MS = 1_800_000_000_000
SOURCE = TopicRef("c1", "default/orders", "3f1d7a52-0c1e-4b8e-9a55-1d2c3b4a5e6f")
TARGET = TopicRef("c1", "default/orders-restored", "9b2e6c10-7d4f-4e3a-8c21-0a1b2c3d4e5f")


def tier_with(store: DirectoryStore, ref: TopicRef, partition: int, objects: int) -> PartitionTier:
    """A partition with ``objects`` objects of 10 offsets each (two batches of 5)."""
    tier = PartitionTier(store, ref.partition_prefix(partition), prefetch_chunks=0)
    for n in range(objects):
        tier.upload(run(n * 10, [5, 5]), epoch=1)
    return tier


def records(tier: PartitionTier, start: int, end: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record a reader gets from ``start`` to ``end`` inclusive."""
    out: list[tuple[int, bytes]] = []
    offset = start
    while offset <= end:
        data = tier.read(offset, 1 << 20)
        for pos, h in rb.scan(data):
            for r in rb.decode(data[pos : pos + h.size]).records(h.base_offset):
                if offset <= r.offset <= end:
                    out.append((r.offset, r.value))
            offset = max(offset, h.next_offset)
    return out


def keys(store: DirectoryStore, prefix: str) -> set[str]:
    return {o.key for o in store.list(prefix)}


@pytest.fixture
def store(tmp_path: Path) -> DirectoryStore:
    return DirectoryStore(tmp_path / "objects")


def test_a_snapshot_is_written_once_and_lists_each_partition_up_to_its_cut(
    store: DirectoryStore,
) -> None:
    tier_with(store, SOURCE, 0, 3)
    tier_with(store, SOURCE, 1, 1)
    cursors = {"cursors": {"billing": 27}, "epoch": 1}
    store.put(SOURCE.partition_prefix(0) + "cursors.json", json.dumps(cursors).encode())
    snap = take_snapshot(store, SOURCE, "nightly", [0, 1, 2], now_ms=NOW_MS)
    assert [(p.partition, p.start, p.cut) for p in snap.partitions] == [
        (0, 0, 29),
        (1, 0, 9),
        (2, 0, -1),
    ]
    assert snap.partitions[0].cursors == {"billing": 27}
    assert pins.read_snapshot(store, SOURCE.prefix, "nightly") == snap
    with pytest.raises(SnapshotExists):
        take_snapshot(store, SOURCE, "nightly", [0], now_ms=NOW_MS)
    with pytest.raises(SnapshotNotReady):
        take_snapshot(store, SOURCE, "later", [0], now_ms=NOW_MS, cuts={0: 30})
    assert [s.name for s in pins.read_snapshots(store, SOURCE.prefix)] == ["nightly"]


def test_retention_in_the_tier_keeps_the_objects_a_snapshot_lists(store: DirectoryStore) -> None:
    tier = tier_with(store, SOURCE, 0, 4)
    take_snapshot(store, SOURCE, "keep", [0], now_ms=NOW_MS, cuts={0: 14})  # objects 0..9, 10..19
    removed = tier.trim(lambda _: 30, epoch=1)  # retention drops 0..9, 10..19, 20..29
    assert [(s.base, s.last) for s in removed] == [(0, 9), (10, 19), (20, 29)]
    deleted = tier.delete_unlisted(removed)
    assert deleted == [layout.segment_key(tier.prefix, 20, 29)]
    left = keys(store, tier.prefix)
    for base, last in ((0, 9), (10, 19)):
        assert layout.segment_key(tier.prefix, base, last) in left
        assert layout.index_key(tier.prefix, base, last) in left
    # deleting the snapshot releases them: the sweep then finds them orphaned
    pins.delete_snapshot(store, SOURCE.prefix, "keep")
    report = sweep_topic(store, SOURCE, now_ms=NOW_MS * 2, grace_ms=0, apply=True)
    assert set(report.deleted) == {
        name(tier.prefix, b, b + 9)
        for b in (0, 10)
        for name in (layout.segment_key, layout.index_key)
    }


def test_compaction_keeps_the_replaced_objects_a_snapshot_lists(store: DirectoryStore) -> None:
    tier = tier_with(store, SOURCE, 0, 3)
    take_snapshot(store, SOURCE, "keep", [0], now_ms=NOW_MS)
    result = compact.compact_partition(
        store, SOURCE, 0, compact.CompactSettings(grace_seconds=0), now_ms=NOW_MS
    )
    assert result.outcome == "compacted"
    [merged] = tier.manifest(refresh=True).segments
    assert (merged.base, merged.last) == (0, 29)
    old = [layout.segment_key(tier.prefix, b, b + 9) for b in (0, 10, 20)]
    assert set(old) <= keys(store, tier.prefix)
    assert result.pinned == old and result.deleted == []
    # the snapshot still reads as it was cut
    assert pins.read_snapshot(store, SOURCE.prefix, "keep").partitions[0].objects[0].key == old[0]


def test_the_sweep_keeps_what_a_snapshot_lists_and_deletes_the_rest(
    store: DirectoryStore,
) -> None:
    tier = tier_with(store, SOURCE, 0, 2)
    take_snapshot(store, SOURCE, "keep", [0], now_ms=NOW_MS)
    # retention that died during its grace period: unlisted, pinned
    tier.trim(lambda _: 20, epoch=1)
    store.put(layout.segment_key(tier.prefix, 40, 49), run(40, [10]))  # a failed upload
    report = sweep_topic(store, SOURCE, now_ms=NOW_MS * 2, grace_ms=0, apply=True)
    assert report.deleted == [layout.segment_key(tier.prefix, 40, 49)]
    assert report.to_doc()["objects"]["pinned"] == 4
    assert {layout.segment_key(tier.prefix, 0, 9), layout.segment_key(tier.prefix, 10, 19)} <= (
        keys(store, tier.prefix)
    )


def test_deleting_the_topic_keeps_what_a_snapshot_lists(store: DirectoryStore) -> None:
    tier = tier_with(store, SOURCE, 0, 2)
    take_snapshot(store, SOURCE, "keep", [0], now_ms=NOW_MS, cuts={0: 9})
    kept = pins.remove_partition(store, tier.prefix)
    assert sorted(kept) == sorted(
        [layout.segment_key(tier.prefix, 0, 9), layout.index_key(tier.prefix, 0, 9)]
    )
    assert keys(store, tier.prefix) == set(kept)
    assert store.exists(pins.read_snapshot(store, SOURCE.prefix, "keep").key)


def test_removing_a_deleted_incarnation_leaves_only_what_snapshots_keep(
    store: DirectoryStore,
) -> None:
    first, second = tier_with(store, SOURCE, 0, 2), tier_with(store, SOURCE, 1, 1)
    store.put(SOURCE.partition_prefix(1) + "cursors.json", b"{}")
    store.put(layout.sealed_key(SOURCE.partition_prefix(2)), b"{}")
    take_snapshot(store, SOURCE, "keep", [0], now_ms=NOW_MS, cuts={0: 9})
    other = tier_with(store, TARGET, 0, 1)  # another topic's objects are never touched
    pinned = [layout.segment_key(first.prefix, 0, 9), layout.index_key(first.prefix, 0, 9)]
    document = pins.read_snapshot(store, SOURCE.prefix, "keep").key
    assert pins.remove_incarnation(store, SOURCE.prefix) == sorted(pinned)
    assert keys(store, SOURCE.prefix) == {*pinned, document}
    assert keys(store, second.prefix) == set()
    assert keys(store, other.prefix) == {
        layout.manifest_key(other.prefix),
        layout.segment_key(other.prefix, 0, 9),
        layout.index_key(other.prefix, 0, 9),
    }
    # done already (a broker that died after its deletes runs it again): the same answer
    assert pins.remove_incarnation(store, SOURCE.prefix) == sorted(pinned)


def test_an_object_put_while_removing_stops_the_removal_from_counting_done(
    store: DirectoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = tier_with(store, SOURCE, 0, 1)
    late = layout.segment_key(tier.prefix, 10, 19)
    deleting = store.delete_many

    def with_a_late_upload(object_keys: object) -> None:
        deleting(object_keys)  # type: ignore[arg-type]
        store.put(late, run(10, [5, 5]))  # a leader that has not heard of the deletion

    monkeypatch.setattr(store, "delete_many", with_a_late_upload)
    with pytest.raises(pins.RemovalIncomplete, match="1 objects appeared"):
        pins.remove_incarnation(store, SOURCE.prefix)
    monkeypatch.undo()
    pins.remove_incarnation(store, SOURCE.prefix)
    assert keys(store, SOURCE.prefix) == set()


def test_a_restore_reads_the_same_records_at_the_same_offsets(store: DirectoryStore) -> None:
    source = tier_with(store, SOURCE, 0, 4)
    tier_with(store, SOURCE, 1, 1)
    cursors = {"cursors": {"billing": 17, "audit": 40}, "epoch": 1}
    store.put(SOURCE.partition_prefix(0) + "cursors.json", json.dumps(cursors).encode())
    source.trim(lambda _: 10, epoch=1)  # retention moved the start: the restore keeps it
    # a cut in the middle of the object 20..29 (after its first batch of 5)
    snap = take_snapshot(store, SOURCE, "s1", [0, 1, 2], now_ms=NOW_MS, cuts={0: 24, 1: 9, 2: -1})
    result = restore_snapshot(store, snap, TARGET, now_ms=NOW_MS)
    assert result.next_offsets == {0: 25, 1: 10, 2: 0}

    restored = PartitionTier(store, TARGET.partition_prefix(0), prefetch_chunks=0)
    manifest = restored.manifest(refresh=True)
    assert (manifest.start_offset, manifest.checkpoint) == (10, 24)
    assert manifest.epoch == -1  # any leader of the new topic may write it
    assert records(restored, 10, 24) == records(source, 10, 24)
    assert all(s.key.startswith(TARGET.prefix) for s in manifest.segments)
    sealed = SealedState.from_json(store.get(layout.sealed_key(TARGET.partition_prefix(0))))
    assert (sealed.next_offset, sealed.moves) == (25, 1)
    assert sealed.cursors == {"billing": 17, "audit": 25}
    empty = SealedState.from_json(store.get(layout.sealed_key(TARGET.partition_prefix(2))))
    assert empty.next_offset == 0

    # the restore's objects are its own: the source's retention and deletion never touch them
    pins.delete_snapshot(store, SOURCE.prefix, "s1")
    pins.remove_partition(store, SOURCE.partition_prefix(0))
    assert records(restored, 10, 24)[0][0] == 10
    # run again, the restore finds the manifests it wrote and changes nothing
    before = {o.key: store.get(o.key) for o in store.list(TARGET.prefix)}
    again = restore_snapshot(store, snap, TARGET, now_ms=NOW_MS + 1)
    assert (again.next_offsets, again.objects, again.bytes) == (
        result.next_offsets,
        result.objects,
        result.bytes,
    )
    assert {o.key: store.get(o.key) for o in store.list(TARGET.prefix)} == before
    # once a leader of the new topic has written its manifest, the target is not the
    # restore's any more: refused, and nothing is written
    restored.upload(run(25, [5]), epoch=1)
    with pytest.raises(RestoreRefused):
        restore_snapshot(store, snap, TARGET, now_ms=NOW_MS + 2)


def test_a_restore_checks_every_batch_and_copies_nothing_of_a_damaged_object(
    store: DirectoryStore,
) -> None:
    source = tier_with(store, SOURCE, 0, 2)
    snap = take_snapshot(store, SOURCE, "s1", [0], now_ms=NOW_MS)
    damaged = source.manifest(refresh=True).segments[1].key
    data = bytearray(store.get(damaged))
    data[-1] ^= 0xFF  # a flipped bit in the last record: its batch's CRC no longer matches
    store.put(damaged, bytes(data))
    with pytest.raises(CorruptSegmentObject, match=damaged):
        restore_snapshot(store, snap, TARGET, now_ms=NOW_MS)
    assert not store.exists(layout.manifest_key(TARGET.partition_prefix(0)))
    assert layout.segment_key(TARGET.partition_prefix(0), 10, 19) not in keys(store, TARGET.prefix)


def test_the_verify_jobs_checks_pass_on_a_restore_and_name_a_damaged_object(
    store: DirectoryStore,
) -> None:
    tier_with(store, SOURCE, 0, 3)
    snap = take_snapshot(store, SOURCE, "s1", [0, 1], now_ms=NOW_MS, cuts={0: 24, 1: -1})
    restore_snapshot(store, snap, TARGET, now_ms=NOW_MS)
    assert verify_restore(store, TARGET, [0, 1]) == []
    damaged = layout.segment_key(TARGET.partition_prefix(0), 10, 19)
    data = bytearray(store.get(damaged))
    data[-1] ^= 0xFF
    store.put(damaged, bytes(data))
    [problem] = verify_restore(store, TARGET, [0, 1])
    assert problem.startswith(f"partition 0: crc-mismatch at {damaged}")


def test_a_rerun_reports_the_snapshot_it_took_instead_of_a_second(store: DirectoryStore) -> None:
    # a Job's pod retried after it wrote the document: the same snapshot, never another
    tier = tier_with(store, SOURCE, 0, 2)
    first = take_once(store, SOURCE, "nightly", {0: 9}, now_ms=lambda: NOW_MS)
    tier.upload(run(20, [5, 5]), epoch=1)
    again = take_once(store, SOURCE, "nightly", {0: 29}, now_ms=lambda: NOW_MS + 1)
    assert again == first and again.partitions[0].cut == 9
    assert [o.key for o in store.list(SOURCE.prefix + "snapshots/")] == [first.key]


def test_taking_waits_for_the_uploaders_until_its_deadline(store: DirectoryStore) -> None:
    tier = tier_with(store, SOURCE, 0, 1)
    waits: list[float] = []

    def upload_round(seconds: float) -> None:
        waits.append(seconds)
        tier.upload(run(10 * len(waits), [5, 5]), epoch=1)

    snap = take_when_stored(store, SOURCE, "nightly", {0: 29}, wait=upload_round)
    assert snap.partitions[0].cut == 29 and len(waits) == 2
    with pytest.raises(SnapshotNotReady):
        take_when_stored(store, SOURCE, "later", {0: 99}, timeout_s=0, wait=lambda s: None)


def test_a_snapshot_is_found_by_name_in_its_namespace(store: DirectoryStore) -> None:
    tier_with(store, SOURCE, 0, 1)
    take_snapshot(store, SOURCE, "nightly", [0], now_ms=NOW_MS)
    assert find_snapshot(store, "c1", "default", "nightly") == SOURCE
    with pytest.raises(SnapshotNotFound, match="found none"):
        find_snapshot(store, "c1", "default", "weekly")
    with pytest.raises(SnapshotNotFound, match="found none"):
        find_snapshot(store, "c1", "other", "nightly")


def test_a_restore_that_fails_verification_says_so(store: DirectoryStore) -> None:
    tier_with(store, SOURCE, 0, 2)
    snap = take_snapshot(store, SOURCE, "nightly", [0], now_ms=NOW_MS)
    assert restore_verified(store, snap, TARGET, now_ms=NOW_MS).objects == 2
    # a second target whose sealed state the restore cannot cover: a stale one in the way
    other = TopicRef("c1", "default/orders-other", "0a1b2c3d-0000-4000-8000-000000000000")
    stale = SealedState(last_committed_offset=99, broker=0, epoch=1, time_ms=NOW_MS, moves=1)
    original_put = store.put

    def put_but_keep_stale_sealed(key: str, data: bytes) -> None:
        original_put(key, stale.to_json() if key.endswith("sealed.json") else data)

    store.put = put_but_keep_stale_sealed  # type: ignore[method-assign]
    with pytest.raises(RestoreNotVerified) as refused:
        restore_verified(store, snap, other, now_ms=NOW_MS)
    assert refused.value.problems and "partition 0" in refused.value.problems[0]


def test_a_target_held_for_one_snapshot_refuses_a_restore_of_another(
    store: DirectoryStore,
) -> None:
    tier = tier_with(store, SOURCE, 0, 2)
    first = take_snapshot(store, SOURCE, "nightly", [0], now_ms=NOW_MS)
    tier.upload(run(20, [5, 5]), epoch=1)
    second = take_snapshot(store, SOURCE, "hourly", [0], now_ms=NOW_MS)
    restore_snapshot(store, first, TARGET, now_ms=NOW_MS)
    claim = json.loads(store.get(TARGET.prefix + RESTORE_CLAIM_NAME))
    assert claim["snapshot"] == first.key

    with pytest.raises(RestoreOfAnotherSnapshot) as refused:
        restore_snapshot(store, second, TARGET, now_ms=NOW_MS)
    assert (refused.value.holds, refused.value.asked) == (first.key, second.key)
    assert "nightly of default/orders" in refused.value.message
    assert "hourly of default/orders" in refused.value.message
    # the same snapshot again is a rerun, not a mix
    assert restore_snapshot(store, first, TARGET, now_ms=NOW_MS).objects == 2


def test_a_restore_claim_names_the_snapshot_it_holds_for() -> None:
    refuse_another_snapshot("c1/default/copy/", "k1", "k1")  # the same: a rerun
    nightly = "c1/default/orders/3f1d/snapshots/nightly.json"
    hourly = "c1/default/orders/3f1d/snapshots/hourly.json"
    with pytest.raises(RestoreOfAnotherSnapshot, match="nightly of default/orders"):
        refuse_another_snapshot("c1/default/copy/", nightly, hourly)
