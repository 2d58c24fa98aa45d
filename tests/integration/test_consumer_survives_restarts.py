"""One long-lived cohort consumer across a kill -9 and a graceful restart of every broker.

Real controller and broker processes (``headrace local up``). Cohort membership
lives in broker memory, so each restarted broker has forgotten the member; the
consumer must notice (its connection closed) and join again wherever it has
partitions, without the application restarting it. Throughout, a producer
writes keyed records with acks=all.

Afterwards every acknowledged record must have reached the consumer, and every
record it got twice must lie above what it had acknowledged one restart
earlier: redelivery is bounded by what was delivered and not yet acknowledged
(plus the cursor window: cursors reach disk and the followers a moment after
the ack, ``operations.md`` §6).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.processes import alive
from headrace.client import Consumer
from tests.integration.acked_load import AckedLoad, keys
from tests.integration.localcluster import LocalCluster, all_in_sync, topic_manifest, until

TOPIC = "default/restarts"
PARTITIONS = 6
#: acknowledged records of load between two restarts (a few seconds of it)
LOAD_PER_STEP = 150


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def leads_nothing(c: LocalCluster, broker: int) -> bool:
    return all(p["leader"] not in (broker, None) for p in c.partitions(TOPIC))


def pid_of(c: LocalCluster, broker: int) -> int:
    return int(next(b["pid"] for b in c.record["brokers"] if b["id"] == broker))


async def test_a_consumer_kept_open_across_every_broker_restart_receives_every_ack(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest("restarts", PARTITIONS)).returncode == 0
    await until(lambda: all_in_sync(cluster, TOPIC, PARTITIONS), "topic online and in sync")
    load = AckedLoad(cluster.bootstrap, "restarts", keys(12))
    #: (partition, offset, value, restarts before this delivery)
    deliveries: list[tuple[int, int, bytes, int]] = []
    #: per restart, the highest offset the consumer had acked on each partition just before
    acked_at_restart: list[dict[int, int]] = []
    acked: dict[int, int] = {}
    done = asyncio.Event()

    async def consume(consumer: Consumer) -> None:
        while not done.is_set():
            for batch in await consumer.getmany(timeout_s=0.2):
                restarts = len(acked_at_restart)
                for offset, value in zip(batch.offsets(), batch.values(), strict=True):
                    deliveries.append((batch.partition, offset, value, restarts))
                consumer.ack_batch(batch)
                acked[batch.partition] = max(acked.get(batch.partition, -1), batch.last_offset)

    async def restart(broker: int, *, graceful: bool) -> None:
        acked_at_restart.append(dict(acked))
        pid = pid_of(cluster, broker)
        if graceful:
            cluster.signal_broker(broker, signal.SIGTERM)
        else:
            cluster.kill_broker(broker)
        await until(lambda: not alive(pid), f"broker {broker} stopped")
        await until(lambda: leads_nothing(cluster, broker), f"leaders moved off broker {broker}")
        await load.wait_for_more(LOAD_PER_STEP)
        cluster.restart_broker(broker)
        await until(
            lambda: all_in_sync(cluster, TOPIC, PARTITIONS),
            f"broker {broker} back in every replica set",
        )
        await load.wait_for_more(LOAD_PER_STEP)

    consumer = Consumer(cluster.bootstrap, "restarts", "survivors", start="earliest")
    await consumer.start()
    consuming = asyncio.create_task(consume(consumer))
    load.start()
    try:
        await load.wait_for_more(LOAD_PER_STEP)
        for broker in (0, 1, 2):
            await restart(broker, graceful=False)
            await restart(broker, graceful=True)
    finally:
        await load.stop()
    try:
        wanted = {value for _, _, _, value in load.acked}
        await until(
            lambda: wanted <= {value for _, _, value, _ in deliveries},
            "every acknowledged record delivered to the consumer",
        )
    finally:
        done.set()
        await consuming
        await consumer.close()

    seen: set[tuple[int, int]] = set()
    redelivered: list[tuple[int, int, int]] = []
    for partition, offset, _, restarts in deliveries:
        if (partition, offset) in seen:
            redelivered.append((partition, offset, restarts))
        seen.add((partition, offset))
    beyond = [
        (p, o, r)
        for p, o, r in redelivered
        if r == 0 or (r >= 2 and o <= acked_at_restart[r - 2].get(p, -1))
    ]
    print(
        f"\n6 broker restarts under acks=all load: {len(load.acked)} acknowledged, all"
        f" delivered to one consumer; {len(redelivered)} redelivered"
    )
    assert not beyond, (
        f"redelivered records the consumer had acknowledged before the previous restart"
        f" (partition, offset, restarts before): {beyond[:10]}"
    )


async def test_a_consumer_kept_open_across_drained_restarts_of_every_broker_follows_every_leader(
    cluster: LocalCluster,
) -> None:
    """A drained restart (``local stop``, then ``local start``: a pod's rolling restart)
    moves leadership off the broker before its process ends, so the consumer leaves it
    while the connection is still open, and that connection closes later, as no member's.
    Once every broker has been restarted so, each connection the consumer had asked for
    the topology on is gone: nothing pushes it the hand-backs of leadership that follow.
    It must still be a member on every leader and receive every acknowledged record."""
    assert cluster.apply(topic_manifest("restarts", PARTITIONS)).returncode == 0
    await until(lambda: all_in_sync(cluster, TOPIC, PARTITIONS), "topic online and in sync")
    load = AckedLoad(cluster.bootstrap, "restarts", keys(12))
    delivered: set[bytes] = set()
    done = asyncio.Event()

    async def consume(consumer: Consumer) -> None:
        while not done.is_set():
            for batch in await consumer.getmany(timeout_s=0.2):
                delivered.update(batch.values())
                consumer.ack_batch(batch)

    def leaders() -> list[int | None]:
        return [
            p["leader"] for p in sorted(cluster.partitions(TOPIC), key=lambda p: p["partition"])
        ]

    async def follow_every_leader(consumer: Consumer, timeout: float = 60.0) -> None:
        """Until the consumer routes by the current leaders and is a member on each (read on
        its own event loop; the controller asked off it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            current = await asyncio.to_thread(leaders)
            routed = list(consumer.cluster.routing.topic(TOPIC).owners)
            if routed == current and not consumer.unjoined_partitions:
                return
            if loop.time() > deadline:
                raise AssertionError(
                    f"leaders {current}, the consumer routes by {routed}, not a member on"
                    f" (leader: partitions) {consumer.unjoined_partitions}"
                )
            await asyncio.sleep(0.1)

    consumer = Consumer(cluster.bootstrap, "restarts", "rolled", start="earliest")
    await consumer.start()
    consuming = asyncio.create_task(consume(consumer))
    load.start()
    try:
        await load.wait_for_more(LOAD_PER_STEP)
        for broker in (0, 1, 2):
            # off the loop: the consumer sees the drain while the broker still runs
            await asyncio.to_thread(
                cluster.cli, "local", "stop", str(broker), "--dir", str(cluster.dir)
            )
            await asyncio.to_thread(
                cluster.cli, "local", "start", str(broker), "--dir", str(cluster.dir)
            )
            await until(
                lambda: all_in_sync(cluster, TOPIC, PARTITIONS),
                f"broker {broker} restarted and back in every replica set",
            )
            await load.wait_for_more(LOAD_PER_STEP)
        # the preferred leaders back: the last hand-backs happen after the last restart
        await until(lambda: set(leaders()) == {0, 1, 2}, "every broker leading again")
        await follow_every_leader(consumer)
    finally:
        await load.stop()
    try:
        wanted = {value for _, _, _, value in load.acked}
        await until(lambda: wanted <= delivered, "every acknowledged record delivered")
    finally:
        done.set()
        await consuming
        await consumer.close()
