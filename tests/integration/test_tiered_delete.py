"""A tiered topic deleted while its brokers are down: its objects still go, on a local
cluster with MinIO.

Each partition's leader removes its own objects when it drops its copy, but a leader
that is down at the delete never does. The controller keeps a record of the deleted
incarnation (persisted, so a controller killed with -9 keeps it too) and asks a live
broker with an object store to remove everything under its prefix; only the objects a
snapshot pins, and the snapshot document, stay.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import Producer
from headrace.jobs.snapshot import take_snapshot
from headrace.jobs.topics import TopicRef
from headrace.objectstore.directory import DirectoryStore
from headrace.protocol.coordination import ClusterTopology, IncarnationRemoval
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.tiered import pins
from headrace.tiered.layout import manifest_key, partition_prefix, segment_key, topic_prefix
from tests.integration.cluster import Cluster
from tests.integration.localcluster import (
    LocalCluster,
    manifest_of,
    running_cluster,
    store_of,
    topic_manifest,
)
from tests.integration.test_unload import online

NAME = "gone"
TOPIC = f"default/{NAME}"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "local", brokers=2, object_store="minio") as c:
        yield c


async def produce(c: LocalCluster, partition: int, values: list[bytes]) -> None:
    async with Producer(c.bootstrap, acks="all") as producer:
        receipts = [await producer.send(TOPIC, v, partition=partition) for v in values]
        for r in receipts:
            await r


def heartbeat(c: LocalCluster, broker: int) -> dict[str, Any]:
    b = next(b for b in c.record["brokers"] if b["id"] == broker)
    url = f"http://{b['host']}:{b['admin_port']}/v1/heartbeat"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return dict(json.loads(resp.read()))


def records(c: LocalCluster) -> list[dict[str, Any]]:
    """The deleted incarnations the controller is removing (its ``/v1/state``)."""
    return list(c.state()["cluster"].get("deleted", []))


async def test_a_topic_deleted_while_its_brokers_are_down_loses_every_unpinned_object(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest(NAME, 2, 1, 1, upload_interval_s=1)).returncode == 0
    cluster.wait(lambda: online(cluster, TOPIC, 2), what="topic online")
    creation_id = cluster.creation_id(TOPIC)
    leaders = {p["partition"]: p["leader"] for p in cluster.partitions(TOPIC)}
    assert sorted(leaders.values()) == [0, 1], "one partition on each broker"
    store = store_of(cluster)
    ref = TopicRef("local", TOPIC, creation_id)
    prefix = topic_prefix("local", TOPIC, creation_id)

    def uploaded(through: int) -> bool:
        return all(manifest_of(cluster, TOPIC, p).checkpoint == through for p in (0, 1))

    for p in (0, 1):
        await produce(cluster, p, [b"pinned-%d" % i for i in range(10)])
    cluster.wait(lambda: uploaded(9), 60, "the first records uploaded")
    snapshot = take_snapshot(store, ref, "keep", [0, 1], now_ms=int(time.time() * 1000))
    for p in (0, 1):
        await produce(cluster, p, [b"later-%d" % i for i in range(10)])
    cluster.wait(lambda: uploaded(19), 60, "the later records uploaded")
    pinned = pins.pinned_in(store, prefix)
    before = {o.key for o in store.list(prefix)}
    assert pinned and snapshot.key in before and len(before - pinned - {snapshot.key}) >= 6

    # Every broker is down at the delete: no leader removes anything, nobody can yet.
    for b in (0, 1):
        cluster.cli("local", "stop", str(b), "--dir", str(cluster.dir))
    cluster.cli("topics", "delete", NAME, "--dir", str(cluster.dir))
    cluster.wait(lambda: not cluster.partitions(TOPIC), what="topic deleted")
    [record] = records(cluster)
    assert (record["topic"], record["creationId"], record["partitions"]) == (
        TOPIC,
        creation_id,
        2,
    )
    assert record["broker"] is None, "no broker is live to remove the objects"

    # The controller crashes; its successor reads the record back. One broker comes back:
    # it removes the objects of both partitions, the other one's too.
    cluster.kill_controller()
    cluster.restart_controller()
    survivor, down = leaders[0], leaders[1]
    cluster.cli("local", "start", str(survivor), "--dir", str(cluster.dir))

    def only_pins_left() -> bool:
        return {o.key for o in store.list(prefix)} == pinned | {snapshot.key}

    cluster.wait(
        lambda: not records(cluster) and only_pins_left(),
        90,
        "the deleted topic's objects removed, all but the pinned ones",
    )

    # The broker that led the other partition comes back with its copy: it drops it, and
    # nothing of the deleted topic comes back to the store.
    cluster.cli("local", "start", str(down), "--dir", str(cluster.dir))
    generation = cluster.state()["cluster"]["generation"]

    def dropped() -> bool:
        beat = heartbeat(cluster, down)
        hosted = [p for p in beat["partitions"] if p["topic"] == TOPIC]
        return beat["generation"] >= generation and not hosted

    cluster.wait(dropped, 60, "the returning broker dropped its copy")
    assert only_pins_left()
    assert not records(cluster)


def test_a_broker_removes_what_the_push_asks_of_it_and_reports_it_while_asked(
    tmp_path: Path,
) -> None:
    """One cluster-mode broker process with a directory store, pushed to by hand."""
    objects = tmp_path / "objects"
    store = DirectoryStore(objects)
    cluster = Cluster(tmp_path, size=1, extra_args=["--object-store", f"file://{objects}"])
    mine, theirs = topic_prefix("test", TOPIC, "u1"), topic_prefix("test", TOPIC, "u2")
    for creation_id in ("u1", "u2"):
        for p in (0, 1):
            prefix = partition_prefix("test", TOPIC, p, creation_id)
            store.put(manifest_key(prefix), b"{}")
            store.put(segment_key(prefix, 0, 9), b"x")
    cluster.start()
    try:
        broker = cluster.brokers[0]

        def push(generation: int, removals: list[IncarnationRemoval]) -> None:
            endpoint = BrokerEndpoint(0, "127.0.0.1", broker.port, broker.admin_port)
            doc = ClusterTopology(generation, "test", [endpoint], removals=removals).to_json()
            broker.post_json("/v1/topology", doc)

        push(1, [IncarnationRemoval(TOPIC, "u1", 2, 0), IncarnationRemoval(TOPIC, "u2", 2, 1)])
        cluster.wait(
            lambda: cluster.heartbeat(0).get("removedIncarnations") == ["u1"],
            what="the removal reported",
        )
        assert cluster.heartbeat(0)["objectStore"] is True
        assert not list(store.list(mine)), "every object of the incarnation asked of it"
        assert len(list(store.list(theirs))) == 4, "another broker's removal is not its own"
        push(2, [])  # done: the controller stops asking, the broker stops reporting
        cluster.wait(
            lambda: "removedIncarnations" not in cluster.heartbeat(0), what="report dropped"
        )
    finally:
        cluster.stop()
