"""In cluster mode a long-lived client sees topics created after its controller or
brokers restarted: the topology generation it orders snapshots by never goes backwards.

Clients apply a snapshot only if its ``(epoch, generation)`` is above the one they hold
(``client/routing.py``). In cluster mode the epoch is 0 and the generation is the
controller's: persisted in its commit record (``controller/cluster.json``) before any
push, restored on start, and a restart that finds a commit torn (the record lost, or
older than a Topic status stamped by the last commit) commits again above every stamp
before it pushes (``control/looping.py``, ``control/documents.restore``). A broker takes
its generation from the pushes alone, fencing any not above the one it holds, so its
restart does not reset a counter as a standalone broker's may
(``test_topology_epochs.py``). Real controller and broker processes (``headrace local``);
one Producer and one Consumer kept open throughout.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.client.cluster import ClusterClient
from tests.integration.localcluster import LocalCluster, running_cluster, topic_manifest, until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "local") as c:
        yield c


def online(c: LocalCluster, topic: str, partitions: int) -> bool:
    parts = c.partitions(f"default/{topic}")
    return len(parts) == partitions and all(p["state"] == "Online" for p in parts)


async def create(c: LocalCluster, topic: str, partitions: int = 2) -> None:
    assert c.apply(topic_manifest(topic, partitions)).returncode == 0
    await until(lambda: online(c, topic, partitions), f"topic {topic} online")


class OrderWatch:
    """Every ``(epoch, generation)`` a client's routing cache held, in the order it held
    them: the cache applies only newer snapshots, so a counter that went backwards shows
    as a stop (the last order never passes the one before the restart)."""

    def __init__(self, client: ClusterClient) -> None:
        self.client = client
        self.seen = [client.routing.order]
        client.topology_listeners.append(self._changed)

    def _changed(self) -> None:
        if self.client.routing.order != self.seen[-1]:
            self.seen.append(self.client.routing.order)


def _gone(pid: int) -> bool:
    """The process exited (a zombie counts: it does nothing more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


async def stop_controller(c: LocalCluster, how: str) -> None:
    pid = c.record["controller_pid"]
    if how == "kill -9":
        c.kill_controller()
    else:
        c.signal_controller(signal.SIGTERM)
    await until(lambda: _gone(pid), "the controller exited", 30)


async def caught_up(c: LocalCluster, producer: Producer, timeout: float = 30.0) -> None:
    """Until the producer's routing holds the controller's generation (every push taken)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        await producer.cluster.refresh()
        want = (await asyncio.to_thread(c.state))["cluster"]["generation"]
        if producer.cluster.routing.generation == want:
            return
        if loop.time() > deadline:
            raise AssertionError(f"the client never reached generation {want}")
        await asyncio.sleep(0.2)


async def produced_to(producer: Producer, topic: str) -> int:
    """Send one record to a topic the producer has not routed to before; its partition."""
    meta = await (await producer.send(topic, b"seen"))
    return meta.partition


async def consumed(consumer: Consumer, want: bytes, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        batches = await consumer.getmany(timeout_s=0.5)
        for batch in batches:
            consumer.ack_batch(batch)
        if any(want in batch.values() for batch in batches):
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out: {want!r} not delivered")


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
async def test_a_topic_created_after_a_controller_and_a_broker_restart_is_seen(
    cluster: LocalCluster, how: str
) -> None:
    """The controller restarted (its state directory kept), then a broker, then a topic
    created: the open Producer routes to it, and the open Consumer goes on."""
    c = cluster
    for i in range(3):
        await create(c, f"before-{i}")
    async with (
        Producer(c.bootstrap, acks="all") as producer,
        Consumer(c.bootstrap, "before-0", "readers", start="earliest") as consumer,
    ):
        await (await producer.send("before-0", b"first"))
        await consumed(consumer, b"first")
        watch = OrderWatch(producer.cluster)
        before = producer.cluster.routing.order

        await stop_controller(c, how)
        c.restart_controller()
        await until(lambda: c.state()["steps"] >= 3, "the restarted controller polling")
        broker = c.record["brokers"][0]["id"]
        c.kill_broker(broker)
        await until(lambda: broker not in c.state()["live"], "the broker seen gone", 30)
        c.restart_broker(broker)
        await until(lambda: broker in c.state()["live"], "the broker back", 60)

        await create(c, "after")
        assert await produced_to(producer, "after") in (0, 1)
        await (await producer.send("before-0", b"second"))
        await consumed(consumer, b"second")
    assert watch.seen[-1] > before, watch.seen
    assert watch.seen == sorted(watch.seen)  # (the cache never takes an older one)
    assert all(epoch == 0 for epoch, _ in watch.seen)  # cluster mode: the controller's counter


@pytest.mark.parametrize("last", ["create", "delete"])
async def test_a_lost_commit_record_does_not_hide_topics_created_afterwards(
    cluster: LocalCluster, last: str
) -> None:
    """The controller's commit record (``cluster.json``) lost while it was down: the
    restart restores the state from the Topic statuses and must commit above the
    generation the brokers and clients hold, whatever the last commit was (``delete``:
    a topic's deletion, which leaves no Topic status stamped with its generation)."""
    c = cluster
    for i in range(3):
        await create(c, f"before-{i}")
    if last == "delete":
        c.cli("topics", "delete", "before-2", "--dir", str(c.dir))
        await until(lambda: not c.partitions("default/before-2"), "before-2 deleted")
    async with Producer(c.bootstrap, acks="all") as producer:
        await (await producer.send("before-0", b"first"))
        await caught_up(c, producer)
        held = producer.cluster.routing.generation
        await stop_controller(c, "SIGTERM")
        (c.dir / "controller" / "cluster.json").unlink()
        c.restart_controller()
        await until(lambda: c.state()["steps"] >= 3, "the restarted controller polling")
        await create(c, "after")
        assert await produced_to(producer, "after") in (0, 1)
        assert producer.cluster.routing.generation > held
        assert c.state()["cluster"]["generation"] > held
