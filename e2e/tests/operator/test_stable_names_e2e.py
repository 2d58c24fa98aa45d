"""Brokers advertise their stable names, and a client in the cluster follows them across a
pod's restart with a new IP.

With the chart's default ``operator.brokerAdvertise: dns`` each broker advertises
``<pod>.<cluster>-brokers.<namespace>.svc``, its name through the headless Service. A
client in a pod (the chart's ``helm test`` pod: ``headrace roundtrip``, acks=all)
bootstraps through the client Service's name, is told those names, and produces and
reads back through them; so do the brokers replicating from one another. A broker pod is
then deleted: its replacement comes back under the same name with another IP, the
BrokerCluster's status still names it by that name, and a second ``helm test`` passes.

Only on the real node (``E2E_NODE=real``): the names are resolved by its cluster DNS
(CoreDNS), which the stand-in runner does not have (docs/testbed.md). The other suites
install the chart with ``brokerAdvertise=podIP`` because their clients run on the host,
whose resolver does not ask CoreDNS; this one's client runs in a pod.
"""

from __future__ import annotations

import json

import pytest

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import (
    RELEASE,
    InstalledOperator,
    pod_ips,
    wait_ready,
)

CLUSTER = "demo"
BROKERS = 3
#: what the chart installs here: the default advertising, and its example cluster
STABLE_NAMES = (
    "--set", "operator.brokerAdvertise=dns",
    "--set", "exampleCluster.enabled=true",
    "--set", f"exampleCluster.name={CLUSTER}",
    "--set", f"exampleCluster.replicas={BROKERS}",
    "--set", "exampleCluster.storageSize=32Mi",
    "--set-json",
    'exampleCluster.topic={"name":"orders","partitions":3,"replicas":3,"minInSync":2}',
    "--set", "test.records=200",
)  # fmt: skip


def advertised(cluster: Cluster, namespace: str) -> dict[int, str]:
    """Broker id -> the host the BrokerCluster's status says it advertises."""
    brokers = cluster.get("brokercluster", CLUSTER, namespace)["status"].get("brokers") or []
    return {int(b["id"]): str(b["host"]) for b in brokers}


def helm_test_passes(cluster: Cluster, namespace: str, operator: InstalledOperator) -> None:
    out = operator.helm("test", RELEASE, "--logs", "--timeout", "4m", timeout=300)
    assert "Succeeded" in out, out
    checked = cluster.logs(f"{RELEASE}-headrace-test", namespace, "-c", "roundtrip")
    assert "consumed all 200 records marked" in checked, checked[-2000:]


@pytest.mark.parametrize("operator", [STABLE_NAMES], indirect=True)
def test_brokers_advertise_stable_names_that_outlive_a_pods_ip(
    real_node_only: None, cluster: Cluster, namespace: str, operator: InstalledOperator
) -> None:
    wait_ready(cluster, "brokercluster", CLUSTER, namespace, timeout=300)
    wait_ready(cluster, "topic", "orders", namespace, timeout=180)
    names = {b: f"{CLUSTER}-{b}.{CLUSTER}-brokers.{namespace}.svc" for b in range(BROKERS)}
    assert advertised(cluster, namespace) == names
    args = cluster.get("statefulset", CLUSTER, namespace)["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert "--advertised-host" in args
    assert "POD_IP" not in args[args.index("--advertised-host") + 1]
    helm_test_passes(cluster, namespace, operator)

    # a broker pod deleted: its replacement has another IP and the same name
    before = pod_ips(cluster, namespace, CLUSTER)
    old = cluster.get("pod", f"{CLUSTER}-1", namespace)["metadata"]["uid"]
    cluster.kubectl_run("delete", "pod", f"{CLUSTER}-1", "-n", namespace, "--wait=false")

    def replaced() -> bool:
        pod = cluster.get("pod", f"{CLUSTER}-1", namespace)
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        return pod["metadata"]["uid"] != old and ready

    wait_for("broker 1's pod replaced and Ready", replaced, timeout_s=180)
    wait_ready(cluster, "brokercluster", CLUSTER, namespace, timeout=180)
    after = pod_ips(cluster, namespace, CLUSTER)
    print(f"[e2e] broker 1's pod IP {before[1]} -> {after[1]}")
    assert after[1] != before[1], json.dumps({"before": before, "after": after})
    assert advertised(cluster, namespace) == names
    helm_test_passes(cluster, namespace, operator)
