"""The partitioning-version fence and idempotent retries (docs/repartition.md, Producers).

A batch stored under the old version whose answer was lost (its leader killed
mid-cutover: found by the chaos campaign's cutover target) comes back as a retry
under that version. It must get the offset it was stored at, not a Redirect: a
Redirect says "nothing stored", so the producer would route the records again to
another partition (stored twice, out of order) and reuse their sequence numbers
here (a later batch acknowledged at the old one's offset)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.protocol import messages as msg
from headrace.protocol.coordination import PartitionPlacement, TopicPlacement
from headrace.protocol.frames import Frame, Op
from headrace.records import batch as rb
from headrace.testing.reading import read_partition
from tests.integration.cluster import Cluster
from tests.integration.raw import RawConnection

TOPIC = "default/fenced"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, size=1)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def place(c: Cluster, partitions: int, version: int) -> None:
    c.topics[TOPIC] = TopicPlacement(
        TOPIC,
        partitions,
        version,
        1,
        {},
        [PartitionPlacement(i, [0], 0, 1, [0]) for i in range(partitions)],
    )
    c.push()


def produce(conn: RawConnection, version: int, value: bytes, sequence: int) -> Frame:
    batch = rb.encode([value], keys=[b"k"], timestamp_ms=1, producer_id=7, base_sequence=sequence)
    request = msg.ProduceRequest(TOPIC, 0, version, msg.Acks.ALL, 5_000, b"")
    return conn.call(Op.PRODUCE, request.encode_prefix() + batch)


def test_a_retry_of_a_batch_stored_before_the_cutover_gets_its_offset(cluster: Cluster) -> None:
    place(cluster, 2, version=1)
    cluster.wait(lambda: cluster.partition_report(0, TOPIC, 0)["role"] == "leader", what="p0 led")
    conn = RawConnection(cluster.brokers[0].bootstrap)
    try:
        first = produce(conn, 1, b"stored before the cutover", 0)
        assert first.op == Op.PRODUCE_OK, first
        assert msg.ProduceResponse.decode(first.body).base_offset == 0

        place(cluster, 3, version=2)  # the cutover: the broker now fences version 1
        cluster.wait(
            lambda: cluster.heartbeat(0)["generation"] == cluster.generation, what="pushed"
        )
        retry = produce(conn, 1, b"stored before the cutover", 0)
        assert retry.op == Op.PRODUCE_OK, msg.Redirect.decode(retry.body)
        assert msg.ProduceResponse.decode(retry.body).base_offset == 0

        fresh = produce(conn, 1, b"routed under version 1, sent after the cutover", 1)
        assert fresh.op == Op.REDIRECT, fresh  # not stored before: the fence stands
    finally:
        conn.close()
    stored = asyncio.run(read_partition(cluster.bootstrap, TOPIC, 0))
    assert [r.value for r in stored] == [b"stored before the cutover"]
