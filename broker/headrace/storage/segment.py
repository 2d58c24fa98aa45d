"""One segment of a partition log: a ``.log`` file of batches and its ``.index``.

Only ``PartitionLog`` touches segments. A segment is append-only except for
``truncate``, which recovery and replica divergence use to cut a tail. Off the
event loop a segment's descriptors are used only while the log has lent it
out (``borrowers``); the log closes a retired segment when the last borrower
gives it back.

Only the ``.log`` file stays open. The index lives in memory and reaches its
file at checkpoints, recovery and truncation, each of which opens the file for
that one operation: a descriptor per partition instead of two, so 10,000
partitions fit a 20,000-descriptor limit. An index file that is
gone when a checkpoint gets to it belonged to a deleted segment: there is
nothing left to make durable.
"""

from __future__ import annotations

import os
from pathlib import Path

from headrace.errors import CorruptBatch, StorageError
from headrace.records import batch as rb
from headrace.storage.bookkeeping import (
    INDEX_ENTRY,
    LogConfig,
    SegmentStats,
    SparseIndex,
    index_file_name,
    segment_file_name,
)

#: bytes read per step when scanning for a batch boundary or recovering
SCAN_CHUNK = 1024 * 1024


class Segment:
    __slots__ = (
        "_fd",
        "borrowers",
        "directory",
        "dirty",
        "index",
        "index_path",
        "path",
        "retired",
        "stats",
    )

    def __init__(
        self, directory: Path, base_offset: int, config: LogConfig, created_ms: int
    ) -> None:
        self.directory = directory
        self.path = directory / segment_file_name(base_offset)
        self.index_path = directory / index_file_name(base_offset)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            os.close(os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644))
        except OSError as exc:
            raise StorageError(f"cannot open segment {self.path}: {exc}") from exc
        size = os.fstat(self._fd).st_size
        self.stats = SegmentStats(base_offset, base_offset, size, created_ms)
        self.index = SparseIndex(base_offset, config.index_interval_bytes)
        self.dirty = False
        #: threads using the descriptors off the loop (see ``PartitionLog``'s lock)
        self.borrowers = 0
        #: the log dropped this segment; the last borrower closes the descriptors
        self.retired = False

    @property
    def base_offset(self) -> int:
        return self.stats.base_offset

    @property
    def size(self) -> int:
        return self.stats.size

    # ------------------------------------------------------------------ writing

    def append(
        self, prefix: bytes, body: memoryview, header: rb.BatchHeader, base_offset: int
    ) -> int:
        """Write a stamped batch (``prefix`` + ``body[16:]``) at the end; returns its position."""
        position = self.stats.size
        total = header.size
        try:
            # Positional write at the tracked end: never depends on the fd's file offset.
            written = os.pwritev(self._fd, [prefix, body[16:total]], position)
        except (OSError, ValueError) as exc:  # ValueError: closed (fd -1)
            self._undo(position)
            raise StorageError(f"write to {self.path} failed: {exc}") from exc
        if written != total:
            self._undo(position)
            raise StorageError(f"short write to {self.path}: {written} of {total} bytes")
        self.index.on_append(base_offset, position, total)
        self.stats.size = position + total
        self.stats.next_offset = base_offset + header.record_count
        if header.max_timestamp > self.stats.max_timestamp:
            self.stats.max_timestamp = header.max_timestamp
        self.dirty = True
        return position

    def append_raw(
        self, data: bytes | memoryview, first_base: int, next_offset: int, max_ts: int
    ) -> None:
        """Append already-stamped batches verbatim (replication, unload restore)."""
        position = self.stats.size
        try:
            written = os.pwrite(self._fd, data, position)
        except (OSError, ValueError) as exc:  # ValueError: closed (fd -1)
            self._undo(position)
            raise StorageError(f"write to {self.path} failed: {exc}") from exc
        if written != len(data):
            self._undo(position)
            raise StorageError(f"short write to {self.path}")
        for pos, header in rb.scan(data):
            self.index.on_append(header.base_offset, position + pos, header.size)
        self.stats.size = position + len(data)
        self.stats.next_offset = next_offset
        self.stats.max_timestamp = max(self.stats.max_timestamp, max_ts)
        self.dirty = True
        del first_base

    def _undo(self, position: int) -> None:
        try:
            os.ftruncate(self._fd, position)
        except OSError:
            pass

    def sync(self) -> None:
        """fdatasync the log file. Off the loop only while borrowed from the log."""
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            raise StorageError(f"fdatasync of {self.path} failed: {exc}") from exc

    def write_index(self) -> None:
        """Write the index entries not yet in the ``.index`` file (page cache only)."""
        start = self.index.persisted_entries
        raw, count = self.index.unpersisted()
        if not raw:
            return
        try:
            fd = os.open(self.index_path, os.O_RDWR)
        except FileNotFoundError:
            return  # the segment was deleted meanwhile
        except OSError as exc:
            raise StorageError(f"cannot open {self.index_path}: {exc}") from exc
        try:
            os.pwrite(fd, raw, start * INDEX_ENTRY.size)
        except OSError as exc:
            raise StorageError(f"write to {self.index_path} failed: {exc}") from exc
        finally:
            os.close(fd)
        self.index.mark_persisted(count)

    def sync_index(self) -> None:
        """fdatasync the index file (through a descriptor of its own: the data is the file's)."""
        try:
            fd = os.open(self.index_path, os.O_RDONLY)
        except FileNotFoundError:
            return  # the segment was deleted meanwhile
        except OSError as exc:
            raise StorageError(f"cannot open {self.index_path}: {exc}") from exc
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise StorageError(f"fdatasync of {self.index_path} failed: {exc}") from exc
        finally:
            os.close(fd)

    def _cut_index_file(self) -> None:
        """Make the ``.index`` file as long as the in-memory index's entries (on the loop)."""
        fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, len(self.index) * INDEX_ENTRY.size)
        finally:
            os.close(fd)

    def truncate(self, position: int, next_offset: int) -> None:
        """Cut the segment at ``position`` (a batch boundary)."""
        try:
            os.ftruncate(self._fd, position)
            self.index.truncate_after(position)
            self._cut_index_file()
        except OSError as exc:
            raise StorageError(f"truncate of {self.path} failed: {exc}") from exc
        self.stats.size = position
        self.stats.next_offset = next_offset
        self.dirty = True

    # ------------------------------------------------------------------ reading

    def read(self, position: int, length: int) -> bytes:
        try:
            return os.pread(self._fd, length, position)
        except (OSError, ValueError) as exc:  # ValueError: closed (fd -1)
            raise StorageError(f"read of {self.path} failed: {exc}") from exc

    def find_batch(self, offset: int) -> int | None:
        """Position of the batch that holds ``offset``, or None if past the end."""
        if offset >= self.stats.next_offset:
            return None
        position = self.index.lookup(offset)
        while position < self.stats.size:
            chunk = self.read(position, min(SCAN_CHUNK, self.stats.size - position))
            advanced = False
            for pos, header in rb.scan(chunk):
                if header.next_offset > offset:
                    return position + pos
                advanced = True
                last_end = pos + header.size
            if not advanced:
                # one batch bigger than the chunk: read just its header
                header = rb.read_header(chunk)
                if header.next_offset > offset:
                    return position
                position += header.size
            else:
                position += last_end
        return None

    # ------------------------------------------------------------------ recovery

    def load_index(self) -> None:
        try:
            raw = self.index_path.read_bytes()
        except FileNotFoundError:
            raw = b""  # rebuilt by the recovery scan
        self.index.load(raw, self.stats.size)

    def recover_from(
        self, position: int, expected_offset: int, min_epoch: int
    ) -> tuple[int, int, list[rb.BatchHeader]]:
        """Validate every batch from ``position``; cut the file at the first bad one.

        A batch is good when its header is sane, its CRC matches, its base
        offset continues the sequence and its leader epoch does not go back.
        Returns (next offset, bytes truncated, headers of the good batches).
        """
        size = os.fstat(self._fd).st_size
        self.stats.size = size
        good: list[rb.BatchHeader] = []
        self.index.truncate_after(position)
        # Entries past the scan start are rebuilt below; stale ones must not outlive them on disk.
        self._cut_index_file()
        next_offset = expected_offset
        epoch = min_epoch
        pos = position
        while pos < size:
            chunk = self.read(pos, min(max(SCAN_CHUNK, 64), size - pos))
            if len(chunk) < rb.HEADER_SIZE:
                break
            header = rb.read_header(chunk)
            if header.size > len(chunk):
                if pos + header.size > size or header.size < rb.HEADER_SIZE:
                    break
                chunk = self.read(pos, header.size)
            consumed = 0
            stop = False
            for rel, hdr in rb.scan(chunk):
                try:
                    rb.check_header(hdr)
                except CorruptBatch:
                    stop = True
                    break
                if (
                    hdr.base_offset != next_offset
                    or hdr.leader_epoch < epoch
                    or not rb.crc_ok(chunk, hdr, rel)
                ):
                    stop = True
                    break
                self.index.on_append(hdr.base_offset, pos + rel, hdr.size)
                next_offset = hdr.next_offset
                epoch = hdr.leader_epoch
                self.stats.max_timestamp = max(self.stats.max_timestamp, hdr.max_timestamp)
                good.append(hdr)
                consumed = rel + hdr.size
            pos += consumed
            if stop or consumed == 0:
                break
        truncated = size - pos
        if truncated:
            self.truncate(pos, next_offset)
        self.stats.size = pos
        self.stats.next_offset = next_offset
        return next_offset, truncated, good

    def tail_after_index(self, end: int | None = None) -> tuple[int, int, int]:
        """Scan from the last index entry to ``end`` (default: the end) of trusted bytes.

        Returns (next offset, max timestamp of scanned batches, last leader epoch).
        """
        position = self.index.last_position()
        stop = self.stats.size if end is None else end
        next_offset = self.stats.base_offset
        max_ts = -1
        epoch = -1
        while position < stop:
            chunk = self.read(position, min(SCAN_CHUNK, stop - position))
            consumed = 0
            for rel, header in rb.scan(chunk):
                next_offset = header.next_offset
                max_ts = max(max_ts, header.max_timestamp)
                epoch = header.leader_epoch
                consumed = rel + header.size
            if consumed == 0:
                header = rb.read_header(chunk)
                next_offset = header.next_offset
                max_ts = max(max_ts, header.max_timestamp)
                epoch = header.leader_epoch
                consumed = header.size
            position += consumed
        return next_offset, max_ts, epoch

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the log file. Idempotent: a second close must not hit a reused descriptor."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            os.close(fd)
        except OSError:
            pass

    def unlink(self) -> None:
        """Remove both files; open descriptors stay usable until closed."""
        for path in (self.path, self.index_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def delete(self) -> None:
        self.close()
        self.unlink()
