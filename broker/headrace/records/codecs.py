"""Batch compression codecs: the record section of a batch, compressed as a whole.

Pure module: bytes in, bytes out. The codec id lives in bits 0-2 of a batch's
attributes (``docs/storage-format.md`` §1.2)::

    id  name  library                 format
    0   none  -                       the record section as is
    1   zlib  zlib (standard library) zlib stream (RFC 1950), level 1
    2   lz4   lz4 (``lz4.frame``)     LZ4 frame, content size stored in the frame header
    3   zstd  zstandard               Zstandard frame, level 3, content size in the frame header
    4-7       reserved                refused with ``UnknownCodec``

The producer picks a codec per batch; the broker only checks that the id is
known (it never decompresses: that would be per-record work on the hot path);
consumers decompress. Every decoder is bounded by ``section_length`` from the
batch header, so a small batch that inflates to gigabytes is refused without
being inflated: zlib and lz4 inflate at most one byte past it, zstd frames must
declare exactly that content size (which libzstd then enforces).

lz4 and zstandard are the ``compression`` extra. They are imported when first
used, so a client without them still reads and writes uncompressed and zlib
batches, and gets ``CodecUnavailable`` (naming the extra) for the others.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, Final

from headrace.errors import CodecUnavailable, DecompressionFailed, UnknownCodec

NONE: Final = 0
ZLIB: Final = 1
LZ4: Final = 2
ZSTD: Final = 3

#: codec names as the CLI and the docs spell them, by id
NAMES: Final[Mapping[int, str]] = {NONE: "none", ZLIB: "zlib", LZ4: "lz4", ZSTD: "zstd"}
IDS: Final[Mapping[str, int]] = {name: codec for codec, name in NAMES.items()}
KNOWN: Final = frozenset(NAMES)

#: zlib level 1: most of the ratio of the default level 6 at several times the speed
ZLIB_LEVEL: Final = 1
#: zstd level 3 is zstd's own default: better ratio than zlib -6 at lz4-like decode speed
ZSTD_LEVEL: Final = 3

_EXTRA_HINT = "install the compression extra: pip install 'headrace[compression]'"


def codec_id(name: str) -> int:
    """The id of a codec named as in :data:`NAMES` (``UnknownCodec`` otherwise)."""
    try:
        return IDS[name.lower()]
    except KeyError:
        raise UnknownCodec(
            f"unknown compression codec {name!r}; choose one of {', '.join(IDS)}"
        ) from None


def codec_name(codec: int) -> str:
    return NAMES.get(codec, f"codec {codec}")


def check_known(codec: int) -> None:
    if codec not in KNOWN:
        raise UnknownCodec(
            f"unknown compression codec {codec} (known: "
            + ", ".join(f"{i}={n}" for i, n in NAMES.items())
            + ")"
        )


def _lz4_frame() -> Any:
    try:
        import lz4.frame
    except ImportError as exc:
        raise CodecUnavailable(f"the lz4 codec needs the lz4 package; {_EXTRA_HINT}") from exc
    return lz4.frame


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError as exc:
        raise CodecUnavailable(
            f"the zstd codec needs the zstandard package; {_EXTRA_HINT}"
        ) from exc
    return zstandard


# Spare zstd contexts, reused: building one costs 15-40 us, as much as compressing a small
# batch. A context serves one caller at a time (zstandard's rule): ``list.pop`` and
# ``list.append`` are atomic, so two threads (two blocking clients) never share one.
_zstd_spares: dict[str, list[Any]] = {"compress": [], "decompress": []}


def _zstd_take(kind: str) -> Any:
    try:
        return _zstd_spares[kind].pop()
    except IndexError:
        zstandard = _zstandard()
        if kind == "compress":
            return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
        return zstandard.ZstdDecompressor()


def _zstd_give_back(kind: str, ctx: Any) -> None:
    _zstd_spares[kind].append(ctx)


def compress(codec: int, section: bytes) -> bytes:
    """The record section compressed with ``codec`` (``NONE`` returns it unchanged)."""
    if codec == NONE:
        return section
    if codec == ZLIB:
        return zlib.compress(section, ZLIB_LEVEL)
    if codec == LZ4:
        return bytes(_lz4_frame().compress(section, store_size=True))
    if codec == ZSTD:
        ctx = _zstd_take("compress")
        try:
            return bytes(ctx.compress(section))
        finally:
            _zstd_give_back("compress", ctx)
    check_known(codec)
    raise AssertionError(f"codec {codec} is known but has no encoder")  # pragma: no cover


def decompress(codec: int, raw: bytes | memoryview, section_length: int) -> bytes | memoryview:
    """The record section of a batch, ``section_length`` bytes once inflated.

    Raises ``UnknownCodec`` for an id outside :data:`KNOWN` and
    ``DecompressionFailed`` for a payload that is not exactly one well-formed
    stream or frame of ``section_length`` bytes.
    """
    if codec == NONE:
        return raw
    if codec == ZLIB:
        section = _inflate_zlib(raw, section_length)
    elif codec == LZ4:
        section = _inflate_lz4(raw, section_length)
    elif codec == ZSTD:
        section = _inflate_zstd(raw, section_length)
    else:
        check_known(codec)
        raise AssertionError(f"codec {codec} is known but has no decoder")  # pragma: no cover
    if len(section) != section_length:
        raise DecompressionFailed(
            f"{codec_name(codec)} section inflates to {len(section)} bytes,"
            f" the header says {section_length}"
        )
    return section


def _inflate_zlib(raw: bytes | memoryview, section_length: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        section = inflater.decompress(raw, section_length + 1)
    except zlib.error as exc:
        raise DecompressionFailed(f"cannot decompress zlib batch: {exc}") from exc
    if not inflater.eof or inflater.unused_data:
        raise DecompressionFailed("zlib section is truncated, too long or has trailing bytes")
    return section


def _inflate_lz4(raw: bytes | memoryview, section_length: int) -> bytes:
    frame = _lz4_frame()
    inflater = frame.LZ4FrameDecompressor()
    try:
        section = inflater.decompress(raw, max_length=section_length + 1)
    except RuntimeError as exc:  # lz4 reports every decoding failure as RuntimeError
        raise DecompressionFailed(f"cannot decompress lz4 batch: {exc}") from exc
    if not inflater.eof or inflater.unused_data:
        raise DecompressionFailed("lz4 frame is truncated, too long or has trailing bytes")
    return bytes(section)


def _inflate_zstd(raw: bytes | memoryview, section_length: int) -> bytes:
    zstandard = _zstandard()
    try:
        declared = zstandard.frame_content_size(raw)
    except zstandard.ZstdError as exc:
        raise DecompressionFailed(f"cannot decompress zstd batch: {exc}") from exc
    # libzstd allocates and enforces the size a frame declares: checking it against
    # the header first is what bounds the memory a hostile batch can make us use
    if declared != section_length:
        raise DecompressionFailed(
            f"zstd frame declares {'no' if declared < 0 else declared} content size,"
            f" the header says {section_length}"
        )
    ctx = _zstd_take("decompress")
    try:
        inflater = ctx.decompressobj()
        section = inflater.decompress(raw)
    except zstandard.ZstdError as exc:
        raise DecompressionFailed(f"cannot decompress zstd batch: {exc}") from exc
    finally:
        _zstd_give_back("decompress", ctx)
    if not inflater.eof or inflater.unused_data:
        raise DecompressionFailed("zstd frame is truncated or has trailing bytes")
    return bytes(section)
