"""Segment-object bytes -> ``pyarrow.RecordBatch``, column by column (no per-record Python).

A segment object is whole stamped batches (docs/storage-format.md §1-2). An
uncompressed batch's record section is already columnar: its length columns
are read with ``numpy.frombuffer`` and their cumulative sums become the Arrow
offsets of ``key`` and ``value``; the key and value blobs are sliced as numpy
views and concatenated once per object. The Python loop runs once per *batch*
(header, bounds), never per record.

Three cases go through the records module's own decoder (``DecodedBatch``) at
batch granularity instead: compressed batches (whatever codecs ``records``
knows, so new codecs work here without a change), Kafka batches (their records
are varint-framed: ``records.kafka_records`` reads them one by one) and the ``headers`` column of
batches that carry headers (header blocks are variable-length structures; that
column is built per record, and only for batches with headers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headrace.errors import CorruptBatch
from headrace.records import batch as rb

#: offsets are u64 in the format; Spark's LongType is signed, which is plenty
NO_END: Final = 2**63 - 1

#: Spark's own Arrow form of ``array<struct<key:string,value:binary>>``
HEADER_TYPE: Final = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)

#: the columns of the ``headrace`` data source, in order
SCHEMA: Final = pa.schema(
    [
        # nullable as Spark declares every column of a Python data source
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
    ]
)
#: without the ``headers`` column (the data source's ``includeHeaders=false``)
SCHEMA_NO_HEADERS: Final = SCHEMA.remove(SCHEMA.get_field_index("headers"))
#: the same schemas as Spark DDL
SPARK_SCHEMA_NO_HEADERS: Final = (
    "partition int, offset bigint, timestamp timestamp, key binary, value binary"
)
SPARK_SCHEMA: Final = SPARK_SCHEMA_NO_HEADERS + ", headers array<struct<key:string,value:binary>>"

_U32: Final = np.dtype("<u4")
_I32: Final = np.dtype("<i4")

U8Array = npt.NDArray[np.uint8]
I64Array = npt.NDArray[np.int64]


@dataclass(slots=True)
class _Columns:
    """The selected records of one batch, as arrays (views into the object where possible)."""

    offsets: I64Array
    timestamps_ms: I64Array
    key_lengths: npt.NDArray[np.int32]  # -1: null key
    keys: U8Array
    value_lengths: npt.NDArray[np.int64]
    values: U8Array
    headers: list[list[dict[str, Any]]] | None  # None: the batch has no headers


def _section_columns(
    header: rb.BatchHeader, section: U8Array, lo: int, hi: int, include_headers: bool = True
) -> _Columns:
    """Columns of records ``lo..hi-1`` (indexes within the batch) of an uncompressed
    section given as a numpy byte array."""
    n = header.record_count
    attrs = header.attributes
    p = 0
    raw = section
    end = len(raw)
    need = (
        4
        * n
        * (
            1
            + bool(attrs & rb.ATTR_TIMESTAMPS)
            + bool(attrs & rb.ATTR_KEYS)
            + bool(attrs & rb.ATTR_HEADERS)
        )
    )
    if need > end:
        raise CorruptBatch("record section is shorter than its length columns")
    if attrs & rb.ATTR_TIMESTAMPS:
        deltas = raw[p : p + 4 * n].view(_U32).astype(np.int64)
        timestamps = deltas[lo:hi] + header.first_timestamp
        p += 4 * n
    else:
        timestamps = np.full(hi - lo, header.first_timestamp, dtype=np.int64)
    if attrs & rb.ATTR_KEYS:
        key_lengths = raw[p : p + 4 * n].view(_I32).astype(np.int32)
        p += 4 * n
    else:
        key_lengths = np.full(n, -1, dtype=np.int32)
    value_lengths = raw[p : p + 4 * n].view(_U32).astype(np.int64)
    p += 4 * n
    header_lengths = None
    if attrs & rb.ATTR_HEADERS:
        header_lengths = raw[p : p + 4 * n].view(_U32).astype(np.int64)
        p += 4 * n
    key_sizes = np.maximum(key_lengths, 0).astype(np.int64)
    key_ends = np.cumsum(key_sizes)
    value_ends = np.cumsum(value_lengths)
    key_total = int(key_ends[-1])
    value_total = int(value_ends[-1])
    header_total = int(header_lengths.sum()) if header_lengths is not None else 0
    if p + key_total + value_total + header_total != end:
        raise CorruptBatch("length columns disagree with the record section's size")
    key_start = p + (int(key_ends[lo - 1]) if lo else 0)
    value_base = p + key_total
    value_start = value_base + (int(value_ends[lo - 1]) if lo else 0)
    headers = None
    if header_lengths is not None and include_headers:
        blob_start = value_base + value_total
        bounds = np.concatenate(([0], np.cumsum(header_lengths))) + blob_start
        blob = raw.tobytes() if lo < hi else b""
        headers = [
            [{"key": k, "value": v} for k, v in rb.decode_header_block(blob[a:b])]
            for a, b in zip(bounds[lo:hi].tolist(), bounds[lo + 1 : hi + 1].tolist(), strict=True)
        ]
    return _Columns(
        offsets=np.arange(header.base_offset + lo, header.base_offset + hi, dtype=np.int64),
        timestamps_ms=timestamps,
        key_lengths=key_lengths[lo:hi],
        keys=raw[key_start : p + int(key_ends[hi - 1])],
        value_lengths=value_lengths[lo:hi],
        values=raw[value_start : value_base + int(value_ends[hi - 1])],
        headers=headers,
    )


def _decoded_columns(view: memoryview, lo: int, hi: int, include_headers: bool) -> _Columns:
    """Columns of a compressed or a Kafka batch: the records module inflates and reads the
    section (at batch granularity, whatever the codec or format) and the columns are read
    from the result."""
    decoded = rb.DecodedBatch(view)
    # the decoded timestamps as they are: a Kafka producer's batch may span more than the
    # columnar form's 32-bit deltas hold (its own CreateTimes, a replay of old events)
    inflated = decoded.columnar_section(timestamps=False)
    plain = decoded.header._replace(
        attributes=decoded.header.attributes & ~rb.COMPRESSION_MASK & ~rb.ATTR_TIMESTAMPS,
        section_length=len(inflated),
    )
    section = np.frombuffer(inflated, dtype=np.uint8)
    columns = _section_columns(plain, section, lo, hi, include_headers)
    columns.timestamps_ms = np.asarray(decoded.timestamps[lo:hi], dtype=np.int64)
    return columns


def to_record_batch(
    data: bytes | bytearray | memoryview,
    partition: int,
    start: int = 0,
    end: int = NO_END,
    *,
    check_crc: bool = True,
    include_headers: bool = True,
) -> pa.RecordBatch:
    """The records of ``data`` (whole batches, as in a segment object) with offsets in
    ``[start, end)`` as one Arrow record batch in ``SCHEMA`` (``SCHEMA_NO_HEADERS``
    without ``include_headers``: header blocks are then not decoded at all).

    Raises ``CorruptBatch`` naming the offset and byte position of the first batch
    that fails a header check or (with ``check_crc``) its CRC, or whose record
    section does not parse.
    """
    view = memoryview(data)
    buf = np.frombuffer(view, dtype=np.uint8)
    pieces: list[_Columns] = []
    consumed = 0  # end of the last batch scanned
    stopped = False
    for pos, header in rb.scan(view):
        consumed = pos + header.size
        if header.last_offset < start:
            continue
        if header.base_offset >= end:
            stopped = True
            break
        try:
            rb.check_header(header)
            if check_crc and not rb.crc_ok(view, header, pos):
                raise CorruptBatch("CRC mismatch")
            lo = max(0, start - header.base_offset)
            hi = min(header.record_count, end - header.base_offset)
            if header.magic == rb.MAGIC and header.compression == rb.COMPRESSION_NONE:
                section = buf[pos + rb.HEADER_SIZE : pos + header.size]
                pieces.append(_section_columns(header, section, lo, hi, include_headers))
            else:
                frame = view[pos : pos + header.size]
                pieces.append(_decoded_columns(frame, lo, hi, include_headers))
        except CorruptBatch as exc:
            raise CorruptBatch(f"offset {header.base_offset} (byte {pos}): {exc.message}") from exc
    if not stopped and consumed != len(view):
        # scan stops silently at an incomplete tail; a segment object has none
        raise CorruptBatch(f"byte {consumed}: {len(view) - consumed} bytes are not a whole batch")
    return _assemble(pieces, partition, include_headers)


def _binary(
    lengths: npt.NDArray[np.int64], blobs: list[U8Array], valid: U8Array | None
) -> pa.Array:
    n = len(lengths)
    ends = np.cumsum(lengths, dtype=np.int64)
    if n and ends[-1] >= 2**31:
        raise ValueError("more than 2 GiB of keys or values in one Arrow batch")
    offsets = np.zeros(n + 1, dtype=np.int32)
    offsets[1:] = ends
    data = np.concatenate(blobs) if blobs else np.zeros(0, dtype=np.uint8)
    bitmap = None
    nulls = 0
    if valid is not None:
        nulls = int(n - np.count_nonzero(valid))
        if nulls:
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(), n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
    )


def _assemble(pieces: list[_Columns], partition: int, include_headers: bool) -> pa.RecordBatch:
    schema = SCHEMA if include_headers else SCHEMA_NO_HEADERS
    if not pieces:
        return pa.RecordBatch.from_pylist([], schema=schema)
    offsets = np.concatenate([p.offsets for p in pieces])
    n = len(offsets)
    timestamps_us = np.concatenate([p.timestamps_ms for p in pieces]) * 1000
    key_lengths = np.concatenate([p.key_lengths for p in pieces])
    keys = _binary(
        np.maximum(key_lengths, 0).astype(np.int64),
        [p.keys for p in pieces],
        (key_lengths >= 0).astype(np.uint8),
    )
    values = _binary(
        np.concatenate([p.value_lengths for p in pieces]), [p.values for p in pieces], None
    )
    columns = [
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(timestamps_us)]),
        keys,
        values,
    ]
    if not include_headers:
        return pa.RecordBatch.from_arrays(columns, schema=schema)
    # a record without headers has null, not an empty list: what Spark's Kafka source
    # gives, and the JVM turns a null into a row faster than an empty array<struct>
    # (a read about 10% faster; docs/spark.md, "Throughput")
    if any(p.headers is not None for p in pieces):
        rows: list[list[dict[str, Any]] | None] = []
        for p in pieces:
            rows.extend(
                [h or None for h in p.headers] if p.headers is not None else [None] * len(p.offsets)
            )
        headers = pa.array(rows, type=HEADER_TYPE)
    else:
        headers = pa.nulls(n, type=HEADER_TYPE)
    return pa.RecordBatch.from_arrays([*columns, headers], schema=schema)
