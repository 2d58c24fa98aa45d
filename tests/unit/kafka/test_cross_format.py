"""One log, two record formats, each readable as the other.

aiokafka's own batch builder and reader are the oracle for Kafka's layout: our
batches converted for a Kafka consumer must read back through aiokafka exactly,
and batches aiokafka builds must read back through our ``DecodedBatch`` and the
Spark columns.
"""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from headrace.checksums import crc32c
from headrace.errors import CodecUnavailable, CorruptBatch, DecompressionFailed
from headrace.jobs import arrow, keyed
from headrace.kafka.convert import to_kafka
from headrace.records import batch as rb
from headrace.records import codecs, kafka_records

# Kafka's codec ids as aiokafka's builder takes them
KAFKA_CODECS = {"none": 0, "gzip": 1, "lz4": 3, "zstd": 4}


def ours(codec: int, *, headers: bool, n: int = 257, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    batch = bytearray(
        rb.encode(
            [b"v%d-" % i + b"x" * rng.randrange(0, 300) for i in range(n)],
            keys=[None if i % 4 == 0 else b"key-%d" % i for i in range(n)],
            headers=[(("trace", b"t%d" % i), ("", b"")) if i % 3 else () for i in range(n)]
            if headers
            else None,
            timestamps=[1_700_000_000_000 + rng.randrange(0, 10**6) for _ in range(n)],
            compression=codec,
        )
    )
    rb.stamp(batch, 1_000, 9)
    return bytes(batch)


@pytest.mark.parametrize("codec", sorted(codecs.KNOWN))
@pytest.mark.parametrize("headers", [False, True])
def test_our_batch_reads_back_through_kafkas_reader(codec: int, headers: bool) -> None:
    stored = ours(codec, headers=headers)
    kafka = DefaultRecordBatch(to_kafka(stored))
    assert kafka.validate_crc()
    assert (kafka.base_offset, kafka.magic, kafka.compression_type) == (1_000, 2, 0)
    assert kafka.producer_id == -1
    records = list(kafka)
    decoded = rb.DecodedBatch(stored)
    assert [r.offset for r in records] == list(range(1_000, 1_000 + 257))
    assert [r.key for r in records] == decoded.keys
    assert [r.value for r in records] == decoded.values
    assert [r.timestamp for r in records] == decoded.timestamps
    assert [tuple(r.headers) for r in records] == decoded.headers()


def test_converted_batch_keeps_offset_epoch_and_timestamps_in_kafkas_header() -> None:
    stored = ours(codecs.NONE, headers=False, n=3)
    converted = to_kafka(stored)
    header = rb.read_kafka_wire_header(converted)
    ours_header = rb.read_header(stored)
    assert (header.base_offset, header.leader_epoch, header.record_count) == (1_000, 9, 3)
    assert (header.first_timestamp, header.max_timestamp) == (
        ours_header.first_timestamp,
        ours_header.max_timestamp,
    )
    assert rb.validate_kafka(converted).size == len(converted)  # what a Kafka produce accepts


def test_a_record_section_that_lies_about_its_lengths_is_corrupt() -> None:
    stored = bytearray(ours(codecs.NONE, headers=False, n=4))
    # the first value length (after 4 timestamp deltas and 4 key lengths) grows past the end
    at = rb.HEADER_SIZE + 4 * 4 + 4 * 4
    stored[at : at + 4] = (10**6).to_bytes(4, "little")
    with pytest.raises(CorruptBatch):
        to_kafka(bytes(stored))


def kafka_batch(codec: str, n: int = 200, seed: int = 2) -> tuple[bytes, list[tuple]]:
    rng = random.Random(seed)
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=KAFKA_CODECS[codec] if codec in ("none", "gzip") else 0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    base = 1_700_000_000_000
    expected = []
    for i in range(n):
        key = None if i % 5 == 0 else b"k%d" % i
        value = b"value-%d-" % i + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        # Kafka's deltas are signed: a later record may be older than the first
        timestamp = base + rng.randrange(-5_000, 5_000)
        headers = [("h", b"%d" % i)] if i % 2 else []
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=headers)
        expected.append((key, value, timestamp, tuple(headers)))
    raw = bytes(builder.build())
    if codec in ("lz4", "zstd"):  # aiokafka's builder needs cramjam for these
        raw = compressed(raw, codec)
    header = rb.validate_kafka(raw)
    return rb.stamp_prefix(header, 5_000, 3) + raw[16:], expected


def compressed(raw: bytes, codec: str) -> bytes:
    """An uncompressed Kafka batch with its records compressed as a whole, as Kafka does."""
    import lz4.frame
    import zstandard

    records = raw[rb.KAFKA_HEADER_SIZE :]
    if codec == "lz4":
        packed = lz4.frame.compress(records)
    else:
        packed = zstandard.ZstdCompressor().compress(records)
    head = bytearray(raw[: rb.KAFKA_HEADER_SIZE])
    struct.pack_into(">i", head, 8, rb.KAFKA_HEADER_SIZE - 12 + len(packed))
    attributes = struct.unpack_from(">h", head, 21)[0] | KAFKA_CODECS[codec]
    struct.pack_into(">h", head, 21, attributes)
    body = bytes(head[21:]) + packed
    struct.pack_into(">I", head, 17, crc32c(body))
    return bytes(head[:21]) + body


@pytest.mark.parametrize("codec", sorted(KAFKA_CODECS))
def test_a_kafka_batch_reads_back_through_our_decoder(codec: str) -> None:
    stored, expected = kafka_batch(codec)
    decoded = rb.DecodedBatch(stored)
    assert [(r.key, r.value, r.timestamp_ms, r.headers) for r in decoded.records()] == expected
    assert [r.offset for r in decoded.records(5_010)] == list(range(5_010, 5_200))
    # in our terms: keys, headers, per-record timestamps from the smallest, no codec
    assert decoded.header.compression == codecs.NONE
    assert decoded.header.first_timestamp == min(t for _, _, t, _ in expected)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_a_kafka_batch_reads_as_spark_columns(codec: str) -> None:
    stored, expected = kafka_batch(codec, n=50)
    table = arrow.to_record_batch(stored, partition=2, start=5_010).to_pylist()
    assert [row["offset"] for row in table] == list(range(5_010, 5_050))
    assert [(row["key"], row["value"]) for row in table] == [(k, v) for k, v, _, _ in expected[10:]]
    stamps = [int(row["timestamp"].timestamp() * 1000) for row in table]
    assert stamps == [t for _, _, t, _ in expected[10:]]
    assert [[(h["key"], h["value"]) for h in row["headers"] or []] for row in table] == [
        list(h) for _, _, _, h in expected[10:]
    ]


def test_a_log_of_both_formats_reads_as_one_arrow_batch() -> None:
    kafka, expected = kafka_batch("none", n=10)
    native = bytearray(rb.encode([b"a", b"b"], keys=[b"x", None], timestamp_ms=7))
    rb.stamp(native, 5_010, 3)
    table = arrow.to_record_batch(kafka + bytes(native), partition=0).to_pylist()
    assert [row["offset"] for row in table] == list(range(5_000, 5_012))
    assert [row["value"] for row in table] == [v for _, v, _, _ in expected] + [b"a", b"b"]


def test_bad_kafka_sections_get_typed_errors() -> None:
    with pytest.raises(CorruptBatch):
        kafka_records.decode_records(b"\x02\x00", 1, 0)  # a record shorter than its fields
    with pytest.raises(CorruptBatch):
        kafka_records.decode_records(b"\x00" * 3, 1, 0)  # trailing bytes after one record
    with pytest.raises(DecompressionFailed):
        kafka_records.inflate(kafka_records.KAFKA_GZIP, b"not gzip")
    with pytest.raises(CodecUnavailable):
        kafka_records.inflate(kafka_records.KAFKA_SNAPPY, b"")


def test_the_compaction_core_keeps_and_rewrites_kafka_batches() -> None:
    """A segment of a Kafka batch then one of ours: a batch kept whole is copied as it is
    (still Kafka's), one that loses records is rewritten in our format, with the
    records and offsets that were kept."""
    kafka, expected = kafka_batch("gzip", n=10)
    native = bytearray(rb.encode([b"a", b"b"], keys=[b"x", None], timestamp_ms=7))
    rb.stamp(native, 5_010, 3)
    native_whole = bytes(native)
    records = keyed.parse(kafka + native_whole)
    assert records.offsets.tolist() == list(range(5_000, 5_012))
    assert records.keys().to_pylist() == [k for k, _, _, _ in expected] + [b"x", None]

    odd = (records.offsets % 2 == 1) | (records.offsets >= 5_010)
    rebuilt = keyed.rebuild(records, odd)
    table = arrow.to_record_batch(rebuilt.data, partition=0).to_pylist()
    assert [row["offset"] for row in table] == [*range(5_001, 5_010, 2), 5_010, 5_011]
    assert [row["value"] for row in table] == [v for _, v, _, _ in expected[1::2]] + [b"a", b"b"]
    assert rebuilt.data.endswith(native_whole)  # kept whole: the same bytes

    whole = keyed.rebuild(records, np.ones(12, dtype=bool))
    assert whole.data == kafka + native_whole
