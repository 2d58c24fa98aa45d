"""A repartition's cutover offset survives the death of the leader that moved the fence.

Real broker processes, with the test as their controller (``tests/integration/cluster``).
Partition 0 (RF=3, minInSync 2) takes records under partitioning version 1, then the
version moves to 2 (the cutover) and it takes more. Its leader is killed before any
controller heard its cutover: the next leader must report the offset where version 2
began, which its followers copied with the records (``docs/repartition.md``), not its own
log end, which lies past the post-cutover records it copied (a cohort would get those as
pre-cutover records, ahead of their keys' older records in other partitions).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.protocol import messages as msg
from headrace.protocol.coordination import PartitionPlacement, TopicPlacement
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from tests.integration.cluster import Cluster
from tests.integration.raw import RawConnection

TOPIC = "default/cutover"
REPLICAS = [0, 1, 2]
BEFORE = 5
AFTER = 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, 3, ["--replica-fetch-wait-ms", "200"])
    c.start()
    try:
        yield c
    finally:
        c.stop()


def place(c: Cluster, version: int, leader: int, epoch: int, lrs: list[int]) -> None:
    c.topics[TOPIC] = TopicPlacement(
        TOPIC, 1, version, 2, {}, [PartitionPlacement(0, REPLICAS, leader, epoch, lrs)]
    )
    c.push()


def produce(conn: RawConnection, version: int, value: bytes) -> int:
    request = msg.ProduceRequest(TOPIC, 0, version, msg.Acks.ALL, 10_000, b"")
    answer = conn.call(
        Op.PRODUCE, request.encode_prefix() + rb.encode([value], keys=[b"k"], timestamp_ms=1)
    )
    assert answer.op == Op.PRODUCE_OK, answer
    return msg.ProduceResponse.decode(answer.body).base_offset


def cut_over_and_copy(c: Cluster) -> int:
    """Records under version 1, the cutover, records under version 2 on every replica;
    the offset version 2 began at, as the leader that moved the fence holds it."""
    place(c, version=1, leader=0, epoch=1, lrs=REPLICAS)
    c.wait(lambda: c.partition_report(0, TOPIC, 0)["liveReplicas"] == REPLICAS, what="in sync")
    conn = RawConnection(c.brokers[0].bootstrap)
    try:
        for i in range(BEFORE):
            produce(conn, 1, f"before-{i}".encode())
        place(c, version=2, leader=0, epoch=1, lrs=REPLICAS)  # the cutover
        c.wait(lambda: c.heartbeat(0)["generation"] == c.generation, what="cutover applied")
        first = produce(conn, 2, b"after-0")
        for i in range(1, AFTER):
            produce(conn, 2, f"after-{i}".encode())
    finally:
        conn.close()
    assert first == BEFORE
    c.wait(
        lambda: all(
            c.partition_report(b, TOPIC, 0)["logEndOffset"] == BEFORE + AFTER for b in REPLICAS
        ),
        what="every replica holds the post-cutover records",
    )
    assert c.partition_report(0, TOPIC, 0)["cutover"] == {"version": 2, "offset": first}
    return first


def lead(c: Cluster, broker: int) -> dict[str, object]:
    """``broker`` leads at epoch 2 (the old leader is dead); its report once it does."""
    place(c, version=2, leader=broker, epoch=2, lrs=[b for b in REPLICAS if c.brokers[b].alive])
    c.wait(
        lambda: (
            c.partition_report(broker, TOPIC, 0)["role"] == "leader"
            and c.partition_report(broker, TOPIC, 0)["leaderEpoch"] == 2
        ),
        what=f"broker {broker} leads",
    )
    return c.partition_report(broker, TOPIC, 0)


def test_the_next_leader_reports_the_dead_leaders_cutover_offset(cluster: Cluster) -> None:
    first = cut_over_and_copy(cluster)
    cluster.brokers[0].kill9()  # before any controller polled its heartbeat
    report = lead(cluster, 1)
    assert report["logEndOffset"] == BEFORE + AFTER  # its own end: past the cutover
    assert report["cutover"] == {"version": 2, "offset": first}


def test_a_restarted_follower_still_knows_the_cutover_offset_when_it_leads(
    cluster: Cluster,
) -> None:
    first = cut_over_and_copy(cluster)
    cluster.brokers[0].kill9()
    cluster.brokers[1].kill9()
    cluster.brokers[1].start()  # its log keeps the post-cutover records; so must the cutover
    report = lead(cluster, 1)
    assert report["logEndOffset"] == BEFORE + AFTER
    assert report["cutover"] == {"version": 2, "offset": first}
