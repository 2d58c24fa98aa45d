"""The records of a Kafka v2 batch, for readers of our own API (pure, consumer side).

A partition's log may hold Kafka batches as a Kafka producer sent them
(``docs/storage-format.md`` §1.1). Our consumers, the blocking client and the
Spark jobs read them through ``DecodedBatch``, which hands the record section
here. Kafka's records are varint-framed one after another, so this decoder walks
them one by one: it runs in the reader, never in the broker.

The broker refuses, before it writes a Kafka batch, an uncompressed record section
this decoder would refuse: :func:`check_structure` walks the records once in C
(``_kafka_check.c``, compiled by the project's build), building no objects.

Kafka's codec ids are its own (1 gzip, 2 snappy, 3 lz4, 4 zstd). A Kafka batch
does not say how large its records inflate to, so inflation is bounded by
:data:`MAX_INFLATED`: a small batch that inflates past it is refused without
being inflated further.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Final

from headrace.errors import CodecUnavailable, CorruptBatch, DecompressionFailed, UnknownCodec

try:
    from headrace.records._kafka_check import check_records as _check_records
except ImportError:  # pragma: no cover - a checkout whose editable install predates the C file
    _check_records = None  # type: ignore[assignment]

KAFKA_NONE: Final = 0
KAFKA_GZIP: Final = 1
KAFKA_SNAPPY: Final = 2
KAFKA_LZ4: Final = 3
KAFKA_ZSTD: Final = 4

#: the largest record section a Kafka batch may inflate to (Kafka's own default
#: ``message.max.bytes`` is 1 MiB compressed; 256 MiB leaves room for any ratio)
MAX_INFLATED: Final = 256 << 20

_EXTRA_HINT = "install the compression extra: pip install 'headrace[compression]'"


@dataclass(frozen=True, slots=True)
class KafkaRecords:
    """One Kafka batch's records as columns. A null value (Kafka's tombstone) is ``b""``:
    our records have no null value."""

    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes]
    headers: list[tuple[tuple[str, bytes], ...]]


def inflate(codec: int, raw: bytes | memoryview) -> bytes | memoryview:
    """The record section of a Kafka batch, inflated with Kafka's codec ``codec``."""
    if codec == KAFKA_NONE:
        return raw
    if codec == KAFKA_GZIP:
        inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header, as Kafka's readers accept
        try:
            section = inflater.decompress(raw, MAX_INFLATED + 1)
        except zlib.error as exc:
            raise DecompressionFailed(f"cannot decompress gzip Kafka batch: {exc}") from exc
        if len(section) > MAX_INFLATED:
            raise DecompressionFailed(f"gzip Kafka batch inflates past {MAX_INFLATED} bytes")
        if not inflater.eof:
            raise DecompressionFailed("gzip Kafka batch is truncated")
        return section
    if codec == KAFKA_LZ4:
        lz4_frame = _optional("lz4.frame", "lz4")
        lz4_inflater = lz4_frame.LZ4FrameDecompressor()
        try:
            section = lz4_inflater.decompress(raw, max_length=MAX_INFLATED + 1)
        except RuntimeError as exc:  # lz4 reports every decoding failure as RuntimeError
            raise DecompressionFailed(f"cannot decompress lz4 Kafka batch: {exc}") from exc
        if len(section) > MAX_INFLATED:
            raise DecompressionFailed(f"lz4 Kafka batch inflates past {MAX_INFLATED} bytes")
        if not lz4_inflater.eof or lz4_inflater.unused_data:
            raise DecompressionFailed("lz4 Kafka frame is truncated or has trailing bytes")
        return bytes(section)
    if codec == KAFKA_ZSTD:
        zstandard = _optional("zstandard", "zstd")
        chunks: list[bytes] = []
        size = 0
        try:
            with zstandard.ZstdDecompressor().stream_reader(bytes(raw)) as stream:
                while chunk := stream.read(1 << 20):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_INFLATED:
                        raise DecompressionFailed(
                            f"zstd Kafka batch inflates past {MAX_INFLATED} bytes"
                        )
        except zstandard.ZstdError as exc:
            raise DecompressionFailed(f"cannot decompress zstd Kafka batch: {exc}") from exc
        return b"".join(chunks)
    if codec == KAFKA_SNAPPY:
        raise CodecUnavailable("snappy Kafka batches cannot be read by headrace's readers yet")
    raise UnknownCodec(f"unknown Kafka compression codec {codec}")


def _optional(module: str, codec: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        raise CodecUnavailable(f"the {codec} codec needs {module}; {_EXTRA_HINT}") from exc


def check_structure(section: bytes | memoryview, count: int) -> None:
    """Refuse (``CorruptBatch``) an uncompressed record section that does not hold exactly
    ``count`` records, each well formed and exactly as long as it says, and nothing after
    them: what :func:`decode_records` would refuse, checked in C without decoding."""
    if _check_records is None:  # pragma: no cover
        raise ImportError(
            "headrace.records._kafka_check is not built: reinstall headrace"
            " (make setup, or pip install -e .), which compiles it"
        )
    problem = _check_records(section, count)
    if problem is not None:
        raise CorruptBatch(problem)


def decode_records(section: bytes | memoryview, count: int, base_timestamp: int) -> KafkaRecords:
    """``count`` Kafka v2 records from ``section`` (inflated), each exactly as long as it says."""
    buf = bytes(section)
    reader = _Reader(buf)
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes] = []
    headers: list[tuple[tuple[str, bytes], ...]] = []
    try:
        for index in range(count):
            length = reader.varint()
            end = reader.pos + length
            if length < 0 or end > len(buf):
                raise CorruptBatch(f"Kafka record {index} overruns the batch")
            reader.pos += 1  # the record's attributes: unused in v2
            timestamps.append(base_timestamp + reader.varint())
            if reader.varint() != index:
                raise CorruptBatch(f"Kafka record {index} has offset delta out of order")
            keys.append(reader.blob())
            values.append(reader.blob() or b"")
            pairs = []
            for _ in range(reader.varint()):
                name = reader.blob()
                if name is None:
                    raise CorruptBatch(f"Kafka record {index} has a null header key")
                pairs.append((name.decode(), reader.blob() or b""))
            headers.append(tuple(pairs))
            if reader.pos != end:
                raise CorruptBatch(f"Kafka record {index} disagrees with its length")
    except (IndexError, UnicodeDecodeError) as exc:
        raise CorruptBatch(f"malformed Kafka record section: {exc}") from exc
    if reader.pos != len(buf):
        raise CorruptBatch("Kafka record section has trailing bytes")
    return KafkaRecords(timestamps, keys, values, headers)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def varint(self) -> int:
        """A zigzag varint (Kafka's varint and varlong share it)."""
        shift = 0
        raw = 0
        while True:
            byte = self.buf[self.pos]
            self.pos += 1
            raw |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (raw >> 1) ^ -(raw & 1)
            shift += 7
            if shift > 63:
                raise CorruptBatch("Kafka varint longer than 10 bytes")

    def blob(self) -> bytes | None:
        length = self.varint()
        if length < 0:
            return None
        start = self.pos
        self.pos += length
        if self.pos > len(self.buf):
            raise IndexError("a length runs past the record")
        return self.buf[start : self.pos]
