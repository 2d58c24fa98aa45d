"""Segment object contents: checking the batches, and the sparse index object (pure).

An uploaded segment object is whole stamped batches, byte for byte as the
broker stores them (docs/storage-format.md): nothing is re-encoded, so a
reader returns ranges of the object as they are. ``summarize`` checks such a
buffer before anything is uploaded and builds its sparse index.

The index object lets a reader find the batch that holds an offset with one
small GET instead of scanning the object from its start. Its layout, every
integer little-endian::

    off size field
    0   4    magic         b"HRSX"
    4   2    format        u16 = 1
    6   2    reserved      u16 = 0
    8   8    base_offset   u64  first offset of the segment object
    16  8    last_offset   u64  last offset of the segment object
    24  8    object_size   u64  bytes in the segment object
    32  4    entry_count   u32
    36  4    crc           u32  CRC-32 (zlib) over bytes [0, 36) and the entries
    40  16n  entries       (offset u64, position u64) * entry_count

Entry ``(offset, position)``: a batch whose base offset is ``offset`` starts at
byte ``position`` of the segment object. The first entry is always
``(base_offset, 0)``; after it, one entry for the first batch that starts at
least ``interval`` bytes after the previous entry (256 KiB by default: a 16 MiB
object gets ~64 entries, 1 KiB of index, and a reader scans at most one
interval of batch headers). The index is only a shortcut: a reader that finds
it missing or damaged starts from position 0 instead.
"""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_right
from dataclasses import dataclass
from typing import Final

from headrace.errors import CorruptBatch
from headrace.records import batch as rb

MAGIC: Final = b"HRSX"
FORMAT: Final = 1
#: magic 4s, format u16, reserved u16, base_offset u64, last_offset u64,
#: object_size u64, entry_count u32 (the CRC follows, separately)
HEAD: Final = struct.Struct("<4sHHQQQI")
CRC: Final = struct.Struct("<I")
HEAD_SIZE: Final = HEAD.size + CRC.size  # 40
#: offset u64, position u64
ENTRY: Final = struct.Struct("<QQ")
#: the largest offset the batch format can hold
MAX_OFFSET: Final = 2**64 - 1
#: default spacing of index entries, in bytes of segment object
DEFAULT_INTERVAL: Final = 256 << 10


class InvalidIndex(ValueError):
    """An index object is damaged or belongs to another segment object."""


@dataclass(frozen=True, slots=True)
class SparseIndex:
    """Batch start positions of one segment object, sorted by offset."""

    base: int
    last: int
    size: int
    offsets: tuple[int, ...]
    positions: tuple[int, ...]

    @classmethod
    def trivial(cls, base: int, last: int, size: int) -> SparseIndex:
        """The index every object has without an index object: its first batch."""
        return cls(base, last, size, (base,), (0,))

    def floor(self, offset: int) -> tuple[int, int]:
        """``(base offset, position)`` of the last indexed batch starting at or
        before ``offset``: where a scan for ``offset`` begins."""
        i = max(0, bisect_right(self.offsets, offset) - 1)
        return self.offsets[i], self.positions[i]

    def encode(self) -> bytes:
        entries = b"".join(
            ENTRY.pack(o, p) for o, p in zip(self.offsets, self.positions, strict=True)
        )
        head = HEAD.pack(MAGIC, FORMAT, 0, self.base, self.last, self.size, len(self.offsets))
        return head + CRC.pack(zlib.crc32(entries, zlib.crc32(head))) + entries

    @classmethod
    def decode(cls, raw: bytes, base: int, last: int, size: int) -> SparseIndex:
        """Parse an index object that must describe the object ``base..last`` of
        ``size`` bytes; ``InvalidIndex`` if it is damaged or describes another."""
        if len(raw) < HEAD_SIZE:
            raise InvalidIndex(f"index of {len(raw)} bytes is shorter than its header")
        magic, fmt, _, i_base, i_last, i_size, count = HEAD.unpack_from(raw, 0)
        if magic != MAGIC or fmt != FORMAT:
            raise InvalidIndex(f"not an index object (magic {magic!r}, format {fmt})")
        (crc,) = CRC.unpack_from(raw, HEAD.size)
        entries = memoryview(raw)[HEAD_SIZE:]
        if len(entries) != count * ENTRY.size:
            raise InvalidIndex(f"index says {count} entries, holds {len(entries)} bytes of them")
        if zlib.crc32(entries, zlib.crc32(memoryview(raw)[: HEAD.size])) != crc:
            raise InvalidIndex("index CRC mismatch")
        if (i_base, i_last, i_size) != (base, last, size):
            raise InvalidIndex(
                f"index describes {i_base}..{i_last} ({i_size} bytes), not {base}..{last}"
                f" ({size} bytes)"
            )
        offsets: list[int] = []
        positions: list[int] = []
        for o, p in ENTRY.iter_unpack(entries):
            if offsets and (o <= offsets[-1] or p <= positions[-1]):
                raise InvalidIndex("index entries are not increasing")
            offsets.append(o)
            positions.append(p)
        if not offsets or offsets[0] != base or positions[0] != 0:
            raise InvalidIndex("index does not start at the object's first batch")
        if offsets[-1] > last or positions[-1] >= size:
            raise InvalidIndex("index entry points past the object")
        return cls(base, last, size, tuple(offsets), tuple(positions))


@dataclass(frozen=True, slots=True)
class Summary:
    """What ``summarize`` found in a buffer of batches."""

    base: int
    last: int
    size: int
    index: SparseIndex
    #: the largest record timestamp of any batch, ms since the Unix epoch (retention by age)
    max_timestamp: int = -1


def summarize(data: bytes | bytearray | memoryview, interval: int = DEFAULT_INTERVAL) -> Summary:
    """Check that ``data`` is whole, intact batches with contiguous offsets and
    build its sparse index; ``CorruptBatch`` names the first problem.

    Checks every header (``check_header``), every CRC, that each batch starts
    at the offset after the previous one's last, and that nothing follows the
    last complete batch.
    """
    if interval < 1:
        raise ValueError("index interval must be >= 1 byte")
    view = memoryview(data)
    end = len(view)
    if end == 0:
        raise CorruptBatch("no batches to upload")
    offsets: list[int] = []
    positions: list[int] = []
    expected = -1  # the offset the next batch must start at; -1 before the first
    consumed = 0  # bytes of whole batches checked so far
    max_timestamp = -1
    for pos, header in rb.scan(view):
        rb.check_header(header)
        if expected >= 0 and header.base_offset != expected:
            raise CorruptBatch(
                f"batch at byte {pos} starts at offset {header.base_offset},"
                f" expected {expected} (offsets must be contiguous)"
            )
        if not rb.crc_ok(view, header, pos):
            raise CorruptBatch(
                f"CRC mismatch in the batch at byte {pos} (offset {header.base_offset})"
            )
        if not positions or pos - positions[-1] >= interval:
            offsets.append(header.base_offset)
            positions.append(pos)
        expected = header.next_offset
        consumed = pos + header.size
        max_timestamp = max(max_timestamp, header.max_timestamp)
    if consumed != end:
        raise CorruptBatch(f"{end - consumed} bytes at byte {consumed} are not a complete batch")
    base = offsets[0]
    last = expected - 1
    if last > MAX_OFFSET:
        raise CorruptBatch(f"last offset {last} does not fit in 64 bits")
    sparse = SparseIndex(base, last, end, tuple(offsets), tuple(positions))
    return Summary(base, last, end, sparse, max_timestamp)
