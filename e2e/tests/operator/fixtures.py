"""The operator e2e suites' shared setup: the chart installs the CRDs and the operator.

Every suite in ``e2e/tests/operator/`` (and ``e2e/tests/chart/``) installs headrace as a
platform team does: ``helm install`` of ``charts/headrace`` into the test's namespace,
the operator running as a pod of the chart's Deployment under the chart's service
account and RBAC, watching that namespace only (so it leaves the rest of a shared test
bed alone). The fixtures in ``conftest.py`` wrap what is here:

``operator`` (per test)
    An ``InstalledOperator``: the release is installed and its pod Ready; the test
    applies its own BrokerClusters and Topics (``cluster_manifests``). At teardown the
    BrokerClusters are deleted while the operator still runs (so it removes its
    finalizers and the brokers stop now, not with the namespace), then the release is
    uninstalled (its ClusterRole is cluster-scoped: it would outlive the namespace).
    On a failed test the operator's log tail is printed.

``crds`` (session)
    The chart's CRDs applied server-side, no operator: for tests that drive the
    operator's parts themselves (``test_status_cas_e2e.py``).

What runs where: on the test bed (``cluster.is_testbed``) the pods run this checkout's
Python (``sys.executable``; the runner ignores images). On any other provider the chart
runs the image ``E2E_HEADRACE_IMAGE`` (its default commands: ``python -m
headrace.operator``, brokers ``headrace``); load it into the cluster first (``kind load
docker-image``), see docs/testbed.md.

The helpers (``produce``, ``consume``, ``Load``, ``pod_ips``, ``figure``, ...) reach brokers on their
pod IPs from this host, which the test bed allows (pods are host processes on
127.B.x.y); on kind they are not routable from the host, so tests using them are test
bed only.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.support import Cluster, ensure_headrace_image, headrace_image, spark_image, wait_for
from headrace.testing import procs

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "headrace"
#: the release name every suite uses (one release per test namespace)
RELEASE = "hr"
#: argv of this checkout's ``headrace`` CLI (test bed pods and host-side clients)
HEADRACE = [sys.executable, "-m", "headrace.cli.main"]
#: the operator's surfaces port (the chart's ``operator.surfaces.port``)
SURFACES_PORT = 8081
#: how many control-loop steps a "nothing changes" window spans (a step polls every
#: broker and reconciles; the operator steps about every second when idle)
QUIET_STEPS = 5
#: the label the chart puts on the operator's pods
OPERATOR_SELECTOR = "app.kubernetes.io/name=headrace-operator"


def helm(cluster: Cluster, namespace: str, *args: str, timeout: float = 240) -> str:
    """Run the provider's helm against ``namespace``; fail the test on a non-zero exit."""
    done = cluster.run(
        cluster.helm, *args, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def operator_values(cluster: Cluster, namespace: str) -> list[str]:
    """The ``helm install`` flags that run the operator watching ``namespace`` only."""
    ensure_headrace_image(cluster)
    values = ["--set-json", f"rbac.watchNamespaces={json.dumps([namespace])}"]
    if cluster.is_testbed:
        values += [
            "--set-json", f"operator.command={json.dumps([sys.executable, '-m', 'headrace.operator'])}",
            "--set", f"operator.brokerCommand={' '.join(HEADRACE)}",
            "--set-json", f"test.command={json.dumps(HEADRACE)}",
            # no cluster DNS: brokers (host processes) and this host's clients resolve
            # names through the host's resolver, which knows no Service (docs/testbed.md)
            "--set", "operator.brokerAdvertise=podIP",
        ]  # fmt: skip
    else:
        repository, _, tag = headrace_image(cluster.real_node).rpartition(":")
        values += ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]
        values += ["--set", "image.pullPolicy=IfNotPresent"]
        # Compactions' drivers and executors: imported by the tests that run one
        # (``storage.operator(spark=True)``)
        values += ["--set", f"spark.image={spark_image()}"]
        if cluster.real_node:
            # this host's clients dial pod IPs (routed to the node's bridge): the host's
            # resolver does not ask the node's cluster DNS
            values += ["--set", "operator.brokerAdvertise=podIP"]
    return values


@dataclass
class InstalledOperator:
    """The chart's release in one namespace, and ways to look at its operator pod."""

    cluster: Cluster
    namespace: str
    release: str = RELEASE

    @property
    def deployment(self) -> str:
        return f"{self.release}-headrace-operator"

    def helm(self, *args: str, timeout: float = 240) -> str:
        return helm(self.cluster, self.namespace, *args, timeout=timeout)

    def install(self, *extra: str) -> None:
        # --force-conflicts: a shared test bed's CRDs may have been applied by kubectl
        # (another suite's field manager); the chart's copies are the same files
        self.helm(
            "install", self.release, str(CHART), *operator_values(self.cluster, self.namespace),
            *extra, "--force-conflicts", "--wait", "--timeout", "3m",
        )  # fmt: skip

    def uninstall(self) -> None:
        self.cluster.run(
            self.cluster.helm, "uninstall", self.release, "-n", self.namespace,
            "--kubeconfig", str(self.cluster.kubeconfig), "--wait", "--timeout", "2m",
            check=False, timeout=150,
        )  # fmt: skip

    def pods(self) -> list[dict[str, Any]]:
        """The release's operator pods that run and are not being deleted."""
        out = self.cluster.kubectl_run(
            "get", "pods", "-n", self.namespace, "-l", OPERATOR_SELECTOR, "-o", "json"
        )
        return [
            p
            for p in json.loads(out.stdout)["items"]
            if p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def pod(self) -> dict[str, Any]:
        """The one running operator pod (waits for it)."""

        def one() -> dict[str, Any] | None:
            pods = self.pods()
            return pods[0] if len(pods) == 1 and pods[0]["status"].get("podIP") else None

        return wait_for("one running operator pod", one, 120)

    def url(self, path: str = "") -> str:
        """Its surfaces (/healthz, /metrics, /dashboard) on its pod IP."""
        return f"http://{self.pod()['status']['podIP']}:{SURFACES_PORT}{path}"

    def logs(self, *extra: str) -> str:
        """The log of the running operator pod's current container (of whichever pod
        ``kubectl logs deployment/...`` picks, while there is not exactly one)."""
        pods = self.pods()
        target = pods[0]["metadata"]["name"] if len(pods) == 1 else f"deployment/{self.deployment}"
        done = self.cluster.kubectl_run("logs", target, "-n", self.namespace, *extra, check=False)
        return done.stdout + done.stderr

    def restarts(self) -> int:
        """Container restarts of the current pod (the runner's, or the kubelet's)."""
        status = self.pod()["status"]
        return sum(c.get("restartCount", 0) for c in status.get("containerStatuses", []))

    def loop_started(self) -> bool:
        """Its current process has taken the Lease and started a cluster's control loop."""
        return "control loop of" in self.logs()

    def steps(self) -> int:
        """Control-loop steps the operator's current process has completed (its /metrics)."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=5) as resp:
            body = resp.read().decode()
        found = re.search(
            r'^headrace_operator_reconciles_total\{kind="BrokerCluster"\} (\S+)$', body, re.M
        )
        return int(float(found.group(1))) if found else 0

    def quiet_window(self, what: str, steps: int = QUIET_STEPS) -> None:
        """Wait until the operator has run ``steps`` more steps: a window counted in the
        operator's own work, not in seconds, over which a check can show nothing changed."""
        start = wait_for("the operator's /metrics", lambda: self.steps() or None, 60)
        wait_for(what, lambda: self.steps() >= start + steps, 60)


def release_stuck_topics(cluster: Cluster, namespace: str) -> None:
    """Topics still there after their deletion timed out: say so (with their status, for
    whoever chases it), then drop their finalizers, or the namespace would never go from
    a shared test bed. (Seen after a scale 3 -> 4 -> 3: the data finalizer stays.)"""
    out = cluster.kubectl_run("get", "topic", "-n", namespace, "-o", "json", check=False)
    if out.returncode != 0:
        return
    for topic in json.loads(out.stdout)["items"]:
        name = topic["metadata"]["name"]
        print(
            f"\n[e2e] Topic {namespace}/{name} not deleted in 60 s; finalizers"
            f" {topic['metadata'].get('finalizers')}, status {json.dumps(topic.get('status'))[:600]}",
            file=sys.stderr,
        )
        cluster.kubectl_run(
            "patch", "topic", name, "-n", namespace, "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip


def remove_release(installed: InstalledOperator, failed: bool) -> None:
    """What the ``operator`` fixture does after a test (on a failed one, the operator's
    log tail first): the Topics, Users and BrokerClusters deleted while the operator
    still runs, so that it removes its finalizers (the Topics' first: their data
    finalizer needs the brokers; the garbage collector then deletes the StatefulSets and
    the brokers go now, not with the namespace), then the release uninstalled."""
    cluster, namespace = installed.cluster, installed.namespace
    if failed:
        print(f"--- operator log\n{installed.logs()[-8000:]}", file=sys.stderr)
    cluster.kubectl_run(
        "delete", "topic", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=90,
    )  # fmt: skip
    release_stuck_topics(cluster, namespace)
    # Users carry kopf's finalizer (it takes them out of the ACL file first)
    cluster.kubectl_run(
        "delete", "user", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=90,
    )  # fmt: skip
    cluster.kubectl_run(
        "delete", "brokercluster", "--all", "-n", namespace, "--timeout=60s",
        check=False, timeout=90,
    )  # fmt: skip
    installed.uninstall()


# ---------------------------------------------------------------------- objects


def cluster_manifests(
    namespace: str,
    name: str = "demo",
    replicas: int = 3,
    storage: str = "64Mi",
    topic: str | None = "orders",
    partitions: int = 2,
    topic_replicas: int = 3,
    min_in_sync: int | None = 2,
) -> list[dict[str, Any]]:
    """A BrokerCluster and (unless ``topic`` is None) one Topic on it, without tiering."""
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "BrokerCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "storage": {"size": storage}},
        }
    ]
    if topic is not None:
        spec: dict[str, Any] = {
            "clusterRef": {"name": name},
            "partitions": partitions,
            "replicas": topic_replicas,
            "tieredStorage": {"enabled": False},
        }
        if min_in_sync is not None:
            spec["minInSync"] = min_in_sync
        docs.append(
            {
                "apiVersion": "headrace.dev/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": topic, "namespace": namespace},
                "spec": spec,
            }
        )
    return docs


def figure(what: str, seconds: float) -> None:
    """A measured figure for the report (never asserted: targets are bench material)."""
    print(f"\n[e2e figure] {what}: {seconds:.2f} s", file=sys.stderr)


def condition(body: dict[str, Any], kind: str = "Ready") -> dict[str, Any] | None:
    return next(
        (c for c in body.get("status", {}).get("conditions", []) if c["type"] == kind), None
    )


def wait_ready(cluster: Cluster, kind: str, name: str, namespace: str, timeout: int = 120) -> None:
    """``kubectl wait --for=condition=Ready`` (the way a user waits)."""
    cluster.kubectl_run(
        "wait", "--for=condition=Ready", f"{kind}/{name}", "-n", namespace,
        f"--timeout={timeout}s", timeout=timeout + 30,
    )  # fmt: skip


def pod_ips(cluster: Cluster, namespace: str, name: str = "demo") -> dict[int, str]:
    """Broker id (pod ordinal) -> pod IP of the BrokerCluster ``name``'s pods that have one."""
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", f"headrace.dev/cluster={name}", "-o", "json"
    )
    ips = {}
    for pod in json.loads(out.stdout)["items"]:
        ip = pod.get("status", {}).get("podIP")
        if ip:
            ips[int(pod["metadata"]["name"].rpartition("-")[2])] = ip
    return ips


def leaders(status: dict[str, Any]) -> dict[int, tuple[Any, Any]]:
    """Partition -> (leader, leader epoch)."""
    return {
        p["partition"]: (p.get("leader"), p.get("leaderEpoch"))
        for p in status.get("partitions", [])
    }


# ---------------------------------------------------------------------- records


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    """acks=all; fails the test unless every record is acknowledged."""
    done = procs.run_headrace(
        "produce", topic, "--acks", "all", "--bootstrap", bootstrap,
        stdin="".join(f"{v}\n" for v in values).encode(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


def consume(bootstrap: str, topic: str, cohort: str | None = None) -> set[str]:
    """Every record of ``topic``, read from the beginning by a fresh cohort until the topic
    has been idle for 5 s."""
    done = procs.run_headrace(
        "consume", topic, "--cohort", cohort or f"check-{uuid.uuid4().hex[:6]}",
        "--from-beginning", "--idle-timeout", "5", "--bootstrap", bootstrap, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    return set(done.stdout.decode().split())


class Load:
    """acks=all produces back to back (20 records a process) until the block ends; what
    was acknowledged and what failed (a produce that exits non-zero acknowledged nothing
    it can be held to, but the tests want none: their brokers never stop)."""

    def __init__(
        self, topic: str, bootstrap: str, prefix: str = "load", token: str | None = None
    ) -> None:
        """``token``: the producers' ``HEADRACE_AUTH_TOKEN`` (a cluster with auth on)."""
        self.topic, self.bootstrap, self.prefix = topic, bootstrap, prefix
        self._env = {"HEADRACE_AUTH_TOKEN": token} if token else {}
        self.acked: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        batch = 0
        while not self._stop.is_set():
            values = [f"{self.prefix}-{batch}-{i}" for i in range(20)]
            done = procs.run_headrace(
                "produce", self.topic, "--acks", "all", "--bootstrap", self.bootstrap,
                stdin="".join(f"{v}\n" for v in values).encode(), timeout=60, env=self._env,
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


def tls_secret(name: str, cert: bytes, key: bytes, ca: bytes) -> dict[str, object]:
    """A Secret of cert-manager's shape."""
    data = {"tls.crt": cert, "tls.key": key, "ca.crt": ca}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
