"""An idle cluster does no work per partition: real brokers, counted work.

A 3-broker local cluster with a few hundred partitions (RF=3) and no traffic.
Once it has settled, replica fetches keep flowing (followers long-poll their
leaders) and the controller keeps polling heartbeats, but the leaders look at
no partition to answer the fetches (fetch sessions) and the brokers rebuild no
partition report for the heartbeats (the report journal). The brokers' own
counters say so; no clock is asserted on.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.testing.waiting import until
from tests.integration.localcluster import LocalCluster, topic_manifest

PARTITIONS = 300
#: replica fetch answers a broker sends in the measured window (each long poll is 0.5 s)
FETCHES = 24


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def counters(c: LocalCluster, broker: int) -> dict[str, float]:
    b = next(b for b in c.record["brokers"] if int(b["id"]) == broker)
    with urllib.request.urlopen(f"http://{b['host']}:{b['admin_port']}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {}
    for name in (
        "headrace_replica_fetches_total",
        "headrace_replica_fetch_partitions_total",
        "headrace_heartbeat_reports_built_total",
    ):
        m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert m is not None, f"{name} missing from /metrics"
        found[name] = float(m.group(1))
    return found


def settled(c: LocalCluster) -> bool:
    parts = c.partitions("default/idle")
    return len(parts) == PARTITIONS and all(
        p["state"] == "Online" and len(p["liveReplicas"]) == 3 for p in parts
    )


def window(c: LocalCluster, broker: int) -> dict[str, float]:
    """The counters' growth over ``FETCHES`` replica fetch answers of ``broker``."""
    before = counters(c, broker)
    fetches = "headrace_replica_fetches_total"
    until(
        lambda: counters(c, broker)[fetches] >= before[fetches] + FETCHES,
        120,
        f"{FETCHES} replica fetches answered by broker {broker}",
        poll_s=0.2,
    )
    after = counters(c, broker)
    return {k: after[k] - before[k] for k in after}


def test_an_idle_cluster_looks_at_no_partition_per_fetch_or_heartbeat(
    cluster: LocalCluster,
) -> None:
    cluster.apply(topic_manifest("idle", PARTITIONS))
    cluster.wait(lambda: settled(cluster), 120, "every partition Online with a full LRS")
    window(cluster, 0)  # settling: first uploads, first journal sweeps
    grew = window(cluster, 0)
    # Sessionless, each fetch looked at every partition the follower follows (about 100
    # per follower here): FETCHES fetches, over 2,400 looks. A safety sweep (every 30 s) may add
    # one pass; nothing more.
    assert grew["headrace_replica_fetch_partitions_total"] < PARTITIONS, grew
    # Without the journal, each poll (once a second) rebuilt all 300 reports: some 1,800 in
    # the window. With it, only the safety sweep (every 30 s) rebuilds them all.
    assert grew["headrace_heartbeat_reports_built_total"] <= 2 * PARTITIONS, grew
