"""Rack awareness on a local cluster: 4 brokers in 2 racks (``headrace local up --racks``).

Real controller and broker processes. Each broker runs with ``--rack`` and reports it in
its heartbeats; the controller spreads every partition's replicas over both racks (with
no racks, placement pairs brokers 0 and 2 for some partition, both in rack ``a`` here),
and the live placement says so. Then one more broker joins rack ``a``: the replicas that
move onto it keep every partition over both racks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.testing.procs import run_headrace
from tests.integration.localcluster import LocalCluster, running_cluster, topic_manifest

TOPIC = "default/spread"
PARTITIONS = 8
RACKS = {0: "a", 1: "b", 2: "a", 3: "b"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path / "local", "--racks", "a,b", brokers=4) as c:
        yield c


def online(c: LocalCluster) -> bool:
    parts = c.partitions(TOPIC)
    return len(parts) == PARTITIONS and all(p["state"] == "Online" for p in parts)


def spans(replicas: list[int], racks: dict[int, str]) -> set[str]:
    return {racks[b] for b in replicas}


async def test_every_partition_spans_both_racks_and_keeps_spanning_them(
    cluster: LocalCluster,
) -> None:
    cluster.wait(lambda: len(cluster.state().get("racks", {})) == 4, what="racks heard")
    assert {int(b): r for b, r in cluster.state()["racks"].items()} == RACKS
    assert cluster.apply(topic_manifest(TOPIC.split("/")[1], PARTITIONS, 2, 1)).returncode == 0
    cluster.wait(lambda: online(cluster), what="topic online")
    parts = cluster.partitions(TOPIC)
    assert all(spans(p["replicas"], RACKS) == {"a", "b"} for p in parts), parts
    holds = [sum(b in p["replicas"] for p in parts) for b in range(4)]
    assert max(holds) - min(holds) <= 1, holds

    # broker 4 joins rack a (the racks go round: 4 mod 2): a share of rack a's replicas
    # move onto it, and no partition ends up in one rack
    proc = await asyncio.to_thread(
        run_headrace, "local", "add-broker", "--timeout", "120", "--dir", str(cluster.dir)
    )
    assert proc.returncode == 0, proc.stderr.decode()
    racks = {**RACKS, 4: "a"}
    assert {int(b): r for b, r in cluster.state()["racks"].items()} == racks
    parts = cluster.partitions(TOPIC)
    assert sum(4 in p["replicas"] for p in parts) >= 1, parts
    assert all(spans(p["replicas"], racks) == {"a", "b"} for p in parts), parts
