"""CRC-32 (zlib's polynomial) for record batches and object bodies alike (pure).

zlib-ng computes the same values as zlib with carry-less multiply (PCLMUL,
VPCLMULQDQ, ARMv8 CRC): about 20x faster than CPython's zlib here, which had
become the largest single item of a broker's CPU on the produce and replica
paths, and a 64 MiB object body takes a few milliseconds.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - no zlib-ng wheel for this platform: same values
    from zlib import crc32


try:
    import crc32c as _castagnoli
except ImportError:  # pragma: no cover - the broker extra installs it
    _castagnoli = None  # type: ignore[assignment]


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli), Kafka's record batch checksum, with SSE4.2/ARMv8 instructions.

    ``crc32c`` is in the ``broker`` extra; a client without it never needs it (only the
    broker reads Kafka batches)."""
    if _castagnoli is None:  # pragma: no cover
        raise ImportError("CRC-32C needs the crc32c package: pip install 'headrace[broker]'")
    return int(_castagnoli.crc32c(data))


__all__ = ["crc32", "crc32c"]
