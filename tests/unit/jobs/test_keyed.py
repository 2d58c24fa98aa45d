"""Keep-last-per-key (``headrace.jobs.keyed``) against a plain reference model.

The model is the obvious one: a dict of each key's last offset, a record kept
when it has no key or is its key's last, minus tombstones older than the cutoff.
The vectorised code must keep exactly that set, and its rebuilt batches must
decode (CRCs valid) to exactly those records, at their original offsets."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import CorruptBatch
from headrace.jobs import keyed
from headrace.records import batch as rb

CUTOFF_MS = 1_000_000
CODECS = [rb.COMPRESSION_NONE, rb.COMPRESSION_ZLIB, rb.COMPRESSION_LZ4, rb.COMPRESSION_ZSTD]


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class BatchSpec:
    records: list[tuple[int, bytes | None, bytes, tuple[tuple[str, bytes], ...]]]
    codec: int
    with_keys: bool
    with_headers: bool
    per_record_timestamps: bool
    producer_id: int
    gap_before: int  # offsets skipped before the batch (an already compacted object)


keys_st = st.one_of(st.none(), st.sampled_from([b"", b"a", b"b", b"c", b"dd", b"eee"]))
values_st = st.one_of(st.just(b""), st.binary(min_size=1, max_size=20))
headers_st = st.lists(
    st.tuples(st.sampled_from(["h", "trace"]), st.binary(max_size=5)), max_size=2
).map(tuple)
record_st = st.tuples(st.integers(CUTOFF_MS - 5, CUTOFF_MS + 5), keys_st, values_st, headers_st)
batch_st = st.builds(
    BatchSpec,
    records=st.lists(record_st, min_size=1, max_size=12),
    codec=st.sampled_from(CODECS),
    with_keys=st.booleans(),
    with_headers=st.booleans(),
    per_record_timestamps=st.booleans(),
    producer_id=st.sampled_from([0, 0, 77]),
    gap_before=st.sampled_from([0, 0, 0, 3]),
)


def build(specs: list[BatchSpec], base: int = 100) -> tuple[bytes, list[Rec]]:
    """The batches as a segment object holds them, and the records they hold."""
    frames: list[bytes] = []
    recs: list[Rec] = []
    offset = base
    for i, spec in enumerate(specs):
        offset += spec.gap_before if i else 0
        values = [v for _, _, v, _ in spec.records]
        keys = [k for _, k, _, _ in spec.records] if spec.with_keys else None
        headers = [h for _, _, _, h in spec.records] if spec.with_headers else None
        stamps = [t for t, _, _, _ in spec.records]
        if not spec.per_record_timestamps:
            stamps = [stamps[0]] * len(stamps)
        frame = bytearray(
            rb.encode(
                values,
                keys=keys,
                headers=headers,
                timestamps=stamps if spec.per_record_timestamps else None,
                timestamp_ms=None if spec.per_record_timestamps else stamps[0],
                compression=spec.codec,
                producer_id=spec.producer_id,
                base_sequence=5 if spec.producer_id else 0,
            )
        )
        rb.stamp(frame, offset, 3 + i % 2)
        frames.append(bytes(frame))
        for j, (t, k, v, h) in enumerate(
            zip(
                stamps,
                keys or [None] * len(values),
                values,
                headers or [()] * len(values),
                strict=True,
            )
        ):
            recs.append(Rec(offset + j, t, k, v, tuple(h)))
        offset += len(values)
    return b"".join(frames), recs


def reference(recs: list[Rec], cutoff_ms: int) -> list[Rec]:
    last: dict[bytes, int] = {}
    for r in recs:
        if r.key is not None:
            last[r.key] = r.offset
    return [
        r
        for r in recs
        if (r.key is None or last[r.key] == r.offset)
        and not (r.key is not None and r.value == b"" and r.timestamp_ms < cutoff_ms)
    ]


def decoded(data: bytes) -> list[Rec]:
    """Every record of ``data``, each batch checked whole (size, header, CRC)."""
    out: list[Rec] = []
    for pos, header in rb.scan(data):
        frame = data[pos : pos + header.size]
        rb.validate(frame)
        records = rb.decode(frame).records()
        stamps = [r.timestamp_ms for r in records]
        assert (header.first_timestamp, header.max_timestamp) == (min(stamps), max(stamps))
        out.extend(Rec(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in records)
    assert sum(h.size for _, h in rb.scan(data)) == len(data)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(batch_st, min_size=1, max_size=8))
def test_survivors_and_rebuilt_batches_match_the_reference_model(specs: list[BatchSpec]) -> None:
    data, recs = build(specs)
    records = keyed.parse(data)
    assert records.offsets.tolist() == [r.offset for r in recs]
    latest = keyed.latest_offsets(records.keys(), records.offsets)
    keep = keyed.keep_mask(records, latest, CUTOFF_MS)
    expected = reference(recs, CUTOFF_MS)
    assert [r.offset for r, k in zip(recs, keep.tolist(), strict=True) if k] == [
        r.offset for r in expected
    ]
    rebuilt = keyed.rebuild(records, keep)
    assert rebuilt.records == len(expected)
    assert rebuilt.removed == len(recs) - len(expected)
    if not expected:
        assert rebuilt.data == b""
        return
    assert decoded(rebuilt.data) == expected
    scanned = list(rb.scan(rebuilt.data))
    assert rebuilt.batch_positions.tolist() == [pos for pos, _ in scanned]
    assert rebuilt.batch_offsets.tolist() == [h.base_offset for _, h in scanned]
    # a rebuilt batch keeps its source batch's leader epoch and producer
    sources = {o: h for _, h in rb.scan(data) for o in range(h.base_offset, h.next_offset)}
    for _, h in scanned:
        src = sources[h.base_offset]
        assert (h.leader_epoch, h.producer_id) == (src.leader_epoch, src.producer_id)
        if h.producer_id:
            assert h.base_sequence == src.base_sequence + h.base_offset - src.base_offset
    # batches that lost nothing are the same bytes
    kept_offsets = {r.offset for r in expected}
    for pos, h in rb.scan(data):
        if all(o in kept_offsets for o in range(h.base_offset, h.next_offset)):
            assert data[pos : pos + h.size] in rebuilt.data
    index = rebuilt.sparse_index(100, recs[-1].offset)
    assert index.offsets[0] == 100 and index.positions[0] == 0
    assert set(zip(index.positions[1:], index.offsets[1:], strict=True)) <= {
        (pos, h.base_offset) for pos, h in scanned
    }


def test_the_sparse_index_has_an_entry_per_interval() -> None:
    value = b"x" * 4000
    specs = [
        BatchSpec(
            [(CUTOFF_MS, b"k%d" % (i * 3 + j), value, ()) for j in range(3)],
            rb.COMPRESSION_NONE,
            True,
            False,
            True,
            0,
            0,
        )
        for i in range(200)
    ]
    data, recs = build(specs, base=0)
    records = keyed.parse(data)
    keep = np.ones(len(recs), dtype=bool)
    keep[1::3] = False  # every batch splits into two
    rebuilt = keyed.rebuild(records, keep)
    index = rebuilt.sparse_index(0, recs[-1].offset)
    assert len(rebuilt.batch_positions) == 400
    assert len(index.offsets) == len(rebuilt.data) // (256 << 10) + 1
    gaps = np.diff(np.asarray(index.positions))
    assert (gaps >= 256 << 10).all()


def test_a_flipped_byte_names_the_batch() -> None:
    data, _ = build(
        [BatchSpec([(CUTOFF_MS, b"k", b"v", ())] * 3, rb.COMPRESSION_NONE, True, False, True, 0, 0)]
        * 2
    )
    broken = bytearray(data)
    broken[-2] ^= 0xFF
    with pytest.raises(CorruptBatch, match=r"offset 103 \(byte \d+\): CRC mismatch"):
        keyed.parse(bytes(broken))
    with pytest.raises(CorruptBatch, match="not a whole batch"):
        keyed.parse(data[:-1])


def test_lengths_that_overrun_the_section_are_refused() -> None:
    data, _ = build(
        [BatchSpec([(CUTOFF_MS, b"k", b"v", ())] * 3, rb.COMPRESSION_NONE, True, False, True, 0, 0)]
    )
    broken = bytearray(data)
    # the first value length (after 3 timestamp deltas and 3 key lengths) grows by one
    broken[rb.HEADER_SIZE + 24] += 1
    broken[rb.CRC_FIELD_OFFSET : rb.CRC_START] = rb.CRC_FIELD.pack(
        zlib.crc32(bytes(broken[rb.CRC_START :]))
    )
    with pytest.raises(CorruptBatch, match=r"offset 100 .*length columns disagree"):
        keyed.parse(bytes(broken))
