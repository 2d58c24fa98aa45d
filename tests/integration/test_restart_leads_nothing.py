"""A restarted cluster broker acknowledges nothing before the controller assigns it roles.

Found by the fault campaign (docs/reliability.md): partitions loaded from disk
started as leaders with no replica set and minInSync 1, so in the second
between a restart and the controller's first topology push the broker
acknowledged acks=all writes alone, then became a follower and truncated them.
Here the controller is down, so no push ever comes: produce must be refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos.campaign import broker_ready
from headrace.client.cluster import ClusterClient
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from tests.integration.localcluster import LocalCluster, topic_manifest

TOPIC = "default/restarting"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


async def test_a_restarted_broker_refuses_produce_until_it_is_told_to_lead(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest("restarting", 1, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(
        lambda: (
            [p["state"] for p in cluster.partitions(TOPIC)] == ["Online"]
            and len(cluster.partitions(TOPIC)[0]["liveReplicas"]) == 3
        ),
        what="topic online with a full LRS",
    )
    leader = cluster.partitions(TOPIC)[0]["leader"]
    client = ClusterClient(cluster.bootstrap)
    await client.start()
    version = client.routing.topic(TOPIC).partitioning_version
    await client.close()

    cluster.kill_controller()  # no topology push reaches the restarted broker
    try:
        cluster.kill_broker(leader)
        cluster.restart_broker(leader)
        cluster.wait(lambda: broker_ready(cluster, leader), what="the broker restarted")
        b = next(b for b in cluster.record["brokers"] if b["id"] == leader)
        conn = await ClientConnection.open(b["host"], b["port"], ConnectOptions())
        try:
            batch = rb.encode([b"alone"], timestamp_ms=1_700_000_000_000)
            produce = msg.ProduceRequest(TOPIC, 0, version, msg.Acks.ALL, 2000, b"")
            with pytest.raises(HeadraceError):
                await conn.request(Op.PRODUCE, produce.encode_prefix(), batch, timeout_s=10)
        finally:
            await conn.close()
    finally:
        cluster.restart_controller()
