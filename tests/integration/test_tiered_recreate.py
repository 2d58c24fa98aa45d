"""A tiered topic deleted and created again under the same name, on a local cluster with MinIO.

The old topic's objects are removed in the background by its leaders, so they can
outlive the topic: a leader killed before the delete never removes them. The new
topic must not meet them: it starts empty at offset 0 and holds only its own records.
Nor may it meet the old topic's copy on a broker that was down during the delete.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Producer
from headrace.testing.reading import offsets_and_values, read_all
from headrace.tiered.layout import partition_prefix
from headrace.tiered.manifest import Manifest
from headrace.tiered.tier import PartitionTier
from tests.integration.localcluster import (
    LocalCluster,
    all_in_sync,
    running_cluster,
    store_of,
    topic_manifest,
)
from tests.integration.test_unload import online

NAME = "again"
TOPIC = f"default/{NAME}"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "local", brokers=2, object_store="minio") as c:
        yield c


def stored_manifests(c: LocalCluster) -> list[Manifest]:
    """Every manifest of partition 0 stored under the topic's name, whatever its layout."""
    store = store_of(c)
    keys = [o.key for o in store.list(f"local/{TOPIC}/") if o.key.endswith("/0/manifest.json")]
    return [Manifest.from_json(store.get(k)) for k in keys]


async def produce(c: LocalCluster, values: list[bytes]) -> list[int]:
    async with Producer(c.bootstrap, acks="all") as producer:
        receipts = [await producer.send(TOPIC, v, partition=0) for v in values]
        return [(await r).offset for r in receipts]


async def test_a_re_created_topic_never_meets_the_deleted_ones_objects(
    cluster: LocalCluster,
) -> None:
    manifest = topic_manifest(NAME, 1, 1, 1, upload_interval_s=1)
    assert cluster.apply(manifest).returncode == 0
    cluster.wait(lambda: online(cluster, TOPIC, 1), what="topic online")
    old_leader = cluster.partitions(TOPIC)[0]["leader"]
    assert await produce(cluster, [b"old-%d" % i for i in range(20)]) == list(range(20))
    cluster.wait(
        lambda: any(m.checkpoint == 19 for m in stored_manifests(cluster)), 60, "old uploaded"
    )

    # Its leader dies before the delete: nobody removes the old objects.
    cluster.kill_broker(old_leader)
    cluster.cli("topics", "delete", NAME, "--dir", str(cluster.dir))
    cluster.wait(lambda: not cluster.partitions(TOPIC), what="topic deleted")
    assert cluster.apply(manifest).returncode == 0
    cluster.wait(lambda: online(cluster, TOPIC, 1), 60, "topic re-created")
    assert cluster.partitions(TOPIC)[0]["leader"] != old_leader

    new = [b"new-%d" % i for i in range(5)]
    assert await produce(cluster, new) == list(range(5)), "the new topic starts at offset 0"
    assert offsets_and_values(await read_all(cluster.bootstrap, TOPIC, 0, attempts=100)) == list(
        enumerate(new)
    )
    cluster.wait(
        lambda: any(m.checkpoint == 4 and m.start_offset == 0 for m in stored_manifests(cluster)),
        60,
        "the new topic's records uploaded under a manifest of their own",
    )


async def test_a_replica_that_missed_the_delete_drops_its_copy_of_the_old_topic(
    cluster: LocalCluster,
) -> None:
    manifest = topic_manifest(NAME, 1, 2, 1, upload_interval_s=1)
    assert cluster.apply(manifest).returncode == 0
    cluster.wait(lambda: all_in_sync(cluster, TOPIC, 1, replicas=2), what="topic in sync")
    assert await produce(cluster, [b"old-%d" % i for i in range(20)]) == list(range(20))
    cluster.wait(lambda: all_in_sync(cluster, TOPIC, 1, replicas=2), what="old records copied")
    follower = 1 - cluster.partitions(TOPIC)[0]["leader"]

    # The follower is down while the topic is deleted and created again: it comes back
    # with a copy of the old topic, and the new one (two replicas) is placed on it.
    cluster.kill_broker(follower)
    cluster.cli("topics", "delete", NAME, "--dir", str(cluster.dir))
    cluster.wait(lambda: not cluster.partitions(TOPIC), what="topic deleted")
    assert cluster.apply(manifest).returncode == 0
    cluster.restart_broker(follower)
    cluster.wait(lambda: all_in_sync(cluster, TOPIC, 1, replicas=2), 60, "topic re-created")

    new = [b"new-%d" % i for i in range(5)]
    assert await produce(cluster, new) == list(range(5))
    cluster.wait(lambda: all_in_sync(cluster, TOPIC, 1, replicas=2), what="new records copied")
    leader = cluster.partitions(TOPIC)[0]["leader"]
    cluster.kill_broker(leader)  # the broker that missed the delete serves alone now
    cluster.wait(
        lambda: cluster.partitions(TOPIC)[0]["leader"] == 1 - leader, 60, "the other one leads"
    )
    assert offsets_and_values(await read_all(cluster.bootstrap, TOPIC, 0, attempts=100)) == list(
        enumerate(new)
    )
    prefix = partition_prefix("local", TOPIC, 0, cluster.creation_id(TOPIC))
    tier = PartitionTier(store_of(cluster), prefix)
    cluster.wait(
        lambda: tier.manifest(refresh=True).checkpoint == 4, 60, "the new records uploaded"
    )
