"""``helm install`` of charts/headrace on the test bed, ``helm test``, ``helm upgrade``
and ``helm uninstall``.

The chart installs the operator (namespaced to the test's namespace, so it leaves the
rest of a shared test bed alone) and its example 3-broker BrokerCluster and Topic; the
operator brings the Topic to Ready. Then, under load (acks=all produces back to back),
``helm upgrade`` replaces the operator pod (a pod annotation changes) and points the
``helm test`` pod at the brokers' pod IPs (the test bed has no cluster DNS): no
acknowledged record is lost and no partition changes leader or epoch because of it.
``helm test`` produces with acks=all and consumes the records back; ``helm uninstall``
removes the operator and leaves the CRDs, the BrokerCluster, the Topic and the
brokers' volumes, as docs/operations.md says.

Test bed only: pods run this checkout's Python (the runner ignores images).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from bench import procs
from e2e.support import Cluster, wait_for
from tests.unit.charts.argocd_lua import run_check

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


def build_kstatus() -> str:
    done = subprocess.run(
        ["bash", str(CHART.parents[1] / "tools" / "kstatus" / "build.sh")],
        capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def health(cluster: Cluster, namespace: str, kstatus: str, kind: str, name: str) -> tuple[str, str]:
    """(Argo CD health by our Lua check, kstatus status) of the live object."""
    text = cluster.kubectl_run("get", kind.lower(), name, "-n", namespace, "-o", "json").stdout
    argo, _ = run_check(kind, json.loads(text))
    done = subprocess.run([kstatus], input=text, capture_output=True, text=True, timeout=30)
    return argo, json.loads(done.stdout)["status"]


def all_brokers(cluster: Cluster, namespace: str) -> list[str] | None:
    ips = broker_ips(cluster, namespace)
    return ips if len(ips) == 3 else None


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
        "--set", "exampleCluster.replicas=3",
        "--set", "exampleCluster.storageSize=32Mi",
        "--set-json", 'exampleCluster.topic={"name":"helm-test","partitions":2,"replicas":3,"minInSync":2}',
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
        # the statuses the operator wrote read as healthy to Argo CD's checks and to kstatus
        kstatus = build_kstatus()
        for kind, name in (("Topic", "helm-test"), ("BrokerCluster", "demo")):

            def healthy(kind: str = kind, name: str = name) -> bool:
                return health(cluster, namespace, kstatus, kind, name) == ("Healthy", "Current")

            wait_for(f"{kind} {name} Healthy to Argo CD and Current to kstatus", healthy, 120)

        ips = wait_for("3 brokers' pod IPs", lambda: all_brokers(cluster, namespace), 90)
        bootstrap = ",".join(f"{ip}:9092" for ip in ips)
        before = leaders(cluster.get("topic", "helm-test", namespace)["status"])
        old_pod = operator_pod(cluster, namespace)
        with Load(f"{namespace}/helm-test", bootstrap) as load:
            wait_for("acknowledged records before the upgrade", lambda: load.acked, 60)
            helm(
                cluster, namespace, "upgrade", RELEASE, str(CHART), "--reuse-values",
                "--set-json", f"test.bootstrap={json.dumps(bootstrap)}",
                "--set", "operator.podAnnotations.upgraded=yes",
                "--wait", "--timeout", "3m",
            )  # fmt: skip
            new_pod: str = wait_for(
                "the new operator pod", lambda: new_operator_pod(cluster, namespace, old_pod), 120
            )
            wait_for(
                "the new operator to take the Lease and start the cluster's loop",
                lambda: "control loop of" in cluster.logs(new_pod, namespace),
                120,
            )
            acked_at_upgrade = len(load.acked)
            wait_for(
                "acknowledged records after the upgrade",
                lambda: len(load.acked) > acked_at_upgrade + 40,
                90,
            )
        assert load.failures == [], load.failures[:3]
        print(
            f"\n[figure] acks=all records acknowledged across the operator's upgrade: "
            f"{len(load.acked)} ({acked_at_upgrade} before its new pod ran the loop)",
            file=sys.stderr,
        )
        status = json.loads(helm(cluster, namespace, "status", RELEASE, "-o", "json"))
        assert status["info"]["status"] == "deployed" and status["version"] == 2
        # the operator's replacement moved no leader and bumped no epoch
        assert leaders(cluster.get("topic", "helm-test", namespace)["status"]) == before

        # every acknowledged record is there: a fresh cohort reads the topic from the start
        read = procs.run_headrace(
            "consume", f"{namespace}/helm-test", "--cohort", f"check-{uuid.uuid4().hex[:6]}",
            "--from-beginning", "--count", str(len(load.acked)), "--bootstrap", bootstrap,
            timeout=120,
        )  # fmt: skip
        assert read.returncode == 0, read.stderr.decode()
        missing = set(load.acked) - set(read.stdout.decode().splitlines())
        assert missing == set(), f"{len(missing)} acknowledged records lost: {sorted(missing)[:5]}"

        out = helm(cluster, namespace, "test", RELEASE, "--logs", "--timeout", "4m", timeout=300)
        assert "Phase:          Succeeded" in out or "Succeeded" in out, out
        consumed = cluster.logs(f"{RELEASE}-headrace-test", namespace, "-c", "consume")
        # the consumer prints each record, then its count (on stderr); from the beginning
        # of the topic, so the load's records come first
        assert "consumed 50 records" in consumed, consumed[-2000:]

    except BaseException:
        print(operator_logs(cluster, namespace), file=sys.stderr)
        # the release's ClusterRole is cluster-scoped: not deleted with the namespace
        cluster.run(
            cluster.helm, "uninstall", RELEASE, "-n", namespace,
            "--kubeconfig", str(cluster.kubeconfig), check=False,
        )  # fmt: skip
        remove_example(cluster, namespace)
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
    assert len(pvcs["items"]) == 3  # one per broker

    remove_example(cluster, namespace)


def remove_example(cluster: Cluster, namespace: str) -> None:
    """Delete the kept example objects; no operator runs to remove its finalizers."""
    for kind, name in (("topic", "helm-test"), ("brokercluster", "demo")):
        cluster.kubectl_run(
            "patch", kind, name, "-n", namespace, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip
        cluster.kubectl_run("delete", kind, name, "-n", namespace, "--wait=false", check=False)


def leaders(status: dict[str, Any]) -> dict[int, tuple[Any, Any]]:
    """Partition -> (leader, leader epoch)."""
    return {
        p["partition"]: (p.get("leader"), p.get("leaderEpoch"))
        for p in status.get("partitions", [])
    }


def operator_pod(cluster: Cluster, namespace: str) -> str | None:
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/name=headrace-operator",
        "-o", "json",
    )  # fmt: skip
    running = [
        p["metadata"]["name"]
        for p in json.loads(out.stdout)["items"]
        if p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]
    return running[0] if len(running) == 1 else None


def new_operator_pod(cluster: Cluster, namespace: str, old: str | None) -> str | None:
    pod = operator_pod(cluster, namespace)
    return pod if pod != old else None


class Load:
    """acks=all produces back to back (20 records a process) until the block ends; what
    was acknowledged and what failed (a produce that exits non-zero acknowledged nothing
    it can be held to, but the test wants none: brokers never stop)."""

    def __init__(self, topic: str, bootstrap: str) -> None:
        self.topic, self.bootstrap = topic, bootstrap
        self.acked: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        batch = 0
        while not self._stop.is_set():
            values = [f"load-{batch}-{i}" for i in range(20)]
            done = procs.run_headrace(
                "produce", self.topic, "--acks", "all", "--bootstrap", self.bootstrap,
                stdin="".join(f"{v}\n" for v in values).encode(), timeout=60,
            )  # fmt: skip
            if done.returncode == 0:
                self.acked += values
            else:
                self.failures.append(done.stderr.decode()[-500:])
            batch += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
