"""Local mode heals like a cluster, and ``apply`` tells the truth.

One real local cluster (controller + 3 broker processes) for the module, with
a 2 s preferred-leader quiet period so the rebalance shows within seconds.
The tests run in file order; the last one brings the cluster down itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.processes import alive
from headrace.client import Producer
from headrace.testing.procs import run_headrace
from headrace.testing.reading import read_partition
from tests.integration.localcluster import LocalCluster, topic_manifest

TOPIC = "default/healing"
QUIET_MS = 2_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("heal") / "local")
    c.up("--preferred-leader-quiet-ms", str(QUIET_MS))
    try:
        yield c
    finally:
        c.down()


def headrace(c: LocalCluster, *args: str) -> tuple[int, str, str]:
    proc = run_headrace(*args, "--dir", str(c.dir))
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_apply_of_a_folder_refuses_what_the_cluster_cannot_honour(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "1-cluster.yaml").write_text(
        "apiVersion: headrace.dev/v1alpha1\nkind: BrokerCluster\nmetadata: {name: main}\n"
        "spec: {replicas: 3}\n"
    )
    (folder / "2-healing.yaml").write_text(topic_manifest("healing", 3, replicas=3, min_in_sync=1))
    (folder / "3-too-wide.yaml").write_text(topic_manifest("too-wide", 1, replicas=4))
    code, out, err = headrace(cluster, "apply", "-f", str(folder))
    assert code == 1, err
    assert (
        "skipping BrokerCluster default/main: local mode runs Topics, Unloads, Repartitions,"
        " TopicSnapshots, TopicRestores, TopicSnapshotSchedules only" in err
    )
    assert "error: topic default/too-wide: 4 replicas need 4 brokers, the cluster has 3" in err
    assert out == "" and "Traceback" not in err and "422" not in err

    (folder / "3-too-wide.yaml").unlink()
    code, out, err = headrace(cluster, "apply", "-f", str(folder))
    assert (code, out) == (0, "topic default/healing applied\n"), err
    cluster.wait(
        lambda: (
            len(cluster.partitions(TOPIC)) == 3
            and all(p["state"] == "Online" for p in cluster.partitions(TOPIC))
        ),
        what="topic online",
    )

    thinner = tmp_path / "thinner.yaml"
    thinner.write_text(topic_manifest("healing", 3, replicas=2, min_in_sync=1))
    code, _, err = headrace(cluster, "apply", "-f", str(thinner))
    assert code == 1
    assert err.splitlines()[0] == (
        "error: topic default/healing: replicas 2, but the topic has 3: changing the"
        " replication factor is not supported"
    )
    assert len(cluster.partitions(TOPIC)) == 3

    missing = tmp_path / "missing.yaml"
    missing.write_text(topic_manifest("never-made", 1))
    code, _, err = headrace(cluster, "delete", "-f", str(missing))
    assert (code, err) == (3, "topic default/never-made not found\n")


async def test_a_killed_leader_restarted_gets_its_leadership_back(cluster: LocalCluster) -> None:
    preferred = {p["partition"]: p["replicas"][0] for p in cluster.partitions(TOPIC)}
    assert {p["partition"]: p["leader"] for p in cluster.partitions(TOPIC)} == preferred
    async with Producer(cluster.bootstrap, acks="all") as producer:
        await producer.send_many("healing", [b"before"] * 200, partition=0)
        await producer.flush()
    victim = preferred[0]
    epochs = {p["partition"]: p["leaderEpoch"] for p in cluster.partitions(TOPIC)}

    cluster.kill_broker(victim)
    cluster.wait(
        lambda: all(
            p["leader"] not in (victim, None) and victim not in p["liveReplicas"]
            for p in cluster.partitions(TOPIC)
        ),
        what=f"failover away from broker {victim}, and its removal from every LRS",
    )
    code, out, _ = headrace(cluster, "local", "status")
    assert code == 0 and f"broker {victim}  " in out and "exited (pid" in out, out

    code, _, err = headrace(cluster, "local", "restart", str(victim))
    assert code == 0, err
    assert f"broker {victim} had already exited" in err and f"broker {victim} started" in err
    cluster.wait(
        lambda: {p["partition"]: p["leader"] for p in cluster.partitions(TOPIC)} == preferred,
        timeout=60,
        what="leadership back on the preferred replicas",
    )
    for p in cluster.partitions(TOPIC):
        if p["replicas"][0] == victim:
            assert p["leaderEpoch"] >= epochs[p["partition"]] + 2  # failover, then hand-back
    values = [r.value for r in await read_partition(cluster.bootstrap, TOPIC, 0)]
    assert values == [b"before"] * 200, "the returned leader serves everything acknowledged"


def test_a_stopped_broker_shows_as_stopped_and_down_knows_it(cluster: LocalCluster) -> None:
    code, _, err = headrace(cluster, "local", "stop", "2")
    assert code == 0 and err.startswith("broker 2 stopped (pid"), err
    cluster.wait(lambda: 2 not in cluster.state()["live"], what="broker 2 no longer live")
    code, out, _ = headrace(cluster, "local", "status")
    assert "broker 2  127.0.0.4:" in out and "stopped  not live" in out, out
    pids = [int(b["pid"]) for b in cluster.record["brokers"] if b["pid"] is not None]
    pids.append(int(cluster.record["controller_pid"]))
    code, _, err = headrace(cluster, "local", "down")
    assert (code, err) == (0, "local cluster stopped (broker 2 was already stopped)\n")
    assert not any(alive(pid) for pid in pids)
