"""Retention in the tier: the manifest's retained start, and where retention moves it."""

from __future__ import annotations

import pytest

from headrace.tiered import layout
from headrace.tiered.manifest import FencedUploader, InvalidManifest, Manifest, SegmentObject
from headrace.tiered.retention import Bounds, retained_start

PREFIX = "c/ns/t/0/"
NOW = 1_700_000_000_000


def seg(base: int, last: int, age_ms: int = 0, size: int = 1000, epoch: int = 1) -> SegmentObject:
    key = layout.segment_key(PREFIX, base, last)
    return SegmentObject(base, last, size, key, epoch, max_timestamp=NOW - age_ms)


def test_trimming_drops_the_entries_below_the_start_and_moves_every_reader_question() -> None:
    m = Manifest((seg(0, 99), seg(100, 199), seg(200, 299)), epoch=3, version=7)
    t = m.trimmed(200, epoch=3)
    assert [s.base for s in t.segments] == [200]
    assert t.retained_from == 200 and t.start_offset == 200 and t.checkpoint == 299
    assert t.version == 8 and t.epoch == 3
    assert t.covering(150) is None and t.covering(250) == seg(200, 299)
    assert [s.base for s in m.removed_by(t)] == [0, 100]


def test_a_manifest_trimmed_empty_keeps_its_checkpoint_so_offsets_are_never_reused() -> None:
    t = Manifest((seg(0, 99),), epoch=1, version=1).trimmed(100, epoch=1)
    assert t.segments == () and t.start_offset is None
    assert t.checkpoint == 99  # a new leader uploads from 100, a recovery reopens at 100
    again = Manifest.from_json(t.to_json())
    assert again == t and again.checkpoint == 99


def test_an_overlapping_leftover_across_the_start_is_kept_but_not_read_below_it() -> None:
    m = Manifest((seg(0, 199), seg(100, 299, epoch=2)), epoch=2, version=1)
    t = m.trimmed(200, epoch=2)
    assert [s.base for s in t.segments] == [100]
    assert t.start_offset == 200 and t.covering(199) is None and t.covering(200) is not None


def test_a_deposed_leader_cannot_trim_and_no_one_trims_past_the_checkpoint() -> None:
    m = Manifest((seg(0, 99), seg(100, 199)), epoch=5, version=1)
    with pytest.raises(FencedUploader):
        m.trimmed(100, epoch=4)
    with pytest.raises(InvalidManifest, match="past the stored checkpoint"):
        m.trimmed(201, epoch=5)


def test_a_merge_never_brings_back_what_retention_removed() -> None:
    trimmed = Manifest((seg(0, 99), seg(100, 199)), epoch=1, version=1).trimmed(100, epoch=1)
    stale = Manifest((seg(0, 99), seg(200, 299)), epoch=1, version=1)
    merged = trimmed.merged(stale)
    assert [s.base for s in merged.segments] == [100, 200] and merged.retained_from == 100


def test_an_entry_below_the_retained_start_is_a_malformed_manifest() -> None:
    with pytest.raises(InvalidManifest, match="below retainedFrom"):
        Manifest((seg(0, 99),), epoch=1, version=1, retained_from=100)


def test_untrimmed_manifests_keep_their_json_and_old_documents_still_parse() -> None:
    doc = Manifest((seg(0, 99),), epoch=1, version=1).to_doc()
    assert "retainedFrom" not in doc
    del doc["segments"][0]["maxTimestamp"]  # written before ages were recorded
    assert Manifest.from_doc(doc).segments[0].max_timestamp == -1


def test_retention_by_age_removes_whole_objects_oldest_first() -> None:
    m = Manifest((seg(0, 99, age_ms=5000), seg(100, 199, age_ms=3000), seg(200, 299, age_ms=10)))
    assert retained_start(m, Bounds(retention_ms=2000), NOW) == 200
    assert retained_start(m, Bounds(retention_ms=6000), NOW) is None
    assert retained_start(m, Bounds(), NOW) is None


def test_an_object_of_unknown_age_stops_retention_by_age() -> None:
    unknown = SegmentObject(100, 199, 1000, layout.segment_key(PREFIX, 100, 199), 1)
    m = Manifest((seg(0, 99, age_ms=5000), unknown, seg(200, 299, age_ms=5000)))
    assert retained_start(m, Bounds(retention_ms=1000), NOW) == 100


def test_retention_by_size_counts_the_local_bytes_not_stored_yet() -> None:
    m = Manifest((seg(0, 99), seg(100, 199), seg(200, 299)))  # 1000 bytes each
    assert retained_start(m, Bounds(retention_bytes=3000), NOW) is None
    assert retained_start(m, Bounds(retention_bytes=3000), NOW, unstored_bytes=500) == 100
    assert retained_start(m, Bounds(retention_bytes=0), NOW) == 300  # everything stored


def test_retention_walks_the_chain_so_overlapped_leftovers_are_not_counted_twice() -> None:
    m = Manifest((seg(0, 199), seg(100, 149, epoch=0), seg(200, 299)))
    assert retained_start(m, Bounds(retention_bytes=1000), NOW) == 200
