"""One tiered partition's state on this broker, shared by the uploader, the reader and moves.

Three parts work on a tiered partition (``tier_upload``, ``tier_reads``,
``tier_moves``); ``tiering.Tiering`` composes them. What they share lives here:
the per-partition record each of them reads and writes (``PartitionTiering``,
hung on ``Partition.tiering``), the one place it is created (``TierStates.attach``),
and the two rules every background step follows: a task is tracked on its
partition so detaching cancels it, and a step applies its result only while the
partition still has the role and incarnation it started with (``still``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from headrace.broker.ports import TieringHost
from headrace.broker.topics import Partition, Role, TierConfig
from headrace.objectstore.interface import ObjectStore
from headrace.tiered.layout import partition_prefix
from headrace.tiered.manifest import SegmentObject
from headrace.tiered.sealing import ReopenTarget, Sealing
from headrace.tiered.tier import PartitionTier

log = logging.getLogger(__name__)

#: told of a partition whose upload, seal or reopen task ended: its heartbeat report
#: (stored through, sealed) may have changed (``broker.reporting``)
ReportChanged = Callable[[Partition], None]


@dataclass(slots=True)
class PartitionTiering:
    """One partition's tiered-storage state on this broker."""

    tier: PartitionTier
    config: TierConfig
    #: the manifest's checkpoint as this broker last saw it (-1: nothing stored yet)
    uploaded_through: int = -1
    #: the lowest offset the object store holds (None: unknown or nothing stored)
    stored_start: int | None = None
    #: whether ``uploaded_through`` was read from the manifest for the current leadership
    checkpoint_epoch: int = -1
    last_upload_ms: int = 0
    #: active segment (base, size) at the last upload: the size threshold counts from it
    last_upload_mark: tuple[int, int] = (-1, 0)
    upload_task: asyncio.Task[None] | None = None
    cursors_uploaded_version: int = -1
    #: the uploader listens to the partition (HW and cursor moves mark it for a look)
    listened: bool = False
    #: the seal and reopen state (``tiered.sealing``: only its table changes it)
    sealing: Sealing = field(default_factory=Sealing)
    #: the tasks that table started last (``tier_moves``)
    seal_task: asyncio.Task[None] | None = None
    reopen_task: asyncio.Task[None] | None = None
    #: objects retention removed from the manifest: (monotonic ms when they may be
    #: deleted, their entries), oldest first
    doomed: list[tuple[int, tuple[SegmentObject, ...]]] = field(default_factory=list)
    #: upload rounds failed in a row, and the last one's error
    errors: int = 0
    last_error: str = ""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def reopening(self) -> ReopenTarget | None:
        return self.sealing.reopening

    @property
    def blocks_appends(self) -> bool:
        return self.sealing.blocks_appends

    @property
    def upload_floor(self) -> int:
        """Local retention may delete segments wholly below this offset."""
        return self.uploaded_through + 1


class TierStates:
    """Creates each tiered partition's state, on first use, with one readahead pool for all."""

    def __init__(self, broker: TieringHost, store: ObjectStore | None) -> None:
        self.broker = broker
        self.store = store
        #: readahead for every partition's tier (one pool, not threads per partition)
        self.prefetch_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tier-prefetch")

    def attach(self, partition: Partition) -> PartitionTiering | None:
        """Give a tiered partition its tier state (idempotent); None if it is not tiered."""
        if partition.tiering is not None:
            return state_of(partition)
        if self.store is None or not self.broker.registry.tiered(partition.topic):
            return None
        topic = partition.topic
        prefix = partition_prefix(
            self.broker.cluster_id, topic.name, partition.index, topic.creation_id
        )
        tier = PartitionTier(self.store, prefix, executor=self.prefetch_pool)
        state = PartitionTiering(tier, TierConfig.of(partition.topic.config))
        partition.tiering = state
        return state


def state_of(p: Partition) -> PartitionTiering | None:
    """The partition's tier state: ``TierStates.attach`` is the only writer of ``p.tiering``."""
    return cast(PartitionTiering | None, p.tiering)


def still(p: Partition, epoch: int, state: PartitionTiering) -> bool:
    """``p`` is still led here at ``epoch``, with ``state``, in its topic: a step that
    started under these may apply its result."""
    return (
        p.role is Role.LEADER
        and p.leader_epoch == epoch
        and p.tiering is state
        and p.topic.partitions.get(p.index) is p
    )


def spawn(
    p: Partition,
    state: PartitionTiering,
    coro: Coroutine[Any, Any, None],
    report_changed: ReportChanged,
) -> asyncio.Task[None]:
    """Run ``coro`` as one of the partition's tasks: detaching cancels it, and its end is
    reported (the heartbeat report may have changed)."""
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
    state.tasks.add(task)
    task.add_done_callback(state.tasks.discard)
    task.add_done_callback(lambda _: report_changed(p))
    task.add_done_callback(log_death)
    return task


def log_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("tiering task %s died", task.get_name(), exc_info=task.exception())
