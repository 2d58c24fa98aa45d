"""A full disk: a broker whose data directory is a 16 MiB tmpfs.

The disk is filled by a ballast file next to the log. Producers then get the
typed ``StorageError`` (retriable: the broker stays up and the producer may
retry), reads keep working, and once the ballast is deleted produce works
again. Everything acknowledged is read back at its offset, before and after a
kill -9 and restart (recovery finds no torn or corrupt batch to cut).

Mounting needs root (CAP_SYS_ADMIN); without it the test is skipped and says why.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Producer
from headrace.errors import StorageError
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition

TOPIC = "full"
DISK_BYTES = 16 * 1024 * 1024
#: 1 MiB segments: the disk fills while rolling to a new segment (its index write fails);
#: 64 MiB: while appending to the active segment (the data write fails)
SEGMENT_SIZES = {"rolling": 1024 * 1024, "appending": 64 * 1024 * 1024}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {mount.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write a ballast file until the file system refuses (ENOSPC)."""
    ballast = disk / "ballast"
    chunk = b"\0" * (64 * 1024)
    with ballast.open("wb") as fh:
        while True:
            try:
                fh.write(chunk)
                fh.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return ballast


async def produce(bootstrap: str, values: list[bytes]) -> list[int]:
    async with Producer(bootstrap, acks="all", delivery_timeout_ms=3_000) as producer:
        receipts = [await producer.send(TOPIC, v, partition=0) for v in values]
        await producer.flush()
        return [(await r).offset for r in receipts]


@pytest.mark.parametrize("segments", SEGMENT_SIZES)
async def test_a_full_disk_refuses_writes_with_a_typed_error_and_recovers(
    small_disk: Path, segments: str
) -> None:
    broker = BrokerProcess(small_disk, extra_args=["--segment-bytes", str(SEGMENT_SIZES[segments])])
    broker.start()
    try:
        await create_topic(broker.bootstrap, TOPIC, 1)
        payload = b"x" * 1000
        before = [b"before-%05d-" % i + payload for i in range(2000)]  # about 2 MB
        acked = dict(zip(await produce(broker.bootstrap, before), before, strict=True))

        ballast = fill(small_disk)
        refused = [b"refused-%05d-" % i + payload for i in range(2000)]
        with pytest.raises(StorageError) as refusal:
            await produce(broker.bootstrap, refused)
        # ENOSPC itself, or the short write that precedes it when part of a batch still fit
        assert "No space left on device" in str(refusal.value) or "short write" in str(
            refusal.value
        )
        assert broker.alive, "the broker must stay up on a full disk"
        served = await read_partition(broker.bootstrap, f"default/{TOPIC}", 0)
        assert {r.offset: r.value for r in served if r.offset in acked} == acked

        ballast.unlink()
        after = [b"after-%05d-" % i + payload for i in range(2000)]
        acked |= dict(zip(await produce(broker.bootstrap, after), after, strict=True))

        def check_log(records: list[object]) -> None:
            offsets = [r.offset for r in records]  # type: ignore[attr-defined]
            assert offsets == list(range(len(offsets))), "offsets not contiguous"
            stored = {r.offset: r.value for r in records}  # type: ignore[attr-defined]
            lost = [o for o, v in acked.items() if stored.get(o) != v]
            assert not lost, f"{len(lost)} acknowledged records lost, first at {lost[:3]}"
            values = list(stored.values())
            assert len(values) == len(set(values)), "a record stored twice"

        check_log(list(await read_partition(broker.bootstrap, f"default/{TOPIC}", 0)))
        broker.kill9()
        broker.start()  # recovery scans the log: a torn write left by ENOSPC would be cut here
        check_log(list(await read_partition(broker.bootstrap, f"default/{TOPIC}", 0)))
    finally:
        broker.kill9()
