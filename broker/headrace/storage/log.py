"""A partition's local log: an ordered run of segments plus a recovery point.

``PartitionLog`` is synchronous file I/O driven by the broker's event loop;
appends and reads are page-cache operations. fdatasync is the slow call, so
``sync_target()``/``sync()``/``mark_synced()`` split it: the loop captures
what to sync, a worker thread syncs, the loop records the result. Decisions
(roll, retention, dedup) come from ``bookkeeping``.

Threads. Everything runs on the loop except ``sync`` and ``write_checkpoint``,
which group commit runs on its fsync thread. Those two *borrow* segments under
``_lock``: the loop may retire a segment meanwhile (retention, truncation,
reset, close) but its descriptors stay open until the last borrower gives it
back, so no thread ever writes through a descriptor that was closed and handed
to another file. The lock is held for list changes and page-cache writes,
never across an fsync, and the append path never takes it. (The uploader also
calls ``read`` from a thread; it borrows nothing, and tiering drops what it
read if the log was truncated meanwhile.)

Files in a partition directory::

    00000000000000000000.log     segment, named by its base offset
    00000000000000000000.index   its sparse offset index
    recovery-point.json          {"offset", "segment", "position", "producers", ...}
    recovery-point.json.*.tmp    a recovery point being written (removed on open)
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace import files
from headrace.errors import OutOfOrderSequence, StorageError
from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk
from headrace.storage.epochs import LeaderEpochCache
from headrace.storage.segment import Segment

RECOVERY_POINT_FILE = "recovery-point.json"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    #: True when the batch was a producer retry that was already in the log
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class SyncTarget:
    """What one fdatasync round covers: captured on the loop, synced on a thread."""

    segments: tuple[Segment, ...]
    offset: int
    segment_base: int
    position: int
    producers: dict[str, object]
    #: False when the producer snapshot was skipped: such a target cannot be a recovery point
    checkpointable: bool = True
    #: the log's last leader epoch at capture; recovery refuses batches below it after ``position``
    epoch: int = -1
    #: ``PartitionLog.truncations`` at capture: a target from before a truncation is stale
    truncations: int = 0


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    next_offset: int
    scanned_bytes: int
    truncated_bytes: int
    used_checkpoint: bool
    seconds: float


@dataclass(slots=True)
class ReadPosition:
    """Where a sequential reader stopped: skip the index lookup next time."""

    segment_base: int
    position: int
    offset: int


class PartitionLog:
    def __init__(
        self,
        directory: Path,
        config: bk.LogConfig,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.directory = directory
        self.config = config
        self._clock = clock
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self.producers = bk.ProducerStateTable()
        #: everything below this offset is on stable storage
        self.flushed_offset = 0
        self.recovery: RecoveryReport | None = None
        self.last_epoch = -1
        #: which leader epoch wrote which offsets (replica divergence uses it)
        self.epochs = LeaderEpochCache(directory) if directory.exists() else None
        #: bumped by every truncate_to; sync targets captured before one are stale
        self.truncations = 0
        #: ``_recovery_key`` of the recovery point this process last wrote (None: none yet)
        self._checkpointed: tuple[int, ...] | None = None
        #: guards what the fsync thread shares with the loop: the segment list, which
        #: segments are lent out or retired, index files, ``truncations`` and the
        #: recovery-point file (see the module docstring)
        self._lock = threading.Lock()
        self._closed = False
        #: set when an fdatasync of this log's data failed. The kernel may have dropped
        #: the dirty pages and marked them clean, so a later fdatasync that succeeds
        #: proves nothing (PostgreSQL's "fsyncgate"). From then on the log takes no
        #: appends and never counts data as durable again; a broker restart recovers
        #: from what is really on disk and catches up from the replicas.
        self.sync_failure: StorageError | None = None

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        directory: Path,
        config: bk.LogConfig,
        clock: Callable[[], int] = wall_clock_ms,
        *,
        initial_offset: int = 0,
        syncs: files.DirectorySyncs | None = None,
    ) -> PartitionLog:
        """Open (creating if needed) and recover the log in ``directory``.

        ``initial_offset`` is where a brand-new log starts (a moved partition
        continues its offsets); an existing log ignores it. ``syncs``: the
        directory fsyncs a brand-new log owes (its directory's entry, its first
        segment's entries) are added to it rather than done here, so that a
        broker creating thousands of partitions syncs them together; the log
        is durable once the caller has flushed it, and must not take appends before.
        """
        if config.fsync is bk.FsyncPolicy.NONE:
            directory.mkdir(parents=True, exist_ok=True)
        else:
            # synced segments are no use in a lost directory
            files.mkdir_durable(directory, syncs)
        log = cls(directory, config, clock)
        log._recover(initial_offset, syncs)
        return log

    def _recover(self, initial_offset: int, syncs: files.DirectorySyncs | None = None) -> None:
        started = time.monotonic()
        names = os.listdir(self.directory)
        for name in names:
            if name.startswith(f"{RECOVERY_POINT_FILE}.") and name.endswith(".tmp"):
                # a recovery point that was never committed
                (self.directory / name).unlink(missing_ok=True)
        bases = sorted(b for b in map(bk.parse_segment_file_name, names) if b is not None)
        if not bases:
            self._new_segment(initial_offset, syncs)
            self.flushed_offset = initial_offset
            if RECOVERY_POINT_FILE not in names:
                # Recovering this directory as it is (one empty segment, no recovery
                # point) gives this log back exactly, so it owes no recovery point until
                # it changes: 10,000 new partitions need not write 10,000 of them, three
                # fsyncs each.
                self._checkpointed = self._recovery_key()
            self.recovery = RecoveryReport(initial_offset, 0, 0, False, time.monotonic() - started)
            return
        checkpoint = self._read_checkpoint()
        now = self._clock()
        for base in bases:
            self._append_segment(Segment(self.directory, base, self.config, now))
        # Segments wholly before the checkpoint are trusted; the rest are scanned.
        start_idx, start_pos, expected = 0, 0, bases[0]
        used_checkpoint = False
        if checkpoint is not None and checkpoint["segment"] in self._bases:
            idx = self._bases.index(checkpoint["segment"])
            seg = self._segments[idx]
            if checkpoint["position"] <= seg.size:
                start_idx, start_pos, expected = idx, checkpoint["position"], checkpoint["offset"]
                used_checkpoint = True
                self.producers.restore(checkpoint.get("producers", {}))
                self.last_epoch = int(checkpoint.get("epoch", -1))
        for seg in self._segments[:start_idx]:
            seg.load_index()
            nxt, max_ts, epoch = seg.tail_after_index()
            seg.stats.next_offset = nxt
            seg.stats.max_timestamp = max_ts
            self.last_epoch = max(self.last_epoch, epoch)
        scanned = 0
        truncated = 0
        cut = False
        for idx in range(start_idx, len(self._segments)):
            seg = self._segments[idx]
            if cut:
                truncated += seg.size
                seg.delete()
                continue
            pos = start_pos if idx == start_idx else 0
            if idx == start_idx and pos > 0:
                seg.load_index()
                # The bytes before the checkpoint are trusted, not rescanned; take
                # their newest timestamp from the tail after the index, as for the
                # older segments (age-based retention skips a segment without one).
                seg.index.truncate_after(pos)
                _, seg.stats.max_timestamp, _ = seg.tail_after_index(end=pos)
            if seg.base_offset != expected and pos == 0:
                # A gap between segments: nothing after it can be trusted.
                truncated += seg.size
                seg.delete()
                cut = True
                continue
            before = seg.size
            nxt, cut_bytes, headers = seg.recover_from(pos, expected, self.last_epoch)
            scanned += before - pos
            truncated += cut_bytes
            for h in headers:
                self.producers.record(
                    h.producer_id, h.base_sequence, h.record_count, h.base_offset, now
                )
                self.last_epoch = max(self.last_epoch, h.leader_epoch)
                self._note_epoch(h.leader_epoch, h.base_offset)
            expected = nxt
            if cut_bytes:
                cut = True
        self._segments = [s for s in self._segments if s.path.exists()]
        self._bases = [s.base_offset for s in self._segments]
        if not self._segments:
            self._new_segment(expected)
        self.flushed_offset = self.next_offset
        if self.epochs is not None:
            self.epochs.truncate_from(self.next_offset)
        self.recovery = RecoveryReport(
            self.next_offset, scanned, truncated, used_checkpoint, time.monotonic() - started
        )
        if truncated:
            for seg in self._segments:
                seg.sync()
            self.write_checkpoint(self.sync_target())

    def _read_checkpoint(self) -> dict[str, Any] | None:
        path = self.directory / RECOVERY_POINT_FILE
        try:
            raw = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(raw, dict) or not all(
            k in raw for k in ("offset", "segment", "position")
        ):
            return None
        return raw

    # ------------------------------------------------------------------ segments

    def _append_segment(self, seg: Segment) -> None:
        with self._lock:
            self._segments.append(seg)
            self._bases.append(seg.base_offset)

    def _retire(self, seg: Segment, *, unlink: bool) -> None:
        """With ``_lock`` held: the log is done with ``seg`` (already off the list, or closing).

        Its files go at once, so a new segment at the same base offset gets a new
        file; its descriptors close now, or when the last borrower gives it back.
        """
        if unlink:
            seg.unlink()
        if seg.retired:
            return
        seg.retired = True
        if seg.borrowers == 0:
            seg.close()

    def _borrow(self, segments: Iterable[Segment]) -> tuple[Segment, ...]:
        """With ``_lock`` held: lend the segments still in use to a thread off the loop."""
        lent = tuple(s for s in segments if not s.retired)
        for seg in lent:
            seg.borrowers += 1
        return lent

    def _give_back_locked(self, segments: Iterable[Segment]) -> None:
        for seg in segments:
            seg.borrowers -= 1
            if seg.retired and seg.borrowers == 0:
                seg.close()

    def _give_back(self, segments: Iterable[Segment]) -> None:
        with self._lock:
            self._give_back_locked(segments)

    def _new_segment(self, base_offset: int, syncs: files.DirectorySyncs | None = None) -> Segment:
        seg = Segment(self.directory, base_offset, self.config, self._clock())
        self._append_segment(seg)
        if syncs is None:
            files.fsync_directory(self.directory)
        else:
            syncs.add(self.directory)
        return seg

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def next_offset(self) -> int:
        """The log end offset (LEO): the offset the next record will get."""
        return self._segments[-1].stats.next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def roll(self) -> None:
        old = self.active
        with self._lock:  # a checkpoint may be writing the same index file
            old.write_index()
        if self.config.fsync is not bk.FsyncPolicy.NONE:
            old.sync_index()
        self._new_segment(self.next_offset)

    # ------------------------------------------------------------------ appending

    def append(
        self, batch: bytes | memoryview, header: rb.BatchHeader, leader_epoch: int
    ) -> AppendResult:
        """Stamp and append a validated batch. Idempotent for producer retries."""
        self._check_writable()  # before dedup: a retry must not be acked off a failed log
        verdict, dup_offset = self.producers.check(
            header.producer_id, header.base_sequence, header.record_count
        )
        if verdict is bk.SequenceVerdict.DUPLICATE:
            return AppendResult(dup_offset, duplicate=True)
        if verdict is bk.SequenceVerdict.OUT_OF_ORDER:
            raise OutOfOrderSequence(
                f"producer {header.producer_id} sent sequence {header.base_sequence}, out of order"
            )
        now = self._clock()
        if bk.should_roll(self.active.stats, header.size, now, self.config):
            self.roll()
        base = self.next_offset
        prefix = rb.stamp_prefix(header, base, leader_epoch)
        self.active.append(prefix, memoryview(batch), header, base)
        self.producers.record(
            header.producer_id, header.base_sequence, header.record_count, base, now
        )
        self.last_epoch = max(self.last_epoch, leader_epoch)
        self._note_epoch(leader_epoch, base)
        return AppendResult(base)

    def _check_writable(self) -> None:
        if self.sync_failure is not None:
            raise StorageError(
                f"{self.directory}: no writes after a failed fdatasync ({self.sync_failure.message});"
                " restart the broker to recover from disk"
            )

    def _note_epoch(self, epoch: int, base_offset: int) -> None:
        if self.epochs is not None and epoch > self.epochs.latest_epoch:
            self.epochs.assign(epoch, base_offset)

    def append_stamped(self, data: bytes | memoryview) -> int:
        """Append batches that already carry their offsets (replication). Returns the new LEO."""
        self._check_writable()
        now = self._clock()
        expected = self.next_offset
        max_ts = -1
        first = -1
        for _, header in rb.scan(data):
            if header.base_offset != expected:
                raise StorageError(
                    f"replicated batch at {header.base_offset}, log end is {expected}"
                )
            if first < 0:
                first = header.base_offset
            expected = header.next_offset
            max_ts = max(max_ts, header.max_timestamp)
            self.producers.record(
                header.producer_id,
                header.base_sequence,
                header.record_count,
                header.base_offset,
                now,
            )
            self.last_epoch = max(self.last_epoch, header.leader_epoch)
            self._note_epoch(header.leader_epoch, header.base_offset)
        if first < 0:
            return self.next_offset
        if bk.should_roll(self.active.stats, len(data), now, self.config):
            self.roll()
        self.active.append_raw(data, first, expected, max_ts)
        return expected

    # ------------------------------------------------------------------ reading

    def read(
        self,
        offset: int,
        max_bytes: int,
        upper_bound: int | None = None,
        hint: ReadPosition | None = None,
    ) -> tuple[bytes | memoryview, ReadPosition | None]:
        """Whole batches starting with the one that holds ``offset``.

        Stops before ``max_bytes`` (but returns at least one batch, so a reader
        always progresses) and before any batch at or above ``upper_bound``
        (the high watermark for committed reads). Returns the bytes and where a
        sequential reader continues. Bytes cut short of what was read come as a
        view of the read (a lagging follower's every fetch is cut at a batch
        boundary: slicing would copy up to ``max_bytes`` again).
        """
        bound = self.next_offset if upper_bound is None else min(upper_bound, self.next_offset)
        if offset >= bound or offset < self.log_start_offset:
            return b"", hint
        seg: Segment | None = None
        position: int | None = None
        if hint is not None and hint.offset == offset:
            i = bisect.bisect_left(self._bases, hint.segment_base)
            if i < len(self._bases) and self._bases[i] == hint.segment_base:
                seg = self._segments[i]
                position = hint.position if hint.position < seg.size else None
        if seg is None or position is None:
            i = bisect.bisect_right(self._bases, offset) - 1
            seg = self._segments[i]
            position = seg.find_batch(offset)
            if position is None:
                if i + 1 < len(self._segments):
                    seg = self._segments[i + 1]
                    position = seg.find_batch(offset)
                if position is None:
                    return b"", hint
        data = seg.read(position, min(max_bytes, seg.size - position))
        end = 0
        last_next = offset
        if bound >= seg.stats.next_offset:
            end = rb.complete_prefix_length(data)
            if end:
                tail = rb.read_header(data, self._last_batch_start(data, end))
                last_next = tail.next_offset
        else:
            for pos, header in rb.scan(data):
                if header.base_offset >= bound:
                    break
                end = pos + header.size
                last_next = header.next_offset
        if end == 0:
            header = rb.read_header(seg.read(position, rb.HEADER_SIZE))
            if header.base_offset >= bound:
                return b"", hint
            data = seg.read(position, header.size)
            end = header.size
            last_next = header.next_offset
        return memoryview(data)[:end] if end < len(data) else data, ReadPosition(
            seg.base_offset, position + end, last_next
        )

    @staticmethod
    def _last_batch_start(data: bytes, end: int) -> int:
        pos = 0
        last = 0
        while pos < end:
            last = pos
            _, length = rb.PREFIX.unpack_from(data, pos)
            pos += length + rb.LENGTH_OVERHEAD
        return last

    # ------------------------------------------------------------------ durability

    def sync_target(self, *, for_checkpoint: bool = True) -> SyncTarget:
        """Capture, on the loop, what the next fdatasync round will make durable.

        The producer-state snapshot is only needed when the round ends in a
        recovery point; skipping it keeps fsync=always rounds cheap.
        """
        dirty = tuple(s for s in self._segments if s.dirty)
        for s in dirty:
            s.dirty = False
        active = self.active
        producers = self.producers.snapshot() if for_checkpoint else {}
        return SyncTarget(
            dirty,
            self.next_offset,
            active.base_offset,
            active.size,
            producers,
            for_checkpoint,
            self.last_epoch,
            self.truncations,
        )

    def sync(self, target: SyncTarget) -> None:
        """The slow part: runs on a worker thread.

        A segment retired since the capture is skipped: it was deleted, or the
        log was closed, and nothing will read it from this log again. After a
        failed fdatasync nothing is synced again (see ``sync_failure``).
        """
        if self.sync_failure is not None:
            raise StorageError(
                f"{self.directory}: not synced again after a failed fdatasync"
                f" ({self.sync_failure.message})"
            )
        with self._lock:
            segments = self._borrow(target.segments)
        try:
            for seg in segments:
                seg.sync()
        except StorageError as exc:
            self.sync_failure = exc  # sticky: see the attribute
            raise
        finally:
            self._give_back(segments)

    def mark_synced(self, target: SyncTarget) -> None:
        if self.sync_failure is not None:
            return  # nothing of this log is known durable beyond what already was
        if target.truncations != self.truncations:
            return  # captured before a truncation: its offset may be above records not synced
        if target.offset > self.flushed_offset:
            self.flushed_offset = target.offset

    def _recovery_key(self) -> tuple[int, ...]:
        active = self.active
        start = self._segments[0].base_offset
        return (self.next_offset, active.base_offset, active.size, self.last_epoch,
                self.truncations, start)  # fmt: skip

    def checkpoint_current(self) -> bool:
        """Whether the recovery point this process last wrote still describes the log (on
        the loop): an idle partition's is not rewritten every interval."""
        return self._checkpointed is not None and self._checkpointed == self._recovery_key()

    def write_checkpoint(self, target: SyncTarget) -> None:
        """Record the recovery point of an already-synced target (atomic replace).

        Runs on the fsync thread or on the loop. Three steps: under the lock,
        borrow the segments, write their index entries and create a temporary
        file; without it, write and fsync the document and fdatasync the
        indexes; under the lock again, replace the recovery point unless a
        truncation or a close came in between (the target may now name a
        position inside other batches, or a directory being removed).

        Not ``headrace.files.atomic_writer``: that creates, writes and renames in
        one step, while here the temporary file must be created under the lock
        and the rename is conditional and under it again. Only the directory
        fsync is shared.
        """
        if not target.checkpointable:
            raise ValueError("this sync target skipped the producer snapshot")
        path = self.directory / RECOVERY_POINT_FILE
        with self._lock:
            if self._closed or target.truncations != self.truncations:
                return  # stale: its position may now lie inside other batches
            segments = self._borrow(self._segments)
            log_start_offset = segments[0].base_offset
            key = (target.offset, target.segment_base, target.position, target.epoch,
                   target.truncations, log_start_offset)  # fmt: skip
            try:
                # Page-cache writes under the lock: truncate_to cuts index files under
                # it too, so no entry it drops is written back after the cut.
                for seg in segments:
                    seg.write_index()
                # Created here so that no file appears in the directory once close()
                # has returned (the partition's directory is removed next).
                fd, tmp_name = tempfile.mkstemp(
                    prefix=f"{RECOVERY_POINT_FILE}.", suffix=".tmp", dir=self.directory
                )
            except BaseException as exc:
                self._give_back_locked(segments)
                if isinstance(exc, OSError):
                    raise StorageError(
                        f"cannot write recovery point in {self.directory}: {exc}"
                    ) from exc
                raise
        tmp = Path(tmp_name)
        committed = False
        doc = {
            "offset": target.offset,
            "segment": target.segment_base,
            "position": target.position,
            # the epoch at the target, not now: batches after the target's position
            # but before a later epoch bump still carry the older epoch
            "epoch": target.epoch,
            "log_start_offset": log_start_offset,
            "producers": target.producers,
            "written_ms": self._clock(),
        }
        try:
            with open(fd, "w") as fh:
                os.fchmod(fd, 0o644)  # as open() would have made it; mkstemp makes 0600
                json.dump(doc, fh)
                fh.flush()
                os.fsync(fh.fileno())
            for seg in segments:
                seg.sync_index()
            with self._lock:
                if self._closed or target.truncations != self.truncations:
                    return
                os.replace(tmp, path)
                committed = True
                self._checkpointed = key
            files.fsync_directory(self.directory)
        except OSError as exc:
            if committed and self._closed and isinstance(exc, FileNotFoundError):
                return  # closed and removed after the replace: nothing left to make durable
            raise StorageError(f"cannot write recovery point in {self.directory}: {exc}") from exc
        finally:
            if not committed:
                tmp.unlink(missing_ok=True)
            self._give_back(segments)

    # ------------------------------------------------------------------ maintenance

    def retention_due(self) -> bool:
        """Whether retention could delete a segment if the object store held everything:
        when not, there is no need to ask the store (a manifest read per
        partition every check was an idle cost in proportion to the partitions)."""
        if len(self._segments) < 2:
            return False  # the active segment is never deleted
        stats = [s.stats for s in self._segments]
        return bool(bk.segments_to_delete(stats, self._clock(), self.config))

    def apply_retention(self, upload_floor: int | None = None) -> list[int]:
        """Delete whole segments that retention allows; returns their base offsets."""
        doomed = bk.segments_to_delete(
            [s.stats for s in self._segments], self._clock(), self.config, upload_floor=upload_floor
        )
        with self._lock:
            for base in doomed:
                seg = self._segments.pop(0)
                self._bases.pop(0)
                assert seg.base_offset == base
                self._retire(seg, unlink=True)
        return doomed

    def reset_to(self, offset: int) -> None:
        """Drop the whole local log and continue empty at ``offset``.

        For a follower whose log end is below its leader's log start (it was away
        longer than retention, or its disk was wiped): nothing it holds can be
        reconciled, and the records it lacks no longer exist anywhere.
        """
        with self._lock:
            for seg in self._segments:
                self._retire(seg, unlink=True)
            self._segments = []
            self._bases = []
            self.truncations += 1
        self._new_segment(offset)
        self.producers = bk.ProducerStateTable()
        if self.epochs is not None:
            self.epochs.truncate_from(-1)
        self.last_epoch = -1
        self.flushed_offset = offset
        self.write_checkpoint(self.sync_target())

    def truncate_to(self, offset: int) -> None:
        """Drop every record at or after ``offset`` (replica divergence, seal rollback).

        Ends with a fresh recovery point: the old one names a position that the
        next appends may fill with different batches.
        """
        if offset >= self.next_offset:
            return
        with self._lock:
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                self._retire(self._segments.pop(), unlink=True)
                self._bases.pop()
            seg = self.active
            if offset <= seg.base_offset:
                seg.truncate(0, seg.base_offset)
            else:
                # None: ``offset`` is this segment's end (the later segments are gone)
                position = seg.find_batch(offset)
                if position is not None:
                    header = rb.read_header(seg.read(position, rb.HEADER_SIZE))
                    if header.base_offset != offset:
                        raise StorageError(
                            f"offset {offset} is inside a batch; truncate at a batch boundary"
                        )
                    seg.truncate(position, offset)
            self.truncations += 1
        self.producers.forget_from(offset)
        if self.epochs is not None:
            self.epochs.truncate_from(offset)
            self.last_epoch = self.epochs.latest_epoch
        self.flushed_offset = min(self.flushed_offset, offset)
        target = self.sync_target()
        self.sync(target)
        self.mark_synced(target)
        self.write_checkpoint(target)

    def close(self) -> None:
        """Close every segment; one lent to the fsync thread closes when it comes back.

        Never waits for that thread. Once this returns no thread creates a file
        in the directory, so the caller may remove it.
        """
        with self._lock:
            self._closed = True
            for seg in self._segments:
                self._retire(seg, unlink=False)
