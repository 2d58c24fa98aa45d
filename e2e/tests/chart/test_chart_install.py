"""``helm install`` of charts/headrace on the test bed, ``helm test``, ``helm upgrade``
and ``helm uninstall``.

The chart installs the operator (namespaced to the test's namespace, so it leaves the
rest of a shared test bed alone) and its example 3-broker BrokerCluster and Topic; the
operator brings the Topic to Ready. Then, under load (acks=all produces back to back),
``helm upgrade`` replaces the operator pod (a pod annotation changes) and points the
``helm test`` pod at the brokers' pod IPs (the brokers advertise them on the test bed): no
acknowledged record is lost and no partition changes leader or epoch because of it.
``helm test`` produces with acks=all and consumes the records back; ``helm uninstall``
removes the operator and leaves the CRDs, the BrokerCluster, the Topic and the
brokers' volumes, as docs/operations.md says.

On the test bed, stand-in or real node: this host's clients reach the brokers' pod IPs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import CHART, RELEASE, InstalledOperator, Load, helm, leaders
from headrace.testing import procs
from tests.unit.charts.argocd_lua import run_check


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


def test_helm_install_test_upgrade_uninstall(
    cluster: Cluster, namespace: str, host_reaches_pods: None
) -> None:
    operator = InstalledOperator(cluster, namespace)
    operator.install(
        "--set", "exampleCluster.enabled=true",
        "--set", "exampleCluster.replicas=3",
        "--set", "exampleCluster.storageSize=32Mi",
        "--set-json", 'exampleCluster.topic={"name":"helm-test","partitions":2,"replicas":3,"minInSync":2}',
        "--set", "test.records=50",
    )  # fmt: skip
    try:
        cluster.kubectl_run(
            "wait", "--for=condition=Ready", "topic/helm-test", "-n", namespace,
            "--timeout=180s", timeout=200,
        )  # fmt: skip
        logs = operator.logs()
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
        old_pod = operator.pod()["metadata"]["name"]
        with Load(f"{namespace}/helm-test", bootstrap) as load:
            wait_for("acknowledged records before the upgrade", lambda: load.acked, 60)
            helm(
                cluster, namespace, "upgrade", RELEASE, str(CHART), "--reuse-values",
                "--set-json", f"test.bootstrap={json.dumps(bootstrap)}",
                "--set", "operator.podAnnotations.upgraded=yes",
                "--wait", "--timeout", "3m",
            )  # fmt: skip
            wait_for(
                "the new operator pod",
                lambda: operator.pod()["metadata"]["name"] != old_pod,
                120,
            )
            wait_for(
                "the new operator to take the Lease and start the cluster's loop",
                operator.loop_started,
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
        checked = cluster.logs(f"{RELEASE}-headrace-test", namespace, "-c", "roundtrip")
        # its own 50 records, not the load's before them (it starts at its own offsets)
        assert "consumed all 50 records marked" in checked, checked[-2000:]

    except BaseException:
        print(operator.logs()[-8000:], file=sys.stderr)
        # the release's ClusterRole is cluster-scoped: not deleted with the namespace
        operator.uninstall()
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
