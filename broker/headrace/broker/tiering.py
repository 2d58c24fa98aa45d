"""Tiered storage on a broker: the one object the broker and the placer hold.

Tiered storage is three parts, each in its own module: the uploader
(``tier_upload``: committed records and cursors into the object store, and the
tier's retention), tiered reads (``tier_reads``: reads below the local log start,
out of the object store) and moves (``tier_moves``: sealing for an unload and
reopening after one, driven by the pure table in ``tiered.sealing``). They share
each partition's tier state (``tier_state``).

``Tiering`` builds the three with what each needs and owns what spans them: the
partitions' tier state (attach, detach, forget a deleted topic's objects), the
removal of deleted incarnations the controller asks of this broker
(``remove_incarnations``), the background work's start and stop, and the heartbeat's and the topic description's
tier fields. Callers reach a part's own calls through it (``tiering.moves.seal``,
``tiering.uploader.apply_retention``); it answers reads itself, by handing them to
``tier_reads``, because the broker gives it to connections as their ``TieredReads``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from typing import Any, Final

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
from headrace.errors import HeadraceError
from headrace.objectstore.interface import ObjectStore
from headrace.protocol.coordination import SealReport
from headrace.tiered import layout, pins

log = logging.getLogger(__name__)

#: failed upload rounds in a row before the heartbeat reports them (``uploadError``)
UPLOAD_ERROR_ROUNDS = 2
#: a failed removal of a deleted incarnation is tried again after this long, doubled on
#: each failure up to ``REMOVAL_RETRY_MAX_S`` (a store that refuses deletes for a while
#: is asked about once a minute), seconds
REMOVAL_RETRY_S: Final = 1.0
REMOVAL_RETRY_MAX_S: Final = 60.0


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
        #: removals the controller asked of this broker, in progress, by creation id
        self._removing: dict[str, asyncio.Task[None]] = {}
        #: the creation ids of the incarnations asked of this broker that it has removed
        #: (the heartbeat's ``removedIncarnations``); forgotten once no longer asked
        self.removed: set[str] = set()

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

    def remove_incarnations(self, wanted: Iterable[tuple[str, str]]) -> None:
        """Remove the objects of these deleted incarnations, (topic, creation id), in the
        background, trying again until done (``tiered.pins.remove_incarnation``), and stop
        removing any other: the controller asks until the heartbeat reports one done."""
        asked = {creation_id: topic for topic, creation_id in wanted}
        for creation_id in [c for c in self._removing if c not in asked]:
            self._removing.pop(creation_id).cancel()
        self.removed &= set(asked)
        if self.store is None:
            return
        loop = asyncio.get_running_loop()
        for creation_id, topic in asked.items():
            if creation_id in self.removed or creation_id in self._removing:
                continue
            task = loop.create_task(self._remove(self.store, topic, creation_id))
            self._removing[creation_id] = task
            task.add_done_callback(log_death)
            task.add_done_callback(functools.partial(self._removed, creation_id))

    def _removed(self, creation_id: str, task: asyncio.Task[None]) -> None:
        if self._removing.get(creation_id) is task:
            del self._removing[creation_id]
            if not task.cancelled() and task.exception() is None:
                self.removed.add(creation_id)

    async def _remove(self, store: ObjectStore, topic: str, creation_id: str) -> None:
        prefix = layout.topic_prefix(self.broker.cluster_id, topic, creation_id)
        delay = REMOVAL_RETRY_S
        while True:
            try:
                kept = await asyncio.to_thread(pins.remove_incarnation, store, prefix)
            except HeadraceError as exc:
                log.warning("%s: removing the deleted topic's objects failed: %s", prefix, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, REMOVAL_RETRY_MAX_S)
                continue
            log.info(
                "%s: removed the deleted topic's objects%s",
                prefix,
                f" (kept {len(kept)} that snapshots list)" if kept else "",
            )
            return

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
        await cancel_and_wait(*self._forgetting, *self._removing.values())
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
