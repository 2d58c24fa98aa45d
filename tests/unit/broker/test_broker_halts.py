"""A failed data fdatasync halts the broker: one in-process ``Broker`` on loopback ports,
with EIO injected into the fdatasync of one partition's data file."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from pathlib import Path

import aiohttp
import pytest

from headrace.broker import main
from headrace.broker.app import Broker
from headrace.broker.config import BrokerSettings
from headrace.broker.topics import Partition
from headrace.errors import StorageError
from headrace.records import batch as rb

#: bounds a regression's hang; never part of the synchronisation
HANG_GUARD_SECONDS = 30
TOPIC = "default/orders"


def fail_data_syncs(monkeypatch: pytest.MonkeyPatch, p: Partition) -> list[int]:
    """EIO from every fdatasync of ``p``'s active data file; returns the calls it saw."""
    real = os.fdatasync
    data_fd = p.log.active._fd
    calls: list[int] = []

    def fdatasync(fd: int) -> None:
        if fd == data_fd:
            calls.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls


async def test_a_failed_data_fdatasync_halts_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broker = Broker(BrokerSettings(data_dir=tmp_path / "data", port=0, admin_port=0))
    await broker.start()
    try:
        await halts(broker, monkeypatch, caplog)  # ends with the broker stopped
    except BaseException:
        with contextlib.suppress(Exception):  # report the failure above, not the stop's
            await broker.stop()
        raise


async def halts(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broker.create_topic(TOPIC, 2)
    p = broker.registry.get(TOPIC).partition(1)
    calls = fail_data_syncs(monkeypatch, p)
    batch = rb.encode([b"v"], timestamp_ms=1, producer_id=7, base_sequence=0)
    p.log.append(batch, rb.validate(batch), leader_epoch=0)
    broker.committer.appended(p)
    durable = broker.committer.wait_durable(p, p.log.next_offset)

    with caplog.at_level(logging.CRITICAL, logger="headrace.broker.app"):
        await asyncio.wait_for(broker.halting.wait(), HANG_GUARD_SECONDS)
    assert broker.fatal is not None and broker.fatal.partition is p
    assert isinstance(durable.exception(), StorageError)
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 1
    assert f"{TOPIC}/1" in critical[0] and "Input/output error" in critical[0]

    # Still up while it stops: not ready, draining, and counted.
    assert not broker.ready and broker.heartbeat().draining
    assert broker.admin is not None
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{broker.admin.port}"
        async with http.get(f"{base}/readyz") as resp:
            assert resp.status == 503
        async with http.get(f"{base}/metrics") as resp:
            assert "headrace_log_sync_failures_total 1.0" in await resp.text()

    # The entry point stops it (no stop signal needed) and reports the halt.
    status = await asyncio.wait_for(
        main.serve_until_stopped(broker, asyncio.Event()), HANG_GUARD_SECONDS
    )
    assert status == main.EXIT_LOG_SYNC_FAILED != 0
    assert len(calls) == 1  # the failed log was never synced again, not even when stopping
