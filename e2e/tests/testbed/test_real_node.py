"""The real node (``E2E_NODE=real``, e2e/testbed/realnode.py): pods are containers that
containerd runs with runc, from images built here and imported, on the node's bridge, and
they reach the API server through the ``kubernetes`` Service (kube-proxy). The
BrokerCluster on it is ``e2e/tests/operator/test_pod_security_e2e.py``."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import pytest

from e2e.support import Cluster, wait_for
from e2e.testbed import realnode
from e2e.testbed.settings import Settings

pytestmark = pytest.mark.usefixtures("real_node_only")


def busybox_pod(name: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "sh",
                    "image": realnode.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                }
            ],
        },
    }


def finished(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    return wait_for(
        f"pod {name} to finish",
        lambda: (
            (pod := cluster.get("pod", name, namespace))["status"].get("phase")
            in ("Succeeded", "Failed")
            and pod
        ),
        90,
    )


def test_a_pod_is_a_container_of_an_imported_image(cluster: Cluster, namespace: str) -> None:
    # pid 1 of its own pid namespace, its own hostname and its own address on eth0
    script = 'echo "pid1=$(cat /proc/1/comm) host=$(hostname)"; ip -4 -o addr show eth0'
    cluster.apply([busybox_pod("box", script)], namespace)
    pod = finished(cluster, "box", namespace)
    assert pod["status"]["phase"] == "Succeeded", json.dumps(pod["status"])
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"].startswith("containerd://")
    assert status["image"] == realnode.BUSYBOX_IMAGE
    out = cluster.logs("box", namespace)
    assert "pid1=sh host=box" in out
    pod_ip = pod["status"]["podIP"]
    assert f"inet {pod_ip}/24" in out
    subnet = realnode.PodNetwork.of(Settings.from_env()).subnet
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(subnet)
    assert pod["status"]["hostIP"] != "127.0.0.1"


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    cluster: Cluster, namespace: str
) -> None:
    # kube-proxy's iptables rules take the ClusterIP to the API server on the host
    script = 'echo | nc -w 5 "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT" && echo reached'
    cluster.apply([busybox_pod("svc", script)], namespace)
    pod = finished(cluster, "svc", namespace)
    assert pod["status"]["phase"] == "Succeeded", cluster.logs("svc", namespace)
    assert "reached" in cluster.logs("svc", namespace)
