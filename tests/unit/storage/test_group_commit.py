"""Group commit on a real log, with the loop's and the fsync thread's steps ordered by the test."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.broker.ports import LogSyncFailed, PartitionEvent, Publish
from headrace.broker.syncing import GroupCommitter
from headrace.errors import StorageError
from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk
from headrace.storage.log import PartitionLog

#: bounds a regression's hang; never part of the synchronisation
HANG_GUARD_SECONDS = 30
HOUR_MS = 3_600_000


class FakePartition:
    """What group commit uses of a partition: its log and the HW hook."""

    name = "t/0"

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.hw_advances = 0

    def advance_high_watermark(self) -> None:
        self.hw_advances += 1


def append(log: PartitionLog, count: int = 1) -> None:
    for _ in range(count):
        raw = rb.encode([b"v" * 40], timestamp_ms=1_000)
        log.append(raw, rb.validate(raw), 0)


def committer_for(
    partition: FakePartition, publish: Publish = lambda event: None
) -> GroupCommitter:
    # Rounds only when kicked (the interval is an hour); every round writes recovery points.
    return GroupCommitter(
        bk.FsyncPolicy.INTERVAL,
        HOUR_MS,
        0,
        lambda: [partition],  # type: ignore[list-item]
        publish=publish,
    )


async def durable(committer: GroupCommitter, partition: FakePartition) -> asyncio.Future[None]:
    committer.appended(partition)  # type: ignore[arg-type]
    return committer.wait_durable(partition, partition.log.next_offset)  # type: ignore[arg-type]


async def first_of(task: asyncio.Task[None], fut: asyncio.Future[None]) -> None:
    """Wait until the round resolves ``fut`` or the committer's task ends, whichever first."""
    await asyncio.wait({task, fut}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        raise AssertionError(f"group commit ended: {task.exception()!r}")
    fut.result()


def _path_of(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


@pytest.fixture
def held_index_sync(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Holds the fsync thread at its first fdatasync of a file in ``state['paths']`` (a
    segment opens its index file for each sync, so the descriptor is known only then)."""
    real = os.fdatasync
    state: dict[str, Any] = {
        "paths": set(),
        "reached": threading.Event(),
        "release": threading.Event(),
        "fired": False,
    }

    def fdatasync(fd: int) -> None:
        if (
            not state["fired"]
            and threading.current_thread().name.startswith("fsync")
            and _path_of(fd) in state["paths"]
        ):
            state["fired"] = True
            state["reached"].set()
            if not state["release"].wait(HANG_GUARD_SECONDS):
                raise AssertionError("the test never released the fsync thread")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    yield state
    state["release"].set()


async def test_group_commit_outlives_retention_during_a_checkpoint(
    tmp_path: Path, held_index_sync: dict[str, Any]
) -> None:
    header = rb.validate(rb.encode([b"v" * 40], timestamp_ms=1_000))
    cfg = bk.LogConfig(
        fsync=bk.FsyncPolicy.INTERVAL,
        index_interval_bytes=1,
        segment_bytes=2 * header.size,
        retention_bytes=2 * header.size,
        retention_ms=-1,
    )
    partition = FakePartition(PartitionLog.open(tmp_path, cfg))
    log = partition.log
    append(log, 8)  # four segments
    held_index_sync["paths"] = {str(seg.index_path) for seg in log.segments}
    committer = committer_for(partition)
    committer.start()
    task = committer._task
    assert task is not None
    try:
        fut = await durable(committer, partition)
        await first_of(task, fut)  # the data is durable; the round goes on to checkpoint
        reached = await asyncio.to_thread(held_index_sync["reached"].wait, HANG_GUARD_SECONDS)
        assert reached
        # Retention runs on the loop while the fsync thread is inside the checkpoint.
        assert log.apply_retention() == [0, 2, 4]
        held_index_sync["release"].set()

        append(log)
        await first_of(task, await durable(committer, partition))
        assert log.flushed_offset == log.next_offset
    finally:
        held_index_sync["release"].set()
        await committer.close()
        log.close()
    reopened = PartitionLog.open(tmp_path, cfg)
    assert reopened.recovery is not None and reopened.recovery.used_checkpoint
    assert (reopened.log_start_offset, reopened.next_offset) == (6, 9)
    reopened.close()


class BrokenCheckpointLog(PartitionLog):
    """A log whose recovery points fail the way a bug would: an untranslated OSError."""

    def write_checkpoint(self, target: Any) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")


async def test_group_commit_outlives_an_unexpected_error(tmp_path: Path) -> None:
    cfg = bk.LogConfig(fsync=bk.FsyncPolicy.INTERVAL)
    partition = FakePartition(BrokenCheckpointLog.open(tmp_path, cfg))
    committer = committer_for(partition)
    committer.start()
    task = committer._task
    assert task is not None
    try:
        for _ in range(2):
            append(partition.log)
            # Records are durable whether or not their recovery point could be written.
            await first_of(task, await durable(committer, partition))
        assert partition.log.flushed_offset == 2
    finally:
        await committer.close()
        partition.log.close()


async def test_a_failed_sync_fails_the_rounds_waiters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = bk.LogConfig(fsync=bk.FsyncPolicy.INTERVAL)
    partition = FakePartition(PartitionLog.open(tmp_path, cfg))
    data_fd = partition.log.active._fd
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if fd == data_fd:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    committer = committer_for(partition)  # not started: the test runs the round itself
    try:
        append(partition.log)
        fut = await durable(committer, partition)
        with pytest.raises(StorageError):
            await committer.sync_round()
        # A producer waiting for acks=all hears of the failure instead of waiting forever.
        assert fut.done(), "the failed round dropped its waiter"
        assert isinstance(fut.exception(), StorageError)
    finally:
        monkeypatch.setattr(os, "fdatasync", real)
        await committer.close()
        partition.log.close()


async def test_a_failed_data_sync_is_never_followed_by_an_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsyncgate: after EIO the kernel may have dropped the pages and marked them clean,
    so the next fdatasync succeeds without writing them. The log must not count that as
    durable, and a producer's retry must not be acked off it as a duplicate."""
    cfg = bk.LogConfig(fsync=bk.FsyncPolicy.INTERVAL)
    partition = FakePartition(PartitionLog.open(tmp_path, cfg))
    data_fd = partition.log.active._fd
    real = os.fdatasync
    failures = [OSError(errno.EIO, "Input/output error")]  # fails once, then "succeeds"

    def fdatasync(fd: int) -> None:
        if fd == data_fd and failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    committer = committer_for(partition)  # not started: the test runs the rounds itself
    try:
        batch = rb.encode([b"v"], timestamp_ms=1, producer_id=7, base_sequence=0)
        header = rb.validate(batch)
        partition.log.append(batch, header, leader_epoch=0)
        fut = await durable(committer, partition)
        with pytest.raises(StorageError):
            await committer.sync_round()
        assert isinstance(fut.exception(), StorageError)
        await committer.sync_round()  # fdatasync would succeed now; it proves nothing
        assert partition.log.flushed_offset == 0
        with pytest.raises(StorageError, match="failed fdatasync"):
            partition.log.append(batch, header, leader_epoch=0)  # the producer's retry
    finally:
        monkeypatch.setattr(os, "fdatasync", real)
        await committer.close()
        partition.log.close()


async def test_a_failed_data_sync_is_published_once_and_the_log_never_synced_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker halts on the published ``LogSyncFailed``; until the process is gone the
    committer leaves the failed log alone (no fdatasync, even in close's final round) and
    fails a new waiter at once instead of requeueing it forever."""
    cfg = bk.LogConfig(fsync=bk.FsyncPolicy.INTERVAL)
    partition = FakePartition(PartitionLog.open(tmp_path, cfg))
    data_fd = partition.log.active._fd
    real = os.fdatasync
    data_syncs = []

    def fdatasync(fd: int) -> None:
        if fd == data_fd:
            data_syncs.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    events: list[PartitionEvent] = []
    committer = committer_for(partition, events.append)
    try:
        append(partition.log)
        await durable(committer, partition)
        with pytest.raises(StorageError):
            await committer.sync_round()
        assert len(events) == 1
        event = events[0]
        assert isinstance(event, LogSyncFailed)
        assert event.partition is partition and "Input/output error" in event.error.message
        fut = await durable(committer, partition)  # a waiter that came in meanwhile
        await committer.sync_round()
        assert isinstance(fut.exception(), StorageError)
        await committer.close()
        assert len(data_syncs) == 1 and len(events) == 1
    finally:
        monkeypatch.setattr(os, "fdatasync", real)
        await committer.close()
        partition.log.close()


class OnceBrokenCaptureLog(PartitionLog):
    """A log whose first sync-target capture fails with an error that is not the disk's."""

    broken = True

    def sync_target(self, *, for_checkpoint: bool = True) -> Any:
        if self.broken:
            self.broken = False
            raise RuntimeError("a bug in the capture")
        return super().sync_target(for_checkpoint=for_checkpoint)


async def test_group_commit_outlives_a_bug_in_a_round(tmp_path: Path) -> None:
    cfg = bk.LogConfig(fsync=bk.FsyncPolicy.INTERVAL)
    partition = FakePartition(OnceBrokenCaptureLog.open(tmp_path, cfg))
    committer = committer_for(partition)
    committer.start()
    task = committer._task
    assert task is not None
    try:
        append(partition.log)
        fut = await durable(committer, partition)
        with pytest.raises(StorageError):
            await first_of(task, fut)  # told, as a retriable error, not left waiting
        # The round's data stays dirty: the next kick makes it durable.
        await first_of(task, await durable(committer, partition))
        assert partition.log.flushed_offset == 1
    finally:
        await committer.close()
        partition.log.close()
