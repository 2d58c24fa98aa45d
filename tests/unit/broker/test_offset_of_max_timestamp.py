"""ListOffsets' MAX_TIMESTAMP on a real partition log: the exact record, below the high
watermark, in either batch format."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from headrace.broker.cohort_admin import TimestampedOffset, offset_of_max_timestamp
from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk
from headrace.storage.log import PartitionLog

GZIP = 1


def _log(tmp_path: Path, segment_bytes: int = 1 << 20) -> PartitionLog:
    config = bk.LogConfig(fsync=bk.FsyncPolicy.NONE, segment_bytes=segment_bytes)
    return PartitionLog.open(tmp_path / "p", config, lambda: 1_700_000_000_000)


def _append(log: PartitionLog, timestamps: list[int], epoch: int = 0) -> None:
    raw = rb.encode([b"v"] * len(timestamps), timestamps=timestamps)
    log.append(raw, rb.validate(raw), epoch)


def _append_kafka(log: PartitionLog, timestamps: list[int], epoch: int = 0) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=GZIP,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, ts in enumerate(timestamps):
        builder.append(i, timestamp=ts, key=None, value=b"v", headers=[])
    raw = bytes(builder.build())
    log.append(raw, rb.validate_kafka(raw), epoch)


def _partition(log: PartitionLog) -> Any:
    return SimpleNamespace(log=log)


def test_the_record_itself_not_its_batch(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _append(log, [1_000, 5_000, 2_000])  # offsets 0-2: the newest is offset 1
    _append(log, [3_000, 4_000], epoch=2)  # offsets 3-4
    assert offset_of_max_timestamp(_partition(log), log.next_offset) == TimestampedOffset(
        1, 5_000, 0
    )
    log.close()


def test_the_first_of_equal_timestamps_and_only_below_the_high_watermark(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _append(log, [1_000, 2_000])  # 0-1
    _append(log, [7_000, 7_000], epoch=1)  # 2-3: the first 7,000 is offset 2
    _append(log, [9_000], epoch=2)  # 4: not committed yet
    p = _partition(log)
    assert offset_of_max_timestamp(p, 4) == TimestampedOffset(2, 7_000, 1)
    assert offset_of_max_timestamp(p, 5) == TimestampedOffset(4, 9_000, 2)
    assert offset_of_max_timestamp(p, 0) is None
    log.close()


def test_a_compressed_kafka_batch_among_ours_across_segments(tmp_path: Path) -> None:
    log = _log(tmp_path, segment_bytes=200)
    for i in range(10):
        _append(log, [1_000 + i, 1_000 + i])  # offsets 0-19
    _append_kafka(log, [3_000, 8_000, 8_000, 6_000], epoch=3)  # offsets 20-23
    for i in range(10):
        _append(log, [2_000 + i])  # offsets 24-33
    _append(log, [8_000])  # offset 34, as new as offset 21 and later: not it
    assert len(log.segments) > 3
    assert offset_of_max_timestamp(_partition(log), log.next_offset) == TimestampedOffset(
        21, 8_000, 3
    )
    log.close()
