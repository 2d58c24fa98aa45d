"""PartitionLog on a temporary directory with a fake clock: append, read, roll, recover."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace import files
from headrace.errors import OutOfOrderSequence, StorageError
from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk
from headrace.storage.log import RECOVERY_POINT_FILE, PartitionLog, ReadPosition


class FakeClock:
    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def config(**overrides: Any) -> bk.LogConfig:
    base: dict[str, Any] = {"fsync": bk.FsyncPolicy.NONE, "index_interval_bytes": 256}
    base.update(overrides)
    return bk.LogConfig(**base)


def make_batch(
    count: int = 1,
    value_size: int = 20,
    *,
    producer_id: int = 0,
    sequence: int = 0,
    ts: int = 1_000,
    tag: int = 0,
) -> tuple[bytes, rb.BatchHeader]:
    values = [bytes([(tag + i) % 256]) * value_size for i in range(count)]
    raw = rb.encode(values, timestamp_ms=ts, producer_id=producer_id, base_sequence=sequence)
    return raw, rb.validate(raw)


def append(log: PartitionLog, count: int = 1, epoch: int = 0, **kwargs: int) -> int:
    raw, header = make_batch(count, **kwargs)
    return log.append(raw, header, epoch).base_offset


def batches_of(data: bytes) -> list[rb.BatchHeader]:
    """Every batch in ``data``, which must be whole, valid batches and nothing else."""
    assert rb.complete_prefix_length(data) == len(data)
    out = []
    for pos, header in rb.scan(data):
        rb.validate(data[pos : pos + header.size])
        out.append(header)
    return out


def read_everything(log: PartitionLog, max_bytes: int, use_hint: bool) -> list[bytes]:
    chunks = []
    offset = log.log_start_offset
    hint: ReadPosition | None = None
    while offset < log.next_offset:
        data, hint = log.read(offset, max_bytes, hint=hint if use_hint else None)
        assert data, f"no progress at {offset}"
        chunks.append(data)
        offset = batches_of(data)[-1].next_offset
        assert hint is not None
        assert hint.offset == offset
    return chunks


def segment_bytes_on_disk(directory: Path) -> dict[int, bytes]:
    return {
        base: path.read_bytes()
        for path in sorted(directory.iterdir())
        if (base := bk.parse_segment_file_name(path.name)) is not None
    }


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# --------------------------------------------------------------------------- creation


def test_new_log_owes_no_recovery_point_until_it_changes(tmp_path: Path, clock: FakeClock) -> None:
    """A brand-new log recovers to itself with no recovery point (one empty segment), so
    the broker writes none for it until it changes."""
    log = PartitionLog.open(tmp_path / "p", config(fsync=bk.FsyncPolicy.INTERVAL), clock)
    assert log.checkpoint_current()
    assert not (tmp_path / "p" / RECOVERY_POINT_FILE).exists()
    append(log, 2)
    assert not log.checkpoint_current()  # the append must reach a recovery point
    log.mark_synced(log.sync_target())
    log.write_checkpoint(log.sync_target())
    assert log.checkpoint_current()
    log.close()
    # reopened with a recovery point: current only once this process wrote one again
    again = PartitionLog.open(tmp_path / "p", config(fsync=bk.FsyncPolicy.INTERVAL), clock)
    assert not again.checkpoint_current()
    assert again.next_offset == 2
    again.close()


def test_empty_directory_with_a_recovery_point_is_not_taken_as_current(tmp_path: Path) -> None:
    """No segment but a recovery point left behind: a new one is written, not assumed."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / RECOVERY_POINT_FILE).write_text('{"offset": 9, "segment": 0, "position": 0}')
    log = PartitionLog.open(tmp_path / "p", config(fsync=bk.FsyncPolicy.INTERVAL))
    assert not log.checkpoint_current()
    log.close()


def test_creation_with_gathered_syncs_leaves_the_directory_fsyncs_to_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``syncs``: the new directory's entry (in its parent) and its segment files' entries
    (in itself) are fsynced at ``flush``, not one by one during the opens."""
    synced: list[Path] = []
    monkeypatch.setattr(files, "fsync_directory", lambda path: synced.append(Path(path)))
    syncs = files.DirectorySyncs()
    topic = tmp_path / "topic"
    topic.mkdir()
    logs = [
        PartitionLog.open(topic / str(i), config(fsync=bk.FsyncPolicy.INTERVAL), syncs=syncs)
        for i in range(3)
    ]
    assert synced == []
    assert len(syncs) == 4  # the topic directory once, and each partition directory
    syncs.flush()
    assert sorted(synced) == sorted([topic, *(topic / str(i) for i in range(3))])
    assert len(syncs) == 0
    for log in logs:
        log.close()


# --------------------------------------------------------------------------- append and read


def test_new_log_starts_at_initial_offset(tmp_path: Path, clock: FakeClock) -> None:
    log = PartitionLog.open(tmp_path / "p", config(), clock, initial_offset=500)
    assert (log.log_start_offset, log.next_offset, log.flushed_offset) == (500, 500, 500)
    assert append(log, 3) == 500
    assert log.next_offset == 503
    log.close()
    # an existing log ignores initial_offset
    again = PartitionLog.open(tmp_path / "p", config(), clock, initial_offset=7)
    assert again.next_offset == 503
    again.close()


def test_append_stamps_offsets_and_epoch(tmp_path: Path, clock: FakeClock) -> None:
    log = PartitionLog.open(tmp_path, config(), clock)
    assert [append(log, n, epoch=4) for n in (1, 3, 2)] == [0, 1, 4]
    data, pos = log.read(0, 1 << 20)
    headers = batches_of(data)
    assert [(h.base_offset, h.record_count, h.leader_epoch) for h in headers] == [
        (0, 1, 4),
        (1, 3, 4),
        (4, 2, 4),
    ]
    assert pos == ReadPosition(0, len(data), 6)
    assert log.last_epoch == 4
    log.close()


@st.composite
def log_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 25))
    return {
        "counts": draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)),
        "sizes": draw(st.lists(st.integers(1, 120), min_size=n, max_size=n)),
        "segment_bytes": draw(st.integers(200, 3000)),
        "max_bytes": draw(st.integers(0, 1500)),
    }


def expected_read(
    appended: list[tuple[int, int, int]],
    segment_of: dict[int, int],
    offset: int,
    max_bytes: int,
    bound: int,
) -> list[int]:
    """Model of read(): base offsets of the batches it should return."""
    start = next(i for i, (base, count, _) in enumerate(appended) if base + count > offset)
    if appended[start][0] >= bound:
        return []
    out = [appended[start][0]]
    total = appended[start][2]
    for base, _, size in appended[start + 1 :]:
        if segment_of[base] != segment_of[out[0]] or base >= bound or total + size > max_bytes:
            break
        out.append(base)
        total += size
    return out


@settings(max_examples=40, deadline=None)
@given(log_scenarios(), st.data())
def test_read_matches_a_model(scenario: dict[str, Any], data: st.DataObject) -> None:
    counts: list[int] = scenario["counts"]
    sizes: list[int] = scenario["sizes"]
    max_bytes: int = scenario["max_bytes"]
    with tempfile.TemporaryDirectory() as tmp:
        log = PartitionLog.open(
            Path(tmp), config(segment_bytes=scenario["segment_bytes"]), FakeClock()
        )
        appended = []
        for i, (count, size) in enumerate(zip(counts, sizes, strict=True)):
            raw, header = make_batch(count, size, tag=i)
            base = log.append(raw, header, 1).base_offset
            appended.append((base, count, header.size))
        bases = [s.base_offset for s in log.segments]
        segment_of = {b: max(s for s in bases if s <= b) for b, _, _ in appended}
        for seg in log.segments[:-1]:
            in_seg = [size for b, _, size in appended if segment_of[b] == seg.base_offset]
            assert seg.size == sum(in_seg)
            assert seg.size <= scenario["segment_bytes"] or len(in_seg) == 1
        leo = log.next_offset
        assert leo == sum(counts)
        for _ in range(5):
            offset = data.draw(st.integers(0, leo - 1), label="offset")
            bound = data.draw(
                st.sampled_from([None, leo, *[b for b, _, _ in appended]]), label="upper_bound"
            )
            got, pos = log.read(offset, max_bytes, upper_bound=bound)
            want = expected_read(
                appended, segment_of, offset, max_bytes, leo if bound is None else bound
            )
            assert [h.base_offset for h in batches_of(got)] == want
            if want:
                assert got
                assert pos is not None
                last = want[-1]
                assert pos.offset == next(b + c for b, c, _ in appended if b == last)
                assert pos.segment_base == segment_of[want[0]]
        # sequential reading with and without the hint returns the same chunks
        assert read_everything(log, max_bytes, True) == read_everything(log, max_bytes, False)
        log.close()


def test_read_edges(tmp_path: Path, clock: FakeClock) -> None:
    log = PartitionLog.open(tmp_path, config(), clock, initial_offset=10)
    append(log, 2)
    append(log, 2)
    assert log.read(14, 1000) == (b"", None)  # at the log end
    assert log.read(9, 1000) == (b"", None)  # below the log start
    assert log.read(10, 1000, upper_bound=10)[0] == b""
    hint = ReadPosition(0, 0, 0)
    assert log.read(99, 1000, hint=hint) == (b"", hint)
    one, _ = log.read(11, 0)  # a reader always progresses by one batch
    assert [h.base_offset for h in batches_of(one)] == [10]
    log.close()


def test_a_read_cut_at_a_batch_boundary_is_a_view_of_whole_batches(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A read whose ``max_bytes`` ends inside a batch stops before it, as a view of what
    was read rather than a copy (a lagging follower's fetches are all cut so)."""
    log = PartitionLog.open(tmp_path, config(), clock)
    for tag in range(3):
        append(log, 4, value_size=100, tag=tag)
    size = rb.read_header(log.read(0, 1)[0]).size
    data, hint = log.read(0, 2 * size + size // 2)
    assert isinstance(data, memoryview)
    assert [h.base_offset for h in batches_of(bytes(data))] == [0, 4]
    assert hint == ReadPosition(0, 2 * size, 8)
    whole, _ = log.read(0, 3 * size)  # nothing cut: the bytes as read
    assert isinstance(whole, bytes) and whole[: 2 * size] == data
    log.close()


def test_stale_hint_for_another_offset_is_ignored(tmp_path: Path, clock: FakeClock) -> None:
    log = PartitionLog.open(tmp_path, config(), clock)
    for _ in range(5):
        append(log)
    _, hint = log.read(0, 1)
    assert hint == ReadPosition(0, rb.read_header(log.read(0, 1)[0]).size, 1)
    plain, _ = log.read(3, 1)
    hinted, _ = log.read(3, 1, hint=hint)
    assert plain == hinted
    log.close()


# --------------------------------------------------------------------------- rolling


def test_roll_by_size(tmp_path: Path, clock: FakeClock) -> None:
    batch, header = make_batch(1, 100)
    log = PartitionLog.open(tmp_path, config(segment_bytes=3 * header.size), clock)
    for _ in range(10):
        log.append(batch, header, 0)
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    assert [s.size for s in log.segments] == [3 * header.size] * 3 + [header.size]
    assert sorted(segment_bytes_on_disk(tmp_path)) == [0, 3, 6, 9]
    assert log.size_bytes == 10 * header.size
    log.close()


def test_roll_by_age(tmp_path: Path, clock: FakeClock) -> None:
    log = PartitionLog.open(tmp_path, config(segment_ms=60_000), clock)
    append(log)
    clock.now += 59_999
    append(log)
    assert len(log.segments) == 1
    clock.now += 1
    append(log)
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.close()


def test_batch_larger_than_a_segment_gets_a_segment_of_its_own(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = PartitionLog.open(tmp_path, config(segment_bytes=100), clock)
    append(log, value_size=500)
    append(log, value_size=500)
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert [h.base_offset for h in batches_of(log.read(1, 10)[0])] == [1]
    log.close()


# --------------------------------------------------------------------------- recovery


def test_reopen_recovers_everything(tmp_path: Path, clock: FakeClock) -> None:
    log = PartitionLog.open(tmp_path, config(segment_bytes=1000), clock)
    for i in range(30):
        append(log, 1 + i % 3, epoch=i // 10, tag=i)
    before = read_everything(log, 700, True)
    leo = log.next_offset
    log.close()
    again = PartitionLog.open(tmp_path, config(segment_bytes=1000), clock)
    assert again.next_offset == leo
    assert again.last_epoch == 2
    assert again.recovery is not None
    assert (again.recovery.truncated_bytes, again.recovery.used_checkpoint) == (0, False)
    assert again.recovery.scanned_bytes == again.size_bytes
    assert read_everything(again, 700, True) == before
    assert append(again) == leo
    # the append after a restart went to the end, not over the first batch
    assert read_everything(again, 700, True)[: len(before) - 1] == before[:-1]
    assert again.read(leo, 1 << 20)[0] == again.read(leo, 1)[0] != b""
    again.close()


def write_log(directory: Path, counts: list[int]) -> tuple[PartitionLog, list[tuple[int, int]]]:
    """A closed-over log with one batch per count; returns (base, position) of each batch."""
    log = PartitionLog.open(directory, config(), FakeClock())
    spots = []
    for i, n in enumerate(counts):
        position = log.active.size
        spots.append((append(log, n, tag=i), position))
    return log, spots


def test_torn_tail_at_every_byte_of_the_last_batch(tmp_path: Path) -> None:
    log, spots = write_log(tmp_path / "orig", [2, 1, 3, 2])
    log.close()
    whole = segment_bytes_on_disk(tmp_path / "orig")[0]
    last_base, last_pos = spots[-1]
    for cut in range(last_pos, len(whole)):
        directory = tmp_path / f"cut-{cut}"
        directory.mkdir()
        (directory / bk.segment_file_name(0)).write_bytes(whole[:cut])
        torn = PartitionLog.open(directory, config(), FakeClock())
        assert torn.next_offset == last_base, cut
        assert torn.recovery is not None
        assert torn.recovery.truncated_bytes == cut - last_pos
        assert segment_bytes_on_disk(directory)[0] == whole[:last_pos]
        assert append(torn, 5) == last_base
        assert [h.base_offset for h in batches_of(torn.read(0, 1 << 20)[0])] == [
            b for b, _ in spots
        ]
        torn.close()


def test_corrupt_byte_in_the_last_batch_cuts_exactly_that_batch(tmp_path: Path) -> None:
    log, spots = write_log(tmp_path / "orig", [2, 1, 3])
    log.close()
    whole = segment_bytes_on_disk(tmp_path / "orig")[0]
    last_base, last_pos = spots[-1]
    # every byte but the leader epoch (outside the CRC; a higher value is
    # indistinguishable from a real epoch bump, a lower one is cut too)
    for index in range(last_pos, len(whole)):
        if last_pos + 12 <= index < last_pos + 16:
            continue
        damaged = bytearray(whole)
        damaged[index] ^= 0x5A
        directory = tmp_path / f"flip-{index}"
        directory.mkdir()
        (directory / bk.segment_file_name(0)).write_bytes(damaged)
        reopened = PartitionLog.open(directory, config(), FakeClock())
        assert reopened.next_offset == last_base, index
        assert segment_bytes_on_disk(directory)[0] == whole[:last_pos]
        reopened.close()


def test_epoch_going_back_is_cut(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    append(log, epoch=3)
    append(log, epoch=5)
    position = log.active.size
    append(log, epoch=5)
    log.close()
    path = tmp_path / bk.segment_file_name(0)
    damaged = bytearray(path.read_bytes())
    rb.STAMP_EPOCH.pack_into(damaged, position + 12, 4)
    path.write_bytes(damaged)
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.next_offset == 2
    reopened.close()


def test_corruption_in_a_middle_segment_discards_everything_after_it(tmp_path: Path) -> None:
    # Offsets must stay contiguous, so the first bad batch ends the log: the rest
    # of its segment and every later segment are deleted (replication or the
    # object store must supply them again).
    batch, header = make_batch(1, 50)
    cfg = config(segment_bytes=4 * header.size)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(12):
        log.append(batch, header, 0)
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    total = log.size_bytes
    log.close()
    middle = tmp_path / bk.segment_file_name(4)
    damaged = bytearray(middle.read_bytes())
    damaged[header.size + 40] ^= 0xFF  # second batch of the middle segment: offset 5
    middle.write_bytes(damaged)

    reopened = PartitionLog.open(tmp_path, cfg, FakeClock())
    assert reopened.next_offset == 5
    assert [s.base_offset for s in reopened.segments] == [0, 4]
    assert sorted(segment_bytes_on_disk(tmp_path)) == [0, 4]
    assert reopened.recovery is not None
    assert reopened.recovery.truncated_bytes == total - 5 * header.size
    assert [h.base_offset for h in batches_of(reopened.read(0, 1 << 20)[0])] == [0, 1, 2, 3]
    assert reopened.log_start_offset == 0
    assert append(reopened) == 5
    reopened.close()


def test_gap_between_segments_discards_the_rest(tmp_path: Path) -> None:
    batch, header = make_batch(1, 50)
    cfg = config(segment_bytes=2 * header.size)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(6):
        log.append(batch, header, 0)
    log.close()
    (tmp_path / bk.segment_file_name(2)).unlink()
    reopened = PartitionLog.open(tmp_path, cfg, FakeClock())
    assert reopened.next_offset == 2
    assert sorted(segment_bytes_on_disk(tmp_path)) == [0]
    reopened.close()


def checkpoint(log: PartitionLog) -> None:
    target = log.sync_target()
    log.sync(target)
    log.mark_synced(target)
    log.write_checkpoint(target)


def test_recovery_starts_at_the_checkpoint(tmp_path: Path) -> None:
    batch, header = make_batch(1, 200)
    cfg = config(segment_bytes=5 * header.size)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(23):
        log.append(batch, header, 2)
    checkpoint(log)
    assert log.flushed_offset == 23
    for _ in range(3):
        log.append(batch, header, 2)
    log.close()
    reopened = PartitionLog.open(tmp_path, cfg, FakeClock())
    report = reopened.recovery
    assert report is not None
    assert report.used_checkpoint
    assert report.scanned_bytes == 3 * header.size
    assert report.next_offset == reopened.next_offset == 26
    assert reopened.last_epoch == 2
    # the trusted segments still know their extent and newest timestamp
    assert [s.stats.next_offset for s in reopened.segments] == [5, 10, 15, 20, 25, 26]
    assert all(s.stats.max_timestamp == header.max_timestamp for s in reopened.segments)
    assert (
        read_everything(reopened, 1 << 20, False)[0][: header.size]
        == bytes(rb.stamped_prefix(batch, 0, 2)) + batch[16:]
    )
    reopened.close()


def test_checkpoint_in_a_closed_segment(tmp_path: Path) -> None:
    batch, header = make_batch(1, 200)
    cfg = config(segment_bytes=2 * header.size)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(3):
        log.append(batch, header, 0)
    checkpoint(log)  # segment 2, position header.size
    for _ in range(4):
        log.append(batch, header, 0)
    log.close()
    reopened = PartitionLog.open(tmp_path, cfg, FakeClock())
    assert reopened.recovery is not None
    assert reopened.recovery.used_checkpoint
    assert reopened.recovery.scanned_bytes == 4 * header.size
    assert reopened.next_offset == 7
    reopened.close()


def test_batches_bigger_than_the_scan_chunk(tmp_path: Path) -> None:
    cfg = config(segment_bytes=8 << 20, index_interval_bytes=4096)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    sizes = [10, 1_500_000, 10, 2_500_000, 10]
    for i, size in enumerate(sizes):
        append(log, value_size=size, tag=i)

    def every_offset_reads_its_batch(log: PartitionLog) -> None:
        for offset in range(log.log_start_offset, log.next_offset):
            assert batches_of(log.read(offset, 1)[0])[0].base_offset == offset

    every_offset_reads_its_batch(log)
    log.close()
    log = PartitionLog.open(tmp_path, cfg, FakeClock())  # full scan
    every_offset_reads_its_batch(log)
    checkpoint(log)
    append(log, value_size=2_000_000)
    log.roll()
    append(log)
    checkpoint(log)  # the big segment is now trusted: recovery reads its tail only
    log.close()
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    assert log.recovery is not None
    assert log.recovery.used_checkpoint
    assert [(s.base_offset, s.stats.next_offset) for s in log.segments] == [(0, 6), (6, 7)]
    every_offset_reads_its_batch(log)
    log.close()


def test_torn_tail_after_the_checkpoint(tmp_path: Path) -> None:
    log, _ = write_log(tmp_path, [1, 1])
    checkpoint(log)
    append(log, 2)
    append(log, 3)
    end = log.active.size
    log.close()
    path = tmp_path / bk.segment_file_name(0)
    path.write_bytes(path.read_bytes()[: end - 7])
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.recovery is not None
    assert reopened.recovery.used_checkpoint
    assert reopened.next_offset == 4
    assert reopened.recovery.truncated_bytes > 0
    reopened.close()


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[1, 2]",
        '{"offset": 3}',
        json.dumps({"offset": 0, "segment": 999, "position": 0}),
    ],
)
def test_unusable_checkpoint_falls_back_to_a_full_scan(tmp_path: Path, content: str) -> None:
    log, _ = write_log(tmp_path, [1, 2, 3])
    log.close()
    (tmp_path / RECOVERY_POINT_FILE).write_text(content)
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.recovery is not None
    assert not reopened.recovery.used_checkpoint
    assert reopened.recovery.scanned_bytes == reopened.size_bytes
    assert reopened.next_offset == 6
    reopened.close()


def test_checkpoint_beyond_a_shrunken_segment_is_ignored(tmp_path: Path) -> None:
    log, spots = write_log(tmp_path, [1, 1, 1])
    checkpoint(log)
    log.close()
    path = tmp_path / bk.segment_file_name(0)
    path.write_bytes(path.read_bytes()[: spots[1][1]])
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.recovery is not None
    assert not reopened.recovery.used_checkpoint
    assert reopened.next_offset == 1
    reopened.close()


def test_checkpoint_epoch_is_the_epoch_of_its_target(tmp_path: Path) -> None:
    # The syncer captures a target on the loop and writes the checkpoint later
    # on a thread while appends go on. A newer leader epoch appended in between
    # must not make recovery distrust the older-epoch batches after the target.
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    append(log, epoch=1)
    target = log.sync_target()
    append(log, epoch=1)
    append(log, epoch=2)
    log.sync(target)
    log.write_checkpoint(target)
    log.close()
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.recovery is not None
    assert reopened.recovery.used_checkpoint
    assert reopened.next_offset == 3
    assert reopened.recovery.truncated_bytes == 0
    assert reopened.last_epoch == 2
    reopened.close()


def test_checkpoint_refuses_a_target_without_producer_state(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    append(log)
    target = log.sync_target(for_checkpoint=False)
    assert target.producers == {}
    with pytest.raises(ValueError, match="producer snapshot"):
        log.write_checkpoint(target)
    log.close()


def test_sync_target_captures_dirty_segments_once(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    append(log, 3)
    first = log.sync_target()
    assert (len(first.segments), first.offset, first.position) == (1, 3, log.active.size)
    assert log.sync_target().segments == ()
    assert log.flushed_offset == 0
    log.mark_synced(first)
    assert log.flushed_offset == 3
    log.mark_synced(log.sync_target())
    assert log.flushed_offset == 3
    log.close()


# --------------------------------------------------------------------------- truncation


def test_truncate_to_a_batch_boundary(tmp_path: Path) -> None:
    log, spots = write_log(tmp_path, [2, 3, 1, 4])
    log.truncate_to(5)
    assert log.next_offset == 5
    assert log.active.size == spots[2][1]
    assert append(log, 2, tag=9) == 5
    log.truncate_to(100)  # past the end: nothing to do
    assert log.next_offset == 7
    with pytest.raises(StorageError, match="inside a batch"):
        log.truncate_to(3)
    log.truncate_to(0)
    assert (log.next_offset, log.active.size) == (0, 0)
    log.close()


def test_truncate_to_across_segments(tmp_path: Path) -> None:
    batch, header = make_batch(1, 50)
    cfg = config(segment_bytes=3 * header.size)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(10):
        log.append(batch, header, 0)
    log.truncate_to(4)
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert sorted(segment_bytes_on_disk(tmp_path)) == [0, 3]
    assert log.next_offset == 4
    log.truncate_to(3)  # exactly a segment base: that segment goes too
    assert [(s.base_offset, s.size) for s in log.segments] == [(0, 3 * header.size)]
    assert sorted(segment_bytes_on_disk(tmp_path)) == [0]
    assert log.next_offset == 3
    assert log.append(batch, header, 0).base_offset == 3
    log.truncate_to(3)
    log.close()
    reopened = PartitionLog.open(tmp_path, cfg, FakeClock())
    assert reopened.next_offset == 3
    reopened.close()


def test_truncated_producer_batch_is_appended_again(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    raw, header = make_batch(2, producer_id=7, sequence=0)
    log.append(raw, header, 0)
    log.truncate_to(0)
    again = log.append(raw, header, 0)
    assert (again.base_offset, again.duplicate) == (0, False)
    assert log.next_offset == 2
    log.close()


def test_truncate_at_a_segment_boundary_forgets_producer_state(tmp_path: Path) -> None:
    batch, header = make_batch(1, 50)
    cfg = config(segment_bytes=2 * header.size)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(2):
        log.append(batch, header, 0)
    retried, retried_header = make_batch(1, producer_id=4, sequence=0)
    assert log.append(retried, retried_header, 0).base_offset == 2
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.truncate_to(2)
    again = log.append(retried, retried_header, 0)
    assert (again.base_offset, again.duplicate) == (2, False)
    log.close()


def test_sync_target_from_before_a_truncation_is_stale(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    for _ in range(4):
        append(log)
    target = log.sync_target()
    log.truncate_to(2)
    append(log, value_size=90)
    log.sync(target)
    log.mark_synced(target)
    assert log.flushed_offset == 2, "the appended record was never synced"
    log.write_checkpoint(target)
    log.close()
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.next_offset == 3
    assert reopened.recovery is not None
    assert reopened.recovery.truncated_bytes == 0
    reopened.close()


def test_truncate_then_append_survives_a_stale_checkpoint(tmp_path: Path) -> None:
    # A recovery point written before truncate_to names a position that, after
    # new appends, may land inside a different batch.
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    for i in range(10):
        append(log, 1, value_size=30, tag=i)
    checkpoint(log)
    log.truncate_to(5)
    for i in range(3):
        append(log, 2, value_size=50, tag=i)
    expected = read_everything(log, 1 << 20, False)
    leo = log.next_offset
    log.close()
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.next_offset == leo == 11
    assert reopened.recovery is not None
    assert reopened.recovery.truncated_bytes == 0
    assert read_everything(reopened, 1 << 20, False) == expected
    reopened.close()


# --------------------------------------------------------------------------- retention


def test_retention_by_size_deletes_whole_old_segments(tmp_path: Path) -> None:
    batch, header = make_batch(1, 100)
    cfg = config(segment_bytes=2 * header.size, retention_bytes=5 * header.size, retention_ms=-1)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(9):
        log.append(batch, header, 0)
    assert log.apply_retention() == [0, 2]
    assert [s.base_offset for s in log.segments] == [4, 6, 8]
    assert sorted(segment_bytes_on_disk(tmp_path)) == [4, 6, 8]
    assert log.log_start_offset == 4
    assert log.read(3, 1000) == (b"", None)
    assert batches_of(log.read(4, 1)[0])[0].base_offset == 4
    assert log.apply_retention() == []
    log.close()
    reopened = PartitionLog.open(tmp_path, cfg, FakeClock())
    assert (reopened.log_start_offset, reopened.next_offset) == (4, 9)
    reopened.close()


def test_retention_by_age_uses_record_timestamps(tmp_path: Path) -> None:
    clock = FakeClock(100_000)
    cfg = config(segment_ms=10, retention_ms=50_000)
    log = PartitionLog.open(tmp_path, cfg, clock)
    for ts in (10_000, 70_000, 90_000):
        append(log, ts=ts)
        clock.now += 10  # every append rolls
    assert [s.base_offset for s in log.segments] == [0, 1, 2]
    assert [s.stats.max_timestamp for s in log.segments] == [10_000, 70_000, 90_000]
    assert log.apply_retention() == [0]
    assert log.apply_retention() == []
    clock.now = 120_000
    assert log.apply_retention() == []  # 70_000 is exactly 50_000 ms old
    clock.now = 120_001
    assert log.apply_retention() == [1]
    clock.now = 10**9
    assert log.apply_retention() == []  # never the active segment
    assert log.log_start_offset == 2
    log.close()


def test_age_retention_still_works_for_the_segment_active_at_a_clean_restart(
    tmp_path: Path,
) -> None:
    batch, header = make_batch(1, 50, ts=1_000)
    clock = FakeClock(10_000)
    cfg = config(segment_bytes=2 * header.size, retention_ms=100_000)
    log = PartitionLog.open(tmp_path, cfg, clock)
    for _ in range(2):
        log.append(batch, header, 0)
    checkpoint(log)  # at the very end of the active segment
    log.close()
    reopened = PartitionLog.open(tmp_path, cfg, clock)
    assert reopened.recovery is not None
    assert reopened.recovery.scanned_bytes == 0
    assert reopened.active.stats.max_timestamp == 1_000
    clock.now = 10**9
    append(reopened, ts=10**9)  # the full segment rolls
    assert reopened.apply_retention() == [0]
    reopened.close()


def test_retention_waits_for_the_upload_floor(tmp_path: Path) -> None:
    batch, header = make_batch(1, 100)
    cfg = config(segment_bytes=header.size, retention_bytes=0, retention_ms=-1)
    log = PartitionLog.open(tmp_path, cfg, FakeClock())
    for _ in range(4):
        log.append(batch, header, 0)
    assert log.apply_retention(upload_floor=0) == []
    assert log.apply_retention(upload_floor=2) == [0, 1]
    assert log.apply_retention(upload_floor=100) == [2]
    log.close()


# --------------------------------------------------------------------------- idempotent producers


def test_duplicate_producer_batch_is_not_appended_twice(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    first, h1 = make_batch(2, producer_id=7, sequence=0)
    second, h2 = make_batch(3, producer_id=7, sequence=2)
    assert log.append(first, h1, 0).base_offset == 0
    assert log.append(second, h2, 0).base_offset == 2
    size = log.size_bytes
    retry = log.append(first, h1, 0)
    assert (retry.base_offset, retry.duplicate) == (0, True)
    assert log.append(second, h2, 0).duplicate
    assert (log.next_offset, log.size_bytes) == (5, size)
    log.close()


@pytest.mark.parametrize("with_checkpoint", [False, True])
def test_duplicates_are_detected_after_a_restart(tmp_path: Path, with_checkpoint: bool) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    raws = [make_batch(1, producer_id=3, sequence=s) for s in range(4)]
    for raw, header in raws[:2]:
        log.append(raw, header, 0)
    if with_checkpoint:
        checkpoint(log)
    for raw, header in raws[2:]:
        log.append(raw, header, 0)
    log.close()
    reopened = PartitionLog.open(tmp_path, config(), FakeClock())
    assert reopened.recovery is not None
    assert reopened.recovery.used_checkpoint is with_checkpoint
    for s, (raw, header) in enumerate(raws):
        result = reopened.append(raw, header, 0)
        assert (result.base_offset, result.duplicate) == (s, True)
    assert reopened.next_offset == 4
    reopened.close()


def test_sequence_gap_raises_out_of_order(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, config(), FakeClock())
    raw, header = make_batch(2, producer_id=5, sequence=0)
    log.append(raw, header, 0)
    gap, gap_header = make_batch(1, producer_id=5, sequence=3)
    with pytest.raises(OutOfOrderSequence):
        log.append(gap, gap_header, 0)
    assert log.next_offset == 2
    ok, ok_header = make_batch(1, producer_id=5, sequence=2)
    assert log.append(ok, ok_header, 0).base_offset == 2
    log.close()


# --------------------------------------------------------------------------- replication


def test_append_stamped_copies_a_leaders_log(tmp_path: Path) -> None:
    batch, header = make_batch(2, 80)
    cfg = config(segment_bytes=3 * header.size)
    leader = PartitionLog.open(tmp_path / "leader", cfg, FakeClock())
    for epoch in (1, 1, 2, 2, 2):
        leader.append(batch, header, epoch)
    follower = PartitionLog.open(tmp_path / "follower", cfg, FakeClock())
    for chunk in read_everything(leader, 1 << 20, True):
        follower.append_stamped(chunk)
    assert follower.next_offset == leader.next_offset == 10
    assert follower.last_epoch == 2
    assert read_everything(follower, 1 << 20, False) == read_everything(leader, 1 << 20, False)
    assert follower.append_stamped(b"") == 10
    with pytest.raises(StorageError, match="log end is 10"):
        follower.append_stamped(leader.read(0, 1)[0])
    leader.close()
    follower.close()
