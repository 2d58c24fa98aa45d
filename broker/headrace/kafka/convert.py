"""Our batches as Kafka v2 batches, for Kafka consumers (pure: bytes in, bytes out).

A Kafka fetch that reaches a batch our own producers wrote needs it in Kafka's
record format: varint-framed records, one after another. The broker builds
it from our columnar section with numpy, column by column, so the work per
batch is a fixed number of array operations whatever its record count: every
record's varints are written by one vectorised pass per varint byte, and the
key and value bytes are scattered to their places by one gather each. Only
record headers are re-encoded record by record (a header block is a
variable-length structure), and only for batches that carry them.

The result is uncompressed (attributes 0, create time), whatever codec the
batch was stored with: Kafka's codecs frame their payloads differently from
ours, and the consumer then has nothing to inflate. It carries no producer id
(-1): ours are not Kafka's, and a Kafka consumer has no use for them.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np
import numpy.typing as npt

from headrace.checksums import crc32c
from headrace.errors import CorruptBatch
from headrace.records import batch as rb
from headrace.records import codecs

#: Kafka's v2 batch header up to the CRC (base offset, length, epoch, magic) and after it
_BEFORE_CRC: Final = struct.Struct(">qiib")
_AFTER_CRC: Final = struct.Struct(">hiqqqhii")
_CRC: Final = struct.Struct(">I")
assert _BEFORE_CRC.size + _CRC.size + _AFTER_CRC.size == rb.KAFKA_HEADER_SIZE

#: a zigzag varint of a value below 2**35 is at most 5 bytes; every varint here is
#: (u32 lengths and timestamp deltas, i32 key lengths, record lengths below 2**32)
_MAX_VARINT: Final = 5

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]


def to_kafka(stored: bytes | memoryview) -> bytes:
    """One stored batch of ours (stamped, either byte order's prefix is ours) as the bytes
    of a Kafka v2 batch with the same base offset, leader epoch, records and timestamps.

    Raises ``CorruptBatch`` when the record section does not parse."""
    header = rb.read_header(stored)
    if header.magic != rb.MAGIC:
        raise CorruptBatch(f"not a headrace batch: magic {header.magic}")
    raw = memoryview(stored)[rb.HEADER_SIZE : header.size]
    section = np.frombuffer(
        codecs.decompress(header.compression, raw, header.section_length), dtype=np.uint8
    )
    records = _records(header, section)
    n = header.record_count
    after_crc = _AFTER_CRC.pack(
        0, n - 1, header.first_timestamp, header.max_timestamp, -1, -1, -1, n
    )
    covered = after_crc + records
    batch_length = rb.KAFKA_HEADER_SIZE - rb.LENGTH_OVERHEAD + len(records)
    return (
        _BEFORE_CRC.pack(header.base_offset, batch_length, header.leader_epoch, rb.KAFKA_MAGIC)
        + _CRC.pack(crc32c(covered))
        + covered
    )


def _records(header: rb.BatchHeader, section: U8) -> bytes:
    """Kafka's record section for our columnar ``section`` (inflated)."""
    n = header.record_count
    attrs = header.attributes
    pos = 0

    def column(dtype: str) -> I64:
        nonlocal pos
        if pos + 4 * n > len(section):
            raise CorruptBatch("record section is shorter than its length columns")
        values = section[pos : pos + 4 * n].view(dtype).astype(np.int64)
        pos += 4 * n
        return values

    deltas = column("<u4") if attrs & rb.ATTR_TIMESTAMPS else np.zeros(n, dtype=np.int64)
    key_lengths = column("<i4") if attrs & rb.ATTR_KEYS else np.full(n, -1, dtype=np.int64)
    value_lengths = column("<u4")
    header_lengths = column("<u4") if attrs & rb.ATTR_HEADERS else None
    key_sizes = np.maximum(key_lengths, 0)
    key_blob = section[pos : pos + int(key_sizes.sum())]
    pos += len(key_blob)
    value_blob = section[pos : pos + int(value_lengths.sum())]
    pos += len(value_blob)
    if header_lengths is None:
        # a record without headers ends with a header count of zero: one byte, 0
        tail_lengths = np.ones(n, dtype=np.int64)
        tail_blob = np.zeros(n, dtype=np.uint8)
    else:
        tails = _kafka_header_sections(section[pos:].tobytes(), header_lengths)
        tail_lengths = np.fromiter(map(len, tails), dtype=np.int64, count=n)
        tail_blob = np.frombuffer(b"".join(tails), dtype=np.uint8)
        pos = len(section)
    if (
        pos != len(section)
        or len(key_blob) != int(key_sizes.sum())
        or len(value_blob) != int(value_lengths.sum())
        or int(key_lengths.min()) < -1
    ):
        raise CorruptBatch("length columns disagree with the record section's size")

    offset_deltas = np.arange(n, dtype=np.int64)
    fields = [_Varints(_zigzag(v)) for v in (deltas, offset_deltas, key_lengths)]
    value_field = _Varints(_zigzag(value_lengths))
    # a record after its length: attributes (1), three varints, key, value length, value, tail
    body = (
        1
        + sum(f.sizes for f in fields)
        + key_sizes
        + value_field.sizes
        + value_lengths
        + tail_lengths
    )
    length_field = _Varints(_zigzag(body))
    sizes = length_field.sizes + body
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    out = np.zeros(int(sizes.sum()), dtype=np.uint8)
    at = length_field.put(out, starts) + 1  # attributes stay 0
    for field in fields:
        at = field.put(out, at)
    at = _scatter(out, at, key_blob, key_sizes)
    at = value_field.put(out, at)
    at = _scatter(out, at, value_blob, value_lengths)
    _scatter(out, at, tail_blob, tail_lengths)
    return out.tobytes()


def _zigzag(values: I64) -> I64:
    return (values << 1) ^ (values >> 63)


class _Varints:
    """One varint per record: their sizes, and how to write them. The work is one array
    operation per byte the largest value needs (one, for most columns)."""

    __slots__ = ("sizes", "values", "width")

    def __init__(self, zigzagged: I64) -> None:
        self.values = zigzagged
        top = int(zigzagged.max()) if len(zigzagged) else 0
        if top >= 1 << (7 * _MAX_VARINT):
            raise CorruptBatch("a length or timestamp delta is too large for a Kafka record")
        self.width = 1
        while top >= 1 << (7 * self.width):
            self.width += 1
        self.sizes = np.ones(len(zigzagged), dtype=np.int64)
        for byte in range(1, self.width):
            self.sizes += zigzagged >= (1 << (7 * byte))

    def put(self, out: U8, at: I64) -> I64:
        """Write each value at its position; returns the positions after them."""
        if self.width == 1:
            out[at] = self.values
            return at + 1
        for byte in range(self.width):
            present = self.sizes > byte
            group = (self.values[present] >> (7 * byte)) & 0x7F
            more = (self.sizes[present] > byte + 1).astype(np.int64) << 7
            out[at[present] + byte] = group | more
        return at + self.sizes


def _scatter(out: U8, at: I64, blob: U8, lengths: I64) -> I64:
    """Copy consecutive pieces of ``blob`` (``lengths`` each) to their positions ``at``."""
    total = int(lengths.sum())
    if total:
        sources = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=sources[1:])
        shift = np.repeat(at - sources, lengths)
        out[shift + np.arange(total, dtype=np.int64)] = blob[:total]
    return at + lengths


def _kafka_header_sections(blob: bytes, lengths: I64) -> list[bytes]:
    """Each record's headers in Kafka's form (count, then key and value, varint-framed)."""
    sections = []
    pos = 0
    for length in lengths.tolist():
        pairs = rb.decode_header_block(blob[pos : pos + length])
        pos += length
        parts = [_varint(len(pairs))]
        for name, value in pairs:
            raw = name.encode()
            parts += [_varint(len(raw)), raw, _varint(len(value)), value]
        sections.append(b"".join(parts))
    if pos != len(blob):
        raise CorruptBatch("header lengths disagree with the header blob")
    return sections


def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)
