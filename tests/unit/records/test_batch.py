"""The record batch codec: round trips, integrity checks and hostile input."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from headrace.errors import BatchTooLarge, CorruptBatch
from headrace.records import batch as rb
from headrace.records import codecs

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

header_names = st.text(max_size=8)
header_lists = st.lists(st.tuples(header_names, st.binary(max_size=16)), max_size=3)


@st.composite
def record_sets(draw: st.DrawFn) -> dict[str, Any]:
    """Arguments for ``rb.encode`` with every optional column switched on or off."""
    n = draw(st.integers(1, 12))
    values = draw(st.lists(st.binary(max_size=40), min_size=n, max_size=n))
    kwargs: dict[str, Any] = {"values": values}
    if draw(st.booleans()):
        kwargs["keys"] = draw(st.lists(st.none() | st.binary(max_size=12), min_size=n, max_size=n))
    if draw(st.booleans()):
        kwargs["headers"] = draw(st.lists(header_lists, min_size=n, max_size=n))
    if draw(st.booleans()):
        first = draw(st.integers(-(2**40), 2**44))
        deltas = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))
        kwargs["timestamps"] = [first + d for d in deltas]
    else:
        kwargs["timestamp_ms"] = draw(st.integers(-(2**40), 2**44))
    kwargs["compression"] = draw(st.sampled_from(sorted(codecs.KNOWN)))
    kwargs["producer_id"] = draw(st.integers(0, 2**64 - 1))
    kwargs["base_sequence"] = draw(st.integers(0, 2**32 - 1))
    return kwargs


def recrc(buf: bytearray) -> bytes:
    """Recompute the CRC after a deliberate edit under it (to reach the deeper checks)."""
    rb.CRC_FIELD.pack_into(buf, rb.CRC_FIELD_OFFSET, zlib.crc32(memoryview(buf)[rb.CRC_START :]))
    return bytes(buf)


def simple_batch(n: int = 3, **kwargs: Any) -> bytes:
    return rb.encode([f"value-{i}".encode() for i in range(n)], timestamp_ms=1_000, **kwargs)


# --------------------------------------------------------------------------- round trips


@FAST
@given(record_sets())
def test_round_trip_of_arbitrary_records(kwargs: dict[str, Any]) -> None:
    raw = rb.encode(**kwargs)
    header = rb.validate(raw)
    values = kwargs["values"]
    n = len(values)
    assert header.record_count == n
    assert header.size == len(raw)
    assert header.base_offset == 0
    assert header.leader_epoch == -1
    assert header.producer_id == kwargs["producer_id"]
    assert header.base_sequence == kwargs["base_sequence"]
    assert header.compression == kwargs["compression"]

    decoded = rb.decode(raw)
    assert decoded.values == values
    keys = kwargs.get("keys")
    assert decoded.keys == (keys if keys is not None else [None] * n)
    timestamps = kwargs.get("timestamps")
    if timestamps is None:
        timestamps = [kwargs["timestamp_ms"]] * n
    assert decoded.timestamps == timestamps
    assert header.first_timestamp == min(timestamps)
    assert header.max_timestamp == max(timestamps)
    headers = kwargs.get("headers")
    expected_headers = [tuple(h) for h in headers] if headers is not None else [()] * n
    assert decoded.headers() == expected_headers

    records = decoded.records()
    assert [r.offset for r in records] == list(range(n))
    assert [r.value for r in records] == values
    assert [r.key for r in records] == decoded.keys
    assert [r.headers for r in records] == expected_headers


def test_round_trip_with_every_column_and_zlib() -> None:
    raw = rb.encode(
        [b"a", b"", b"ccc"],
        keys=[b"k1", None, b""],
        headers=[[("h", b"1")], [], [("x", b""), ("\u00e9", b"\x00")]],
        timestamps=[50, 10, 30],
        compression=rb.COMPRESSION_ZLIB,
        producer_id=9,
        base_sequence=4,
    )
    header = rb.validate(raw)
    assert header.attributes == (
        rb.COMPRESSION_ZLIB | rb.ATTR_KEYS | rb.ATTR_HEADERS | rb.ATTR_TIMESTAMPS
    )
    assert (header.first_timestamp, header.max_timestamp) == (10, 50)
    records = rb.decode(raw).records()
    assert [(r.key, r.value, r.timestamp_ms) for r in records] == [
        (b"k1", b"a", 50),
        (None, b"", 10),
        (b"", b"ccc", 30),
    ]
    assert records[2].headers == (("x", b""), ("\u00e9", b"\x00"))


def test_zlib_shrinks_repetitive_values_and_keeps_uncompressed_length() -> None:
    values = [b"x" * 200] * 20
    plain = rb.encode(values, timestamp_ms=0)
    packed = rb.encode(values, timestamp_ms=0, compression=rb.COMPRESSION_ZLIB)
    assert len(packed) < len(plain) // 4
    assert rb.read_header(packed).section_length == rb.read_header(plain).section_length
    assert rb.decode(packed).values == values


def test_records_from_offset_skips_the_head_of_the_batch() -> None:
    raw = bytearray(simple_batch(5))
    rb.stamp(raw, 100, 3)
    records = rb.decode(raw).records(from_offset=103)
    assert [r.offset for r in records] == [103, 104]
    assert [r.value for r in records] == [b"value-3", b"value-4"]


def test_header_properties() -> None:
    raw = bytearray(simple_batch(4))
    rb.stamp(raw, 10, 1)
    header = rb.read_header(raw)
    assert (header.last_offset, header.next_offset) == (13, 14)
    assert header.size == len(raw)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"values": [], "timestamp_ms": 0}, "at least one record"),
        ({"values": [b"a"], "keys": [b"k", b"k"], "timestamp_ms": 0}, "keys"),
        ({"values": [b"a"], "headers": [[], []], "timestamp_ms": 0}, "headers"),
        ({"values": [b"a"], "timestamps": [1, 2]}, "timestamps"),
        ({"values": [b"a"], "compression": 5, "timestamp_ms": 0}, "compression"),
        ({"values": [b"a", b"b"], "timestamps": [0, 2**32]}, "span"),
        # the codec is pure: the caller says when, never the clock
        ({"values": [b"a"]}, "timestamps or timestamp_ms"),
        ({"values": [b"a"], "timestamps": [1], "timestamp_ms": 1}, "timestamps or timestamp_ms"),
    ],
)
def test_encode_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rb.encode(**kwargs)


# --------------------------------------------------------------------------- integrity


@FAST
@given(record_sets(), st.data())
def test_any_single_byte_corruption_under_the_crc_is_detected(
    kwargs: dict[str, Any], data: st.DataObject
) -> None:
    raw = bytearray(rb.encode(**kwargs))
    index = data.draw(st.integers(rb.CRC_START, len(raw) - 1), label="index")
    flip = data.draw(st.integers(1, 255), label="xor")
    raw[index] ^= flip
    with pytest.raises(CorruptBatch):
        rb.validate(raw)


@pytest.mark.parametrize("index", [*range(8, 12), *range(16, 21)])
def test_corruption_of_length_magic_or_crc_is_detected(index: int) -> None:
    raw = bytearray(simple_batch())
    raw[index] ^= 0x01
    with pytest.raises(CorruptBatch):
        rb.validate(raw)


@pytest.mark.parametrize("index", [*range(0, 8), *range(12, 16)])
def test_leader_stamped_fields_lie_outside_the_crc(index: int) -> None:
    # By design: base_offset and leader_epoch are rewritten by the leader, so
    # validate() cannot see damage there; recovery checks them by continuity.
    raw = bytearray(simple_batch())
    raw[index] ^= 0x01
    rb.validate(raw)


@FAST
@given(record_sets(), st.data())
def test_truncation_anywhere_is_detected(kwargs: dict[str, Any], data: st.DataObject) -> None:
    raw = rb.encode(**kwargs)
    cut = data.draw(st.integers(0, len(raw) - 1), label="cut")
    with pytest.raises(CorruptBatch):
        rb.validate(raw[:cut])


def test_trailing_bytes_are_detected() -> None:
    with pytest.raises(CorruptBatch, match="batch_length"):
        rb.validate(simple_batch() + b"\x00")


def test_max_batch_bytes_is_enforced_before_parsing() -> None:
    raw = simple_batch()
    assert rb.validate(raw, max_batch_bytes=len(raw)).size == len(raw)
    with pytest.raises(BatchTooLarge):
        rb.validate(raw, max_batch_bytes=len(raw) - 1)


def _edit(field_offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(simple_batch())
    struct.pack_into(fmt, buf, field_offset, value)
    return recrc(buf)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_edit(16, "<B", 2), "magic"),
        (_edit(21, "<H", 0x40), "attributes"),
        (_edit(21, "<H", 0x05), "compression"),
        (_edit(23, "<I", 0), "no records"),
        (_edit(35, "<q", 999), "max_timestamp"),
        (_edit(55, "<I", 1), "section_length"),
    ],
)
def test_header_checks_run_even_with_a_good_crc(raw: bytes, message: str) -> None:
    with pytest.raises(CorruptBatch, match=message):
        rb.validate(raw)


# --------------------------------------------------------------------------- stamping


@FAST
@given(record_sets(), st.integers(0, 2**64 - 1), st.integers(-(2**31), 2**31 - 1))
def test_stamping_offset_and_epoch_keeps_the_crc_valid(
    kwargs: dict[str, Any], base_offset: int, epoch: int
) -> None:
    raw = rb.encode(**kwargs)
    stamped = bytearray(raw)
    rb.stamp(stamped, base_offset, epoch)
    header = rb.validate(stamped)
    assert (header.base_offset, header.leader_epoch) == (base_offset, epoch)
    assert stamped[16:] == raw[16:]
    # the writev form: stamped prefix + the untouched body
    assert rb.stamped_prefix(raw, base_offset, epoch) + raw[16:] == stamped
    assert rb.stamped_prefix(memoryview(raw), base_offset, epoch) == stamped[:16]


@FAST
@given(record_sets(), st.integers(0, 2**32 - 1))
def test_restamp_sequence_rewrites_the_crc(kwargs: dict[str, Any], sequence: int) -> None:
    raw = rb.encode(**kwargs)
    out = rb.restamp_sequence(raw, sequence)
    header = rb.validate(out)
    assert header.base_sequence == sequence
    assert rb.decode(out).values == kwargs["values"]
    changed = {i for i, (a, b) in enumerate(zip(raw, out, strict=True)) if a != b}
    allowed = set(range(rb.CRC_FIELD_OFFSET, rb.CRC_START)) | set(
        range(rb.SEQUENCE_FIELD_OFFSET, rb.SEQUENCE_FIELD_OFFSET + 4)
    )
    assert changed <= allowed


def test_crc_ok_checks_a_batch_inside_a_larger_buffer() -> None:
    first, second = simple_batch(2), simple_batch(3)
    buf = bytearray(first + second)
    header = rb.read_header(buf, len(first))
    assert rb.crc_ok(buf, header, len(first))
    buf[len(first) + 40] ^= 0xFF
    assert not rb.crc_ok(buf, header, len(first))
    assert rb.crc_ok(buf, rb.read_header(buf), 0)


# --------------------------------------------------------------------------- boundaries


@FAST
@given(st.lists(record_sets(), min_size=1, max_size=5), st.data())
def test_scan_and_complete_prefix_find_exactly_the_whole_batches(
    sets: list[dict[str, Any]], data: st.DataObject
) -> None:
    batches = [rb.encode(**k) for k in sets]
    buf = b"".join(batches)
    ends = [0]
    for b in batches:
        ends.append(ends[-1] + len(b))
    cut = data.draw(st.integers(0, len(buf)), label="cut")
    prefix = buf[:cut]
    whole = max(e for e in ends if e <= cut)
    assert rb.complete_prefix_length(prefix) == whole
    scanned = list(rb.scan(prefix))
    assert [pos for pos, _ in scanned] == [
        ends[i] for i in range(len(batches)) if ends[i + 1] <= cut
    ]
    assert all(h.size == len(batches[i]) for i, (_, h) in enumerate(scanned))


def test_scan_starts_at_a_position_and_stops_at_a_bogus_length() -> None:
    a, b = simple_batch(1), simple_batch(2)
    assert [p for p, _ in rb.scan(a + b, len(a))] == [len(a)]
    bogus = bytearray(b)
    struct.pack_into("<I", bogus, 8, 3)  # length shorter than a header
    assert [p for p, _ in rb.scan(a + bytes(bogus))] == [0]
    assert rb.complete_prefix_length(a + bytes(bogus)) == len(a)


def test_read_header_needs_a_whole_header() -> None:
    with pytest.raises(CorruptBatch):
        rb.read_header(simple_batch()[: rb.HEADER_SIZE - 1])
    with pytest.raises(CorruptBatch):
        rb.read_header(simple_batch(), pos=len(simple_batch()) - 10)


# --------------------------------------------------------------------------- hostile input


def _decode_fully(buf: bytes | bytearray) -> None:
    decoded = rb.decode(buf)
    decoded.records()
    decoded.headers()


def _only_corrupt_batch(buf: bytes | bytearray) -> None:
    try:
        _decode_fully(buf)
    except CorruptBatch:
        pass


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_decoding_garbage_raises_only_corrupt_batch(garbage: bytes) -> None:
    _only_corrupt_batch(garbage)
    try:
        rb.validate(garbage)
    except CorruptBatch:
        pass


@st.composite
def plausible_batches(draw: st.DrawFn) -> bytes:
    """A header that passes validation over an arbitrary record section."""
    codec = draw(st.sampled_from(sorted(codecs.KNOWN)))
    attributes = draw(st.integers(0, rb.KNOWN_ATTRIBUTES)) & ~rb.COMPRESSION_MASK | codec
    section = draw(st.binary(max_size=200))
    count = draw(st.integers(1, 40))
    if codec:
        section_length = draw(st.integers(0, 400))
        section = codecs.compress(codec, section) if draw(st.booleans()) else section
    else:
        section_length = len(section)
    body = struct.pack("<HIqqQII", attributes, count, 5, 7, 0, 0, section_length) + section
    return (
        struct.pack("<QIiBI", 0, rb.HEADER_SIZE - 12 + len(section), 0, 1, zlib.crc32(body)) + body
    )


@settings(max_examples=400, deadline=None)
@given(plausible_batches())
def test_decoding_a_valid_header_over_garbage_raises_only_corrupt_batch(raw: bytes) -> None:
    rb.validate(raw)  # the broker would accept it: it never looks inside
    _only_corrupt_batch(raw)


@FAST
@given(record_sets(), st.data())
def test_decoding_a_recrced_mutation_raises_only_corrupt_batch(
    kwargs: dict[str, Any], data: st.DataObject
) -> None:
    # A producer can send a batch with a correct CRC over a bad record section.
    raw = bytearray(rb.encode(**kwargs))
    assume(len(raw) > rb.HEADER_SIZE)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        index = data.draw(st.integers(rb.HEADER_SIZE, len(raw) - 1), label="index")
        raw[index] = data.draw(st.integers(0, 255), label="byte")
    _only_corrupt_batch(recrc(raw))


def test_malformed_header_block_is_a_corrupt_batch() -> None:
    # one record whose header block claims a header but holds 3 bytes
    section = struct.pack("<II", 1, 3) + b"v" + b"\x05\x00\x00"
    body = struct.pack("<HIqqQII", rb.ATTR_HEADERS, 1, 1, 1, 0, 0, len(section)) + section
    raw = struct.pack("<QIiBI", 0, rb.HEADER_SIZE - 12 + len(section), 0, 1, zlib.crc32(body))
    raw += body
    rb.validate(raw)
    with pytest.raises(CorruptBatch):
        rb.decode(raw).records()


def test_header_name_that_is_not_utf8_is_a_corrupt_batch() -> None:
    block = struct.pack("<HH", 1, 1) + b"\xff" + struct.pack("<I", 0)
    with pytest.raises(CorruptBatch):
        rb.decode_header_block(block)


def test_decompression_bomb_is_refused_without_inflating_it() -> None:
    import tracemalloc

    bomb = zlib.compress(b"\x00" * (64 * 1024 * 1024), 9)
    body = struct.pack("<HIqqQII", rb.COMPRESSION_ZLIB, 1, 0, 0, 0, 0, 8) + bomb
    raw = struct.pack("<QIiBI", 0, rb.HEADER_SIZE - 12 + len(bomb), 0, 1, zlib.crc32(body)) + body
    rb.validate(raw)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptBatch):
            rb.decode(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 0xFFFF_FFFF))
def test_the_batch_crc_is_zlibs_crc32(data: bytes, start: int) -> None:
    """The accelerated CRC (zlib-ng) must give zlib's values: logs written with either
    stay readable by the other, and by every client."""
    assert rb.crc32(data) == zlib.crc32(data)
    assert rb.crc32(data, start) == zlib.crc32(data, start)
    assert rb.crc32(memoryview(data)[3:]) == zlib.crc32(data[3:])
