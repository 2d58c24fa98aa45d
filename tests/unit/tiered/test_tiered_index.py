"""Checking upload input, and the sparse index object."""

from __future__ import annotations

import pytest
from tiered_batches import boundaries, run, stamped

from headrace.errors import CorruptBatch
from headrace.records import batch as rb
from headrace.tiered import index


def test_summarize_finds_the_range_and_indexes_every_interval() -> None:
    data = run(1000, [10] * 40, value_bytes=200)  # ~2 KiB batches
    summary = index.summarize(data, interval=8 << 10)
    assert (summary.base, summary.last, summary.size) == (1000, 1399, len(data))
    idx = summary.index
    starts = {pos: base for pos, base, _ in boundaries(data)}
    assert idx.offsets[0] == 1000 and idx.positions[0] == 0
    for o, p in zip(idx.offsets, idx.positions, strict=True):
        assert starts[p] == o  # every entry is a batch start
    gaps = [b - a for a, b in zip(idx.positions, idx.positions[1:], strict=False)]
    assert all(g >= 8 << 10 for g in gaps)
    assert all(g < (8 << 10) + 3000 for g in gaps)  # the first batch at or past the interval


def test_one_batch_is_one_entry() -> None:
    summary = index.summarize(stamped(7, 3))
    assert summary.index.offsets == (7,) and summary.index.positions == (0,)
    assert (summary.base, summary.last) == (7, 9)


def test_floor_finds_where_to_start_scanning() -> None:
    idx = index.SparseIndex(100, 399, 9000, (100, 200, 300), (0, 3000, 6000))
    assert idx.floor(100) == (100, 0)
    assert idx.floor(199) == (100, 0)
    assert idx.floor(200) == (200, 3000)
    assert idx.floor(399) == (300, 6000)
    assert idx.floor(50) == (100, 0)  # below: the start (the reader then finds no batch)


def test_index_objects_round_trip() -> None:
    data = run(0, [5] * 100, value_bytes=300)
    idx = index.summarize(data, interval=4096).index
    raw = idx.encode()
    assert raw[:4] == b"HRSX"
    assert len(raw) == index.HEAD_SIZE + 16 * len(idx.offsets)
    assert index.SparseIndex.decode(raw, 0, 499, len(data)) == idx


def damaged(raw: bytes, at: int) -> bytes:
    out = bytearray(raw)
    out[at] ^= 0x01
    return bytes(out)


def test_damaged_or_foreign_index_objects_are_refused() -> None:
    data = run(0, [5] * 100, value_bytes=300)
    raw = index.summarize(data, interval=4096).index.encode()
    size = len(data)
    for bad, why in [
        (raw[:20], "shorter than its header"),
        (b"XXXX" + raw[4:], "not an index object"),
        (damaged(raw, len(raw) - 3), "CRC mismatch"),
        (damaged(raw, 9), "CRC mismatch"),  # the header is under the CRC too
        (raw[:-16], "entries"),
    ]:
        with pytest.raises(index.InvalidIndex, match=why):
            index.SparseIndex.decode(bad, 0, 499, size)
    with pytest.raises(index.InvalidIndex, match="describes"):
        index.SparseIndex.decode(raw, 0, 499, size + 1)  # the object was replaced by another


def corrupt_crc(batch: bytes) -> bytes:
    out = bytearray(batch)
    out[-1] ^= 0xFF  # inside the record section, under the CRC
    return bytes(out)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "no batches"),
        (stamped(0, 5)[:-1], "not a complete batch"),
        (stamped(0, 5) + b"\x00" * 10, "not a complete batch"),
        (stamped(0, 5) + stamped(6, 5), "expected 5"),  # a hole
        (stamped(0, 5) + stamped(3, 5), "expected 5"),  # an overlap
        (stamped(0, 5) + corrupt_crc(stamped(5, 5)), "CRC mismatch in the batch at byte"),
    ],
)
def test_summarize_refuses_damaged_input(data: bytes, why: str) -> None:
    with pytest.raises(CorruptBatch, match=why):
        index.summarize(data)


def test_summarize_refuses_a_bad_header() -> None:
    bad = bytearray(stamped(0, 5))
    bad[16] = 9  # magic
    with pytest.raises(CorruptBatch, match="magic"):
        index.summarize(bytes(bad))
    assert rb.read_header(bad).magic == 9
