"""Pure bookkeeping for partition logs: decisions, no file I/O.

The file layer (``segment.py``, ``log.py``) asks this module what to do --
where a batch lives, when to roll, what retention may delete, whether a
producer's batch is a retry -- and then does it. Everything here takes plain
values and the current time as arguments, so it is tested with a fake clock.
"""

from __future__ import annotations

import bisect
import enum
import struct
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

SEGMENT_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
#: sparse index entry: offset relative to the segment base u32, file position u32
INDEX_ENTRY: Final = struct.Struct("<II")


class FsyncPolicy(enum.StrEnum):
    #: never fsync on the write path; the OS decides (fastest, loses the page cache on power loss)
    NONE = "none"
    #: group commit on a timer: one fdatasync per dirty segment every ``flush_interval_ms``
    INTERVAL = "interval"
    #: a produce is acknowledged only after an fdatasync that covers it (still group-committed)
    ALWAYS = "always"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-partition log settings. Sizes in bytes, times in milliseconds."""

    #: roll to a new segment past this size; 256 MiB keeps file counts low and recovery cheap
    segment_bytes: int = 256 * 1024 * 1024
    #: roll a segment this old even if small, so age-based retention can delete it (7 days)
    segment_ms: int = 7 * 24 * 3600 * 1000
    #: delete oldest segments while the log is larger than this; -1 = unlimited
    retention_bytes: int = -1
    #: delete segments whose newest record is older than this; -1 = forever (7 days)
    retention_ms: int = 7 * 24 * 3600 * 1000
    #: one sparse index entry per this many bytes of log: bounds the scan on a lookup
    index_interval_bytes: int = 4096
    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    #: group-commit period under ``interval``; 1 s matches Redis ``appendfsync everysec``
    flush_interval_ms: int = 1000
    #: write the recovery point this often; restart scans at most this much recent log
    checkpoint_interval_ms: int = 5000
    #: largest batch a producer may send; bigger ones get BatchTooLarge
    max_batch_bytes: int = 8 * 1024 * 1024


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def index_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{INDEX_SUFFIX}"


def parse_segment_file_name(name: str) -> int | None:
    if not name.endswith(SEGMENT_SUFFIX):
        return None
    stem = name[: -len(SEGMENT_SUFFIX)]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


class SparseIndex:
    """Offset -> file position entries, one per ``interval`` bytes of a segment.

    Entries are (relative offset, position) pairs in increasing order. A lookup
    returns the position of the last indexed batch starting at or before the
    wanted offset; the caller scans forward from there (at most ``interval``
    bytes plus one batch).
    """

    __slots__ = (
        "_bytes_since_last",
        "_interval",
        "_persisted",
        "base_offset",
        "offsets",
        "positions",
    )

    def __init__(self, base_offset: int, interval: int) -> None:
        self.base_offset = base_offset
        self._interval = interval
        self.offsets: array[int] = array("I")
        self.positions: array[int] = array("I")
        self._bytes_since_last = 0
        self._persisted = 0

    def __len__(self) -> int:
        return len(self.offsets)

    def on_append(self, batch_base_offset: int, position: int, size: int) -> None:
        """Note a batch written at ``position``; index it if enough bytes have passed."""
        if self._bytes_since_last >= self._interval or (not self.offsets and position > 0):
            # Positions first: the fsync thread reads up to len(offsets) without the lock
            # (``unpersisted``), so an entry must be whole by the time offsets names it.
            self.positions.append(position)
            self.offsets.append(batch_base_offset - self.base_offset)
            self._bytes_since_last = 0
        self._bytes_since_last += size

    def lookup(self, offset: int) -> int:
        """File position to start scanning from for ``offset``."""
        i = bisect.bisect_right(self.offsets, offset - self.base_offset)
        return 0 if i == 0 else self.positions[i - 1]

    def truncate_after(self, position: int) -> None:
        """Drop entries at or beyond ``position`` (the log was cut there)."""
        i = bisect.bisect_left(self.positions, position)
        del self.offsets[i:]
        del self.positions[i:]
        self._persisted = min(self._persisted, i)
        self._bytes_since_last = 0

    def last_position(self) -> int:
        return self.positions[-1] if self.positions else 0

    def unpersisted(self) -> tuple[bytes, int]:
        """Encoded entries not yet persisted, and the entry count they bring the file to.

        The count is captured with the bytes: entries appended meanwhile (the
        loop keeps appending while a worker thread persists) stay unpersisted.
        Runs on the fsync thread while ``on_append`` runs on the loop without a
        lock, so an entry may be half-appended: only whole pairs count.
        """
        end = min(len(self.offsets), len(self.positions))
        out = bytearray()
        for i in range(self._persisted, end):
            out += INDEX_ENTRY.pack(self.offsets[i], self.positions[i])
        return bytes(out), end

    def mark_persisted(self, count: int) -> None:
        self._persisted = max(self._persisted, min(count, len(self.offsets)))

    @property
    def persisted_entries(self) -> int:
        return self._persisted

    def load(self, raw: bytes, segment_size: int) -> None:
        """Load persisted entries, keeping only a valid, increasing prefix inside the segment."""
        usable = len(raw) - len(raw) % INDEX_ENTRY.size
        last_off, last_pos = -1, -1
        for rel, pos in INDEX_ENTRY.iter_unpack(raw[:usable]):
            if rel <= last_off or pos <= last_pos or pos >= segment_size:
                break
            self.offsets.append(rel)
            self.positions.append(pos)
            last_off, last_pos = rel, pos
        self._persisted = len(self.offsets)
        self._bytes_since_last = 0


@dataclass(slots=True)
class SegmentStats:
    """What the log knows about one segment without reading it."""

    base_offset: int
    next_offset: int
    size: int
    #: wall-clock ms when the segment was created (drives age-based rolling)
    created_ms: int
    #: largest record timestamp seen (drives age-based retention); -1 if unknown
    max_timestamp: int = -1


def should_roll(active: SegmentStats, incoming_bytes: int, now_ms: int, config: LogConfig) -> bool:
    """Roll before appending ``incoming_bytes`` to ``active``?"""
    if active.size == 0:
        return False
    if active.size + incoming_bytes > config.segment_bytes:
        return True
    # Positions are u32 in the index: never let a segment reach 4 GiB.
    if active.size + incoming_bytes >= 0xFFFF_FFFF:
        return True
    return now_ms - active.created_ms >= config.segment_ms


def segments_to_delete(
    segments: Sequence[SegmentStats],
    now_ms: int,
    config: LogConfig,
    *,
    upload_floor: int | None = None,
) -> list[int]:
    """Base offsets of the oldest segments retention may delete.

    Never the active (last) segment. Deletes a prefix only, so the log stays
    contiguous. ``upload_floor``: when tiered storage is on, only segments
    whose records are all below this offset are durable elsewhere and may go.
    """
    closed = list(segments[:-1])
    total = sum(s.size for s in segments)
    doomed: list[int] = []
    for seg in closed:
        if upload_floor is not None and seg.next_offset > upload_floor:
            break
        over_size = config.retention_bytes >= 0 and total > config.retention_bytes
        too_old = (
            config.retention_ms >= 0
            and seg.max_timestamp >= 0
            and now_ms - seg.max_timestamp > config.retention_ms
        )
        if not (over_size or too_old):
            break
        doomed.append(seg.base_offset)
        total -= seg.size
    return doomed


# --------------------------------------------------------------------------- idempotent producers


class SequenceVerdict(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"


_SEQ_MOD: Final = 1 << 32
#: batches remembered per producer: a producer retries at most this many in-flight batches
PRODUCER_WINDOW: Final = 8


@dataclass(slots=True)
class ProducerEntry:
    #: (base_sequence, record_count, base_offset) of recent batches, oldest first
    batches: list[tuple[int, int, int]] = field(default_factory=list)
    last_seen_ms: int = 0
    #: with no batch left (a truncation took them all): the sequence the log continues at
    resume_sequence: int = 0

    @property
    def next_sequence(self) -> int:
        if not self.batches:
            return self.resume_sequence
        seq, count, _ = self.batches[-1]
        return (seq + count) % _SEQ_MOD


#: a producer with no state here: its log starts at sequence 0
_UNKNOWN: Final = ProducerEntry()


class ProducerStateTable:
    """Recent batches per idempotent producer, to turn retries into no-ops.

    A producer numbers its records per partition. A batch whose sequence was
    already appended is a retry: answer it with the offset it got the first
    time. A batch that skips ahead means an earlier one was lost: reject it so
    the producer resends in order. Rebuilt on recovery from the checkpoint
    snapshot plus the batch headers scanned after it.

    A producer this table does not know starts at sequence 0, and only there.
    Accepting any first sequence would let a pipelined batch be appended while
    the one before it was refused (no replicas yet, not the leader yet): the
    retry of the earlier batch then lands after it, and a key's records are
    stored out of order. A producer whose state was lost (expiry, eviction)
    gets ``OUT_OF_ORDER`` and continues under a new identity from 0.
    """

    def __init__(self, max_producers: int = 10_000, idle_expiry_ms: int = 3600_000) -> None:
        self._entries: OrderedDict[int, ProducerEntry] = OrderedDict()
        self._max = max_producers
        self._expiry = idle_expiry_ms

    def __len__(self) -> int:
        return len(self._entries)

    def check(
        self, producer_id: int, base_sequence: int, count: int
    ) -> tuple[SequenceVerdict, int]:
        """Verdict for a batch, and for a duplicate the base offset it was stored at."""
        if producer_id == 0:
            return SequenceVerdict.APPEND, -1
        entry = self._entries.get(producer_id)
        if entry is None:
            entry = _UNKNOWN
        for seq, n, base in entry.batches:
            if seq == base_sequence and n == count:
                return SequenceVerdict.DUPLICATE, base
        if base_sequence == entry.next_sequence:
            return SequenceVerdict.APPEND, -1
        return SequenceVerdict.OUT_OF_ORDER, -1

    def record(
        self, producer_id: int, base_sequence: int, count: int, base_offset: int, now_ms: int
    ) -> None:
        if producer_id == 0:
            return
        entry = self._entries.pop(producer_id, None) or ProducerEntry()
        entry.batches.append((base_sequence, count, base_offset))
        if len(entry.batches) > PRODUCER_WINDOW:
            del entry.batches[0]
        entry.last_seen_ms = now_ms
        self._entries[producer_id] = entry
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def expire(self, now_ms: int) -> None:
        for pid in [p for p, e in self._entries.items() if now_ms - e.last_seen_ms > self._expiry]:
            del self._entries[pid]

    def forget_from(self, offset: int) -> None:
        """The log was truncated at ``offset``: forget batches stored at or after it."""
        for pid in list(self._entries):
            entry = self._entries[pid]
            kept = [b for b in entry.batches if b[2] < offset]
            if len(kept) == len(entry.batches):
                continue
            if not kept:
                # The log continues at the first forgotten batch: older batches of this
                # producer may still be in the log, below what the window remembered.
                entry.resume_sequence = entry.batches[0][0]
                if entry.resume_sequence == 0:
                    del self._entries[pid]  # the same as a producer never seen
                    continue
            entry.batches = kept

    def snapshot(self) -> dict[str, object]:
        return {
            str(pid): {
                "batches": [list(b) for b in e.batches],
                "last_seen_ms": e.last_seen_ms,
                "resume_sequence": e.resume_sequence,
            }
            for pid, e in self._entries.items()
        }

    def restore(self, snap: dict[str, object]) -> None:
        self._entries.clear()
        for pid, raw in snap.items():
            if not isinstance(raw, dict):
                continue
            batches = [(int(b[0]), int(b[1]), int(b[2])) for b in raw.get("batches", [])]
            self._entries[int(pid)] = ProducerEntry(
                batches, int(raw.get("last_seen_ms", 0)), int(raw.get("resume_sequence", 0))
            )
