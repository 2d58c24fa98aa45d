"""``headrace roundtrip``'s bookkeeping: only records with this run's marker count."""

from __future__ import annotations

from headrace.cli.roundtrip import MarkedRecords, lowest_offsets


def test_only_this_runs_numbered_records_count() -> None:
    ours = MarkedRecords("abc123", 3)
    assert ours.values() == [b"abc123-0", b"abc123-1", b"abc123-2"]
    ours.observe([b"abc123-0", b"someone-else", b"abc1234-1", b"abc123-2", b"abc123-2"])
    assert (ours.seen, ours.missing, ours.complete) == ({0, 2}, 1, False)
    assert ours.others == 2
    ours.observe([b"abc123-1"])
    assert ours.complete
    ours.observe([b"abc123-7", b"abc123-x"])  # marked, but not a record this run sent
    assert ours.strangers == 2


def test_each_partition_starts_at_its_lowest_acknowledged_offset() -> None:
    assert lowest_offsets([(0, 40), (1, 7), (0, 12), (1, 9)]) == {0: 12, 1: 7}
    assert lowest_offsets([]) == {}
