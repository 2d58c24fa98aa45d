"""CRC-32 (zlib's polynomial) for record batches and object bodies alike (pure).

zlib-ng computes the same values as zlib with carry-less multiply (PCLMUL,
VPCLMULQDQ, ARMv8 CRC): about 20x faster than CPython's zlib here, which had
become the largest single item of a broker's CPU on the produce and replica
paths (issue 16 §7), and a 64 MiB object body takes a few milliseconds.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - no zlib-ng wheel for this platform: same values
    from zlib import crc32

__all__ = ["crc32"]
