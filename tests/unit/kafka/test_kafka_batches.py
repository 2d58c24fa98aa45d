"""Kafka v2 record batches in our log: validated as sent, stored behind our prefix.

Batches come from aiokafka's own builder, so the layout is not ours to get wrong twice.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from headrace.checksums import crc32c
from headrace.errors import BatchTooLarge, CorruptBatch, InvalidRecordBatch
from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk
from headrace.storage.log import PartitionLog


def kafka_batch(n: int = 3, *, transactional: bool = False, producer_id: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=-1 if producer_id < 0 else 0,
        base_sequence=-1 if producer_id < 0 else 0,
        batch_size=1 << 20,
    )
    for i in range(n):
        builder.append(
            i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v%d" % i, headers=[]
        )
    return bytes(builder.build())


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_a_kafka_batch_validates_and_reads_as_our_header() -> None:
    raw = kafka_batch(3)
    header = rb.validate_kafka(raw)
    assert header.magic == rb.KAFKA_MAGIC
    assert header.record_count == 3
    assert header.size == len(raw)
    assert header.producer_id == 0  # Kafka's -1: no producer
    assert header.max_timestamp == 1_700_000_000_002


def test_stored_kafka_batch_keeps_its_crc_and_restamps_to_kafkas_prefix() -> None:
    raw = kafka_batch(2)
    header = rb.validate_kafka(raw)
    stored = rb.stamp_prefix(header, 42, 7) + raw[16:]
    read = rb.read_header(stored)
    assert (read.base_offset, read.leader_epoch, read.record_count) == (42, 7, 2)
    assert read.last_offset == 43
    assert rb.crc_ok(stored, read)
    rb.check_header(read)  # what recovery runs
    assert [pos for pos, _ in rb.scan(stored + stored)] == [0, len(stored)]
    served = rb.kafka_prefix(read) + stored[16:]
    assert struct.unpack_from(">qii", served) == (42, len(raw) - 12, 7)
    assert served[16:] == raw[16:]


@pytest.mark.parametrize("where", [22, 30, -1])
def test_a_flipped_bit_under_the_crc_is_corrupt(where: int) -> None:
    raw = bytearray(kafka_batch())
    raw[where] ^= 0x01
    with pytest.raises(CorruptBatch, match="CRC"):
        rb.validate_kafka(bytes(raw))


def test_wrong_length_magic_and_size_limits() -> None:
    raw = kafka_batch()
    with pytest.raises(CorruptBatch):
        rb.validate_kafka(raw[:-1])
    with pytest.raises(CorruptBatch):
        rb.validate_kafka(raw + raw)  # exactly one batch per partition
    with pytest.raises(CorruptBatch, match="magic"):
        rb.validate_kafka(raw[:16] + b"\x01" + raw[17:])
    with pytest.raises(CorruptBatch):
        rb.validate_kafka(raw[:40])
    with pytest.raises(BatchTooLarge):
        rb.validate_kafka(raw, max_batch_bytes=len(raw) - 1)


def test_transactional_batches_and_producer_id_0_are_refused_as_invalid_records() -> None:
    with pytest.raises(InvalidRecordBatch):
        rb.validate_kafka(kafka_batch(transactional=True, producer_id=5))
    with pytest.raises(InvalidRecordBatch):
        rb.validate_kafka(kafka_batch(producer_id=0))


@pytest.mark.xfail(
    strict=True,
    reason="the broker checks a Kafka batch's header and CRC-32C, not its record section"
    " (docs/kafka.md, Validation before anything is written)",
)
def test_a_record_section_that_does_not_parse_is_refused_under_a_valid_crc() -> None:
    # A producer that sends garbled records with a CRC computed over them: stored, no
    # reader of ours can decode the batch.
    raw = bytearray(kafka_batch(3))
    raw[rb.KAFKA_HEADER_SIZE] = 0x7E  # the first record's length: 63 bytes, past the batch
    struct.pack_into(">I", raw, rb.CRC_START - 4, crc32c(bytes(raw[rb.CRC_START :])))
    with pytest.raises(CorruptBatch):
        rb.decode(rb.stamp_prefix(rb.read_kafka_wire_header(raw), 0, 0) + raw[16:]).records()
    with pytest.raises(CorruptBatch):
        rb.validate_kafka(bytes(raw))


def test_an_idempotent_batch_reads_as_our_producer_and_sequence() -> None:
    header = rb.validate_kafka(kafka_batch(4, producer_id=5))
    assert (header.producer_id, header.base_sequence, header.record_count) == (5, 0, 4)


def test_the_native_validator_refuses_a_kafka_batch() -> None:
    raw = kafka_batch()
    header = rb.validate_kafka(raw)
    with pytest.raises(CorruptBatch, match="magic"):
        rb.validate(rb.stamp_prefix(header, 0, -1) + raw[16:])


def test_a_log_of_both_formats_recovers_and_reads_back(tmp_path: Path) -> None:
    """Kafka batches appended next to ours survive a reopen without a recovery point
    (a full scan: header checks and CRCs of both formats) and read back byte for byte."""
    config = bk.LogConfig(fsync=bk.FsyncPolicy.NONE, index_interval_bytes=64)
    log = PartitionLog.open(tmp_path / "p", config)
    kafka = kafka_batch(3)
    assert log.append(kafka, rb.validate_kafka(kafka), 4).base_offset == 0
    native = rb.encode([b"n0", b"n1"], timestamp_ms=1_000)
    assert log.append(native, rb.validate(native), 4).base_offset == 3
    assert log.append(kafka, rb.validate_kafka(kafka), 5).base_offset == 5
    log.close()
    again = PartitionLog.open(tmp_path / "p", config)
    try:
        assert again.next_offset == 8
        data, _ = again.read(0, 1 << 20)
        headers = [h for _, h in rb.scan(data)]
        assert [(h.magic, h.base_offset, h.leader_epoch) for h in headers] == [
            (2, 0, 4),
            (1, 3, 4),
            (2, 5, 5),
        ]
        assert bytes(data[16 : len(kafka)]) == kafka[16:]
        later, _ = again.read(5, 1 << 20)
        assert rb.kafka_prefix(rb.read_header(later)) + bytes(later[16:]) == (
            struct.pack(">qii", 5, len(kafka) - 12, 5) + kafka[16:]
        )
    finally:
        again.close()


def test_recovery_truncates_a_kafka_batch_with_a_bad_crc(tmp_path: Path) -> None:
    config = bk.LogConfig(fsync=bk.FsyncPolicy.NONE, index_interval_bytes=64)
    log = PartitionLog.open(tmp_path / "p", config)
    kafka = kafka_batch(3)
    log.append(kafka, rb.validate_kafka(kafka), 0)
    log.append(kafka, rb.validate_kafka(kafka), 0)
    log.close()
    segment = tmp_path / "p" / "00000000000000000000.log"
    raw = bytearray(segment.read_bytes())
    raw[-1] ^= 0xFF  # the second batch's last byte, under its CRC-32C
    segment.write_bytes(bytes(raw))
    again = PartitionLog.open(tmp_path / "p", config)
    try:
        assert again.next_offset == 3
    finally:
        again.close()
