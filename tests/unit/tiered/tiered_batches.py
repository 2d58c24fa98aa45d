"""Stamped record batches for the tiered tests, built with the real codec."""

from __future__ import annotations

import random
from collections.abc import Sequence

from headrace.records import batch as rb


def stamped(base: int, records: int, value_bytes: int = 64, epoch: int = 1, seed: int = 0) -> bytes:
    """One batch of ``records`` records at ``base``, stamped as a leader at ``epoch`` would."""
    rng = random.Random(seed * 1_000_003 + base)
    values = [rng.randbytes(value_bytes) for _ in range(records)]
    raw = bytearray(rb.encode(values, timestamp_ms=1_700_000_000_000 + base))
    rb.stamp(raw, base, epoch)
    return bytes(raw)


def run(base: int, counts: Sequence[int], value_bytes: int = 64, epoch: int = 1) -> bytes:
    """Contiguous batches starting at ``base``, one per entry of ``counts`` (records each)."""
    out = []
    for n in counts:
        out.append(stamped(base, n, value_bytes, epoch))
        base += n
    return b"".join(out)


def boundaries(data: bytes) -> list[tuple[int, int, int]]:
    """``(position, base offset, next offset)`` of every batch in ``data``."""
    return [(pos, h.base_offset, h.next_offset) for pos, h in rb.scan(data)]
