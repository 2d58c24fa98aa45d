"""A recovery point written on a worker thread while the loop closes segments.

Group commit writes recovery points on its fsync thread; ``write_checkpoint``
persists every segment's index there. Meanwhile the event loop may delete
segments (retention) or close the whole log (the partition moved away). These
tests drive that interleaving explicitly: the checkpoint thread is held at its
first fdatasync of an index file until the test has done the loop's part, then
released. No sleeps, no timing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk
from headrace.storage.log import PartitionLog, SyncTarget

#: a safety net so that a regression hangs for a bounded time instead of forever;
#: never part of the synchronisation (every wait below is for an event that is set)
HANG_GUARD_SECONDS = 30


def make_batch(tag: int) -> tuple[bytes, rb.BatchHeader]:
    raw = rb.encode([bytes([tag]) * 40], timestamp_ms=1_000)
    return raw, rb.validate(raw)


def fill(log: PartitionLog, count: int) -> None:
    for i in range(count):
        raw, header = make_batch(i % 256)
        log.append(raw, header, 0)


class IndexSyncGate:
    """Holds the first fdatasync of an index file made on ``thread_name`` until released."""

    def __init__(self, thread_name: str, index_fds: Callable[[], set[int]]) -> None:
        self.thread_name = thread_name
        self.index_fds = index_fds
        self.reached = threading.Event()
        self.release = threading.Event()
        self._fired = False
        self._real = os.fdatasync

    def fdatasync(self, fd: int) -> None:
        if (
            not self._fired
            and threading.current_thread().name == self.thread_name
            and fd in self.index_fds()
        ):
            self._fired = True
            self.reached.set()
            if not self.release.wait(HANG_GUARD_SECONDS):
                raise AssertionError("the test never released the checkpoint thread")
        self._real(fd)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., IndexSyncGate]]:
    made: list[IndexSyncGate] = []

    def make(thread_name: str, index_fds: Callable[[], set[int]]) -> IndexSyncGate:
        g = IndexSyncGate(thread_name, index_fds)
        monkeypatch.setattr(os, "fdatasync", g.fdatasync)
        made.append(g)
        return g

    yield make
    for g in made:
        g.release.set()  # never leave a thread parked if an assertion failed first


def index_fds_of(log: PartitionLog) -> Callable[[], set[int]]:
    """The descriptors open on the log's ``.index`` files now (a segment opens its index
    file for each write or sync only, so they are looked up when the sync comes)."""
    paths = {str(seg.index_path) for seg in log.segments}

    def open_now() -> set[int]:
        found = set()
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}") in paths:
                    found.add(int(name))
            except OSError:
                continue
        return found

    return open_now


class CheckpointThread:
    """Runs ``log.write_checkpoint(target)`` on a thread and keeps what it raised."""

    NAME = "checkpoint-under-test"

    def __init__(self, log: PartitionLog, target: SyncTarget) -> None:
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(log, target), name=self.NAME, daemon=True
        )

    def _run(self, log: PartitionLog, target: SyncTarget) -> None:
        try:
            log.write_checkpoint(target)
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(HANG_GUARD_SECONDS)
        assert not self._thread.is_alive(), "the checkpoint thread never finished"


def synced_target(log: PartitionLog) -> SyncTarget:
    target = log.sync_target()
    log.sync(target)
    log.mark_synced(target)
    return target


def test_checkpoint_survives_retention_deleting_its_segments(
    tmp_path: Path, gate: Callable[..., IndexSyncGate]
) -> None:
    _, header = make_batch(0)
    cfg = bk.LogConfig(
        fsync=bk.FsyncPolicy.NONE,
        index_interval_bytes=1,
        segment_bytes=2 * header.size,
        retention_bytes=2 * header.size,
        retention_ms=-1,
    )
    log = PartitionLog.open(tmp_path, cfg)
    fill(log, 8)  # four segments of two batches
    assert len(log.segments) == 4
    target = synced_target(log)
    g = gate(CheckpointThread.NAME, index_fds_of(log))
    worker = CheckpointThread(log, target)
    worker.start()
    assert g.reached.wait(HANG_GUARD_SECONDS)
    # The loop's turn, while the checkpoint is inside the first segment's index.
    assert log.apply_retention() == [0, 2, 4]
    g.release.set()
    worker.join()

    assert worker.error is None, f"the checkpoint raised {worker.error!r}"
    end = log.next_offset
    log.close()
    reopened = PartitionLog.open(tmp_path, cfg)
    assert reopened.recovery is not None and reopened.recovery.used_checkpoint
    assert (reopened.log_start_offset, reopened.next_offset) == (6, end)
    reopened.close()


def test_checkpoint_never_writes_through_the_descriptors_of_a_closed_log(
    tmp_path: Path, gate: Callable[..., IndexSyncGate]
) -> None:
    _, header = make_batch(0)
    cfg = bk.LogConfig(
        fsync=bk.FsyncPolicy.NONE, index_interval_bytes=1, segment_bytes=4 * header.size
    )
    log = PartitionLog.open(tmp_path / "log", cfg)
    fill(log, 7)  # a closed segment of four batches, an active one of three
    assert len(log.segments) == 2
    freed = 2 * len(log.segments)
    target = synced_target(log)
    g = gate(CheckpointThread.NAME, index_fds_of(log))
    worker = CheckpointThread(log, target)
    worker.start()
    assert g.reached.wait(HANG_GUARD_SECONDS)
    # The partition moves away while the checkpoint is under way, and new files
    # open at once: the kernel hands out the lowest free descriptors first.
    log.close()
    original = b"\xee" * 4096
    victims: list[tuple[Path, int]] = []
    for i in range(freed):
        path = tmp_path / f"victim-{i}"
        path.write_bytes(original)
        victims.append((path, os.open(path, os.O_RDWR)))
    try:
        g.release.set()
        worker.join()
    finally:
        for _, fd in victims:
            os.close(fd)

    assert worker.error is None, f"the checkpoint raised {worker.error!r}"
    for path, _ in victims:
        assert path.read_bytes() == original, f"the checkpoint wrote into {path.name}"


def test_checkpoint_from_before_a_truncation_never_replaces_a_newer_one(
    tmp_path: Path, gate: Callable[..., IndexSyncGate]
) -> None:
    _, header = make_batch(0)
    cfg = bk.LogConfig(fsync=bk.FsyncPolicy.NONE, index_interval_bytes=1)
    log = PartitionLog.open(tmp_path, cfg)
    fill(log, 4)
    target = synced_target(log)  # offset 4, at position 4 * size
    g = gate(CheckpointThread.NAME, index_fds_of(log))
    worker = CheckpointThread(log, target)
    worker.start()
    assert g.reached.wait(HANG_GUARD_SECONDS)
    # Replica divergence on the loop: cut to offset 2 (this writes its own recovery
    # point), then a bigger batch fills the space the stale target points into.
    log.truncate_to(2)
    raw = rb.encode([b"x" * (2 * header.size)], timestamp_ms=1_000)
    log.append(raw, rb.validate(raw), 1)
    assert log.active.size > target.position
    synced_target(log)
    g.release.set()
    worker.join()

    assert worker.error is None, f"the checkpoint raised {worker.error!r}"
    log.close()
    reopened = PartitionLog.open(tmp_path, cfg)
    assert reopened.recovery is not None
    assert reopened.recovery.truncated_bytes == 0
    assert reopened.next_offset == 3
    data, _ = reopened.read(2, 1 << 20)
    assert rb.validate(data).base_offset == 2
    reopened.close()
