"""The manifest and sealed state: JSON, merge, fencing, covering, checkpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import InvalidRequest
from headrace.storage.bookkeeping import ProducerStateTable
from headrace.tiered import layout
from headrace.tiered.manifest import (
    FencedUploader,
    InvalidManifest,
    Manifest,
    SealedState,
    SegmentObject,
)

PREFIX = "c/ns/t/0/"


def seg(base: int, last: int, epoch: int = 1, size: int = 1000) -> SegmentObject:
    return SegmentObject(base, last, size, layout.segment_key(PREFIX, base, last), epoch)


def manifest(*segments: SegmentObject, epoch: int = 1, version: int = 1) -> Manifest:
    return Manifest(tuple(segments), epoch, version)


# --------------------------------------------------------------------------- JSON


def test_manifest_json_round_trips_with_camel_case_fields() -> None:
    m = manifest(seg(0, 99), seg(100, 199, epoch=2), seg(50, 149, epoch=2), epoch=2, version=7)
    doc = json.loads(m.to_json())
    assert doc["format"] == 1 and doc["version"] == 7 and doc["epoch"] == 2
    assert doc["segments"][0] == {
        "base": 0,
        "last": 99,
        "size": 1000,
        "key": PREFIX + "00000000000000000000-00000000000000000099.log",
        "epoch": 1,
    }
    assert Manifest.from_json(m.to_json()) == m
    assert Manifest.from_json(m.to_json().decode()) == m


def test_manifest_lists_segments_in_base_order_whatever_the_input_order() -> None:
    m = manifest(seg(200, 299), seg(0, 99), seg(100, 199))
    assert [s.base for s in m.segments] == [0, 100, 200]
    assert Manifest.from_json(m.to_json()).segments == m.segments


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    doc = json.loads(manifest(seg(0, 9)).to_json())
    doc["writtenBy"] = "a newer broker"
    doc["segments"][0]["checksum"] = "abc"
    assert Manifest.from_json(json.dumps(doc)) == manifest(seg(0, 9))


def good_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(manifest(seg(0, 9), seg(10, 19)).to_json())
    return doc


def edited(path: str, value: Any) -> str:
    """``good_doc()`` with one field (``a.b.1.c``) replaced, or removed if ``value`` is ...."""
    doc = good_doc()
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "expected a JSON object"),
        (edited("format", 2), "format"),
        (edited("format", ...), "format: missing"),
        (edited("version", -1), "version"),
        (edited("epoch", "3"), "epoch: expected an integer"),
        (edited("epoch", True), "epoch: expected an integer"),
        (edited("segments", {}), "segments: expected a list"),
        (edited("segments.1", 7), "segments[1].segment: expected a JSON object"),
        (edited("segments.1.last", ...), "segments[1].last: missing"),
        (edited("segments.1.last", 5), "segments[1].last"),
        (edited("segments.0.base", -3), "segments[0].base"),
        (edited("segments.0.base", 1.5), "segments[0].base: expected an integer"),
        (edited("segments.1.size", 3), "segments[1].size"),
        (edited("segments.1.key", "/bad//key"), "segments[1].key"),
        (edited("segments.1.key", None), "segments[1].key: expected a string"),
        (edited("segments.1.epoch", -1), "segments[1].epoch"),
        (edited("segments.1.key", good_doc()["segments"][0]["key"]), "same key is listed twice"),
    ],
)
def test_malformed_manifests_are_rejected_naming_the_field(raw: str, names: str) -> None:
    with pytest.raises(InvalidManifest) as info:
        Manifest.from_json(raw)
    assert names in info.value.message
    assert isinstance(info.value, InvalidRequest)  # the InvalidRequest family, not a crash


def test_sealed_state_round_trips_with_a_real_producer_snapshot() -> None:
    producers = ProducerStateTable()
    producers.record(producer_id=42, base_sequence=0, count=10, base_offset=12, now_ms=5)
    state = SealedState(
        last_committed_offset=21,
        broker=3,
        epoch=4,
        time_ms=1_768_625_254_000,
        moves=1,
        cursors={"billing": 14, "audit": 0},
        producers=producers.snapshot(),
        verified=True,
        message="sealed for unload",
    )
    doc = json.loads(state.to_json())
    assert doc["lastCommittedOffset"] == 21 and doc["timeMs"] == 1_768_625_254_000
    back = SealedState.from_json(state.to_json())
    assert back == state
    assert back.next_offset == 22
    restored = ProducerStateTable()
    restored.restore(back.producers)
    assert restored.snapshot() == producers.snapshot()


def test_an_empty_log_seals_at_minus_one() -> None:
    state = SealedState(-1, broker=0, epoch=0, time_ms=0, moves=0)
    assert SealedState.from_json(state.to_json()) == state
    assert state.next_offset == 0


def sealed_doc(**changes: Any) -> str:
    doc: dict[str, Any] = json.loads(SealedState(5, 1, 2, 3, 4, {"g": 1}).to_json())
    for name, value in changes.items():
        if value is ...:
            del doc[name]
        else:
            doc[name] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (sealed_doc(lastCommittedOffset=-2), "lastCommittedOffset"),
        (sealed_doc(lastCommittedOffset=...), "lastCommittedOffset: missing"),
        (sealed_doc(broker="b1"), "broker: expected an integer"),
        (sealed_doc(timeMs=-1), "timeMs"),
        (sealed_doc(moves=None), "moves"),
        (sealed_doc(cursors=[1]), "cursors: expected an object"),
        (sealed_doc(cursors={"g": -1}), "cursors.g"),
        (sealed_doc(cursors={"": 1}), "cursors: cohort name"),
        (sealed_doc(producers="x"), "producers: expected an object"),
        (sealed_doc(verified="yes"), "verified"),
        (sealed_doc(message=3), "message"),
        (sealed_doc(format=0), "format"),
        ("null", "expected a JSON object"),
    ],
)
def test_malformed_sealed_states_are_rejected_naming_the_field(raw: str, names: str) -> None:
    with pytest.raises(InvalidManifest) as info:
        SealedState.from_json(raw)
    assert names in info.value.message


# --------------------------------------------------------------------------- questions


def test_an_empty_manifest() -> None:
    m = Manifest()
    assert m.start_offset is None
    assert m.checkpoint == -1
    assert m.end_offset == -1
    assert m.covering(0) is None
    assert m.gaps() == ()
    assert m.epoch == -1 and m.version == 0


def test_checkpoint_is_the_end_of_the_contiguous_run_from_the_start() -> None:
    assert manifest(seg(0, 99), seg(100, 199)).checkpoint == 199
    assert manifest(seg(500, 599), seg(600, 699)).checkpoint == 699  # need not start at 0
    gapped = manifest(seg(0, 99), seg(150, 199), seg(200, 299))
    assert gapped.checkpoint == 99
    assert gapped.end_offset == 299
    assert gapped.gaps() == ((100, 149),)
    # an object inside another does not end the run early
    assert manifest(seg(0, 199), seg(50, 99), seg(200, 250)).checkpoint == 250


def test_covering_picks_the_holder_with_the_largest_base() -> None:
    a, b, c = seg(0, 99), seg(50, 149, epoch=2), seg(150, 199, epoch=2)
    m = manifest(a, b, c)
    assert m.covering(0) == a
    assert m.covering(49) == a
    assert m.covering(50) == b  # both hold it; b has the larger base
    assert m.covering(99) == b
    assert m.covering(149) == b
    assert m.covering(150) == c
    assert m.covering(200) is None
    assert m.covering(-1) is None


def test_covering_looks_past_a_nearer_object_that_ends_too_soon() -> None:
    wide, inner = seg(0, 199), seg(50, 99)
    m = manifest(wide, inner)
    assert m.covering(75) == inner
    assert m.covering(150) == wide  # inner has the larger base but does not hold 150


def test_covering_prefers_the_newest_epoch_among_equal_bases() -> None:
    old = seg(0, 99, epoch=1)
    new = SegmentObject(0, 99, 1000, PREFIX + "other-name.log", 2)
    m = manifest(old, new)
    assert m.covering(10) == new


def test_covering_in_a_gap_and_above_the_end_is_none() -> None:
    m = manifest(seg(0, 9), seg(20, 29))
    assert [m.covering(o) is None for o in (9, 10, 19, 20, 29, 30)] == [
        False,
        True,
        True,
        False,
        False,
        True,
    ]


# --------------------------------------------------------------------------- changes


def test_with_segment_adds_or_replaces_by_key() -> None:
    m = manifest(seg(0, 9))
    m2 = m.with_segment(seg(10, 19))
    assert [s.base for s in m2.segments] == [0, 10]
    assert (m2.epoch, m2.version) == (m.epoch, m.version)
    m3 = m2.with_segment(seg(10, 19, epoch=5))
    assert [s.epoch for s in m3.segments] == [1, 5]


def test_merged_is_the_union_by_key_at_the_higher_epoch_and_next_version() -> None:
    mine = manifest(seg(0, 9), seg(10, 19), epoch=3, version=4)
    theirs = manifest(seg(10, 19), seg(20, 29), epoch=2, version=9)
    m = mine.merged(theirs)
    assert [s.key for s in m.segments] == [seg(b, b + 9).key for b in (0, 10, 20)]
    assert (m.epoch, m.version) == (3, 10)


def test_merged_keeps_the_newer_epoch_entry_for_a_shared_key() -> None:
    old, new = seg(0, 9, epoch=1, size=500), seg(0, 9, epoch=2, size=600)
    assert manifest(new).merged(manifest(old)).segments == (new,)
    assert manifest(old).merged(manifest(new)).segments == (new,)
    tie = seg(0, 9, epoch=1, size=700)
    assert manifest(old).merged(manifest(tie)).segments == (tie,)  # other's wins a tie


def test_admitting_fences_a_deposed_leader() -> None:
    stored = manifest(seg(0, 9, epoch=5), epoch=5, version=3)
    with pytest.raises(FencedUploader, match="epoch 5"):
        stored.admitting(seg(10, 19, epoch=4), epoch=4)
    same = stored.admitting(seg(10, 19, epoch=5), epoch=5)
    assert same.checkpoint == 19 and same.epoch == 5 and same.version == 4
    newer = stored.admitting(seg(10, 19, epoch=6), epoch=6)
    assert newer.epoch == 6  # from now on the epoch-5 leader is fenced
    with pytest.raises(FencedUploader):
        newer.check_fence(5)


def test_a_deposed_leader_is_fenced_by_an_empty_manifest_never() -> None:
    assert Manifest().admitting(seg(0, 9, epoch=0), epoch=0).epoch == 0


def test_bad_values_are_refused_at_construction() -> None:
    with pytest.raises(InvalidManifest, match="last"):
        SegmentObject(10, 9, 100, PREFIX + "x.log", 1)
    with pytest.raises(InvalidManifest, match="size"):
        SegmentObject(0, 9, 0, PREFIX + "x.log", 1)
    with pytest.raises(InvalidManifest, match="key"):
        SegmentObject(0, 9, 100, "", 1)
    with pytest.raises(InvalidManifest, match="epoch"):
        Manifest((), -2, 0)


# --------------------------------------------------------------------------- properties


@st.composite
def upload_histories(draw: st.DrawFn) -> tuple[int, list[SegmentObject]]:
    """Contiguous ranges cut from one log, uploaded by successive leaders: a new
    leader may re-upload from an earlier point (overlap) with its own cut points."""
    start = draw(st.integers(0, 10**12))
    end = start + draw(st.integers(1, 400))
    uploads: list[SegmentObject] = []
    epoch = draw(st.integers(0, 3))
    pos = start
    while pos < end:
        if uploads and draw(st.integers(0, 5)) == 0:  # leader change: back up a little
            epoch += 1
            pos = max(start, pos - draw(st.integers(0, 30)))
        length = draw(st.integers(1, 60))
        last = min(end - 1, pos + length - 1)
        uploads.append(seg(pos, last, epoch))
        pos = last + 1
    return end - 1, uploads


@settings(max_examples=300, deadline=None)
@given(upload_histories(), st.randoms(use_true_random=False))
def test_covering_finds_a_holder_for_every_offset_whatever_the_upload_order(
    history: tuple[int, list[SegmentObject]], rnd: Any
) -> None:
    last, uploads = history
    rnd.shuffle(uploads)
    m = Manifest()
    for i, u in enumerate(uploads):
        m = m.merged(Manifest((u,), u.epoch, i))
    assert m.start_offset == min(u.base for u in uploads)
    assert m.checkpoint == last
    assert m.gaps() == ()
    for offset in range(m.start_offset, last + 1):
        found = m.covering(offset)
        assert found is not None and found.holds(offset)
        holders = [u for u in m.segments if u.holds(offset)]
        assert found.base == max(h.base for h in holders)
    assert m.covering(last + 1) is None
    assert m.covering(m.start_offset - 1) is None
    assert Manifest.from_json(m.to_json()) == m


ranges = st.tuples(st.integers(0, 300), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ranges, st.integers(0, 3)), max_size=12))
def test_covering_checkpoint_and_gaps_match_a_brute_force_reference(
    items: list[tuple[tuple[int, int], int]],
) -> None:
    segments = {seg(b, end, e).key: seg(b, end, e) for (b, end), e in items}
    m = Manifest(tuple(segments.values()))
    held = {o for s in m.segments for o in range(s.base, s.last + 1)}
    for offset in range(-1, 345):
        holders = [s for s in m.segments if s.holds(offset)]
        found = m.covering(offset)
        if not holders:
            assert found is None
        else:
            assert found is not None and found.holds(offset)
            assert found.base == max(h.base for h in holders)
    if held:
        run_end = min(held) - 1
        while run_end + 1 in held:
            run_end += 1
        assert m.checkpoint == run_end
        missing = [o for o in range(min(held), max(held) + 1) if o not in held]
        assert [o for a, b in m.gaps() for o in range(a, b + 1)] == missing
    else:
        assert m.checkpoint == -1 and m.gaps() == ()


def test_tiered_error_codes_are_their_own() -> None:
    from headrace import errors
    from headrace.objectstore.errors import ERROR_CLASSES
    from headrace.tiered.tier import ManifestConflict

    tiered = [InvalidManifest, FencedUploader, ManifestConflict]
    codes = [cls.CODE for cls in tiered]
    assert all("CODE" in vars(cls) for cls in tiered)
    assert len(set(codes)) == len(codes) and all(80 <= c <= 89 for c in codes)
    assert not set(codes) & set(errors.all_error_classes())
    assert not set(codes) & {cls.CODE for cls in ERROR_CLASSES}
    assert errors.CorruptSegmentObject.CODE == 34
    assert errors.error_for_code(34, "x").__class__ is errors.CorruptSegmentObject


def test_compacted_flag_round_trips_and_survives_a_leaders_merge() -> None:
    key = "c/ns/t/0/00000000000000000000-00000000000000000099.log"
    seg = SegmentObject(0, 99, 500, key, 3, compacted=True)
    doc = Manifest((seg,), 3, 1).to_doc()
    assert doc["segments"][0]["compacted"] is True
    stored = Manifest.from_json(Manifest((seg,), 3, 1).to_json())
    assert stored.segments[0].compacted
    # a leader's read-merge-put keeps it; uncompacted entries do not carry the field
    other = SegmentObject(
        100,
        199,
        500,
        layout.segment_key("c/ns/t/0/", 100, 199),
        3,
    )
    merged = stored.admitting(other, 3)
    assert merged.find(key) == seg
    assert "compacted" not in Manifest((other,), 3, 1).to_doc()["segments"][0]
    with pytest.raises(InvalidManifest):
        SegmentObject(0, 99, 500, key, 3, compacted="yes")  # type: ignore[arg-type]
