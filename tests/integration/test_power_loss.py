"""Power loss: a FUSE file system that forgets unsynced data, under a real broker.

The short version of ``make powerloss`` (``bench/powerloss.py``): a few cuts
each, so it stays in seconds. Skipped, with the reason, where FUSE cannot be
mounted (no /dev/fuse, no fuse3, not root).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import powerfs
from bench.powerloss import run_campaign

pytestmark = pytest.mark.skipif(
    powerfs.fuse_unavailable() is not None, reason=f"powerfs: {powerfs.fuse_unavailable()}"
)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[powerfs.PowerLossMount]:
    m = powerfs.PowerLossMount(tmp_path)
    m.start()
    try:
        yield m
    finally:
        m.stop()


def _write(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_a_cut_keeps_what_was_synced_and_forgets_the_rest(
    mount: powerfs.PowerLossMount,
) -> None:
    mnt = mount.mountpoint
    _write(mnt / "log", b"synced.", sync=True)
    _write(mnt / "log", b"unsynced.", sync=False)
    (mnt / "kept-dir").mkdir()
    _sync_dir(mnt)  # names "log" and "kept-dir" durably
    _write(mnt / "kept-dir" / "inner", b"x", sync=True)  # its directory never synced
    _write(mnt / "new", b"synced but unnamed", sync=True)  # the root not synced again
    os.rename(mnt / "log", mnt / "renamed")  # nor this rename

    assert (mnt / "renamed").read_bytes() == b"synced.unsynced."
    report = mount.cut()

    assert sorted(os.listdir(mnt)) == ["kept-dir", "log"]
    assert (mnt / "log").read_bytes() == b"synced."
    assert os.listdir(mnt / "kept-dir") == []
    assert report["kept_bytes"] == len(b"synced.")


def test_a_replaced_file_keeps_its_durable_content_until_the_directory_is_synced(
    mount: powerfs.PowerLossMount,
) -> None:
    mnt = mount.mountpoint
    _write(mnt / "state", b"old", sync=True)
    _sync_dir(mnt)
    _write(mnt / "state.tmp", b"new", sync=True)
    os.replace(mnt / "state.tmp", mnt / "state")  # atomic, not yet durable
    mount.cut()
    assert (mnt / "state").read_bytes() == b"old"
    assert not (mnt / "state.tmp").exists()

    _write(mnt / "state.tmp", b"new", sync=True)
    os.replace(mnt / "state.tmp", mnt / "state")
    _sync_dir(mnt)
    mount.cut()
    assert (mnt / "state").read_bytes() == b"new"


async def test_power_cuts_under_fsync_always_lose_no_acknowledged_record(
    tmp_path: Path,
) -> None:
    report = await run_campaign(
        tmp_path, fsync="always", cuts=3, seed=14, min_load_s=0.2, max_load_s=0.6
    )
    summary = report.summary()
    assert summary["cuts"] == 3, summary
    assert summary["acked"] > 0, summary
    assert summary["corrupt_rounds"] == 0, summary
    assert summary["lost"] == 0, summary
    assert summary["duplicated"] == 0, summary


async def test_power_cuts_under_fsync_interval_never_leave_a_torn_log(tmp_path: Path) -> None:
    """Loss is allowed here (and measured by ``make powerloss``); corruption is not."""
    report = await run_campaign(
        tmp_path,
        fsync="interval",
        cuts=2,
        seed=14,
        flush_interval_ms=200,
        min_load_s=0.2,
        max_load_s=0.6,
    )
    summary = report.summary()
    assert summary["cuts"] == 2, summary
    assert summary["acked"] > 0, summary
    assert summary["corrupt_rounds"] == 0, summary
    assert summary["duplicated"] == 0, summary


def test_partitions_created_with_gathered_directory_syncs_survive_a_cut(
    mount: powerfs.PowerLossMount,
) -> None:
    """The cluster broker's creation path (``Placer.execute``): many partitions opened with
    their directory fsyncs gathered in a ``files.DirectorySyncs`` and flushed at the end.
    After the flush every partition directory and its first segment are durable; before
    it, a cut may lose them (so the flush is what makes them durable, not luck)."""
    from headrace import files
    from headrace.broker.topics import TopicRegistry
    from headrace.storage.bookkeeping import FsyncPolicy, LogConfig

    data = mount.mountpoint / "data"
    config = LogConfig(fsync=FsyncPolicy.INTERVAL)

    def create(name: str, flush: bool) -> None:
        registry = TopicRegistry(data, config)
        topic = registry.ensure_topic(name, 20, 1, {})
        syncs = files.DirectorySyncs()
        for index in range(20):
            registry.open_partition(topic, index, syncs)
        if flush:
            syncs.flush()
        registry.close()

    create("kept", flush=True)
    create("unsynced", flush=False)
    mount.cut()

    kept = data / "topics" / "default" / "kept"
    assert sorted(int(p.name) for p in kept.iterdir() if p.is_dir()) == list(range(20))
    for index in range(20):
        assert any(n.endswith(".log") for n in os.listdir(kept / str(index)))
    unsynced = data / "topics" / "default" / "unsynced"
    assert not any(p.is_dir() for p in unsynced.iterdir())  # nothing made it durable
