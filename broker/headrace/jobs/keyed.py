"""Keep the last record per key, in vectorised code (pure: bytes in, bytes out).

The compact job's keep-last-per-key path (``cleanupPolicy: compact``) in three
steps, none of which runs Python per record:

1. ``parse`` reads every record's columns out of an object's batches with
   numpy: the length columns of all batches are gathered at once (a record's
   column positions follow from its batch's header), and the key, value and
   header-block positions are segmented cumulative sums. The Python loop runs
   once per *batch* (header and CRC checks; a compressed section is inflated).
2. ``latest_offsets`` finds each key's last offset (Arrow dictionary-encodes
   the keys, ``np.maximum.at`` takes each entry's largest offset); ``keep_mask`` decides the survivors: a
   record survives when it has no key or is the last of its key, unless it is a
   tombstone (a key with an empty value) older than the cutoff.
3. ``rebuild`` writes the survivors. A batch that keeps every record is copied
   byte for byte (codec, producer and CRC as written). A batch that loses some
   becomes one batch per run of consecutive kept offsets (the format has no
   per-record offset, so a batch cannot hold a hole; docs/storage-format.md),
   stamped with the run's first offset and the batch's leader epoch, producer
   id and sequence, uncompressed. The runs' headers and length columns are
   built as numpy arrays; their key, value and header bytes are contiguous
   slices of the old section (a run is consecutive records of one batch). The
   whole output is then *one* Arrow ``take`` over a binary array whose
   elements are those slices: Arrow's C++ copies the bytes. The only Python
   loop left is one ``zlib.crc32`` call per rebuilt batch.

Offsets never move, so an object keeps its ``<base>-<last>`` range with holes
inside; its manifest entry says ``compacted`` (the broker's tiered reads and
the verify job accept the holes).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import CorruptBatch
from headrace.records import batch as rb
from headrace.records import codecs
from headrace.tiered import index

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]

#: the batch header as a packed numpy record, field for field as ``rb.HEADER``
HEADER_DTYPE: Final = np.dtype(
    [
        ("base_offset", "<u8"),
        ("batch_length", "<u4"),
        ("leader_epoch", "<i4"),
        ("magic", "u1"),
        ("crc", "<u4"),
        ("attributes", "<u2"),
        ("record_count", "<u4"),
        ("first_timestamp", "<i8"),
        ("max_timestamp", "<i8"),
        ("producer_id", "<u8"),
        ("base_sequence", "<u4"),
        ("section_length", "<u4"),
    ]
)
assert HEADER_DTYPE.itemsize == rb.HEADER_SIZE
_BYTE4: Final = np.arange(4, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Records:
    """Every record of an object's batches, column by column.

    Positions are into ``pool``: the object's bytes followed by the inflated
    sections of its compressed batches. Per batch: ``batch_*`` arrays; per
    record: the rest, with ``batch`` naming the record's batch."""

    pool: U8
    batch_pos: I64
    batch_size: I64
    batch_base: I64
    batch_count: I64
    batch_epoch: I64
    batch_attributes: I64
    batch_producer: npt.NDArray[np.uint64]
    batch_sequence: I64
    batch: I64
    offsets: I64
    timestamps_ms: I64
    key_lengths: I64  # -1: no key
    key_starts: I64
    value_lengths: I64
    value_starts: I64
    header_lengths: I64
    header_starts: I64

    def keys(self) -> pa.LargeBinaryArray:
        """The keys as an Arrow array (null where a record has no key)."""
        present = self.key_lengths >= 0
        taken = _take_slices(self.pool, self.key_starts, np.maximum(self.key_lengths, 0))
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
        nulls = int(len(present) - np.count_nonzero(present))
        offsets, data = taken.buffers()[1:]
        result = pa.Array.from_buffers(
            pa.large_binary(),
            len(present),
            [validity if nulls else None, offsets, data],
            null_count=nulls,
        )
        assert isinstance(result, pa.LargeBinaryArray)
        return result


def _u32_at(pool: U8, positions: I64) -> I64:
    """The little-endian u32 at each byte position of ``pool``."""
    if len(positions) == 0:
        return np.zeros(0, dtype=np.int64)
    quads = pool[positions[:, None] + _BYTE4]
    return np.ascontiguousarray(quads).view("<u4").ravel().astype(np.int64)


def _exclusive_segment_cumsum(values: I64, firsts: I64, counts: I64) -> I64:
    """Per record, the sum of ``values`` of the records before it in its batch."""
    inclusive = np.cumsum(values)
    exclusive = inclusive - values
    return exclusive - np.repeat(exclusive[firsts], counts)


def parse(data: bytes | memoryview) -> Records:
    """The records of ``data`` (whole batches, as in a segment object).

    Raises ``CorruptBatch`` naming the offset and byte of the first batch whose
    header, CRC or record section is wrong, or a tail that is not a whole batch."""
    view = memoryview(data)
    headers: list[tuple[int, rb.BatchHeader]] = []
    inflated: list[bytes | memoryview] = []
    section_starts: list[int] = []
    consumed = 0
    extra = len(view)  # where the next inflated section goes in the pool
    for pos, header in rb.scan(view):
        consumed = pos + header.size
        try:
            rb.check_header(header)
            if not rb.crc_ok(view, header, pos):
                raise CorruptBatch("CRC mismatch")
            if header.magic == rb.KAFKA_MAGIC:
                # a Kafka producer's batch: its records in our columns, read like ours
                decoded = rb.DecodedBatch(view[pos : pos + header.size])
                columnar = decoded.columnar_section()
                header = decoded.header._replace(section_length=len(columnar))
                inflated.append(columnar)
                section_starts.append(extra)
                extra += len(columnar)
                headers.append((pos, header))
                continue
            columns = 1 + sum(
                bool(header.attributes & a)
                for a in (rb.ATTR_TIMESTAMPS, rb.ATTR_KEYS, rb.ATTR_HEADERS)
            )
            if 4 * header.record_count * columns > header.section_length:
                raise CorruptBatch("record section is shorter than its length columns")
            if header.compression == rb.COMPRESSION_NONE:
                section_starts.append(pos + rb.HEADER_SIZE)
            else:
                frame = view[pos : pos + header.size]
                plain = codecs.decompress(
                    header.compression, frame[rb.HEADER_SIZE :], header.section_length
                )
                if len(plain) != header.section_length:
                    raise CorruptBatch("record section length mismatch")
                inflated.append(plain)
                section_starts.append(extra)
                extra += len(plain)
        except CorruptBatch as exc:
            raise CorruptBatch(f"offset {header.base_offset} (byte {pos}): {exc.message}") from exc
        headers.append((pos, header))
    if consumed != len(view):
        raise CorruptBatch(f"byte {consumed}: {len(view) - consumed} bytes are not a whole batch")
    raw = np.frombuffer(view, dtype=np.uint8)
    pool = (
        np.concatenate([raw, *(np.frombuffer(s, dtype=np.uint8) for s in inflated)])
        if inflated
        else raw
    )
    return _columns(pool, headers, np.asarray(section_starts, dtype=np.int64))


def _columns(pool: U8, headers: list[tuple[int, rb.BatchHeader]], sections: I64) -> Records:
    """The per-record columns of the batches, all at once."""
    hs = [h for _, h in headers]
    b_pos = np.asarray([p for p, _ in headers], dtype=np.int64)
    b_count = np.asarray([h.record_count for h in hs], dtype=np.int64)
    b_attrs = np.asarray([h.attributes for h in hs], dtype=np.int64)
    b_section_len = np.asarray([h.section_length for h in hs], dtype=np.int64)
    b_first_ts = np.asarray([h.first_timestamp for h in hs], dtype=np.int64)
    n_batches = len(hs)
    total = int(b_count.sum())
    firsts = np.cumsum(b_count) - b_count  # index of each batch's first record
    batch = np.repeat(np.arange(n_batches, dtype=np.int64), b_count)
    within = np.arange(total, dtype=np.int64) - firsts[batch]
    has_ts = (b_attrs & rb.ATTR_TIMESTAMPS) != 0
    has_keys = (b_attrs & rb.ATTR_KEYS) != 0
    has_headers = (b_attrs & rb.ATTR_HEADERS) != 0
    # column starts per batch: [ts deltas] [key lengths] value lengths [header lengths] blobs
    col_ts = sections
    col_keys = col_ts + 4 * b_count * has_ts
    col_values = col_keys + 4 * b_count * has_keys
    col_headers = col_values + 4 * b_count
    blobs = col_headers + 4 * b_count * has_headers
    r_has_ts, r_has_keys, r_has_headers = has_ts[batch], has_keys[batch], has_headers[batch]
    timestamps = b_first_ts[batch].copy()
    timestamps[r_has_ts] += _u32_at(pool, col_ts[batch][r_has_ts] + 4 * within[r_has_ts])
    key_lengths = np.full(total, -1, dtype=np.int64)
    key_lengths[r_has_keys] = (
        _u32_at(pool, col_keys[batch][r_has_keys] + 4 * within[r_has_keys])
        .astype(np.uint32)
        .view(np.int32)
    )
    value_lengths = _u32_at(pool, col_values[batch] + 4 * within)
    header_lengths = np.zeros(total, dtype=np.int64)
    header_lengths[r_has_headers] = _u32_at(
        pool, col_headers[batch][r_has_headers] + 4 * within[r_has_headers]
    )
    if total and (key_lengths < -1).any():
        bad = int(batch[np.argmax(key_lengths < -1)])
        raise _corrupt(headers[bad], "negative key length")
    key_sizes = np.maximum(key_lengths, 0)
    key_totals = np.add.reduceat(key_sizes, firsts) if total else key_sizes
    value_totals = np.add.reduceat(value_lengths, firsts) if total else value_lengths
    header_totals = np.add.reduceat(header_lengths, firsts) if total else header_lengths
    ends = blobs + key_totals + value_totals + header_totals
    wrong = ends != sections + b_section_len
    if wrong.any():
        raise _corrupt(
            headers[int(np.argmax(wrong))], "length columns disagree with the record section's size"
        )
    key_starts = blobs[batch] + _exclusive_segment_cumsum(key_sizes, firsts, b_count)
    value_starts = (blobs + key_totals)[batch] + _exclusive_segment_cumsum(
        value_lengths, firsts, b_count
    )
    header_starts = (blobs + key_totals + value_totals)[batch] + _exclusive_segment_cumsum(
        header_lengths, firsts, b_count
    )
    b_base = np.asarray([h.base_offset for h in hs], dtype=np.int64)
    return Records(
        pool=pool,
        batch_pos=b_pos,
        batch_size=np.asarray([h.size for h in hs], dtype=np.int64),
        batch_base=b_base,
        batch_count=b_count,
        batch_epoch=np.asarray([h.leader_epoch for h in hs], dtype=np.int64),
        batch_attributes=b_attrs,
        batch_producer=np.asarray([h.producer_id for h in hs], dtype=np.uint64),
        batch_sequence=np.asarray([h.base_sequence for h in hs], dtype=np.int64),
        batch=batch,
        offsets=b_base[batch] + within,
        timestamps_ms=timestamps,
        key_lengths=key_lengths,
        key_starts=key_starts,
        value_lengths=value_lengths,
        value_starts=value_starts,
        header_lengths=header_lengths,
        header_starts=header_starts,
    )


def _corrupt(where: tuple[int, rb.BatchHeader], why: str) -> CorruptBatch:
    pos, header = where
    return CorruptBatch(f"offset {header.base_offset} (byte {pos}): {why}")


def latest_offsets(keys: pa.Array, offsets: I64) -> I64:
    """The offset of the last record of each (non-null) key, sorted.

    The keys are dictionary-encoded (Arrow's hash table, in C++) and each
    dictionary entry's largest offset is found with ``np.maximum.at``: several
    times cheaper than an Acero ``group_by(key).max(offset)`` on the same input."""
    valid = keys.is_valid().to_numpy(zero_copy_only=False)
    if not valid.all():
        keys = keys.filter(pa.array(valid))
        offsets = offsets[valid]
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    encoded = pc.dictionary_encode(keys)
    entry = encoded.indices.to_numpy()
    last = np.full(len(encoded.dictionary), -1, dtype=np.int64)
    np.maximum.at(last, entry, offsets)
    return np.sort(last)


def keep_mask(records: Records, latest: I64, tombstone_cutoff_ms: int) -> Mask:
    """Which records survive: no key, or the key's last record (``latest``: sorted
    offsets), except tombstones (a key with an empty value) older than the cutoff."""
    return survivors(
        records.offsets,
        records.key_lengths >= 0,
        records.value_lengths,
        records.timestamps_ms,
        latest,
        tombstone_cutoff_ms,
    )


def survivors(
    offsets: I64,
    has_key: Mask,
    value_lengths: I64,
    timestamps_ms: I64,
    latest: I64,
    tombstone_cutoff_ms: int,
) -> Mask:
    """``keep_mask`` on plain columns (the rule itself; also what the tests check)."""
    at = np.searchsorted(latest, offsets)
    is_latest = np.zeros(len(offsets), dtype=bool)
    found = at < len(latest)
    is_latest[found] = latest[at[found]] == offsets[found]
    old_tombstone = has_key & (value_lengths == 0) & (timestamps_ms < tombstone_cutoff_ms)
    result: Mask = (~has_key | is_latest) & ~old_tombstone
    return result


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """The kept records as whole batches, with where each batch starts."""

    data: bytes
    records: int
    removed: int
    batch_offsets: I64
    batch_positions: I64

    def sparse_index(self, base: int, last: int) -> index.SparseIndex:
        """The object's index: an entry per ``index.DEFAULT_INTERVAL`` bytes (the
        first stands for the object's base, which may have lost its record)."""
        offsets, positions = [base], [0]
        pos = self.batch_positions
        i = 0
        while True:
            i = int(np.searchsorted(pos, positions[-1] + index.DEFAULT_INTERVAL))
            if i >= len(pos):
                break
            offsets.append(int(self.batch_offsets[i]))
            positions.append(int(pos[i]))
        return index.SparseIndex(base, last, len(self.data), tuple(offsets), tuple(positions))


def rebuild(records: Records, keep: Mask) -> Rebuilt:
    """The batches of ``records`` with only the ``keep`` records (see the module
    docstring). Empty ``data`` when nothing is kept."""
    n_batches = len(records.batch_count)
    kept_per_batch = np.bincount(records.batch, weights=keep, minlength=n_batches).astype(np.int64)
    whole = kept_per_batch == records.batch_count
    # the records to re-encode: kept ones of batches that lost some
    partial = keep & ~whole[records.batch]
    idx = np.flatnonzero(partial)
    r_batch = records.batch[idx]
    r_offsets = records.offsets[idx]
    starts_run = np.ones(len(idx), dtype=bool)
    if len(idx) > 1:
        starts_run[1:] = (r_batch[1:] != r_batch[:-1]) | (r_offsets[1:] != r_offsets[:-1] + 1)
    run_first = np.flatnonzero(starts_run)  # index into idx
    n_runs = len(run_first)
    run_count = np.diff(np.append(run_first, len(idx)))
    run_of = np.repeat(np.arange(n_runs, dtype=np.int64), run_count)
    rank = np.arange(len(idx), dtype=np.int64) - run_first[run_of]
    first_rec = idx[run_first]
    run_batch = records.batch[first_rec]
    attrs = records.batch_attributes[run_batch] & (
        rb.ATTR_TIMESTAMPS | rb.ATTR_KEYS | rb.ATTR_HEADERS
    )
    has_ts = (attrs & rb.ATTR_TIMESTAMPS) != 0
    has_keys = (attrs & rb.ATTR_KEYS) != 0
    has_headers = (attrs & rb.ATTR_HEADERS) != 0
    ts = records.timestamps_ms[idx]
    key_sizes = np.maximum(records.key_lengths[idx], 0)
    value_lengths = records.value_lengths[idx]
    header_lengths = records.header_lengths[idx]
    if n_runs:
        first_ts = np.minimum.reduceat(ts, run_first)
        max_ts = np.maximum.reduceat(ts, run_first)
        run_key_bytes = np.add.reduceat(key_sizes, run_first)
        run_value_bytes = np.add.reduceat(value_lengths, run_first)
        run_header_bytes = np.add.reduceat(header_lengths, run_first)
    else:
        first_ts = max_ts = run_key_bytes = run_value_bytes = run_header_bytes = run_count
    columns = 1 + has_ts.astype(np.int64) + has_keys + has_headers
    prefix_len = rb.HEADER_SIZE + 4 * run_count * columns
    run_size = prefix_len + run_key_bytes + run_value_bytes + run_header_bytes

    # the runs' headers and length columns, in one buffer appended to the pool
    prefix_at = np.cumsum(prefix_len) - prefix_len
    prefixes = np.zeros(int(prefix_len.sum()), dtype=np.uint8)
    heads = np.zeros(n_runs, dtype=HEADER_DTYPE)
    heads["base_offset"] = records.offsets[first_rec]
    heads["batch_length"] = run_size - rb.LENGTH_OVERHEAD
    heads["leader_epoch"] = records.batch_epoch[run_batch]
    heads["magic"] = rb.MAGIC
    heads["attributes"] = attrs
    heads["record_count"] = run_count
    heads["first_timestamp"] = first_ts
    heads["max_timestamp"] = max_ts
    producer = records.batch_producer[run_batch]
    heads["producer_id"] = producer
    # an idempotent producer's sequence numbers its records: the run's first one
    first_within = records.offsets[first_rec] - records.batch_base[run_batch]
    sequence = records.batch_sequence[run_batch] + np.where(producer != 0, first_within, 0)
    heads["base_sequence"] = sequence & 0xFFFF_FFFF
    heads["section_length"] = run_size - rb.HEADER_SIZE
    _scatter(prefixes, prefix_at, heads.view(np.uint8).reshape(n_runs, rb.HEADER_SIZE))
    column = prefix_at + rb.HEADER_SIZE  # start of each run's next column
    counts4 = 4 * run_count
    for present, values in (
        (has_ts, ts - first_ts[run_of]),
        (has_keys, records.key_lengths[idx]),
        (np.ones(n_runs, dtype=bool), value_lengths),
        (has_headers, header_lengths),
    ):
        rows = present[run_of]
        quads = values[rows].astype("<i8").astype("<u4").view(np.uint8).reshape(-1, 4)
        _scatter(prefixes, (column[run_of] + 4 * rank)[rows], quads)
        column = column + counts4 * present

    # the output as slices of pool + prefixes, in offset order
    pool = records.pool
    base = len(pool)
    run_first_offset = records.offsets[first_rec]
    whole_batches = np.flatnonzero(whole)
    slice_start = np.concatenate(
        [
            records.batch_pos[whole_batches],
            base + prefix_at,
            records.key_starts[first_rec],
            records.value_starts[first_rec],
            records.header_starts[first_rec],
        ]
    )
    slice_len = np.concatenate(
        [
            records.batch_size[whole_batches],
            prefix_len,
            run_key_bytes,
            run_value_bytes,
            run_header_bytes,
        ]
    )
    order_offset = np.concatenate([records.batch_base[whole_batches], *[run_first_offset] * 4])
    order_part = np.repeat(np.arange(5, dtype=np.int64), [len(whole_batches), *[n_runs] * 4])
    order = np.lexsort((order_part, order_offset))
    out_len = int(slice_len.sum())
    if out_len == 0:
        return Rebuilt(b"", 0, len(keep), np.zeros(0, np.int64), np.zeros(0, np.int64))
    taken = _take_slices(np.concatenate([pool, prefixes]), slice_start[order], slice_len[order])
    buffer = taken.buffers()[2]
    assert buffer is not None
    # Arrow's fresh output buffer is ours to patch; a copy if it says otherwise
    out = np.frombuffer(buffer, dtype=np.uint8, count=out_len)
    if not buffer.is_mutable:
        out = out.copy()
    out.flags.writeable = True

    # where every whole batch and run landed; then the runs' CRCs, the only
    # per-batch Python loop
    landed = np.empty(len(order), dtype=np.int64)
    landed[order] = np.cumsum(slice_len[order]) - slice_len[order]
    batch_pos = landed[: len(whole_batches) + n_runs]  # whole batches, then runs
    run_pos = batch_pos[len(whole_batches) :]
    view = out.data
    crcs = np.fromiter(
        (
            zlib.crc32(view[a:b])
            for a, b in zip(
                (run_pos + rb.CRC_START).tolist(), (run_pos + run_size).tolist(), strict=True
            )
        ),
        dtype="<u4",
        count=n_runs,
    )
    _scatter(out, run_pos + rb.CRC_FIELD_OFFSET, crcs.view(np.uint8).reshape(n_runs, 4))
    batch_offsets = np.concatenate([records.batch_base[whole_batches], run_first_offset])
    by_pos = np.argsort(batch_pos)
    kept = int(keep.sum())
    return Rebuilt(
        data=out.tobytes(),
        records=kept,
        removed=len(keep) - kept,
        batch_offsets=batch_offsets[by_pos],
        batch_positions=batch_pos[by_pos],
    )


def _scatter(target: U8, starts: I64, rows: U8) -> None:
    """``target[starts[i] : starts[i] + width] = rows[i]`` for every row, at once."""
    if len(starts) == 0:
        return
    width = rows.shape[1]
    target[starts[:, None] + np.arange(width, dtype=np.int64)] = rows


def _take_slices(pool: U8, starts: I64, lengths: I64) -> pa.LargeBinaryArray:
    """The byte ranges ``[start, start + length)`` of ``pool`` as one Arrow array, in
    the order given: the ranges (which must not overlap) become elements of a
    binary array over the pool (zero copy), and one ``take`` copies them out."""
    nonempty = lengths > 0
    lo = starts[nonempty]
    if len(lo) > 1 and (np.diff(lo) < 0).any():
        lo = np.sort(lo)  # the ranges do not overlap: sorting the starts sorts the ends too
        hi = lo + lengths[nonempty][np.argsort(starts[nonempty], kind="stable")]
    else:
        hi = lo + lengths[nonempty]
    # every range's start and end, in order; a range that ends where the next one
    # starts gives one cut, not two
    bounds = np.empty(2 * len(lo) + 2, dtype=np.int64)
    bounds[0], bounds[-1] = 0, len(pool)
    bounds[1:-1:2], bounds[2:-1:2] = lo, hi
    cuts = bounds[np.concatenate(([True], bounds[1:] != bounds[:-1]))]
    over_pool = pa.Array.from_buffers(
        pa.large_binary(), len(cuts) - 1, [None, pa.py_buffer(cuts), pa.py_buffer(pool)]
    )
    element = np.searchsorted(cuts, starts)
    indices = pa.array(element, mask=~nonempty, type=pa.int64())
    taken = pc.take(over_pool, indices)
    assert isinstance(taken, pa.LargeBinaryArray)
    return taken
