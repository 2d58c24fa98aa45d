"""The record batch format, shared by the wire, the WAL and object-store segments.

Pure module: bytes in, bytes or values out. The full layout with rationale is
in ``docs/storage-format.md``; the struct codes below carry the field names.

A batch is a fixed 59-byte header followed by a *columnar* record section::

    off size field            notes
    0   8    base_offset      u64  stamped by the leader on append
    8   4    batch_length     u32  bytes after this field (total size - 12)
    12  4    leader_epoch     i32  stamped by the leader on append
    16  1    magic            u8   = 1
    17  4    crc              u32  CRC-32 (zlib/IEEE) over bytes [21, end)
    21  2    attributes       u16  bits 0-2 codec (codecs.py), 3 keys, 4 headers, 5 timestamps
    23  4    record_count     u32  >= 1
    27  8    first_timestamp  i64  ms since the epoch, the smallest in the batch
    35  8    max_timestamp    i64  ms since the epoch, the largest in the batch
    43  8    producer_id      u64  0 = not idempotent
    51  4    base_sequence    u32  sequence of the first record for producer_id
    55  4    section_length   u32  uncompressed size of the record section
    59  ...  record section (compressed as a whole when compression != 0)

Record section, every integer little-endian::

    [u32 * n] timestamp deltas from first_timestamp     (only when bit 5 is set)
    [i32 * n] key lengths, -1 for a null key             (only when bit 3 is set)
    [u32 * n] value lengths
    [u32 * n] header block lengths                      (only when bit 4 is set)
    keys blob | values blob | header blocks

A second format shares the log (``KAFKA_MAGIC`` = 2): Kafka's v2 record batch as a
Kafka producer sent it, from byte 16 on, behind our little-endian 16-byte prefix.
Kafka laid its batch out like ours up to the magic byte, and the fields the
broker needs sit at the same offsets after it (``_KAFKA_FIELDS``), so every
header reader here serves both formats with one byte of dispatch per batch;
only the record section differs, which the broker never decodes (it checks an
uncompressed Kafka section's structure, in C, before storing it).
``docs/storage-format.md`` §1.1 and ``docs/decisions.md`` say why.

Why columnar: the producer builds the length arrays with ``array(map(len, ...))``
and the blobs with ``bytes.join`` -- loops that run in C, so a Python producer
encodes millions of records per second; the consumer slices values the same way.
The broker never looks inside our record section at all: it validates the header
and CRC, overwrites base_offset and leader_epoch (outside the CRC), and appends.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Final, NamedTuple

from headrace.checksums import crc32, crc32c
from headrace.errors import BatchTooLarge, CorruptBatch, InvalidRecordBatch, UnknownCodec
from headrace.records import codecs, kafka_records

MAGIC: Final = 1
#: Kafka's record batch v2, stored as received behind our prefix (see the module docstring)
KAFKA_MAGIC: Final = 2
MAGIC_OFFSET: Final = 16

#: base_offset u64, batch_length u32, leader_epoch i32, magic u8, crc u32,
#: attributes u16, record_count u32, first_timestamp i64, max_timestamp i64,
#: producer_id u64, base_sequence u32, section_length u32
HEADER: Final = struct.Struct("<QIiBIHIqqQII")
HEADER_SIZE: Final = HEADER.size  # 59
#: the prefix every reader needs to find batch boundaries: base_offset, batch_length
PREFIX: Final = struct.Struct("<QI")
PREFIX_SIZE: Final = PREFIX.size  # 12
LENGTH_OVERHEAD: Final = PREFIX_SIZE  # batch_length counts bytes after the prefix
#: the leader stamps base_offset (0..8) and leader_epoch (12..16); neither is under the CRC
STAMP_OFFSET: Final = struct.Struct("<Q")
STAMP_EPOCH: Final = struct.Struct("<i")
CRC_START: Final = 21
CRC_FIELD: Final = struct.Struct("<I")
CRC_FIELD_OFFSET: Final = 17
SEQUENCE_FIELD: Final = struct.Struct("<I")
SEQUENCE_FIELD_OFFSET: Final = 51
COUNT_FIELD: Final = struct.Struct("<I")
COUNT_FIELD_OFFSET: Final = 23

#: base_offset u64, batch_length u32, leader_epoch i32: ours, little-endian, in both formats
STAMPED_PREFIX: Final = struct.Struct("<QIi")
#: Kafka's v2 batch from the magic byte, big-endian: magic i8, crc u32 (CRC-32C over
#: [21, end)), attributes i16, last_offset_delta i32, base_timestamp i64, max_timestamp
#: i64, producer_id i64, producer_epoch i16, base_sequence i32 (then records_count i32,
#: at 57, which the broker never needs: last_offset_delta gives the count)
_KAFKA_FIELDS: Final = struct.Struct(">BIhiqqqhi")
#: Kafka's prefix as its clients send and expect it: base_offset, batch_length, leader_epoch
KAFKA_PREFIX: Final = struct.Struct(">qii")
KAFKA_HEADER_SIZE: Final = 61
#: Kafka attributes: bits 0-2 codec (none, gzip, snappy, lz4, zstd), bit 3 log-append time,
#: bit 4 transactional, bit 5 control batch, bit 6 delete horizon
KAFKA_CODECS: Final = 5
KAFKA_TRANSACTIONAL: Final = 1 << 4
KAFKA_CONTROL: Final = 1 << 5
KAFKA_KNOWN_ATTRIBUTES: Final = 0x07 | (1 << 3) | KAFKA_TRANSACTIONAL | KAFKA_CONTROL | (1 << 6)

COMPRESSION_MASK: Final = 0x07
COMPRESSION_NONE: Final = codecs.NONE
COMPRESSION_ZLIB: Final = codecs.ZLIB
COMPRESSION_LZ4: Final = codecs.LZ4
COMPRESSION_ZSTD: Final = codecs.ZSTD
ATTR_KEYS: Final = 1 << 3
ATTR_HEADERS: Final = 1 << 4
ATTR_TIMESTAMPS: Final = 1 << 5
KNOWN_ATTRIBUTES: Final = COMPRESSION_MASK | ATTR_KEYS | ATTR_HEADERS | ATTR_TIMESTAMPS

_NATIVE_LITTLE = sys.byteorder == "little"
_HEADER_COUNT = struct.Struct("<H")
_HEADER_NAME_LEN = struct.Struct("<H")
_HEADER_VALUE_LEN = struct.Struct("<I")

Headers = Sequence[tuple[str, bytes]]


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    base_sequence: int
    section_length: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on disk and on the wire."""
        return self.batch_length + LENGTH_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the fixed header at ``pos`` (either format); raises CorruptBatch if too short."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptBatch(f"batch header needs {HEADER_SIZE} bytes, {len(buf) - pos} left")
    if buf[pos + MAGIC_OFFSET] == KAFKA_MAGIC:
        base_offset, batch_length, leader_epoch = STAMPED_PREFIX.unpack_from(buf, pos)
        return _kafka_header(buf, pos, base_offset, batch_length, leader_epoch)
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def _kafka_header(
    buf: bytes | bytearray | memoryview,
    pos: int,
    base_offset: int,
    batch_length: int,
    leader_epoch: int,
) -> BatchHeader:
    """A Kafka v2 batch's fields in our header's terms.

    A producer id below 0 (Kafka's "none") is our 0, with sequence 0. ``attributes``
    stay Kafka's: only ``KAFKA_MAGIC``-aware code reads them."""
    (magic, crc, attributes, last_delta, first_ts, max_ts, producer_id, _, sequence) = (
        _KAFKA_FIELDS.unpack_from(buf, pos + MAGIC_OFFSET)
    )
    if producer_id < 0:
        producer_id, sequence = 0, 0
    return BatchHeader(
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes & 0xFFFF,
        last_delta + 1,
        first_ts,
        max_ts,
        producer_id,
        sequence,
        batch_length + LENGTH_OVERHEAD - KAFKA_HEADER_SIZE,
    )


def read_kafka_wire_header(buf: bytes | bytearray | memoryview) -> BatchHeader:
    """The header of a Kafka v2 batch as a Kafka client sends it (big-endian prefix)."""
    if len(buf) < KAFKA_HEADER_SIZE:
        raise CorruptBatch(f"Kafka batch header needs {KAFKA_HEADER_SIZE} bytes, {len(buf)} given")
    base_offset, batch_length, leader_epoch = KAFKA_PREFIX.unpack_from(buf, 0)
    if buf[MAGIC_OFFSET] != KAFKA_MAGIC:
        raise CorruptBatch(f"Kafka record batch magic {buf[MAGIC_OFFSET]}, only 2 is supported")
    return _kafka_header(buf, 0, base_offset, batch_length, leader_epoch)


def validate(
    buf: bytes | bytearray | memoryview, *, max_batch_bytes: int | None = None
) -> BatchHeader:
    """Check that ``buf`` holds exactly one well-formed batch and return its header.

    Checks run in order of cost: sizes, magic, attributes, counts, then the CRC.
    The record section itself is not decoded (that is per-record work).
    """
    total = len(buf)
    if max_batch_bytes is not None and total > max_batch_bytes:
        raise BatchTooLarge(f"batch of {total} bytes exceeds the limit of {max_batch_bytes}")
    header = read_header(buf)
    if header.size != total:
        raise CorruptBatch(f"batch_length says {header.size} bytes, frame holds {total}")
    if header.magic != MAGIC:  # Kafka's batches come through ``validate_kafka`` only
        raise CorruptBatch(f"unknown batch magic {header.magic}")
    check_header(header)
    crc = crc32(memoryview(buf)[CRC_START:])
    if crc != header.crc:
        raise CorruptBatch(f"CRC mismatch: header {header.crc:#010x}, computed {crc:#010x}")
    return header


def validate_kafka(
    buf: bytes | bytearray | memoryview, *, max_batch_bytes: int | None = None
) -> BatchHeader:
    """``validate`` for the records of a Kafka produce: exactly one v2 batch, as sent.

    Header work, one CRC-32C pass and, for an uncompressed batch, one compiled pass
    over the record section's structure (``kafka_records.check_structure``); no
    per-record Python. Raises ``BatchTooLarge``, ``CorruptBatch`` (bad size, magic,
    codec, CRC or record structure) or ``InvalidRecordBatch`` (an intact batch this
    broker will not store)."""
    total = len(buf)
    if max_batch_bytes is not None and total > max_batch_bytes:
        raise BatchTooLarge(f"batch of {total} bytes exceeds the limit of {max_batch_bytes}")
    header = read_kafka_wire_header(buf)
    if header.size != total:
        raise CorruptBatch(f"batch_length says {header.size} bytes, the records hold {total}")
    check_kafka_header(header)
    if not crc_ok(buf, header):
        raise CorruptBatch("CRC-32C mismatch")
    (records_count,) = _KAFKA_COUNT.unpack_from(buf, 57)
    if records_count != header.record_count:
        raise InvalidRecordBatch(
            f"records_count {records_count} disagrees with last_offset_delta"
            f" {header.record_count - 1}: a produced batch has contiguous offsets"
        )
    (producer_id,) = _KAFKA_PRODUCER.unpack_from(buf, 43)
    if producer_id == 0:
        # 0 is our "not idempotent": InitProducerId never hands it out
        raise InvalidRecordBatch("producer id 0 was not issued by this broker")
    if header.compression == kafka_records.KAFKA_NONE:
        # our readers decode the records: refuse now what they would refuse later. A
        # compressed section is checked when read (the broker never inflates: codecs.py)
        kafka_records.check_structure(memoryview(buf)[KAFKA_HEADER_SIZE:], header.record_count)
    return header


_KAFKA_COUNT: Final = struct.Struct(">i")
_KAFKA_PRODUCER: Final = struct.Struct(">q")


def check_header(header: BatchHeader) -> None:
    """Header-only sanity checks shared by produce validation and log recovery."""
    if header.magic == KAFKA_MAGIC:
        check_kafka_header(header)
        return
    if header.magic != MAGIC:
        raise CorruptBatch(f"unknown batch magic {header.magic}")
    if header.attributes & ~KNOWN_ATTRIBUTES:
        raise CorruptBatch(f"unknown batch attributes {header.attributes:#06x}")
    # the codec id only: the broker never decompresses (codecs.py says why)
    codecs.check_known(header.compression)
    if header.record_count < 1:
        raise CorruptBatch("batch holds no records")
    if header.batch_length < HEADER_SIZE - LENGTH_OVERHEAD:
        raise CorruptBatch(f"batch_length {header.batch_length} is shorter than a header")
    if header.max_timestamp < header.first_timestamp:
        raise CorruptBatch("max_timestamp is before first_timestamp")
    if (
        header.compression == COMPRESSION_NONE
        and header.section_length != header.size - HEADER_SIZE
    ):
        raise CorruptBatch("section_length disagrees with batch_length")


def check_kafka_header(header: BatchHeader) -> None:
    """``check_header`` for a Kafka v2 batch. Transactional and control batches are refused:
    this broker has no transactions yet, and a control batch is the broker's to write."""
    if header.attributes & ~KAFKA_KNOWN_ATTRIBUTES:
        raise CorruptBatch(f"unknown Kafka batch attributes {header.attributes:#06x}")
    if header.compression >= KAFKA_CODECS:
        raise UnknownCodec(f"unknown Kafka compression codec {header.compression}")
    if header.attributes & (KAFKA_TRANSACTIONAL | KAFKA_CONTROL):
        raise InvalidRecordBatch("transactional and control batches are not supported")
    if header.record_count < 1:
        raise CorruptBatch("batch holds no records")
    if header.size < KAFKA_HEADER_SIZE:
        raise CorruptBatch(f"batch_length {header.batch_length} is shorter than a Kafka header")


def crc_ok(buf: bytes | bytearray | memoryview, header: BatchHeader, pos: int = 0) -> bool:
    """CRC check of a batch that sits at ``pos`` inside a larger buffer (either format)."""
    view = memoryview(buf)[pos + CRC_START : pos + header.size]
    if header.magic == KAFKA_MAGIC:
        return crc32c(view) == header.crc
    return crc32(view) == header.crc


def stamp_prefix(header: BatchHeader, base_offset: int, leader_epoch: int) -> bytes:
    """The 16 bytes a stored batch starts with: ours, little-endian, in both formats.

    ``header.batch_length`` rather than the batch's own bytes 8-12: a Kafka batch
    arrives with them big-endian."""
    return STAMPED_PREFIX.pack(base_offset, header.batch_length, leader_epoch)


def kafka_prefix(header: BatchHeader) -> bytes:
    """A stored Kafka batch's 16-byte prefix as Kafka's clients read it (big-endian)."""
    return KAFKA_PREFIX.pack(header.base_offset, header.batch_length, header.leader_epoch)


def stamp(batch: bytearray, base_offset: int, leader_epoch: int) -> None:
    """Overwrite the leader-stamped fields in place (both lie outside the CRC)."""
    STAMP_OFFSET.pack_into(batch, 0, base_offset)
    STAMP_EPOCH.pack_into(batch, 12, leader_epoch)


def restamp_sequence(batch: bytes, sequence: int) -> bytes:
    """A copy of ``batch`` with a new base_sequence (which is under the CRC, so re-CRC)."""
    buf = bytearray(batch)
    SEQUENCE_FIELD.pack_into(buf, SEQUENCE_FIELD_OFFSET, sequence)
    CRC_FIELD.pack_into(buf, CRC_FIELD_OFFSET, crc32(memoryview(buf)[CRC_START:]))
    return bytes(buf)


PRODUCER_FIELD: Final = struct.Struct("<Q")
PRODUCER_FIELD_OFFSET: Final = 43


def restamp_producer(batch: bytes, producer_id: int, sequence: int) -> bytes:
    """A copy of ``batch`` under a new producer identity and sequence (re-CRC'd)."""
    buf = bytearray(batch)
    PRODUCER_FIELD.pack_into(buf, PRODUCER_FIELD_OFFSET, producer_id)
    SEQUENCE_FIELD.pack_into(buf, SEQUENCE_FIELD_OFFSET, sequence)
    CRC_FIELD.pack_into(buf, CRC_FIELD_OFFSET, crc32(memoryview(buf)[CRC_START:]))
    return bytes(buf)


def stamped_prefix(batch: bytes | memoryview, base_offset: int, leader_epoch: int) -> bytes:
    """The first 16 bytes of ``batch`` with the leader's fields stamped.

    Writing ``prefix + batch[16:]`` with one ``writev`` stamps a batch without
    copying its body.
    """
    prefix = bytearray(batch[:16])
    stamp(prefix, base_offset, leader_epoch)
    return bytes(prefix)


def scan(buf: bytes | bytearray | memoryview, pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` of every complete batch in ``buf`` from ``pos``.

    Stops silently at an incomplete tail; does not verify CRCs.
    """
    end = len(buf)
    unpack = HEADER.unpack_from
    while end - pos >= HEADER_SIZE:
        if buf[pos + MAGIC_OFFSET] == KAFKA_MAGIC:
            base, length, epoch = STAMPED_PREFIX.unpack_from(buf, pos)
            header = _kafka_header(buf, pos, base, length, epoch)
        else:
            header = BatchHeader._make(unpack(buf, pos))
        size = header.batch_length + LENGTH_OVERHEAD
        if size < HEADER_SIZE or pos + size > end:
            return
        yield pos, header
        pos += size


def complete_prefix_length(buf: bytes | bytearray | memoryview) -> int:
    """Length of the longest prefix of ``buf`` that consists of whole batches."""
    pos = 0
    end = len(buf)
    unpack = PREFIX.unpack_from
    while end - pos >= PREFIX_SIZE:
        _, length = unpack(buf, pos)
        size = length + LENGTH_OVERHEAD
        if size < HEADER_SIZE or pos + size > end:
            break
        pos += size
    return pos


# --------------------------------------------------------------------------- encoding


def _u32_array(values: Sequence[int]) -> bytes:
    arr = array("I", values)
    if not _NATIVE_LITTLE:
        arr.byteswap()
    return arr.tobytes()


def _i32_array(values: Sequence[int]) -> bytes:
    arr = array("i", values)
    if not _NATIVE_LITTLE:
        arr.byteswap()
    return arr.tobytes()


def encode_header_block(headers: Headers) -> bytes:
    parts = [_HEADER_COUNT.pack(len(headers))]
    for name, value in headers:
        raw = name.encode()
        parts.append(_HEADER_NAME_LEN.pack(len(raw)))
        parts.append(raw)
        parts.append(_HEADER_VALUE_LEN.pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def encode(
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Headers] | None = None,
    timestamps: Sequence[int] | None = None,
    timestamp_ms: int | None = None,
    compression: int = COMPRESSION_NONE,
    producer_id: int = 0,
    base_sequence: int = 0,
) -> bytes:
    """Encode records into one batch with base_offset 0 and leader_epoch -1.

    ``values`` must be bytes-like. Pass exactly one of ``timestamps`` (one per
    record) and ``timestamp_ms`` (every record's): the codec never reads the
    clock, so the same inputs always give the same bytes. The loops here are
    ``map``/``join`` over the inputs, which run in C.
    """
    count = len(values)
    if count == 0:
        raise ValueError("a batch needs at least one record")
    if (timestamps is None) == (timestamp_ms is None):
        raise ValueError("pass either timestamps or timestamp_ms (the codec reads no clock)")
    attributes = compression & COMPRESSION_MASK
    columns: list[bytes] = []
    if timestamps is not None:
        if len(timestamps) != count:
            raise ValueError("timestamps and values differ in length")
        first_ts = min(timestamps)
        max_ts = max(timestamps)
        if max_ts - first_ts > 0xFFFF_FFFF:
            raise ValueError("timestamps in one batch must span less than 2**32 ms (49 days)")
        attributes |= ATTR_TIMESTAMPS
        columns.append(_u32_array([ts - first_ts for ts in timestamps]))
    else:
        assert timestamp_ms is not None
        first_ts = max_ts = timestamp_ms
    key_blob = b""
    if keys is not None:
        if len(keys) != count:
            raise ValueError("keys and values differ in length")
        attributes |= ATTR_KEYS
        columns.append(_i32_array([-1 if k is None else len(k) for k in keys]))
        key_blob = b"".join([k for k in keys if k is not None])
    columns.append(_u32_array(list(map(len, values))))
    header_blob = b""
    if headers is not None:
        if len(headers) != count:
            raise ValueError("headers and values differ in length")
        blocks = [encode_header_block(h) for h in headers]
        attributes |= ATTR_HEADERS
        columns.append(_u32_array(list(map(len, blocks))))
        header_blob = b"".join(blocks)
    columns.append(key_blob)
    columns.append(b"".join(values))
    columns.append(header_blob)
    section = b"".join(columns)
    section_length = len(section)
    if compression not in codecs.KNOWN:
        raise ValueError(f"unknown compression codec {compression}")
    section = codecs.compress(compression, section)
    body_after_crc = _ATTRS_ETC.pack(
        attributes, count, first_ts, max_ts, producer_id, base_sequence, section_length
    )
    crc = crc32(section, crc32(body_after_crc))
    batch_length = HEADER_SIZE - LENGTH_OVERHEAD + len(section)
    return _PRE_CRC.pack(0, batch_length, -1, MAGIC, crc) + body_after_crc + section


#: the header split at the CRC: what precedes it, and what it covers
_PRE_CRC = struct.Struct("<QIiBI")
_ATTRS_ETC = struct.Struct("<HIqqQII")
assert _PRE_CRC.size == CRC_START
assert _PRE_CRC.size + _ATTRS_ETC.size == HEADER_SIZE


# --------------------------------------------------------------------------- decoding


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record: a consumer-side convenience, never built by the broker."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


def _read_u32s(section: memoryview, pos: int, count: int) -> array[int]:
    arr = array("I")
    arr.frombytes(section[pos : pos + 4 * count])
    if not _NATIVE_LITTLE:
        arr.byteswap()
    return arr


def _read_i32s(section: memoryview, pos: int, count: int) -> array[int]:
    arr = array("i")
    arr.frombytes(section[pos : pos + 4 * count])
    if not _NATIVE_LITTLE:
        arr.byteswap()
    return arr


def _slices(blob: memoryview, lengths: Sequence[int]) -> list[bytes]:
    ends = list(accumulate(lengths))
    starts = [0, *ends][:-1]
    raw = bytes(blob)
    return [raw[s:e] for s, e in zip(starts, ends, strict=True)]


def decode_header_block(block: bytes) -> tuple[tuple[str, bytes], ...]:
    pos = 2
    out: list[tuple[str, bytes]] = []
    try:
        (count,) = _HEADER_COUNT.unpack_from(block, 0)
        for _ in range(count):
            (name_len,) = _HEADER_NAME_LEN.unpack_from(block, pos)
            pos += 2
            name = block[pos : pos + name_len].decode()
            pos += name_len
            (value_len,) = _HEADER_VALUE_LEN.unpack_from(block, pos)
            pos += 4
            out.append((name, block[pos : pos + value_len]))
            pos += value_len
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptBatch(f"malformed header block: {exc}") from exc
    if pos != len(block):
        raise CorruptBatch("header block has trailing bytes")
    return tuple(out)


class DecodedBatch:
    """The records of one batch, decoded column by column.

    ``values`` and ``keys`` are lists built by C-level slicing; ``records()``
    builds per-record objects for callers that want them.

    A Kafka batch (``KAFKA_MAGIC``) is read too, record by record
    (``kafka_records``). Its ``header`` is then given in our terms: the attributes
    say keys, headers and per-record timestamps, and no compression (the columns
    are inflated); offsets, epoch, counts and timestamps are the batch's own.
    """

    __slots__ = (
        "_header_lengths",
        "_headers_blob",
        "_kafka_headers",
        "header",
        "key_lengths",
        "keys",
        "timestamps",
        "values",
    )

    def __init__(self, batch: bytes | bytearray | memoryview) -> None:
        header = read_header(batch)
        self.header = header
        self._kafka_headers: list[tuple[tuple[str, bytes], ...]] | None = None
        if header.magic == KAFKA_MAGIC:
            self._read_kafka(batch, header)
            return
        n = header.record_count
        raw = memoryview(batch)[HEADER_SIZE : header.size]
        # bounded by section_length: a small batch that inflates to gigabytes is
        # refused without being inflated (UnknownCodec, DecompressionFailed)
        section = memoryview(codecs.decompress(header.compression, raw, header.section_length))
        if len(section) != header.section_length:
            raise CorruptBatch("record section length mismatch")
        pos = 0
        try:
            if header.attributes & ATTR_TIMESTAMPS:
                deltas = _read_u32s(section, pos, n)
                pos += 4 * n
                base = header.first_timestamp
                self.timestamps: list[int] = [base + d for d in deltas]
            else:
                self.timestamps = [header.first_timestamp] * n
            key_lengths: array[int] | None = None
            if header.attributes & ATTR_KEYS:
                key_lengths = _read_i32s(section, pos, n)
                pos += 4 * n
            value_lengths = _read_u32s(section, pos, n)
            pos += 4 * n
            self._header_lengths: array[int] | None = None
            if header.attributes & ATTR_HEADERS:
                self._header_lengths = _read_u32s(section, pos, n)
                pos += 4 * n
            if len(value_lengths) != n:
                raise CorruptBatch("record section is shorter than its length columns")
            self.key_lengths = key_lengths
            if key_lengths is not None:
                present = [k for k in key_lengths if k >= 0]
                key_total = sum(present)
                key_slices = iter(_slices(section[pos : pos + key_total], present))
                self.keys: list[bytes | None] = [
                    next(key_slices) if k >= 0 else None for k in key_lengths
                ]
                pos += key_total
            else:
                self.keys = [None] * n
            value_total = sum(value_lengths)
            if pos + value_total > len(section):
                raise CorruptBatch("value lengths overrun the record section")
            self.values: list[bytes] = _slices(section[pos : pos + value_total], value_lengths)
            pos += value_total
            self._headers_blob = bytes(section[pos:])
            if self._header_lengths is None and self._headers_blob:
                raise CorruptBatch("record section has trailing bytes")
            if self._header_lengths is not None and sum(self._header_lengths) != len(
                self._headers_blob
            ):
                raise CorruptBatch("header lengths disagree with the header blob")
        except (ValueError, IndexError, StopIteration) as exc:
            raise CorruptBatch(f"malformed record section: {exc}") from exc

    def _read_kafka(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> None:
        raw = memoryview(batch)[KAFKA_HEADER_SIZE : header.size]
        section = kafka_records.inflate(header.compression, raw)
        records = kafka_records.decode_records(section, header.record_count, header.first_timestamp)
        self.timestamps = records.timestamps
        self.keys = records.keys
        self.values = records.values
        self.key_lengths = array("i", [-1 if k is None else len(k) for k in records.keys])
        self._header_lengths = None
        self._headers_blob = b""
        self._kafka_headers = records.headers
        # Kafka's base timestamp is the first record's, and later ones may be earlier: ours
        # is the smallest, so every delta from it is non-negative
        self.header = header._replace(
            attributes=ATTR_TIMESTAMPS | ATTR_KEYS | (ATTR_HEADERS if any(records.headers) else 0),
            first_timestamp=min(records.timestamps),
        )

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    def columnar_section(self, *, timestamps: bool = True) -> bytes:
        """The record section in our columnar form (§2), uncompressed, with the columns
        ``self.header``'s attributes name: what a reader of our format takes from a
        compressed or a Kafka batch. Built with C-level joins over the decoded columns.

        ``timestamps=False`` leaves the timestamp column out (read the section as if the
        header had no ``ATTR_TIMESTAMPS``): a reader that takes ``self.timestamps`` as
        they are, since a Kafka producer's batch may span more than the column's 32-bit
        deltas hold."""
        h = self.header
        parts: list[bytes] = []
        if timestamps and h.attributes & ATTR_TIMESTAMPS:
            parts.append(_u32_array([t - h.first_timestamp for t in self.timestamps]))
        if h.attributes & ATTR_KEYS:
            assert self.key_lengths is not None
            parts.append(_i32_array(self.key_lengths))
        parts.append(_u32_array(list(map(len, self.values))))
        blocks: list[bytes] = []
        if h.attributes & ATTR_HEADERS:
            blocks = [encode_header_block(hs) for hs in self.headers()]
            parts.append(_u32_array(list(map(len, blocks))))
        parts.append(b"".join([k for k in self.keys if k is not None]))
        parts.append(b"".join(self.values))
        parts.append(b"".join(blocks))
        return b"".join(parts)

    def headers(self) -> list[tuple[tuple[str, bytes], ...]]:
        if self._kafka_headers is not None:
            return self._kafka_headers
        if self._header_lengths is None:
            return [()] * self.header.record_count
        blocks = _slices(memoryview(self._headers_blob), self._header_lengths)
        return [decode_header_block(b) for b in blocks]

    def records(self, from_offset: int = 0) -> list[Record]:
        base = self.header.base_offset
        headers = self.headers()
        skip = max(0, from_offset - base)
        return [
            Record(base + i, self.timestamps[i], self.keys[i], self.values[i], headers[i])
            for i in range(skip, self.header.record_count)
        ]


def decode(batch: bytes | bytearray | memoryview) -> DecodedBatch:
    return DecodedBatch(batch)
