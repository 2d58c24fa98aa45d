"""A topology push in a format newer than the broker reads (a controller upgraded before
its brokers): refused with a typed error, counted, shown in the heartbeat, and the broker
keeps serving the topology it has. Real cluster-mode broker processes over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.protocol.coordination import TOPOLOGY_FORMAT
from tests.integration.cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, size=1)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def refused_count(c: Cluster) -> float:
    url = f"{c.brokers[0].admin_url}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith('headrace_admin_documents_refused_total{document="topology"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_newer_topology_format_is_refused_and_reported_and_the_old_one_stays(
    cluster: Cluster,
) -> None:
    cluster.set_topic("default/t", [([0], 0, 1, [0])])
    cluster.push()
    assert cluster.heartbeat(0)["generation"] == 1
    broker = cluster.brokers[0]
    newer = {"format": TOPOLOGY_FORMAT + 1, "generation": 2, "brokers": [], "topics": []}
    with pytest.raises(urllib.error.HTTPError) as refused:
        broker.post_json("/v1/topology", newer)
    assert refused.value.code == 422
    body = json.loads(refused.value.read())
    assert body["error"] == "UnsupportedDocument" and "upgrade it" in body["message"]
    heartbeat = cluster.heartbeat(0)
    assert heartbeat["refusedTopologyFormat"] == TOPOLOGY_FORMAT + 1
    assert heartbeat["topologyFormat"] == TOPOLOGY_FORMAT
    assert heartbeat["generation"] == 1  # the topology it had: nothing of the new one
    assert [p["topic"] for p in heartbeat["partitions"]] == ["default/t"]
    assert refused_count(cluster) == 1
    # a push it reads (the controller rolled back, or the broker was upgraded) clears it
    cluster.push()
    heartbeat = cluster.heartbeat(0)
    assert heartbeat["refusedTopologyFormat"] is None and heartbeat["generation"] == 2
