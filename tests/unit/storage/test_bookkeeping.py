"""Log bookkeeping decisions: index, rolling, retention, idempotent producers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.storage import bookkeeping as bk

SETTINGS = settings(max_examples=150, deadline=None)


# --------------------------------------------------------------------------- file names


def test_segment_file_names_round_trip() -> None:
    assert bk.segment_file_name(42) == "00000000000000000042.log"
    assert bk.index_file_name(42) == "00000000000000000042.index"
    assert bk.parse_segment_file_name(bk.segment_file_name(2**63)) == 2**63
    for bad in ["42.log", "0000000000000000004x.log", "00000000000000000042.index", "x"]:
        assert bk.parse_segment_file_name(bad) is None


# --------------------------------------------------------------------------- sparse index


def build_index(
    base: int, counts: list[int], sizes: list[int], interval: int
) -> tuple[bk.SparseIndex, list[tuple[int, int, int]]]:
    """Index a run of batches; return it and the (base offset, position, size) of each."""
    index = bk.SparseIndex(base, interval)
    batches = []
    offset, position = base, 0
    for count, size in zip(counts, sizes, strict=True):
        index.on_append(offset, position, size)
        batches.append((offset, position, size))
        offset += count
        position += size
    return index, batches


@st.composite
def batch_runs(draw: st.DrawFn) -> tuple[int, list[int], list[int], int]:
    n = draw(st.integers(1, 40))
    counts = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(60, 500), min_size=n, max_size=n))
    return draw(st.integers(0, 10**6)), counts, sizes, draw(st.integers(1, 2000))


@SETTINGS
@given(batch_runs(), st.data())
def test_lookup_is_a_floor_within_one_interval(
    run: tuple[int, list[int], list[int], int], data: st.DataObject
) -> None:
    base, counts, sizes, interval = run
    index, batches = build_index(base, counts, sizes, interval)
    end = batches[-1][0] + counts[-1]
    offset = data.draw(st.integers(base - 5, end + 5), label="offset")
    holding = [b for b in batches if b[0] <= offset]
    target = holding[-1][1] if holding else 0
    start = index.lookup(offset)
    positions = [b[1] for b in batches]
    assert start in positions, "lookups land on batch boundaries"
    assert start <= target, "never past the batch that holds the offset"
    # at most one interval of whole batches (plus the batch that crossed it) to scan
    skipped = sum(size for _, pos, size in batches if start <= pos < target)
    assert skipped < interval + max(sizes)


def test_lookup_fixed_vector() -> None:
    index, _ = build_index(100, [1] * 6, [100] * 6, 150)
    # the first batch past position 0 is always indexed, then one per 150 bytes
    assert list(index.offsets) == [1, 3, 5]
    assert list(index.positions) == [100, 300, 500]
    lookups = [index.lookup(o) for o in (99, 100, 101, 102, 103, 104, 105, 999)]
    assert lookups == [0, 0, 100, 100, 300, 300, 500, 500]


def test_first_batch_at_a_nonzero_position_is_indexed() -> None:
    index = bk.SparseIndex(10, 10_000)
    index.on_append(10, 64, 100)
    assert list(index.positions) == [64]
    assert index.lookup(10) == 64


@SETTINGS
@given(batch_runs(), st.data())
def test_truncate_after_drops_entries_at_or_beyond_the_cut(
    run: tuple[int, list[int], list[int], int], data: st.DataObject
) -> None:
    base, counts, sizes, interval = run
    index, batches = build_index(base, counts, sizes, interval)
    before = list(zip(index.offsets, index.positions, strict=True))
    cut = data.draw(st.sampled_from([b[1] for b in batches] + [batches[-1][1] + sizes[-1]]))
    index.truncate_after(cut)
    assert list(zip(index.offsets, index.positions, strict=True)) == [
        e for e in before if e[1] < cut
    ]
    assert all(index.lookup(o) < cut or index.lookup(o) == 0 for o in range(base, base + 200))


def test_persist_and_load_round_trip() -> None:
    index, _ = build_index(0, [1] * 50, [100] * 50, 300)
    raw, count = index.unpersisted()
    assert count == len(index) > 5
    index.mark_persisted(count)
    assert index.unpersisted() == (b"", count)
    loaded = bk.SparseIndex(0, 300)
    loaded.load(raw, 5000)
    assert list(loaded.offsets) == list(index.offsets)
    assert list(loaded.positions) == list(index.positions)
    assert loaded.persisted_entries == count


def test_unpersisted_captures_only_the_new_tail() -> None:
    index, _ = build_index(0, [1] * 10, [100] * 10, 200)
    first, count = index.unpersisted()
    index.mark_persisted(count)
    index.on_append(10, 1000, 100)
    index.on_append(11, 1100, 100)
    index.on_append(12, 1200, 100)
    tail, total = index.unpersisted()
    assert total > count
    assert len(tail) == (total - count) * bk.INDEX_ENTRY.size
    loaded = bk.SparseIndex(0, 200)
    loaded.load(first + tail, 10_000)
    assert list(loaded.positions) == list(index.positions)


@pytest.mark.parametrize("half", ["offsets", "positions"])
def test_unpersisted_skips_an_entry_appended_halfway(half: str) -> None:
    """The loop appends an entry's two halves without the lock while the fsync thread
    reads them (``write_checkpoint``): a thread switch between the two appends leaves
    one array an entry longer. Only whole entries are persisted; the half one later."""
    index, _ = build_index(0, [1] * 10, [100] * 10, 200)
    whole = len(index)
    getattr(index, half).append(5000)  # the other half not yet appended
    raw, count = index.unpersisted()
    assert count == whole
    assert len(raw) == whole * bk.INDEX_ENTRY.size
    index.mark_persisted(count)
    assert index.persisted_entries == whole


def test_truncate_lowers_the_persisted_mark() -> None:
    index, _ = build_index(0, [1] * 10, [100] * 10, 200)
    _, count = index.unpersisted()
    index.mark_persisted(count)
    index.truncate_after(500)
    assert index.persisted_entries == len(index) == 2


@pytest.mark.parametrize(
    ("entries", "tail", "segment_size", "kept"),
    [
        ([(1, 100), (2, 200), (3, 300)], b"", 1000, 3),
        ([(1, 100), (2, 200), (3, 300)], b"\x01\x02\x03", 1000, 3),  # torn last entry
        ([(1, 100), (2, 200), (1, 300)], b"", 1000, 2),  # offset goes back
        ([(1, 100), (2, 100), (3, 300)], b"", 1000, 1),  # position does not advance
        ([(1, 100), (2, 200), (3, 300)], b"", 250, 2),  # past the end of the segment
        ([(0, 0), (5, 64)], b"", 1000, 2),
    ],
)
def test_load_keeps_the_valid_increasing_prefix(
    entries: list[tuple[int, int]], tail: bytes, segment_size: int, kept: int
) -> None:
    raw = b"".join(bk.INDEX_ENTRY.pack(o, p) for o, p in entries) + tail
    index = bk.SparseIndex(0, 100)
    index.load(raw, segment_size)
    assert list(zip(index.offsets, index.positions, strict=True)) == entries[:kept]


@SETTINGS
@given(st.binary(max_size=200), st.integers(0, 2**32))
def test_load_of_garbage_gives_a_sane_prefix(raw: bytes, segment_size: int) -> None:
    index = bk.SparseIndex(0, 100)
    index.load(raw, segment_size)
    entries = list(zip(index.offsets, index.positions, strict=True))
    usable = len(raw) - len(raw) % bk.INDEX_ENTRY.size
    assert entries == list(bk.INDEX_ENTRY.iter_unpack(raw[:usable]))[: len(entries)]
    assert all(p < segment_size for _, p in entries)
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(entries))


# --------------------------------------------------------------------------- rolling

CONFIG = bk.LogConfig(segment_bytes=1000, segment_ms=60_000)


def stats(size: int, created_ms: int = 0) -> bk.SegmentStats:
    return bk.SegmentStats(0, 10, size, created_ms)


@pytest.mark.parametrize(
    ("size", "incoming", "now", "roll"),
    [
        (0, 10_000, 10**9, False),  # an empty segment never rolls, however old or big the batch
        (500, 500, 0, False),  # exactly full is not over
        (500, 501, 0, True),
        (999, 1, 59_999, False),
        (1, 1, 60_000, True),  # age
        (1, 1, 59_999, False),
    ],
)
def test_should_roll(size: int, incoming: int, now: int, roll: bool) -> None:
    assert bk.should_roll(stats(size), incoming, now, CONFIG) is roll


def test_age_is_counted_from_creation() -> None:
    assert not bk.should_roll(stats(10, created_ms=50_000), 1, 100_000, CONFIG)
    assert bk.should_roll(stats(10, created_ms=50_000), 1, 110_000, CONFIG)


def test_segment_never_reaches_four_gib() -> None:
    huge = bk.LogConfig(segment_bytes=2**40)
    assert not bk.should_roll(stats(2**32 - 100), 50, 0, huge)
    assert bk.should_roll(stats(2**32 - 100), 100, 0, huge)


# --------------------------------------------------------------------------- retention


def segs(*spec: tuple[int, int, int]) -> list[bk.SegmentStats]:
    """(base, size, max_timestamp) per segment; next_offset is the next segment's base."""
    out = []
    for i, (base, size, ts) in enumerate(spec):
        nxt = spec[i + 1][0] if i + 1 < len(spec) else base + 10
        out.append(bk.SegmentStats(base, nxt, size, 0, ts))
    return out


LOG = segs((0, 100, 1_000), (10, 100, 2_000), (20, 100, 3_000), (30, 100, 4_000))


@pytest.mark.parametrize(
    ("retention_bytes", "retention_ms", "now", "floor", "doomed"),
    [
        (-1, -1, 10**9, None, []),  # keep forever
        (250, -1, 0, None, [0, 10]),  # down to 200 <= 250
        (0, -1, 0, None, [0, 10, 20]),  # never the active segment
        (-1, 1_500, 4_000, None, [0, 10]),  # 2_000 is 2_000 ms old > 1_500
        (-1, 2_000, 4_000, None, [0]),  # exactly the retention is kept
        (0, -1, 0, 20, [0, 10]),  # not uploaded yet: stays
        (0, -1, 0, 19, [0]),
        (0, -1, 0, 0, []),
        (250, 1_500, 3_500, None, [0, 10]),  # either reason suffices
    ],
)
def test_segments_to_delete(
    retention_bytes: int, retention_ms: int, now: int, floor: int | None, doomed: list[int]
) -> None:
    config = bk.LogConfig(retention_bytes=retention_bytes, retention_ms=retention_ms)
    assert bk.segments_to_delete(LOG, now, config, upload_floor=floor) == doomed


def test_age_retention_deletes_a_prefix_only() -> None:
    log = segs((0, 100, 5_000), (10, 100, 1_000), (20, 100, 1_000))
    config = bk.LogConfig(retention_ms=1_000)
    assert bk.segments_to_delete(log, 5_500, config) == []


def test_unknown_timestamp_is_never_too_old() -> None:
    log = segs((0, 100, -1), (10, 100, 1))
    assert bk.segments_to_delete(log, 10**12, bk.LogConfig(retention_ms=1)) == []


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(1, 500), st.integers(-1, 10_000)), min_size=1, max_size=8),
    st.integers(-1, 2_000),
    st.integers(-1, 5_000),
    st.none() | st.integers(0, 100),
)
def test_retention_properties(
    spec: list[tuple[int, int]], retention_bytes: int, retention_ms: int, floor: int | None
) -> None:
    log = segs(*[(i * 10, size, ts) for i, (size, ts) in enumerate(spec)])
    config = bk.LogConfig(retention_bytes=retention_bytes, retention_ms=retention_ms)
    doomed = bk.segments_to_delete(log, 10_000, config, upload_floor=floor)
    assert doomed == [s.base_offset for s in log[: len(doomed)]], "a prefix"
    assert len(doomed) < len(log), "never the active segment"
    if floor is not None:
        assert all(s.next_offset <= floor for s in log[: len(doomed)])
    # maximal: the next segment is not deletable for any reason
    if len(doomed) < len(log) - 1:
        nxt = log[len(doomed)]
        remaining = sum(s.size for s in log[len(doomed) :])
        blocked = floor is not None and nxt.next_offset > floor
        over = retention_bytes >= 0 and remaining > retention_bytes
        old = (
            retention_ms >= 0
            and nxt.max_timestamp >= 0
            and 10_000 - nxt.max_timestamp > retention_ms
        )
        assert blocked or not (over or old)


# --------------------------------------------------------------------------- producer state

APPEND, DUP, OOO = (
    bk.SequenceVerdict.APPEND,
    bk.SequenceVerdict.DUPLICATE,
    bk.SequenceVerdict.OUT_OF_ORDER,
)


def test_non_idempotent_producer_always_appends() -> None:
    table = bk.ProducerStateTable()
    table.record(0, 0, 5, 0, 0)
    assert table.check(0, 0, 5) == (APPEND, -1)
    assert len(table) == 0


def test_sequence_checks() -> None:
    table = bk.ProducerStateTable()
    assert table.check(7, 0, 3) == (APPEND, -1)
    table.record(7, 0, 3, 100, 0)
    assert table.check(7, 0, 3) == (DUP, 100)
    assert table.check(7, 3, 2) == (APPEND, -1)
    assert table.check(7, 4, 2) == (OOO, -1)  # a gap
    assert table.check(7, 0, 2) == (OOO, -1)  # same start, different size: not the same batch
    table.record(7, 3, 2, 103, 0)
    assert table.check(7, 3, 2) == (DUP, 103)
    assert table.check(7, 0, 3) == (DUP, 100)
    assert table.check(8, 0, 1) == (APPEND, -1)  # an unknown producer starts at 0


def test_an_unknown_producer_is_accepted_only_from_sequence_zero() -> None:
    # Its first batch (0..2) was refused before it was appended (no replicas yet) and the
    # pipelined second one (3..4) arrives: appending it would store it before the first
    # one's retry, out of order.
    table = bk.ProducerStateTable()
    assert table.check(8, 3, 2) == (OOO, -1)
    assert table.check(8, 0, 3) == (APPEND, -1)
    table.record(8, 0, 3, 50, 0)
    assert table.check(8, 3, 2) == (APPEND, -1)


def test_window_remembers_the_last_eight_batches() -> None:
    table = bk.ProducerStateTable()
    for i in range(bk.PRODUCER_WINDOW + 2):
        table.record(1, i, 1, 1000 + i, 0)
    assert table.check(1, 0, 1) == (OOO, -1)
    assert table.check(1, 1, 1) == (OOO, -1)
    for i in range(2, bk.PRODUCER_WINDOW + 2):
        assert table.check(1, i, 1) == (DUP, 1000 + i)
    assert table.check(1, bk.PRODUCER_WINDOW + 2, 1) == (APPEND, -1)


def test_sequence_wraps_around() -> None:
    table = bk.ProducerStateTable()
    table.record(1, 2**32 - 2, 3, 0, 0)
    assert table.check(1, 1, 1) == (APPEND, -1)
    assert table.check(1, 2**32 + 1, 1) == (OOO, -1)


def test_forget_from_drops_truncated_batches() -> None:
    table = bk.ProducerStateTable()
    table.record(1, 0, 1, 10, 0)
    table.record(1, 1, 1, 11, 0)
    table.record(2, 0, 1, 12, 0)
    table.forget_from(11)
    assert table.check(1, 0, 1) == (DUP, 10)
    assert table.check(1, 1, 1) == (APPEND, -1)  # its batch is gone: appending again is right
    assert len(table) == 1  # producer 2 had nothing left


def test_a_truncation_of_every_remembered_batch_keeps_where_the_log_continues() -> None:
    table = bk.ProducerStateTable()
    for i in range(bk.PRODUCER_WINDOW + 3):
        table.record(1, i * 2, 2, 100 + i * 2, 0)
    first_kept = 3 * 2  # the window holds the batches from sequence 6 on
    table.forget_from(100 + first_kept)
    # batches below sequence 6 are still in the log: the producer resumes at 6, nowhere else
    assert table.check(1, first_kept + 2, 2) == (OOO, -1)
    assert table.check(1, 0, 2) == (OOO, -1)
    assert table.check(1, first_kept, 2) == (APPEND, -1)
    restored = bk.ProducerStateTable()
    restored.restore(table.snapshot())
    assert restored.check(1, first_kept, 2) == (APPEND, -1)
    assert restored.check(1, first_kept + 2, 2) == (OOO, -1)


def test_snapshot_restore_round_trip() -> None:
    table = bk.ProducerStateTable()
    for pid in (1, 2, 3):
        for seq in range(pid * 3):
            table.record(pid, seq, 1, pid * 100 + seq, pid * 1000)
    snap = table.snapshot()
    restored = bk.ProducerStateTable()
    restored.restore(snap)
    assert restored.snapshot() == snap
    for pid in (1, 2, 3):
        for seq in range(pid * 3):
            assert table.check(pid, seq, 1) == restored.check(pid, seq, 1)
        assert restored.check(pid, pid * 3, 1) == (APPEND, -1)


def test_restore_skips_junk_and_replaces_state() -> None:
    table = bk.ProducerStateTable()
    table.record(9, 0, 1, 0, 0)
    table.restore({"1": {"batches": [[0, 2, 5]], "last_seen_ms": 7}, "2": "junk"})
    assert len(table) == 1
    assert table.check(1, 0, 2) == (DUP, 5)
    assert table.check(9, 0, 1) == (APPEND, -1)


def test_idle_producers_expire() -> None:
    table = bk.ProducerStateTable(idle_expiry_ms=1_000)
    table.record(1, 0, 1, 0, now_ms=0)
    table.record(2, 0, 1, 1, now_ms=500)
    table.expire(1_000)
    assert len(table) == 2  # exactly the expiry is kept
    table.expire(1_001)
    assert table.check(1, 0, 1) == (APPEND, -1)
    assert table.check(2, 0, 1) == (DUP, 1)
    table.record(2, 1, 1, 2, now_ms=1_400)  # activity refreshes
    table.expire(2_000)
    assert len(table) == 1


def test_least_recently_used_producer_is_evicted() -> None:
    table = bk.ProducerStateTable(max_producers=2)
    table.record(1, 0, 1, 0, 0)
    table.record(2, 0, 1, 1, 0)
    table.record(1, 1, 1, 2, 0)  # producer 1 is now the most recent
    table.record(3, 0, 1, 3, 0)
    assert len(table) == 2
    assert table.check(2, 0, 1) == (APPEND, -1)
    assert table.check(1, 1, 1) == (DUP, 2)
    assert table.check(3, 0, 1) == (DUP, 3)
