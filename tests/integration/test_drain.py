"""Controlled shutdown in local mode: ``headrace drain`` moves a broker's leadership away
(epoch + 1, to another in-sync replica), the rebalance does not hand it back while it is
draining, and ``local stop`` drains before it stops, so no partition goes offline.

One real local cluster (controller + 3 broker processes), 2 s preferred-leader quiet
period; the tests run in file order.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from headrace.testing.procs import run_headrace
from tests.integration.localcluster import LocalCluster, topic_manifest

TOPIC = "default/drained"
QUIET_MS = 2_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("drain") / "local")
    c.up("--preferred-leader-quiet-ms", str(QUIET_MS))
    try:
        yield c
    finally:
        c.down()


def admin_url(c: LocalCluster, broker: int) -> str:
    b = next(b for b in c.record["brokers"] if b["id"] == broker)
    return f"http://{b['host']}:{b['admin_port']}"


def drain_report(c: LocalCluster, broker: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"{admin_url(c, broker)}/v1/drain", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def online_with_preferred_leaders(c: LocalCluster) -> bool:
    parts = c.partitions(TOPIC)
    return len(parts) == 3 and all(
        p["state"] == "Online" and p["leader"] == p["replicas"][0] and len(p["liveReplicas"]) == 3
        for p in parts
    )


def test_a_drained_broker_leads_nothing_and_gets_nothing_back_until_called_off(
    cluster: LocalCluster,
) -> None:
    assert cluster.apply(topic_manifest("drained", 3, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(lambda: online_with_preferred_leaders(cluster), what="preferred leaders")
    before = {p["partition"]: p for p in cluster.partitions(TOPIC)}
    led = [n for n, p in before.items() if p["leader"] == 0]
    assert led

    proc = run_headrace("drain", "--admin-url", admin_url(cluster, 0), "--timeout", "20")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "broker 0: drained" in proc.stdout.decode()
    report = drain_report(cluster, 0)
    assert report["draining"] and report["leading"] == [] and report["drained"]
    # the candidates promoted themselves on the push that drained broker 0; the controller
    # marks them Online once their heartbeats say so
    cluster.wait(
        lambda: all(p["state"] == "Online" for p in cluster.partitions(TOPIC)), what="online"
    )
    after = {p["partition"]: p for p in cluster.partitions(TOPIC)}
    for n in led:  # handed off once, to another in-sync replica
        assert after[n]["leader"] != 0
        assert after[n]["leaderEpoch"] == before[n]["leaderEpoch"] + 1

    # several quiet periods later it still leads nothing: no hand-back to a draining broker
    steps = cluster.state()["steps"]
    cluster.wait(
        lambda: cluster.state()["steps"] >= steps + 3 * QUIET_MS // 1000,
        what="controller steps over three quiet periods",
    )
    assert all(p["leader"] != 0 for p in cluster.partitions(TOPIC))

    proc = run_headrace("drain", "--admin-url", admin_url(cluster, 0), "--cancel")
    assert proc.returncode == 0, proc.stderr.decode()
    cluster.wait(lambda: online_with_preferred_leaders(cluster), what="leadership handed back")


def test_local_stop_drains_first_so_no_partition_goes_offline(cluster: LocalCluster) -> None:
    before = {p["partition"]: p for p in cluster.partitions(TOPIC)}
    proc = run_headrace("local", "stop", "1", "--dir", str(cluster.dir))
    assert proc.returncode == 0, proc.stderr.decode()
    cluster.wait(
        lambda: all(p["state"] == "Online" for p in cluster.partitions(TOPIC)), what="online"
    )
    after = {p["partition"]: p for p in cluster.partitions(TOPIC)}
    for n, p in before.items():
        # leadership moved while broker 1 was still up: one election each, none after it
        # stopped (a failover would have bumped the epoch again)
        assert after[n]["leader"] != 1
        bumped = 1 if p["leader"] == 1 else 0
        assert after[n]["leaderEpoch"] == p["leaderEpoch"] + bumped
    proc = run_headrace("local", "start", "1", "--dir", str(cluster.dir))
    assert proc.returncode == 0, proc.stderr.decode()
    cluster.wait(lambda: online_with_preferred_leaders(cluster), what="broker 1 back and leading")
