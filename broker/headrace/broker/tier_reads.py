"""Tiered reads: what lies below a partition's local log start, out of the object store.

A read below the local log start (a cohort cursor or fetch into history, or
any read after a move, which opens a partition empty) is served from the
object store, then chains to the local log: the objects and the local log
share offsets, so the seam has no gap and no duplicate. This is the
``ports.TieredReads`` port that connections and cohort runtimes read through;
it needs nothing of the uploader or of moves but the stored start they keep
current on the partition's tier state.
"""

from __future__ import annotations

import asyncio

from headrace.broker.metrics import BrokerMetrics
from headrace.broker.tier_state import state_of
from headrace.broker.topics import Partition
from headrace.errors import OffsetOutOfRange


class TieredReader:
    """Reads from the object store for every tiered partition of one broker."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def stored_start(self, p: Partition) -> int | None:
        state = p.tiering  # on every fetch: no helper call
        return None if state is None else state.stored_start

    def earliest(self, p: Partition) -> int:
        """The lowest offset a reader can get: from the object store if it holds older ones."""
        stored = self.stored_start(p)
        local = p.log.log_start_offset
        return local if stored is None else min(stored, local)

    async def read(self, p: Partition, offset: int, max_bytes: int) -> bytes:
        """Whole batches from ``offset`` (below the local log start) out of the object store."""
        state = state_of(p)
        if state is None:
            raise OffsetOutOfRange(
                f"offset {offset} is below log start {p.log.log_start_offset} of {p.name}"
            )
        data = await asyncio.to_thread(state.tier.read, offset, max_bytes)
        self.metrics.tier_read_bytes.inc(len(data))
        return data
