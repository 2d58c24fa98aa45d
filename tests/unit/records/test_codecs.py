"""Batch codecs (none, zlib, lz4, zstd): round trips, typed errors, hostile payloads."""

from __future__ import annotations

import struct
import sys
import tracemalloc
import zlib

import lz4.frame
import pytest
import zstandard

from headrace.client.producer import Producer
from headrace.errors import CodecUnavailable, CorruptBatch, DecompressionFailed, UnknownCodec
from headrace.records import batch as rb
from headrace.records import codecs

COMPRESSED = [rb.COMPRESSION_ZLIB, rb.COMPRESSION_LZ4, rb.COMPRESSION_ZSTD]
ALL = [rb.COMPRESSION_NONE, *COMPRESSED]


def handmade_batch(attributes: int, section_length: int, payload: bytes, count: int = 1) -> bytes:
    """A batch with a good CRC around any payload: what a buggy or hostile producer sends."""
    body = struct.pack("<HIqqQII", attributes, count, 0, 0, 0, 0, section_length) + payload
    prefix = struct.pack("<QIiBI", 0, rb.HEADER_SIZE - 12 + len(payload), 0, 1, zlib.crc32(body))
    return prefix + body


def json_events(n: int) -> list[bytes]:
    return [
        b'{"event":"page_view","user_id":%d,"path":"/products/%d","ok":true}' % (i, i % 17)
        for i in range(n)
    ]


@pytest.mark.parametrize("codec", ALL, ids=codecs.codec_name)
def test_every_codec_round_trips_every_column(codec: int) -> None:
    raw = rb.encode(
        [b"a", b"", b"ccc" * 50],
        keys=[b"k1", None, b""],
        headers=[[("h", b"1")], [], [("x", b"")]],
        timestamps=[50, 10, 30],
        compression=codec,
    )
    header = rb.validate(raw)
    assert header.compression == codec
    records = rb.decode(raw).records()
    assert [(r.key, r.value, r.timestamp_ms) for r in records] == [
        (b"k1", b"a", 50),
        (None, b"", 10),
        (b"", b"ccc" * 50, 30),
    ]
    assert records[0].headers == (("h", b"1"),)


@pytest.mark.parametrize("codec", COMPRESSED, ids=codecs.codec_name)
def test_compressed_codecs_shrink_json_events(codec: int) -> None:
    values = json_events(500)
    plain = rb.encode(values, timestamp_ms=0)
    packed = rb.encode(values, timestamp_ms=0, compression=codec)
    assert len(packed) < len(plain) // 3
    assert rb.read_header(packed).section_length == rb.read_header(plain).section_length
    assert rb.decode(packed).values == values


def test_codec_names_and_ids() -> None:
    assert [codecs.codec_id(n) for n in ("none", "zlib", "lz4", "ZSTD")] == [0, 1, 2, 3]
    assert codecs.codec_name(rb.COMPRESSION_LZ4) == "lz4"
    with pytest.raises(UnknownCodec, match=r"'snappy'.*none, zlib, lz4, zstd"):
        codecs.codec_id("snappy")


@pytest.mark.parametrize("codec_bits", [4, 5, 6, 7])
def test_unknown_codec_id_is_a_typed_error_for_broker_and_consumer(codec_bits: int) -> None:
    raw = handmade_batch(codec_bits, 1, b"v")
    with pytest.raises(UnknownCodec, match=f"unknown compression codec {codec_bits}"):
        rb.validate(raw)  # what the broker runs on produce
    with pytest.raises(UnknownCodec):
        rb.decode(raw)  # what a consumer runs
    # old callers that catch CorruptBatch still catch it, and it has its own wire code
    assert issubclass(UnknownCodec, CorruptBatch)
    assert UnknownCodec.CODE != CorruptBatch.CODE


def test_a_producer_with_an_unknown_codec_fails_at_construction() -> None:
    with pytest.raises(UnknownCodec):
        Producer("127.0.0.1:1", compression="snappy")
    with pytest.raises(UnknownCodec):
        Producer("127.0.0.1:1", compression=6)
    assert Producer("127.0.0.1:1", compression="zstd").compression == rb.COMPRESSION_ZSTD


def _compressed_section(codec: int, section: bytes) -> bytes:
    return codecs.compress(codec, section)


@pytest.mark.parametrize("codec", COMPRESSED, ids=codecs.codec_name)
def test_garbage_payload_is_decompression_failed(codec: int) -> None:
    raw = handmade_batch(codec, 16, b"this is not compressed at all")
    rb.validate(raw)  # the broker accepts it: it never looks inside
    with pytest.raises(DecompressionFailed, match=codecs.codec_name(codec)):
        rb.decode(raw)


@pytest.mark.parametrize("codec", COMPRESSED, ids=codecs.codec_name)
def test_truncated_payload_is_decompression_failed(codec: int) -> None:
    section = struct.pack("<I", 4) + b"abcd"
    payload = _compressed_section(codec, section)
    with pytest.raises(DecompressionFailed):
        rb.decode(handmade_batch(codec, len(section), payload[:-3]))


@pytest.mark.parametrize("codec", COMPRESSED, ids=codecs.codec_name)
def test_trailing_bytes_after_the_stream_are_decompression_failed(codec: int) -> None:
    section = struct.pack("<I", 4) + b"abcd"
    payload = _compressed_section(codec, section)
    assert rb.decode(handmade_batch(codec, len(section), payload)).values == [b"abcd"]
    with pytest.raises(DecompressionFailed):
        rb.decode(handmade_batch(codec, len(section), payload + b"\x00junk"))


@pytest.mark.parametrize("codec", COMPRESSED, ids=codecs.codec_name)
@pytest.mark.parametrize("delta", [-1, 1])
def test_section_length_that_disagrees_with_the_stream_is_decompression_failed(
    codec: int, delta: int
) -> None:
    section = struct.pack("<I", 4) + b"abcd"
    payload = _compressed_section(codec, section)
    with pytest.raises(DecompressionFailed):
        rb.decode(handmade_batch(codec, len(section) + delta, payload))


@pytest.mark.parametrize("codec", COMPRESSED, ids=codecs.codec_name)
def test_flipped_bytes_inside_the_compressed_stream_never_escape_as_other_errors(
    codec: int,
) -> None:
    section = b"".join(json_events(40))
    payload = bytearray(_compressed_section(codec, struct.pack("<I", len(section)) + section))
    for index in range(0, len(payload), 3):
        damaged = bytearray(payload)
        damaged[index] ^= 0x5A
        try:
            rb.decode(handmade_batch(codec, 4 + len(section), bytes(damaged)))
        except CorruptBatch:
            pass  # DecompressionFailed, or a section that inflates to nonsense


def test_zstd_frame_without_a_content_size_is_refused() -> None:
    section = struct.pack("<I", 4) + b"abcd"
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(section)
    with pytest.raises(DecompressionFailed, match="declares no content size"):
        rb.decode(handmade_batch(rb.COMPRESSION_ZSTD, len(section), frame))


@pytest.mark.parametrize(
    "bomb",
    [
        pytest.param(
            (rb.COMPRESSION_LZ4, lz4.frame.compress(b"\x00" * (64 << 20), store_size=False)),
            id="lz4",
        ),
        pytest.param(
            (rb.COMPRESSION_ZSTD, zstandard.ZstdCompressor().compress(b"\x00" * (64 << 20))),
            id="zstd",
        ),
    ],
)
def test_decompression_bombs_are_refused_without_inflating_them(bomb: tuple[int, bytes]) -> None:
    codec, payload = bomb
    raw = handmade_batch(codec, 8, payload)
    rb.validate(raw)
    tracemalloc.start()
    try:
        with pytest.raises(DecompressionFailed):
            rb.decode(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024


def test_missing_libraries_give_codec_unavailable_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a client installed without the compression extra: None in sys.modules fails the import
    monkeypatch.setitem(sys.modules, "lz4", None)
    monkeypatch.setitem(sys.modules, "lz4.frame", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setattr(codecs, "_zstd_spares", {"compress": [], "decompress": []})
    for codec in (rb.COMPRESSION_LZ4, rb.COMPRESSION_ZSTD):
        with pytest.raises(CodecUnavailable, match=r"headrace\[compression\]"):
            rb.encode([b"v"], timestamp_ms=0, compression=codec)
    # zlib and uncompressed batches still work
    assert rb.decode(rb.encode([b"v"], timestamp_ms=0, compression=rb.COMPRESSION_ZLIB)).values


def test_zstd_contexts_are_never_shared_between_threads() -> None:
    # two blocking clients run two event-loop threads in one process; zstandard's
    # contexts must not serve both at once
    from concurrent.futures import ThreadPoolExecutor

    def round_trips(worker: int) -> bool:
        values = [b"worker %d event %d " % (worker, i) * 20 for i in range(200)]
        for _ in range(30):
            raw = rb.encode(values, timestamp_ms=0, compression=rb.COMPRESSION_ZSTD)
            if rb.decode(raw).values != values:
                return False
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(round_trips, range(8)))
    # the spare contexts went back to the pool, at most one per thread that held one
    assert 1 <= len(codecs._zstd_spares["compress"]) <= 4
