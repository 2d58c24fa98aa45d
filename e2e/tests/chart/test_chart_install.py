"""``helm install`` of charts/headrace on the test bed, ``helm test``, ``helm upgrade``
and ``helm uninstall``.

The chart installs the operator (namespaced to the test's namespace, so it leaves the
rest of a shared test bed alone) and its example BrokerCluster and Topic; the operator
brings the Topic to Ready; an upgrade points the ``helm test`` pod at the brokers' pod
IPs (the test bed has no cluster DNS); ``helm test`` produces with acks=all and
consumes the records back; ``helm uninstall`` removes the operator and leaves the CRDs,
the BrokerCluster, the Topic and the brokers' volumes, as docs/operations.md says.

Test bed only: pods run this checkout's Python (the runner ignores images).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from e2e.support import Cluster, wait_for

CHART = Path(__file__).resolve().parents[3] / "charts" / "headrace"
RELEASE = "hr"
HEADRACE = [sys.executable, "-m", "headrace.cli.main"]


def helm(cluster: Cluster, namespace: str, *args: str, timeout: float = 240) -> str:
    done = cluster.run(
        cluster.helm, *args, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def broker_ips(cluster: Cluster, namespace: str) -> list[str]:
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
    )
    return [
        pod["status"]["podIP"]
        for pod in json.loads(out.stdout)["items"]
        if pod.get("status", {}).get("podIP")
    ]


def operator_logs(cluster: Cluster, namespace: str) -> str:
    done = cluster.kubectl_run(
        "logs", f"deployment/{RELEASE}-headrace-operator", "-n", namespace, check=False
    )
    return done.stdout[-6000:] + done.stderr[-2000:]


def test_helm_install_test_upgrade_uninstall(
    cluster: Cluster, namespace: str, testbed_only: None
) -> None:
    values: list[str] = [
        "--set-json", f"operator.command={json.dumps([sys.executable, '-m', 'headrace.operator'])}",
        "--set", f"operator.brokerCommand={' '.join(HEADRACE)}",
        "--set-json", f"rbac.watchNamespaces={json.dumps([namespace])}",
        "--set", "exampleCluster.enabled=true",
        "--set", "exampleCluster.replicas=1",
        "--set", "exampleCluster.storageSize=32Mi",
        "--set-json", 'exampleCluster.topic={"name":"helm-test","partitions":2,"replicas":1,"minInSync":1}',
        "--set-json", f"test.command={json.dumps(HEADRACE)}",
        "--set", "test.records=50",
    ]  # fmt: skip
    # --force-conflicts: the shared test bed's CRDs may have been applied by kubectl
    # (another suite's field manager); the chart's copies are the same files
    helm(
        cluster, namespace, "install", RELEASE, str(CHART), *values,
        "--force-conflicts", "--wait", "--timeout", "3m",
    )  # fmt: skip
    try:
        cluster.kubectl_run(
            "wait", "--for=condition=Ready", "topic/helm-test", "-n", namespace,
            "--timeout=180s", timeout=200,
        )  # fmt: skip
        logs = operator_logs(cluster, namespace)
        assert "Forbidden" not in logs, logs

        ips = wait_for("the broker's pod IP", lambda: broker_ips(cluster, namespace), 60)
        bootstrap = ",".join(f"{ip}:9092" for ip in ips)
        before = cluster.get("topic", "helm-test", namespace)["status"]
        helm(
            cluster, namespace, "upgrade", RELEASE, str(CHART), "--reuse-values",
            "--set", f"test.bootstrap={bootstrap}", "--wait", "--timeout", "3m",
        )  # fmt: skip
        status = json.loads(helm(cluster, namespace, "status", RELEASE, "-o", "json"))
        assert status["info"]["status"] == "deployed" and status["version"] == 2

        out = helm(cluster, namespace, "test", RELEASE, "--logs", "--timeout", "4m", timeout=300)
        assert "Phase:          Succeeded" in out or "Succeeded" in out, out
        consumed = cluster.logs(f"{RELEASE}-headrace-test", namespace, "-c", "consume")
        # bench writes 64-byte values; the consumer prints each, then its count (stderr)
        assert sum(1 for line in consumed.splitlines() if len(line) == 64) == 50, consumed
        assert "consumed 50 records" in consumed

        # the upgrade touched only the test pod's values: the topic's leaders stayed put
        after = cluster.get("topic", "helm-test", namespace)["status"]
        assert leaders(after) == leaders(before)
    except BaseException:
        print(operator_logs(cluster, namespace), file=sys.stderr)
        raise

    helm(cluster, namespace, "uninstall", RELEASE, "--wait", "--timeout", "2m")
    # the operator and its RBAC are gone...
    gone = cluster.kubectl_run(
        "get", "deployment", f"{RELEASE}-headrace-operator", "-n", namespace, check=False
    )
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    # ...the CRDs, the cluster, its topic and the brokers' volumes stay
    cluster.kubectl_run("get", "crd", "topics.headrace.dev", "brokerclusters.headrace.dev")
    assert cluster.get("brokercluster", "demo", namespace)["metadata"]["name"] == "demo"
    assert cluster.get("topic", "helm-test", namespace)["metadata"]["name"] == "helm-test"
    pvcs = json.loads(cluster.kubectl_run("get", "pvc", "-n", namespace, "-o", "json").stdout)
    assert len(pvcs["items"]) == 1

    # clean up what the operator's finalizers would have: no operator runs to remove them
    for kind, name in (("topic", "helm-test"), ("brokercluster", "demo")):
        cluster.kubectl_run(
            "patch", kind, name, "-n", namespace, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip
        cluster.kubectl_run("delete", kind, name, "-n", namespace, "--wait=false", check=False)


def leaders(status: dict[str, Any]) -> dict[int, Any]:
    return {p["partition"]: p.get("leader") for p in status.get("partitions", [])}
