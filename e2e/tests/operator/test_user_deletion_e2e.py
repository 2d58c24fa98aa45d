"""A deleted User leaves its cluster's ACL file before it goes, on a
real API server with the chart's operator.

kopf puts its finalizer on every User (the operator's delete handler needs it), so the
API server keeps a deleted User until the handler has written the ACL ConfigMap without
it; a failed write is retried (the failure itself is tested on kmock,
``tests/unit/operator/test_operator_user_deletion.py``). Here: the finalizer is on the
Users, ``kubectl delete`` returns once the User is gone, and by then the ConfigMap names
only the other User. One broker, no Topic: nothing here needs the brokers.
"""

from __future__ import annotations

from typing import Any

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import InstalledOperator, cluster_manifests
from headrace.operator import handlers
from headrace.security import acl

FINALIZER = f"{handlers.ANNOTATION_PREFIX}/finalizer"


def user(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "User",
        "metadata": {"name": name},
        "spec": {
            "clusterRef": {"name": "demo"},
            "authentication": {"type": "tls"},
            "authorization": {"grants": [{"operations": ["consume"], "topics": ["orders"]}]},
        },
    }


def principals(cluster: Cluster, namespace: str) -> set[str]:
    text = cluster.get("configmap", "demo-acl", namespace)["data"]["acl.json"]
    return {p.name for p in acl.AclFile.model_validate_json(text).principals}


def test_a_deleted_user_leaves_the_acl_file_before_it_goes(
    cluster: Cluster, namespace: str, operator: InstalledOperator
) -> None:
    (broker_cluster,) = cluster_manifests(namespace, replicas=1, topic=None)
    broker_cluster["spec"]["auth"] = {"enabled": True}
    cluster.apply([user("keeper"), user("leaver"), broker_cluster], namespace)
    both = {f"{namespace}:keeper", f"{namespace}:leaver"}
    wait_for("both Users in the ACL file", lambda: principals(cluster, namespace) == both, 120)
    for name in ("keeper", "leaver"):
        wait_for(
            f"kopf's finalizer on User {name}",
            lambda name=name: (
                FINALIZER  # type: ignore[misc]
                in cluster.get("user", name, namespace)["metadata"].get("finalizers", [])
            ),
            60,
        )
    # kubectl waits until the User is gone: the finalizer's handler has run by then
    cluster.kubectl_run(
        "delete", "user", "leaver", "-n", namespace, "--timeout=60s", timeout=90
    )  # fmt: skip
    assert principals(cluster, namespace) == {f"{namespace}:keeper"}
