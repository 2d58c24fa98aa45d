"""Topic snapshots (pure): the cut of a manifest, the document, the pins, the sweep's verdict."""

from __future__ import annotations

import pytest

from headrace.tiered import layout, snapshots
from headrace.tiered.manifest import Manifest, SegmentObject
from headrace.tiered.orphans import StoredObject, Verdict, classify
from headrace.tiered.snapshots import (
    InvalidSnapshot,
    PartitionCut,
    Snapshot,
    SnapshotNotReady,
    cut_partition,
    pinned_keys,
    snapshot_key,
    topic_prefix_of,
)

CID = "5c0e9c1e-3b5a-4a8f-9b43-1f2a7d9e0c11"
PREFIX = layout.partition_prefix("c", "ns/t", 0, CID)


def seg(base: int, last: int, epoch: int = 1) -> SegmentObject:
    return SegmentObject(base, last, 100, layout.segment_key(PREFIX, base, last), epoch)


def snapshot(*parts: PartitionCut, name: str = "nightly") -> Snapshot:
    return Snapshot(name, "c", "ns/t", CID, 1_700_000_000_000, parts)


def test_a_cut_lists_the_chain_up_to_the_object_holding_the_cut() -> None:
    m = Manifest((seg(0, 9), seg(10, 19), seg(20, 29), seg(30, 39)), epoch=1, version=4)
    part = cut_partition(0, m, 24, {"billing": 12, "audit": 35})
    assert [s.key for s in part.objects] == [seg(0, 9).key, seg(10, 19).key, seg(20, 29).key]
    assert (part.start, part.cut) == (0, 24)
    # a cursor past the cut comes back to it: those records are not in the snapshot
    assert part.cursors == {"billing": 12, "audit": 25}


def test_a_cut_skips_overlapped_leftovers_and_starts_at_the_retained_start() -> None:
    m = Manifest(
        (seg(0, 9), seg(10, 19), seg(12, 15), seg(20, 29)),
        epoch=2,
        version=5,
        retained_from=5,
    )
    part = cut_partition(0, m, 29, {})
    assert part.start == 5
    assert [(s.base, s.last) for s in part.objects] == [(0, 9), (10, 19), (20, 29)]


def test_a_cut_past_the_stored_checkpoint_is_not_ready() -> None:
    m = Manifest((seg(0, 9),), epoch=1, version=1)
    with pytest.raises(SnapshotNotReady, match="holds up to offset 9"):
        cut_partition(0, m, 10, {})
    assert SnapshotNotReady.retriable


def test_an_empty_partition_cuts_to_no_objects() -> None:
    part = cut_partition(3, Manifest(), -1, {"billing": 0})
    assert (part.start, part.cut, part.objects) == (0, -1, ())
    assert part.cursors == {"billing": 0}


def test_the_document_round_trips_and_names_its_key() -> None:
    m = Manifest((seg(0, 9), seg(10, 19)), epoch=1, version=2)
    snap = snapshot(cut_partition(0, m, 19, {"billing": 7}), cut_partition(1, Manifest(), -1, {}))
    again = Snapshot.from_json(snap.to_json())
    assert again == snap
    assert snap.key == f"c/ns/t/{CID}/snapshots/nightly.json"
    assert snap.key == snapshot_key(topic_prefix_of(PREFIX), "nightly")
    assert (snap.objects, snap.size_bytes) == (2, 200)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "not valid JSON"),
        (b'{"format": 2}', "format"),
        (b'{"format": 1, "name": "n"}', "clusterId: missing"),
        (
            b'{"format":1,"name":"Bad_Name","clusterId":"c","topic":"ns/t","creationId":"x",'
            b'"timeMs":0,"partitions":[]}',
            "RFC 1123",
        ),
        (
            b'{"format":1,"name":"n","clusterId":"c","topic":"ns/t","creationId":"x",'
            b'"timeMs":0,"partitions":[{"partition":0,"start":0,"cut":5,"objects":[]}]}',
            "offsets but no objects",
        ),
    ],
)
def test_a_malformed_document_is_refused_naming_the_problem(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidSnapshot, match=message):
        Snapshot.from_json(raw)


def test_objects_must_chain_to_the_cut() -> None:
    with pytest.raises(InvalidSnapshot, match="does not hold offset 10"):
        PartitionCut(0, 0, 25, (seg(0, 9), seg(11, 29)))
    with pytest.raises(InvalidSnapshot, match="do not end at the cut"):
        PartitionCut(0, 0, 35, (seg(0, 9), seg(10, 29)))
    with pytest.raises(InvalidSnapshot, match="past the cut"):
        PartitionCut(0, 0, 9, (seg(0, 9),), {"billing": 11})


def test_pinned_keys_are_every_listed_object_and_its_index() -> None:
    m = Manifest((seg(0, 9), seg(10, 19)), epoch=1, version=2)
    first = snapshot(cut_partition(0, m, 9, {}), name="a")
    second = snapshot(cut_partition(0, m, 19, {}), name="b")
    assert pinned_keys([first, second]) == {
        seg(0, 9).key,
        layout.index_key_for(seg(0, 9).key),
        seg(10, 19).key,
        layout.index_key_for(seg(10, 19).key),
    }


def test_the_sweep_keeps_pinned_objects_that_no_manifest_lists() -> None:
    # retention trimmed 0..9 from the manifest; a snapshot still lists it
    old = seg(0, 9)
    m = Manifest((seg(10, 19),), epoch=1, version=3, retained_from=10)
    pinned = pinned_keys([snapshot(PartitionCut(0, 0, 9, (old,)))])
    objects = [
        StoredObject(old.key, 100, 0),
        StoredObject(layout.index_key_for(old.key), 10, 0),
        StoredObject(seg(10, 19).key, 100, 0),
        StoredObject(seg(20, 29).key, 100, 0),  # a real orphan
    ]
    found = classify(PREFIX, objects, m, 10**12, 1000, pinned)
    assert [o.key for o in found.orphans] == [seg(20, 29).key]
    assert found.counts[Verdict.PINNED] == 2
    # without the pin (today's sweep), the snapshot's object would be swept
    unpinned = classify(PREFIX, objects, m, 10**12, 1000)
    assert old.key in [o.key for o in unpinned.orphans]


def test_snapshot_error_codes_clash_with_no_other() -> None:
    from headrace.errors import HeadraceError
    from headrace.jobs.snapshot import RestoreRefused
    from headrace.tiered.snapshots import SnapshotExists

    def every(cls: type[HeadraceError]) -> list[type[HeadraceError]]:
        return [cls, *(s for sub in cls.__subclasses__() for s in every(sub))]

    codes: dict[int, str] = {}
    for cls in every(HeadraceError):
        code = cls.__dict__.get("CODE")
        if code is None:
            continue
        assert codes.setdefault(code, cls.__name__) == cls.__name__, (code, cls.__name__)
    for mine in (InvalidSnapshot, SnapshotNotReady, SnapshotExists, RestoreRefused):
        assert codes[mine.CODE] == mine.__name__


def test_the_cuts_are_the_highest_high_watermark_less_one() -> None:
    # any replica's high watermark is committed; a follower's may be behind
    assert snapshots.cuts_at([(0, 42), (1, 10), (0, 40), (1, 17), (2, 0)]) == {
        0: 41,
        1: 16,
        2: -1,
    }


def test_a_documents_key_names_its_topic_incarnation() -> None:
    key = snapshots.snapshot_key("prod/payments/orders/5c0e/", "nightly")
    assert snapshots.where_stored(key) == ("prod", "payments/orders", "5c0e", "nightly")
    legacy = snapshots.snapshot_key("prod/payments/orders/", "nightly")
    assert snapshots.where_stored(legacy) == ("prod", "payments/orders", "", "nightly")
    with pytest.raises(snapshots.InvalidSnapshot, match="not a snapshot document's key"):
        snapshots.where_stored("prod/payments/orders/5c0e/0/manifest.json")
