"""Orphans in the tier: which unlisted objects a sweep may delete."""

from __future__ import annotations

import pytest

from headrace.tiered import layout
from headrace.tiered.manifest import Manifest, SegmentObject
from headrace.tiered.orphans import StoredObject, Verdict, classify

PREFIX = "c/ns/t/0/"
NOW = 1_700_000_000_000
GRACE = 60_000
OLD = NOW - GRACE - 1


def listed(base: int, last: int) -> SegmentObject:
    return SegmentObject(base, last, 100, layout.segment_key(PREFIX, base, last), 1)


def obj(key: str, modified_ms: int | None = OLD) -> StoredObject:
    return StoredObject(key, 100, modified_ms)


def test_unlisted_old_segments_and_indexes_are_orphans_and_nothing_else_is() -> None:
    m = Manifest((listed(0, 9),), epoch=1, version=1)
    objects = [
        obj(layout.segment_key(PREFIX, 0, 9)),
        obj(layout.index_key(PREFIX, 0, 9)),
        obj(layout.segment_key(PREFIX, 10, 19)),  # a failed or fenced upload
        obj(layout.index_key(PREFIX, 10, 19)),
        obj(layout.segment_key(PREFIX, 20, 29), modified_ms=NOW - 10),  # an upload in flight
        obj(layout.segment_key(PREFIX, 30, 39), modified_ms=None),  # age unknown
        obj(layout.manifest_key(PREFIX)),
        obj(layout.sealed_key(PREFIX)),
        obj(PREFIX + "cursors.json"),
        obj(PREFIX + "compaction.lock"),
        obj(PREFIX + "notes-00000000000000000000.index"),
    ]
    found = classify(PREFIX, objects, m, NOW, GRACE)
    assert [o.key for o in found.orphans] == [
        layout.segment_key(PREFIX, 10, 19),
        layout.index_key(PREFIX, 10, 19),
    ]
    assert found.counts == {
        Verdict.LISTED: 2,
        Verdict.OTHER: 5,
        Verdict.PINNED: 0,
        Verdict.YOUNG: 2,
        Verdict.ORPHAN: 2,
    }


def test_without_a_manifest_the_cursors_copy_and_a_lock_are_remains_too() -> None:
    objects = [
        obj(layout.segment_key(PREFIX, 0, 9)),
        obj(PREFIX + "compaction.lock"),
        obj(PREFIX + "cursors.json"),
        obj(layout.sealed_key(PREFIX)),
    ]
    found = classify(PREFIX, objects, None, NOW, GRACE)
    assert not found.has_manifest
    assert [o.key for o in found.orphans] == [
        layout.segment_key(PREFIX, 0, 9),
        PREFIX + "compaction.lock",
        PREFIX + "cursors.json",
    ]
    assert found.counts[Verdict.OTHER] == 1  # the sealed state is never swept


def test_objects_outside_the_prefix_and_a_negative_grace_are_refused() -> None:
    with pytest.raises(ValueError, match="is not under"):
        classify(PREFIX, [obj("c/ns/t/1/x.log")], None, NOW, GRACE)
    with pytest.raises(ValueError, match="grace_ms"):
        classify(PREFIX, [], None, NOW, -1)
