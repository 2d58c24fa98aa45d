"""The operator installed as the plain manifests ship it (ServiceAccount, Role, RoleBinding,
Deployment from ``headrace.operator.install``), running as a pod under its own service
account: its RBAC is enough to run a BrokerCluster and bring a Topic to Ready.

Its surfaces answer on the pod IP: ``/healthz`` (the kubelet's liveness probe too),
``/metrics`` with the Topic's readiness, and the dashboard's view of the cluster.

Test bed only: the pod runs this checkout's Python (the runner ignores images).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from e2e.support import Cluster, wait_for
from headrace.operator import install
from headrace.operator.surfaces import DEFAULT_PORT

REPO = Path(__file__).resolve().parents[3]


def resources(namespace: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "BrokerCluster",
            "metadata": {"name": "solo", "namespace": namespace},
            "spec": {"replicas": 1, "storage": {"size": "16Mi"}},
        },
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "events", "namespace": namespace},
            "spec": {
                "clusterRef": {"name": "solo"},
                "partitions": 1,
                "replicas": 1,
                "tieredStorage": {"enabled": False},
            },
        },
    ]


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def check_surfaces(cluster: Cluster, namespace: str) -> None:
    pods = json.loads(
        cluster.kubectl_run(
            "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/name={install.NAME}",
            "-o", "json",
        ).stdout
    )["items"]  # fmt: skip
    (pod,) = pods
    base = f"http://{pod['status']['podIP']}:{DEFAULT_PORT}"
    assert http_get(f"{base}/healthz") == (200, f"ok\n{namespace}/solo: stepping\n")
    ready_line = (
        f'headrace_operator_object_ready{{kind="Topic",name="events",namespace="{namespace}"}} 1.0'
    )
    # the metrics snapshot is taken at scrape time: Ready was written before this scrape
    metrics = wait_for("the Topic ready in /metrics", lambda: _scrape(base, ready_line), 30)
    assert "headrace_operator_leader 1.0" in metrics
    assert 'headrace_operator_reconciles_total{kind="BrokerCluster"}' in metrics
    status, view = http_get(f"{base}/dashboard/view.json")
    assert status == 200 and json.loads(view)["cluster"]["id"] == "solo"


def _scrape(base: str, line: str) -> str | None:
    text = http_get(f"{base}/metrics")[1]
    return text if line in text else None


def test_the_installed_operator_runs_under_its_own_rbac(
    cluster: Cluster, namespace: str, testbed_only: None
) -> None:
    cluster.kubectl_run("apply", "-f", str(REPO / "crds"))
    cluster.apply(
        install.manifests(
            namespace,
            watch=(namespace,),
            command=(sys.executable, "-m", "headrace.operator"),
            broker_command=f"{sys.executable} -m headrace.cli.main",
        ),
        namespace,
    )
    cluster.apply(resources(namespace), namespace)
    try:
        cluster.kubectl_run(
            "wait",
            "--for=condition=Ready",
            "topic/events",
            "-n",
            namespace,
            "--timeout=120s",
            timeout=150,
        )
        logs = cluster.logs(f"deployment/{install.NAME}", namespace)
        assert "lease headrace-operator acquired" in logs
        check_surfaces(cluster, namespace)
        assert "Forbidden" not in logs and "403" not in logs, logs[-4000:]
    except BaseException:
        print(cluster.logs(f"deployment/{install.NAME}", namespace)[-8000:], file=sys.stderr)
        raise
    finally:
        # while the operator runs, so that it removes its finalizer
        cluster.kubectl_run(
            "delete",
            "brokercluster",
            "solo",
            "-n",
            namespace,
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        # cluster-scoped: not deleted with the namespace
        cluster.kubectl_run(
            "delete",
            "clusterrole,clusterrolebinding",
            f"{install.NAME}-{namespace}",
            check=False,
        )
