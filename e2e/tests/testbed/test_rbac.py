"""RBAC as an in-pod client sees it: 403 without a Role, 200 with one."""

from __future__ import annotations

import json
from typing import Any

from e2e.support import Cluster, python_container, wait_for

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# The in-cluster recipe every client library follows: token and CA from the mounted
# service-account directory, address from KUBERNETES_SERVICE_HOST/PORT.
LIST_CONFIGMAPS = r"""
import json, os, ssl, sys, urllib.error, urllib.request
sa = sys.argv[1]
ns = open(os.path.join(sa, "namespace")).read()
token = open(os.path.join(sa, "token")).read()
ctx = ssl.create_default_context(cafile=os.path.join(sa, "ca.crt"))
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
req = urllib.request.Request(
    f"https://{host}:{port}/api/v1/namespaces/{ns}/configmaps",
    headers={"Authorization": "Bearer " + token},
)
try:
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        status = resp.status
except urllib.error.HTTPError as err:
    status = err.code
print("status=%d" % status, flush=True)
sys.exit(0 if status == 200 else 1)
"""

# The same through the official Python client's own configuration loading
# (test bed: KUBECONFIG written by the runner; a cluster: the in-cluster files).
WHOAMI = r"""
from kubernetes import client, config
config.load_config()
review = client.AuthenticationV1Api().create_self_subject_review({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
print("user=" + review.status.user_info.username, flush=True)
"""


def pod(cluster: Cluster, name: str, script: str, *args: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": "reader",
            "restartPolicy": "Never",
            "containers": [python_container(cluster, "main", script, *args)],
        },
    }


def finished(cluster: Cluster, name: str, namespace: str) -> str | None:
    phase = cluster.get("pod", name, namespace)["status"].get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


def test_service_account_needs_a_role(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl_run("create", "serviceaccount", "reader", "-n", namespace)
    cluster.apply([pod(cluster, "denied", LIST_CONFIGMAPS, SA_DIR)], namespace)
    assert wait_for("pod to finish", lambda: finished(cluster, "denied", namespace)) == "Failed"
    assert "status=403" in cluster.logs("denied", namespace)

    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "configmap-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "reader-reads-configmaps"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "configmap-reader",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    cluster.apply([role, binding], namespace)
    cluster.apply([pod(cluster, "allowed", LIST_CONFIGMAPS, SA_DIR)], namespace)
    assert wait_for("pod to finish", lambda: finished(cluster, "allowed", namespace)) == "Succeeded"
    assert "status=200" in cluster.logs("allowed", namespace)


def test_official_client_in_pod_authenticates_as_its_service_account(
    cluster: Cluster, namespace: str, testbed_only: None
) -> None:
    # Needs the kubernetes package inside the pod: the test bed runs this virtualenv's
    # Python; a kind image would need it installed.
    cluster.kubectl_run("create", "serviceaccount", "reader", "-n", namespace)
    cluster.apply([pod(cluster, "whoami", WHOAMI)], namespace)
    assert wait_for("pod to finish", lambda: finished(cluster, "whoami", namespace)) == "Succeeded"
    assert f"user=system:serviceaccount:{namespace}:reader" in cluster.logs("whoami", namespace)
    status = cluster.get("pod", "whoami", namespace)["status"]
    assert json.dumps(status["containerStatuses"][0]["state"]["terminated"]["exitCode"]) == "0"
