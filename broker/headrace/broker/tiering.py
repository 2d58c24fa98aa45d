"""Tiered storage on a broker: the one object the broker and the placer hold.

Tiered storage is three parts, each in its own module: the uploader
(``tier_upload``: committed records and cursors into the object store, and the
tier's retention), tiered reads (``tier_reads``: reads below the local log start,
out of the object store) and moves (``tier_moves``: sealing for an unload and
reopening after one, driven by the pure table in ``tiered.sealing``). They share
each partition's tier state (``tier_state``).

``Tiering`` builds the three with what each needs and owns what spans them: the
partitions' tier state (attach, detach, forget a deleted topic's objects), the
background work's start and stop, and the heartbeat's and the topic description's
tier fields. Callers reach a part's own calls through it (``tiering.moves.seal``,
``tiering.uploader.apply_retention``); it answers reads itself, by handing them to
``tier_reads``, because the broker gives it to connections as their ``TieredReads``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from headrace.aio import cancel_and_wait
from headrace.broker.ports import Publish, TieringHost
from headrace.broker.tier_moves import TierMoves
from headrace.broker.tier_reads import TieredReader
from headrace.broker.tier_state import (
    PartitionTiering,
    ReportChanged,
    TierStates,
    log_death,
    state_of,
)
from headrace.broker.tier_upload import Uploader
from headrace.broker.topics import Partition
from headrace.objectstore.interface import ObjectStore
from headrace.protocol.coordination import SealReport
from headrace.tiered import pins

log = logging.getLogger(__name__)

#: failed upload rounds in a row before the heartbeat reports them (``uploadError``)
UPLOAD_ERROR_ROUNDS = 2


class Tiering:
    """The tiered-storage side of one broker."""

    def __init__(
        self,
        broker: TieringHost,
        store: ObjectStore | None,
        publish: Publish,
        *,
        report_changed: ReportChanged,
    ) -> None:
        """``publish``: where finished reopens are reported (the broker then applies the
        partition's role). ``report_changed``: told of a partition whose upload, seal or
        reopen task ended, as its heartbeat report may have changed."""
        self.broker = broker
        self.store = store
        self._states = TierStates(broker, store)
        self.uploader = Uploader(broker, store, self._states.attach, report_changed)
        self.reads = TieredReader(broker.metrics)
        self.moves = TierMoves(
            broker, store, self._states.attach, self.uploader, publish, report_changed
        )
        #: deletions of deleted topics' objects in progress
        self._forgetting: set[asyncio.Task[None]] = set()

    @property
    def enabled(self) -> bool:
        return self.store is not None

    # ------------------------------------------------------------------ partitions

    def attach(self, partition: Partition) -> PartitionTiering | None:
        """Give a tiered partition its tier state (idempotent); None if it is not tiered."""
        return self._states.attach(partition)

    def forget(self, partition: Partition) -> None:
        """The partition's topic was deleted: remove its objects, in the background.

        The manifest goes first, so a reader sees no history rather than part of one;
        objects a snapshot of the topic lists stay (``tiered.pins.remove_partition``).
        A topic created again under the same name meanwhile has another creation id, so
        its objects are under another prefix (``tiered.layout``): this never touches them.
        """
        state = state_of(partition)
        if state is None or self.store is None:
            return
        store, prefix = self.store, state.tier.prefix

        def remove() -> None:
            kept = pins.remove_partition(store, prefix)
            if kept:
                log.info("%s: kept %d objects that snapshots list", prefix, len(kept))

        task = asyncio.get_running_loop().create_task(asyncio.to_thread(remove))
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)
        task.add_done_callback(log_death)

    def detach(self, partition: Partition) -> None:
        state = state_of(partition)
        if state is None:
            return
        for task in state.tasks:  # every upload, seal and reopen task (``tier_state.spawn``)
            task.cancel()
        self.uploader.unlisten(partition, state)
        partition.tiering = None

    def mark_all(self) -> None:
        """Roles or partitions changed: the next tick looks at every partition."""
        self.uploader.mark_all()

    def start(self) -> None:
        if self.store is not None:
            self.uploader.start()

    async def close(self) -> None:
        await self.uploader.stop()
        await cancel_and_wait(*self._forgetting)
        for p in self.broker.registry.all_partitions():
            state = state_of(p)
            if state is not None:
                await cancel_and_wait(*state.tasks)
        self._states.prefetch_pool.shutdown(wait=False, cancel_futures=True)
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ reads (``ports.TieredReads``)

    def stored_start(self, p: Partition) -> int | None:
        return self.reads.stored_start(p)

    def earliest(self, p: Partition) -> int:
        """The lowest offset a reader can get, stored or local (``TieredReader.earliest``)."""
        return self.reads.earliest(p)

    async def read(self, p: Partition, offset: int, max_bytes: int) -> bytes:
        """Whole batches from ``offset`` out of the object store (``TieredReader.read``)."""
        return await self.reads.read(p, offset, max_bytes)

    # ------------------------------------------------------------------ reports

    def describe(self, p: Partition) -> dict[str, Any]:
        """Tier fields of a topic description (``/v1/topics/...``)."""
        state = state_of(p)
        if state is None:
            return {"tiered": False}
        stage = state.sealing.stage
        return {
            "tiered": True,
            "stored_start_offset": state.stored_start,
            "uploaded_through": state.uploaded_through,
            "moves": p.moves,
            "move_start_offset": p.start_offset,
            "seal": stage.value if stage else None,
        }

    def stored_through(self, p: Partition) -> int | None:
        """The heartbeat's ``storedThrough``: the last offset uploaded, None if not tiered."""
        state = state_of(p)
        return state.uploaded_through if state is not None else None

    def upload_error(self, p: Partition) -> str | None:
        """The heartbeat's ``uploadError``: set once ``UPLOAD_ERROR_ROUNDS`` upload rounds in a
        row failed (one failure is a blip the next round usually fixes), None otherwise."""
        state = state_of(p)
        if state is None or state.errors < UPLOAD_ERROR_ROUNDS:
            return None
        return f"{state.errors} upload rounds in a row failed: {state.last_error}"

    def seal_report(self, p: Partition) -> SealReport | None:
        """The heartbeat's ``sealed`` for one partition: set once this leader has sealed it."""
        state = state_of(p)
        return state.sealing.sealed if state is not None else None
