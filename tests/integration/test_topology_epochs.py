"""A long-lived client sees topics created after its broker restarted, whatever the restart.

Clients apply a topology snapshot only if it is newer than the one they hold,
so the broker's topology generation must never go backwards as a client sees
it. A plain restart keeps the counter (it is on disk); a restart that lost the
counter (the data directory replaced, or a directory written before the
counter was kept) starts it again lower, and the snapshot's ``epoch`` (when
the counter began) orders it after everything the old counter numbered.
One real standalone broker, restarted at the same address; one Producer kept
open across the restarts.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Producer
from headrace.testing.procs import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        yield b
    finally:
        b.kill9()


async def grow_the_generation(b: BrokerProcess, producer: Producer, topics: int) -> None:
    """Create and use ``topics`` topics: each create bumps the generation the client holds."""
    for i in range(topics):
        b.create_topic(f"before-{i}", 1)
        await (await producer.send(f"before-{i}", b"x"))


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
async def test_a_topic_created_after_a_restart_is_seen(broker: BrokerProcess, how: str) -> None:
    async with Producer(broker.bootstrap, acks="leader") as producer:
        await grow_the_generation(broker, producer, 3)
        broker.restart(crash=how == "kill -9")
        broker.create_topic("after", 1)
        meta = await (await producer.send("after", b"seen"))
        assert (meta.partition, meta.offset) == (0, 0)


async def test_a_counter_reset_by_a_new_data_directory_is_not_older(
    broker: BrokerProcess,
) -> None:
    async with Producer(broker.bootstrap, acks="leader") as producer:
        await grow_the_generation(broker, producer, 5)
        broker.kill9()
        shutil.rmtree(broker.data_dir)  # a replaced disk: the generation starts again
        broker.start()
        broker.create_topic("after", 1)
        meta = await (await producer.send("after", b"seen"))
        assert (meta.partition, meta.offset) == (0, 0)


async def test_a_counter_lost_from_a_kept_data_directory_is_not_older(
    broker: BrokerProcess,
) -> None:
    async with Producer(broker.bootstrap, acks="leader") as producer:
        await grow_the_generation(broker, producer, 5)
        broker.stop()
        # What a directory written before the counter was kept looks like.
        (broker.data_dir / "topology-generation").unlink()
        broker.start()
        broker.create_topic("after", 1)
        meta = await (await producer.send("after", b"seen"))
        assert (meta.partition, meta.offset) == (0, 0)
