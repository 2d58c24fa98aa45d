"""``cohorts seek --to TIMESTAMP`` on a real partition log: batch headers decide."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from headrace.broker.cohort_admin import offset_for_timestamp
from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk
from headrace.storage.log import PartitionLog


def _log(tmp_path: Path, timestamps: list[int], segment_bytes: int = 1 << 20) -> PartitionLog:
    config = bk.LogConfig(fsync=bk.FsyncPolicy.NONE, segment_bytes=segment_bytes)
    log = PartitionLog.open(tmp_path / "p", config, lambda: 1_700_000_000_000)
    for ts in timestamps:
        raw = rb.encode([b"a", b"b"], timestamp_ms=ts)  # two records per batch
        log.append(raw, rb.validate(raw), 0)
    return log


def _partition(log: PartitionLog) -> Any:
    return SimpleNamespace(log=log)


def test_a_time_resolves_to_the_first_batch_at_or_after_it(tmp_path: Path) -> None:
    log = _log(tmp_path, [1_000, 2_000, 3_000])
    p = _partition(log)
    assert offset_for_timestamp(p, 2_000, 0) == 2
    assert offset_for_timestamp(p, 2_500, 0) == 4
    assert offset_for_timestamp(p, 3_001, 0) == log.next_offset == 6
    # Before every local record: the earliest offset anyone holds (the object store's).
    assert offset_for_timestamp(p, 10, earliest=0) == 0
    log.close()


def test_segments_older_than_the_time_are_skipped_across_rolls(tmp_path: Path) -> None:
    log = _log(tmp_path, [1_000 * i for i in range(1, 40)], segment_bytes=256)
    assert len(log.segments) > 3
    p = _partition(log)
    assert offset_for_timestamp(p, 30_000, 0) == 2 * 29
    log.close()
