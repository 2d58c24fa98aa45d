"""A leader that missed a replica's removal does not count it in sync when a move adds it
back, on real broker processes with the test as their controller."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Producer
from headrace.protocol.coordination import PartitionPlacement, TopicPlacement
from tests.integration.cluster import Cluster

TOPIC = "default/moved"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, 3, ["--replica-fetch-wait-ms", "200"])
    c.start()
    yield c
    c.stop()


def place(cluster: Cluster, replicas: list[int], lrs: list[int], move_generation: int) -> None:
    """Partition 0 led by broker 0 at epoch 1 (min in sync 2)."""
    assignment = PartitionPlacement(0, replicas, 0, 1, lrs, move_generation=move_generation)
    cluster.topics[TOPIC] = TopicPlacement(TOPIC, 1, 1, 2, {}, [assignment])


def hosts(cluster: Cluster, broker: int) -> bool:
    return any(p["topic"] == TOPIC for p in cluster.heartbeat(broker)["partitions"])


async def test_a_move_adding_back_a_replica_the_leader_never_saw_leave_makes_it_fetch_again(
    cluster: Cluster,
) -> None:
    place(cluster, [0, 1, 2], [0, 1, 2], 0)
    cluster.push()
    async with Producer(cluster.bootstrap, acks="all", linger_ms=1) as producer:
        for f in await producer.send_many(TOPIC, [b"x"] * 100, partition=0):
            await f
    cluster.wait(
        lambda: cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0, 1, 2],
        what="every replica in sync",
    )
    # The push removing broker 2 reaches brokers 1 and 2, not the leader: broker 2 drops
    # its copy, the leader still has it in its replica set and LRS.
    place(cluster, [0, 1], [0, 1], 0)
    cluster.push(only=[1, 2])
    cluster.wait(lambda: not hosts(cluster, 2), what="broker 2 dropped its copy")
    # A move adds broker 2 back; the leader applies it before broker 2 does.
    place(cluster, [0, 1, 2], [0, 1], cluster.generation + 1)
    cluster.push(only=[0, 1])
    assert cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0, 1], (
        "broker 2 holds nothing: its progress from before must not keep it in sync"
    )
    # Broker 2 applies it, copies the log, and is admitted again.
    cluster.push()
    cluster.wait(
        lambda: cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0, 1, 2],
        what="broker 2 back in sync",
    )
    assert cluster.partition_report(2, TOPIC, 0)["logEndOffset"] >= 100


async def test_an_in_sync_follower_the_reset_catches_is_back_without_new_records(
    cluster: Cluster,
) -> None:
    # The controller's LRS lags the leader's (it had not heard that broker 2 caught up)
    # when a move starts: the leader resets broker 2 too. On an idle partition broker 2
    # names no new position, so the leader must credit the one its fetch session holds.
    place(cluster, [0, 1, 2], [0, 1, 2], 0)
    cluster.push()
    async with Producer(cluster.bootstrap, acks="all", linger_ms=1) as producer:
        for f in await producer.send_many(TOPIC, [b"x"] * 100, partition=0):
            await f
    cluster.wait(
        lambda: cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0, 1, 2],
        what="every replica in sync",
    )
    place(cluster, [0, 1, 2], [0, 1], cluster.generation + 1)
    cluster.push()
    cluster.wait(
        lambda: cluster.partition_report(0, TOPIC, 0)["liveReplicas"] == [0, 1, 2],
        what="broker 2 credited from its session, with nothing produced",
    )
