"""Stamped record batches for the tiered integration tests, built with the real codec."""

from __future__ import annotations

import random
from collections.abc import Sequence

from headrace.records import batch as rb


def run(base: int, counts: Sequence[int], value_bytes: int = 64, epoch: int = 1) -> bytes:
    """Contiguous batches from ``base``, one per entry of ``counts`` (records each)."""
    rng = random.Random(base)
    out = []
    for n in counts:
        raw = bytearray(rb.encode([rng.randbytes(value_bytes) for _ in range(n)], timestamp_ms=1))
        rb.stamp(raw, base, epoch)
        out.append(bytes(raw))
        base += n
    return b"".join(out)


def boundaries(data: bytes) -> list[tuple[int, int, int]]:
    """``(position, base offset, next offset)`` of every batch in ``data``."""
    return [(pos, h.base_offset, h.next_offset) for pos, h in rb.scan(data)]
