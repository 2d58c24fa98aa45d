"""Group commit: one fdatasync covers every batch appended since the last.

Appends are plain writes on the event loop. This module owns the slow half:
it captures what is dirty, runs fdatasync on a worker thread while the loop
keeps accepting appends for the *next* round, then advances flushed offsets
and wakes whoever waits for durability. Recovery points are written after a
sync, so they only ever name data that is on disk.

A failed round does not end group commit: it is the only thing that makes
appends durable, and if its task died every acks=all producer would wait
forever without an error while the high watermark stood still. A round that
fails tells its own waiters (a retriable ``StorageError``). A failed fdatasync
of a partition's data is sticky for its log (``PartitionLog.sync_failure``):
that log is never synced again, its waiters fail at once, and the committer
publishes ``LogSyncFailed`` once so that the broker halts (the partition's
data can no longer be trusted). Any other failure leaves the round's data dirty
for the next round. A recovery point that cannot be written is logged and
skipped, since the records it covers are on disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from headrace.aio import cancel_and_wait
from headrace.broker.ports import LogSyncFailed, Publish
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
        *,
        publish: Publish,
        on_round: Callable[[float], None] | None = None,
    ) -> None:
        self._policy = policy
        self._interval = flush_interval_ms / 1000
        self._checkpoint_interval = checkpoint_interval_ms / 1000
        self._partitions = partitions
        #: where a log's sticky fdatasync failure is reported (``LogSyncFailed``)
        self._publish = publish
        #: partitions whose failure has been published (each once)
        self._failed: set[Partition] = set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync")
        self._dirty: set[Partition] = set()
        self._waiters: list[tuple[Partition, int, asyncio.Future[None]]] = []
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_checkpoint = time.monotonic()
        self.rounds = 0
        self.last_sync_seconds = 0.0
        #: called with each round's duration in seconds (metrics)
        self.on_round = on_round

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    def appended(self, partition: Partition) -> None:
        self._dirty.add(partition)

    def wait_durable(self, partition: Partition, offset: int) -> asyncio.Future[None]:
        """A future that completes once everything below ``offset`` is on disk."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if partition.log.sync_failure is not None and partition.log.flushed_offset < offset:
            fut.set_exception(_never_durable(partition))  # it will never get there
            return fut
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
                # The round's waiters have been told; the next round syncs its data again,
                # except a failed log's (reported to the broker, which halts).
                log.error("group commit failed: %s", exc)
                await asyncio.sleep(0.1)
            except Exception:
                # A bug, not the disk (I/O errors arrive as StorageError). Keep going,
                # loudly: ending this task would hang every producer silently.
                log.exception("group commit round failed unexpectedly")
                await asyncio.sleep(0.1)

    async def sync_round(self, *, checkpoint: bool = False) -> None:
        dirty, self._dirty = self._dirty, set()
        waiters, self._waiters = self._waiters, []
        checkpoint = (
            checkpoint or time.monotonic() - self._last_checkpoint >= self._checkpoint_interval
        )
        try:
            targets = await self._sync(dirty, checkpoint)
        except BaseException as exc:
            if isinstance(exc, Exception):
                # Producers hear of it and retry; their batches dedup.
                error = _storage_error(exc)
                for _, _, fut in waiters:
                    if not fut.done():
                        fut.set_exception(error)
            else:
                self._waiters[:0] = waiters  # cancelled: close()'s final round serves them
            raise
        for partition, offset, fut in waiters:
            if fut.done():
                continue
            if partition.log.flushed_offset >= offset:
                fut.set_result(None)
            elif partition.log.sync_failure is not None:
                fut.set_exception(_never_durable(partition))  # do not requeue it forever
            else:
                self._waiters.append((partition, offset, fut))
                self._kick.set()
        if checkpoint:
            self._last_checkpoint = time.monotonic()
            await self._checkpoint_all(targets)

    async def _sync(
        self, dirty: set[Partition], checkpoint: bool
    ) -> list[tuple[Partition, SyncTarget]]:
        """Capture on the loop, fdatasync on the thread, record on the loop."""
        loop = asyncio.get_running_loop()
        targets: list[tuple[Partition, SyncTarget]] = []
        started = time.monotonic()
        # A log whose fdatasync failed is never synced again: a later success would
        # prove nothing (see PartitionLog.sync_failure), and it takes no more writes.
        dirty = {p for p in dirty if p.log.sync_failure is None}
        try:
            for p in dirty:
                targets.append((p, p.log.sync_target(for_checkpoint=checkpoint)))
            if targets:
                await loop.run_in_executor(
                    self._executor, _sync_all, [(p.log, t) for p, t in targets]
                )
        except BaseException:
            # Nothing of this round is known durable: the next round syncs it again.
            for _, target in targets:
                for seg in target.segments:
                    seg.dirty = True
            self._dirty |= {p for p in dirty if p.log.sync_failure is None}
            self._report_failures(dirty)
            raise
        self.last_sync_seconds = time.monotonic() - started
        self.rounds += 1
        if targets and self.on_round is not None:
            self.on_round(self.last_sync_seconds)
        for partition, target in targets:
            partition.log.mark_synced(target)
            partition.advance_high_watermark()
        return targets

    def _report_failures(self, partitions: Iterable[Partition]) -> None:
        """Publish each newly failed log once: the broker halts on it."""
        for p in partitions:
            error = p.log.sync_failure
            if error is not None and p not in self._failed:
                self._failed.add(p)
                self._publish(LogSyncFailed(p, error))

    async def _checkpoint_all(self, synced: list[tuple[Partition, SyncTarget]]) -> None:
        loop = asyncio.get_running_loop()
        fresh = {p: t for p, t in synced}
        for partition in self._partitions():
            if partition.log.sync_failure is not None:
                continue  # its recovery point stays where its last good sync left it
            target = fresh.get(partition)
            if target is None:
                # Nothing dirty: the current end is already durable.
                if partition.log.flushed_offset < partition.log.next_offset:
                    continue
                if partition.log.checkpoint_current():
                    continue  # idle since its last recovery point: no rewrite, no fsyncs
                target = partition.log.sync_target()
            try:
                await loop.run_in_executor(self._executor, partition.log.write_checkpoint, target)
            except StorageError as exc:
                # Only restarts get slower (they scan from the previous recovery point).
                log.error("recovery point of %s not written: %s", partition.name, exc)
            except Exception:
                # A bug in one partition's recovery point must not stop the others'.
                log.exception("recovery point of %s not written", partition.name)

    async def close(self) -> None:
        """Final sync and checkpoint (clean shutdown makes restart instant).

        A failed log is left alone: no new fdatasync, no recovery point.
        """
        await cancel_and_wait(self._task)
        # A round cancelled mid-fdatasync may have failed without reporting it.
        self._report_failures(self._partitions())
        for partition in self._partitions():
            self._dirty.add(partition)
        await self.sync_round(checkpoint=True)
        self._executor.shutdown(wait=True)


def _sync_all(targets: list[tuple[PartitionLog, SyncTarget]]) -> None:
    for partition_log, target in targets:
        partition_log.sync(target)


def _never_durable(partition: Partition) -> StorageError:
    failure = partition.log.sync_failure
    reason = failure.message if failure is not None else "?"
    return StorageError(f"{partition.name} will not become durable here: {reason}")


def _storage_error(exc: Exception) -> StorageError:
    if isinstance(exc, StorageError):
        return exc
    error = StorageError(f"group commit failed: {exc!r}")
    error.__cause__ = exc
    return error
