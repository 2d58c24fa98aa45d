"""Group commit: one fdatasync covers every batch appended since the last.

Appends are plain writes on the event loop. This module owns the slow half:
it captures what is dirty, runs fdatasync on a worker thread while the loop
keeps accepting appends for the *next* round, then advances flushed offsets
and wakes whoever waits for durability. Recovery points are written after a
sync, so they only ever name data that is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from headrace.aio import cancel_and_wait
from headrace.broker.topics import Partition
from headrace.errors import StorageError
from headrace.storage.bookkeeping import FsyncPolicy
from headrace.storage.log import PartitionLog, SyncTarget

log = logging.getLogger(__name__)


class GroupCommitter:
    def __init__(
        self,
        policy: FsyncPolicy,
        flush_interval_ms: int,
        checkpoint_interval_ms: int,
        partitions: Callable[[], list[Partition]],
    ) -> None:
        self._policy = policy
        self._interval = flush_interval_ms / 1000
        self._checkpoint_interval = checkpoint_interval_ms / 1000
        self._partitions = partitions
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync")
        self._dirty: set[Partition] = set()
        self._waiters: list[tuple[Partition, int, asyncio.Future[None]]] = []
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_checkpoint = time.monotonic()
        self.rounds = 0
        self.last_sync_seconds = 0.0
        #: called with each round's duration in seconds (metrics)
        self.on_round: Callable[[float], None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    def appended(self, partition: Partition) -> None:
        self._dirty.add(partition)

    def wait_durable(self, partition: Partition, offset: int) -> asyncio.Future[None]:
        """A future that completes once everything below ``offset`` is on disk."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if partition.log.flushed_offset >= offset:
            fut.set_result(None)
            return fut
        self._waiters.append((partition, offset, fut))
        self._kick.set()
        return fut

    async def _run(self) -> None:
        while True:
            # always: rounds run on demand (a waiter kicks); the timeout only keeps
            # recovery points fresh when idle. interval: rounds run on the timer.
            period = (
                self._interval
                if self._policy is FsyncPolicy.INTERVAL
                else self._checkpoint_interval
            )
            try:
                await asyncio.wait_for(self._kick.wait(), timeout=period)
            except TimeoutError:
                pass
            self._kick.clear()
            try:
                await self.sync_round()
            except StorageError as exc:
                log.error("group commit failed: %s", exc)
                self._fail_waiters(exc)
                await asyncio.sleep(0.1)

    async def sync_round(self, *, checkpoint: bool = False) -> None:
        loop = asyncio.get_running_loop()
        dirty, self._dirty = self._dirty, set()
        waiters, self._waiters = self._waiters, []
        checkpoint = (
            checkpoint or time.monotonic() - self._last_checkpoint >= self._checkpoint_interval
        )
        targets: list[tuple[Partition, SyncTarget]] = [
            (p, p.log.sync_target(for_checkpoint=checkpoint)) for p in dirty
        ]
        started = time.monotonic()
        if targets:
            await loop.run_in_executor(self._executor, _sync_all, [(p.log, t) for p, t in targets])
        self.last_sync_seconds = time.monotonic() - started
        self.rounds += 1
        if targets and self.on_round is not None:
            self.on_round(self.last_sync_seconds)
        for partition, target in targets:
            partition.log.mark_synced(target)
            partition.advance_high_watermark()
        for partition, offset, fut in waiters:
            if fut.done():
                continue
            if partition.log.flushed_offset >= offset:
                fut.set_result(None)
            else:
                self._waiters.append((partition, offset, fut))
                self._kick.set()
        if checkpoint:
            self._last_checkpoint = time.monotonic()
            await self._checkpoint_all(targets)

    async def _checkpoint_all(self, synced: list[tuple[Partition, SyncTarget]]) -> None:
        loop = asyncio.get_running_loop()
        fresh = {p: t for p, t in synced}
        for partition in self._partitions():
            target = fresh.get(partition)
            if target is None:
                # Nothing dirty: the current end is already durable.
                if partition.log.flushed_offset < partition.log.next_offset:
                    continue
                target = partition.log.sync_target()
            await loop.run_in_executor(self._executor, partition.log.write_checkpoint, target)

    def _fail_waiters(self, exc: StorageError) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    async def close(self) -> None:
        """Final sync and checkpoint (clean shutdown makes restart instant)."""
        await cancel_and_wait(self._task)
        for partition in self._partitions():
            self._dirty.add(partition)
        await self.sync_round(checkpoint=True)
        self._executor.shutdown(wait=True)


def _sync_all(targets: list[tuple[PartitionLog, SyncTarget]]) -> None:
    for partition_log, target in targets:
        partition_log.sync(target)
