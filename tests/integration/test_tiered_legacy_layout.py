"""A tiered topic from before creation ids keeps its objects where they are (local mode, MinIO).

A 2-broker cluster of the previous release (``upgrading.PREVIOUS_RELEASE``,
which stores objects under ``<cluster>/<namespace>/<topic>/<partition>/``) uploads a
topic's records; its brokers, then its controller, are upgraded to this release. The
topic's status has no creation id, so this release goes on in the legacy layout: it
uploads new records next to the old ones, and a partition moved to another broker (an
Unload: the new owner starts empty) reads the old release's objects back.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.processes import alive
from headrace.testing.reading import offsets_and_values, read_all
from headrace.tiered.layout import partition_prefix
from headrace.tiered.manifest import Manifest
from headrace.tiered.tier import PartitionTier
from tests.integration.localcluster import LocalCluster, store_of, topic_manifest, until
from tests.integration.objectstore import servers
from tests.integration.test_rolling_upgrade import previous  # noqa: F401  (a fixture)
from tests.integration.test_tiered_recreate import produce
from tests.integration.test_unload import online, unload_manifest, wait_unload

NAME = "again"  # the topic ``test_tiered_recreate``'s helpers produce to and read
TOPIC = f"default/{NAME}"


@pytest.fixture
def cluster(
    tmp_path: Path,
    previous: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[LocalCluster]:
    # the exported release finds no tools/ of its own: it takes the binary from here
    monkeypatch.setenv("HEADRACE_MINIO_BIN", str(servers.minio_binary()))
    c = LocalCluster(tmp_path / "local", brokers=2, object_store="minio", src=previous)
    c.up()
    try:
        yield c
    finally:
        c.src = None  # whichever release runs now, this one's `local down` stops it
        c.down()


def legacy_manifest(c: LocalCluster) -> Manifest:
    return PartitionTier(store_of(c), partition_prefix("local", TOPIC, 0)).manifest(refresh=True)


async def test_a_topic_from_before_creation_ids_is_read_and_written_in_the_legacy_layout(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest(NAME, 1, 1, 1, upload_interval_s=1)).returncode == 0
    cluster.wait(lambda: online(cluster, TOPIC, 1), what="topic online")
    old = [b"old-%d" % i for i in range(20)]
    assert await produce(cluster, old) == list(range(20))
    cluster.wait(lambda: legacy_manifest(cluster).checkpoint == 19, 60, "the old release uploads")

    cluster.src = None
    for broker in (0, 1):
        cluster.cli("local", "stop", str(broker), "--dir", str(cluster.dir))
        cluster.cli("local", "start", str(broker), "--dir", str(cluster.dir))
        await until(lambda: online(cluster, TOPIC, 1), f"broker {broker} upgraded")
    old_controller = cluster.record["controller_pid"]
    cluster.signal_controller(signal.SIGTERM)
    await until(lambda: not alive(old_controller), "the old controller stopped")
    cluster.restart_controller()
    await until(lambda: online(cluster, TOPIC, 1), "the new controller places the topic")
    assert cluster.creation_id(TOPIC) == ""

    new = [b"new-%d" % i for i in range(5)]
    assert await produce(cluster, new) == list(range(20, 25))
    cluster.wait(lambda: legacy_manifest(cluster).checkpoint == 24, 60, "uploads go on in place")
    assert not [
        o.key
        for o in store_of(cluster).list(f"local/{TOPIC}/")
        if not o.key.split("/")[3].isdigit()
    ], "no object of the topic under a creation id"

    owner = cluster.partitions(TOPIC)[0]["leader"]
    unload = unload_manifest("away", TOPIC, [0], 1 - owner)
    assert cluster.apply(unload).returncode == 0
    await asyncio.to_thread(wait_unload, cluster, "away")
    assert cluster.partitions(TOPIC)[0]["leader"] == 1 - owner
    # the new owner holds nothing below the move: offsets 0-24 come from the objects
    read = await read_all(cluster.bootstrap, TOPIC, 0, attempts=100)
    assert offsets_and_values(read) == list(enumerate(old + new))
