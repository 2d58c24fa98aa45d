"""The operator end to end on the test bed: real API server, real kopf, brokers as pods.

One test, step by step (issue 10, e2e steps 1 to 5, 7 and 10, plus the idle check):
install the CRDs and start the operator as a process; apply a 3-broker
BrokerCluster and a Topic; ``kubectl wait`` for the Topic's Ready condition;
produce and consume with acks=all through the pod IPs; kill -9 a leader's
broker process and see a new leader in the Topic's status with no
acknowledged record lost; a deleted pod comes back on its PVC and rejoins; the operator
costs no ``headrace.dev`` writes while nothing changes; ``kubectl diff
--server-side`` of the applied manifests shows no drift (the operator never
wrote spec); a restarted operator changes no leader and bumps no generation;
scaling 3 -> 4 -> 3 loses nothing, and a scale down to 2 (which would remove a broker
holding replicas) is refused with a condition.

Test bed only: the operator runs on this host and its broker pods run this
checkout's ``headrace`` (the runner ignores images).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import procs
from bench.operator_idle import writes
from e2e.support import Cluster, wait_for

REPO = Path(__file__).resolve().parents[3]
HEADRACE = f"{sys.executable} -m headrace.cli.main"


def manifests(namespace: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "BrokerCluster",
            "metadata": {"name": "demo", "namespace": namespace},
            "spec": {"replicas": 3, "storage": {"size": "64Mi"}},
        },
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "orders", "namespace": namespace},
            "spec": {
                "clusterRef": {"name": "demo"},
                "partitions": 2,
                "replicas": 3,
                "minInSync": 2,
                "tieredStorage": {"enabled": False},
            },
        },
    ]


def start_operator(cluster: Cluster, namespace: str, log: Path) -> subprocess.Popen[bytes]:
    return procs.spawn(
        [
            sys.executable,
            "-m",
            "headrace.operator",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--namespace",
            namespace,
            "--lease-namespace",
            namespace,
            "--broker-command",
            HEADRACE,
            "--lease-duration-seconds",
            "15",
            # an ephemeral port: operators of a restart (or of parallel runs) share the host
            "--surfaces",
            "127.0.0.1:0",
        ],
        log,
    )


#: how many control-loop steps a "nothing changes" window spans (a step polls every
#: broker and reconciles; the operator steps about every second when idle)
QUIET_STEPS = 5


def operator_steps(log: Path) -> int:
    """Control-loop steps the newest operator in ``log`` has completed, from its /metrics
    (``main`` logs the ephemeral port it bound as "surfaces on http://HOST:PORT/")."""
    url = re.findall(r"surfaces on (http://[\d.]+:\d+)/", log.read_text())[-1]
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    found = re.search(
        r'^headrace_operator_reconciles_total\{kind="BrokerCluster"\} (\S+)$', body, re.M
    )
    return int(float(found.group(1))) if found else 0


def quiet_window(log: Path, what: str) -> None:
    """Wait until the operator has run ``QUIET_STEPS`` more steps: a window counted in the
    operator's own work, not in seconds, over which a check can show nothing changed."""
    start = operator_steps(log)
    wait_for(what, lambda: operator_steps(log) >= start + QUIET_STEPS, 60)


@pytest.fixture
def operator(
    cluster: Cluster, namespace: str, testbed_only: None, tmp_path: Path
) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    cluster.kubectl_run("apply", "-f", str(REPO / "crds"))
    log = tmp_path / "operator.log"
    started = [start_operator(cluster, namespace, log)]
    try:
        yield log, started
    finally:
        # While the operator runs, so that it removes its finalizers: the Topics' first
        # (their data finalizer needs the brokers), then the cluster's (the garbage
        # collector then deletes the StatefulSet and the brokers go now, not with the
        # namespace).
        cluster.kubectl_run(
            "delete", "topic", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=90
        )
        cluster.kubectl_run(
            "delete",
            "brokercluster",
            "--all",
            "-n",
            namespace,
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        for proc in started:
            procs.reap(proc)


def server_side_apply(cluster: Cluster, docs: list[dict[str, Any]], namespace: str) -> None:
    """``kubectl apply --server-side``, as a GitOps tool applies."""
    cluster.kubectl_run(
        "apply", "--server-side", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs)
    )


def figure(what: str, seconds: float) -> None:
    """A measured figure for the report (never asserted: targets are bench material)."""
    print(f"\n[e2e figure] {what}: {seconds:.2f} s", file=sys.stderr)


def settled(status: dict[str, Any]) -> bool:
    """Every partition Online under its preferred leader with its whole replica set live:
    nothing left for the controller to do (a preferred-leader rebalance is done)."""
    return all(
        p["state"] == "Online"
        and p.get("leader") == p["replicas"][0]
        and sorted(p["liveReplicas"]) == sorted(p["replicas"])
        for p in status["partitions"]
    )


def topic_status(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return cluster.get("topic", "orders", namespace).get("status") or {}


def pod_ips(cluster: Cluster, namespace: str) -> dict[int, str]:
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
    )
    ips = {}
    for pod in json.loads(out.stdout)["items"]:
        ip = pod.get("status", {}).get("podIP")
        if ip:
            ips[int(pod["metadata"]["name"].rpartition("-")[2])] = ip
    return ips


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    """acks=all; fails the test unless every record is acknowledged."""
    done = procs.run_headrace(
        "produce",
        topic,
        "--acks",
        "all",
        "--bootstrap",
        bootstrap,
        stdin="".join(f"{v}\n" for v in values).encode(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()


def broker_pid(ip: str) -> int:
    out = subprocess.run(
        ["pgrep", "-f", f"broker --cluster --broker-id [0-9]+ --host {ip} "],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert len(out) == 1, f"expected one broker process on {ip}: {out}"
    return int(out[0])


def restarts(cluster: Cluster, namespace: str, pod: str) -> int:
    status = cluster.get("pod", pod, namespace)["status"]
    return sum(c.get("restartCount", 0) for c in status.get("containerStatuses", []))


def test_operator_runs_a_cluster_and_elects_a_new_leader_after_kill_9(
    cluster: Cluster, namespace: str, operator: tuple[Path, list[subprocess.Popen[bytes]]]
) -> None:
    log, started = operator
    topic = f"{namespace}/orders"
    try:
        # 1. apply the cluster, then the Topic, and wait for Ready with kubectl itself
        cluster_doc, topic_doc = manifests(namespace)
        server_side_apply(cluster, [cluster_doc], namespace)
        wait_for(
            "the BrokerCluster to be Ready",
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in cluster.get("brokercluster", "demo", namespace)
                .get("status", {})
                .get("conditions", [])
            ),
            120,
        )
        applied = time.monotonic()
        server_side_apply(cluster, [topic_doc], namespace)
        cluster.kubectl_run(
            "wait",
            "--for=condition=Ready",
            "topic/orders",
            "-n",
            namespace,
            "--timeout=120s",
            timeout=150,
        )
        figure("Topic apply to Ready (kubectl apply + kubectl wait)", time.monotonic() - applied)
        status = topic_status(cluster, namespace)
        assert status["observedGeneration"] == 1
        assert len(status["partitions"]) == 2

        # 2. produce and consume with acks=all through the pod IPs
        ips = pod_ips(cluster, namespace)
        assert sorted(ips) == [0, 1, 2]
        bootstrap = ",".join(f"{ip}:9092" for ip in ips.values())
        acked = [f"a-{i}" for i in range(100)]
        produce(bootstrap, topic, acked)

        # idle: nothing changes, so the operator writes nothing to headrace objects
        before = writes(str(cluster.kubeconfig), cluster.kubectl)
        quiet_window(log, f"{QUIET_STEPS} control-loop steps of an idle cluster")
        after = writes(str(cluster.kubeconfig), cluster.kubectl)
        # (DELETEs are left out: the namespace controller empties the namespaces of earlier
        # tests; the operator never deletes a headrace object)
        idle = {
            k: after[k] - before[k]
            for k in after
            if k.startswith("headrace.dev/") and " DELETE" not in k and after[k] != before[k]
        }
        assert idle == {}, f"the operator wrote while nothing changed: {idle}"

        # 3. kill -9 the leader of partition 0. The runner restarts a container at once the
        # first time (as the kubelet does), so kill it again once it is back: the runner's
        # back-off then leaves nothing listening for 2 s, which the operator sees.
        old = status["partitions"][0]
        leader_pod = f"demo-{old['leader']}"
        ip = ips[old["leader"]]
        os.kill(broker_pid(ip), 9)
        wait_for("the broker to restart", lambda: restarts(cluster, namespace, leader_pod) >= 1, 60)
        wait_for("its process", lambda: broker_pid(ip), 30)
        os.kill(broker_pid(ip), 9)
        killed = time.monotonic()

        def new_leader() -> dict[str, Any] | None:
            p = topic_status(cluster, namespace)["partitions"][0]
            moved = p["leaderEpoch"] > old["leaderEpoch"] and p.get("leader") is not None
            return p if moved and p["state"] == "Online" else None

        wait_for("a new leader epoch of partition 0 in the Topic's status", new_leader, 60)

        # ... another broker was elected (the status may already show the preferred leader
        # back, if the rebalance was quick), and an Event on the Topic says so
        def elected_elsewhere() -> list[str]:
            out = cluster.kubectl_run(
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                "involvedObject.kind=Topic,involvedObject.name=orders",
                "-o",
                "json",
            ).stdout
            return [
                e["message"]
                for e in json.loads(out)["items"]
                if e["reason"] == "LeaderElected"
                and "/orders/0:" in e["message"]
                and f"broker {old['leader']} leads" not in e["message"]
            ]

        wait_for("a LeaderElected Event naming another broker", elected_elsewhere, 30)

        first = wait_for(
            "a first acks=all produce after the kill",
            lambda: (
                procs.run_headrace(
                    "produce",
                    topic,
                    "--acks",
                    "all",
                    "--bootstrap",
                    bootstrap,
                    stdin=b"first\n",
                    timeout=30,
                ).returncode
                == 0
                and time.monotonic()
            ),
            60,
            every_s=0.2,
        )
        figure("second kill -9 to the first acks=all produce acknowledged", first - killed)
        more = [f"b-{i}" for i in range(100)]
        wait_for(
            "an acks=all produce after the failover",
            lambda: (
                procs.run_headrace(
                    "produce",
                    topic,
                    "--acks",
                    "all",
                    "--bootstrap",
                    bootstrap,
                    stdin="".join(f"{v}\n" for v in more).encode(),
                    timeout=30,
                ).returncode
                == 0
            ),
            60,
            every_s=1.0,
        )
        # Read back once the cluster has settled: the returned broker is back in every LRS
        # and the preferred-leader rebalance has given it its partitions back. (A consumer
        # reading *during* that rebalance went idle for more than its 5 s idle timeout in
        # some runs and stopped early: a client or rebalance latency to look at, not a loss;
        # the records were all there when read again.)
        wait_for(
            "the cluster to settle (preferred leaders, whole LRS)",
            lambda: settled(topic_status(cluster, namespace)),
            90,
        )
        consumed = procs.run_headrace(
            "consume",
            topic,
            "--cohort",
            "check",
            "--from-beginning",
            # every record there is (failed attempts may have left unacknowledged extras)
            "--idle-timeout",
            "5",
            "--bootstrap",
            bootstrap,
            timeout=60,
        )
        assert consumed.returncode == 0, consumed.stderr.decode()
        values = set(consumed.stdout.decode().split())
        missing = (set(acked) | set(more)) - values
        if missing:
            # tell a loss from a consumer that stopped early: read it all again
            again = procs.run_headrace(
                "consume",
                topic,
                "--cohort",
                "check-again",
                "--from-beginning",
                "--idle-timeout",
                "5",
                "--bootstrap",
                bootstrap,
                timeout=60,
            )
            still = missing - set(again.stdout.decode().split())
            for pod in ("demo-0", "demo-1", "demo-2"):  # for whoever chases it
                tail = cluster.kubectl_run("logs", pod, "-n", namespace, check=False).stdout
                print(f"--- {pod}\n{tail[-3000:]}", file=sys.stderr)
            raise AssertionError(
                f"{len(missing)} acknowledged records not consumed, {len(still)} of them not"
                f" there on a second read either (e.g. {sorted(still)[:5]}); topic status:"
                f" {json.dumps(topic_status(cluster, namespace)['partitions'])}"
            )

        # 4. delete a pod: the StatefulSet recreates it on the same PVC and it rejoins
        claim = cluster.get("pvc", "data-demo-2", namespace)["spec"]["volumeName"]
        old_uid = cluster.get("pod", "demo-2", namespace)["metadata"]["uid"]
        cluster.kubectl_run("delete", "pod", "demo-2", "-n", namespace, "--wait=true", timeout=90)

        def recreated_and_ready() -> bool:
            pod = cluster.get("pod", "demo-2", namespace)
            return pod["metadata"]["uid"] != old_uid and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pod.get("status", {}).get("conditions", [])
            )

        wait_for("demo-2 recreated and Ready", recreated_and_ready, 90)
        assert cluster.get("pvc", "data-demo-2", namespace)["spec"]["volumeName"] == claim

        # 7. the operator never wrote spec: applying the same manifests shows no drift
        diff = cluster.kubectl_run(
            "diff",
            "--server-side",
            "-n",
            namespace,
            "-f",
            "-",
            input=yaml.safe_dump_all(manifests(namespace)),
            check=False,
        )
        assert diff.returncode == 0, f"drift:\n{diff.stdout}{diff.stderr}"

        # 5. restart the operator: no leader change, no generation bump (once the killed
        # broker is back in every live replica set and the consumer's cohort is empty, so
        # that the cluster itself is quiet)
        def whole() -> dict[str, Any] | None:
            status = topic_status(cluster, namespace)
            quiet = settled(status) and not any(
                plan.get("assignment") for plan in status.get("cohortPlans", [])
            )
            # (the consumer above has left: its cohort's plan is empty again)
            return status if quiet else None

        quiet_status = wait_for("every live replica set whole again", whole, 90)
        generation = cluster.get("brokercluster", "demo", namespace)["status"]["topologyGeneration"]
        procs.kill_group(started[0], 15)
        started[0].wait(30)
        started.append(start_operator(cluster, namespace, log))
        wait_for(
            "the restarted operator's loop",
            lambda: log.read_text().count("control loop of") >= 2,
            60,
        )
        quiet_window(log, f"{QUIET_STEPS} steps of the restarted operator")
        after_restart = topic_status(cluster, namespace)
        assert [(p["leader"], p["leaderEpoch"]) for p in after_restart["partitions"]] == [
            (p["leader"], p["leaderEpoch"]) for p in quiet_status["partitions"]
        ]
        status = cluster.get("brokercluster", "demo", namespace)["status"]
        assert status["topologyGeneration"] == generation

        # 10. scale 3 -> 4 -> 3 (between produces; nothing lost), and a refused 3 -> 2
        def cluster_ready(generation: int) -> Any:
            body = cluster.get("brokercluster", "demo", namespace)
            return next(
                (
                    c
                    for c in body.get("status", {}).get("conditions", [])
                    if c["type"] == "Ready" and c["observedGeneration"] == generation
                ),
                None,
            )

        def scale(replicas: int) -> int:
            cluster.kubectl_run(
                "patch",
                "brokercluster",
                "demo",
                "-n",
                namespace,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"replicas": replicas}}),
            )
            return int(cluster.get("brokercluster", "demo", namespace)["metadata"]["generation"])

        def statefulset_replicas() -> int:
            return int(cluster.get("statefulset", "demo", namespace)["spec"]["replicas"])

        up = scale(4)
        wait_for(
            "4 live brokers",
            lambda: (cluster_ready(up) or {}).get("reason") == "AllBrokersLive",
            120,
        )
        produce(bootstrap, topic, [f"c-{i}" for i in range(50)])
        down = scale(3)
        wait_for("the StatefulSet back at 3", lambda: statefulset_replicas() == 3, 60)
        wait_for("demo-3 gone", lambda: 3 not in pod_ips(cluster, namespace), 90)
        wait_for(
            "Ready at 3 brokers",
            lambda: (cluster_ready(down) or {}).get("status") == "True",
            60,
        )
        produce(bootstrap, topic, [f"d-{i}" for i in range(50)])
        refused = scale(2)  # broker 2 holds replicas of every partition
        blocked = wait_for("ScaleDownBlocked", lambda: cluster_ready(refused), 60)
        assert (blocked["status"], blocked["reason"]) == ("False", "ScaleDownBlocked")
        assert statefulset_replicas() == 3
        wait_for(
            "the cluster to settle after scaling",
            lambda: settled(topic_status(cluster, namespace)),
            90,
        )
        consumed = procs.run_headrace(
            "consume",
            topic,
            "--cohort",
            "after-scaling",
            "--from-beginning",
            "--idle-timeout",
            "5",
            "--bootstrap",
            bootstrap,
            timeout=60,
        )
        assert consumed.returncode == 0, consumed.stderr.decode()
        values = set(consumed.stdout.decode().split())
        for batch in (acked, more, [f"c-{i}" for i in range(50)], [f"d-{i}" for i in range(50)]):
            assert set(batch) <= values, "an acknowledged record was lost"
    except BaseException:
        print(log.read_text()[-8000:], file=sys.stderr)
        raise
