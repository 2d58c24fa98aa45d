"""The operator installed as the plain manifests ship it (ServiceAccount, Role, RoleBinding,
Deployment from ``headrace.operator.install``), running as a pod under its own service
account: its RBAC is enough to run a BrokerCluster and bring a Topic to Ready.

Test bed only: the pod runs this checkout's Python (the runner ignores images).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from e2e.support import Cluster
from headrace.operator import install

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
