"""An uncommitted long-poll fetch wakes when the log end moves, not only the HW.

A real local cluster; the partition's two followers are stopped (SIGSTOP), so
the leader's high watermark cannot cover a new record. A FETCH with
``isolation=uncommitted`` waiting at the log end must answer as soon as the
record is appended, still above the HW. Before the fix it answered only once
the HW moved (after the leader dropped the silent followers), or at its
timeout.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Producer
from headrace.client.cluster import ClusterClient
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from tests.integration.localcluster import LocalCluster, topic_manifest

TOPIC = "default/peeking"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        for b in c.record["brokers"]:
            c.signal_broker(b["id"], signal.SIGCONT)
        c.down()


async def test_an_uncommitted_long_poll_answers_at_the_append(cluster: LocalCluster) -> None:
    assert cluster.apply(topic_manifest("peeking", 1, replicas=3, min_in_sync=1)).returncode == 0
    cluster.wait(
        lambda: (
            [p["state"] for p in cluster.partitions(TOPIC)] == ["Online"]
            and len(cluster.partitions(TOPIC)[0]["liveReplicas"]) == 3
        ),
        what="topic online with a full LRS",
    )
    async with Producer(cluster.bootstrap, acks="all") as producer:
        await (await producer.send("peeking", b"committed", partition=0))
    part = cluster.partitions(TOPIC)[0]
    for follower in (b for b in part["replicas"] if b != part["leader"]):
        cluster.signal_broker(follower, signal.SIGSTOP)

    client = ClusterClient(cluster.bootstrap)
    await client.start()
    try:
        conn = await client.connection_for(TOPIC, 0)
        poll = msg.FetchRequest(TOPIC, 0, 1, 65536, 60_000, msg.Isolation.UNCOMMITTED)
        fetching = conn.request(Op.FETCH, poll.encode(), timeout_s=90)
        async with Producer(cluster.bootstrap, acks="leader") as producer:
            await (await producer.send("peeking", b"uncommitted", partition=0))
        frame = await asyncio.wait_for(fetching, 90)
    finally:
        await client.close()
    head, data = msg.FetchResponseHeader.decode(frame.body)
    values = [r.value for _, h in rb.scan(data) for r in rb.decode(data[_ : _ + h.size]).records(1)]
    assert values == [b"uncommitted"]
    assert head.high_watermark == 1, "answered at the append, before the HW covered the record"
