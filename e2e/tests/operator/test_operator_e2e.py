"""The operator end to end on the test bed: real API server, real kopf, brokers as pods.

One test, step by step, ending with the idle check:
``helm install`` of charts/headrace (the CRDs, and the operator as a pod under the
chart's service account and RBAC; the ``operator`` fixture); apply a 3-broker
BrokerCluster and a Topic; ``kubectl wait`` for the Topic's Ready condition; the
operator's surfaces answer on its pod IP and its log shows no RBAC refusal; produce and
consume with acks=all through the pod IPs; the operator costs no ``headrace.dev`` writes
while nothing changes (the API server's request metrics); kill -9 a leader's broker
process and see a new leader in the Topic's status with no acknowledged record lost; a
deleted pod comes back on its PVC and rejoins; ``kubectl diff --server-side`` of the
applied manifests shows no drift (the operator never wrote spec); kill -9 the operator's
process under acks=all load: its pod's container restarts, takes the Lease again and
changes no leader and bumps no generation; scaling 3 -> 4 -> 3 loses nothing, and a
scale down to 2 (which would remove a broker holding replicas) is refused with a
condition; the pause annotation holds a spec change back until it is removed.

On the test bed, stand-in or real node: the test reaches the brokers' pod IPs from this
host and kills pods' containers with kill -9 from it (``crash.kill_9``).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from typing import Any

import yaml

from bench.operator_idle import writes
from e2e.support import Cluster, wait_for
from e2e.tests.operator import crash
from e2e.tests.operator.fixtures import (
    QUIET_STEPS,
    InstalledOperator,
    Load,
    cluster_manifests,
    condition,
    consume,
    figure,
    leaders,
    pod_ips,
    produce,
    wait_ready,
)
from headrace.testing import procs


def server_side_apply(cluster: Cluster, docs: list[dict[str, Any]], namespace: str) -> None:
    """``kubectl apply --server-side``, as a GitOps tool applies."""
    cluster.kubectl_run(
        "apply", "--server-side", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs)
    )


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


def restarts(cluster: Cluster, namespace: str, pod: str) -> int:
    status = cluster.get("pod", pod, namespace)["status"]
    return sum(c.get("restartCount", 0) for c in status.get("containerStatuses", []))


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def check_surfaces(operator: InstalledOperator) -> None:
    """/healthz and /livez (the kubelet's liveness probe), /metrics with the Topic's readiness and
    the Lease, the dashboard's view of the cluster; all on the pod IP."""
    namespace = operator.namespace
    assert http_get(operator.url("/healthz")) == (200, f"ok\n{namespace}/demo: stepping\n")
    assert http_get(operator.url("/livez")) == (200, f"ok\n{namespace}/demo: stepping\n")
    ready = (
        f'headrace_operator_object_ready{{kind="Topic",name="orders",namespace="{namespace}"}} 1.0'
    )

    def scraped() -> str | None:  # the snapshot is taken at scrape time
        text = http_get(operator.url("/metrics"))[1]
        return text if ready in text else None

    metrics = wait_for("the Topic ready in /metrics", scraped, 30)
    assert "headrace_operator_leader 1.0" in metrics
    assert 'headrace_operator_reconciles_total{kind="BrokerCluster"}' in metrics
    status, view = http_get(operator.url("/dashboard/view.json"))
    assert status == 200 and json.loads(view)["cluster"]["id"] == "demo"
    logs = operator.logs()
    assert "lease headrace-operator acquired" in logs
    # the chart's RBAC is enough for everything the operator did
    assert "Forbidden" not in logs and " 403" not in logs, logs[-4000:]


def test_operator_runs_a_cluster_and_elects_a_new_leader_after_kill_9(
    cluster: Cluster, namespace: str, host_reaches_pods: None, operator: InstalledOperator
) -> None:
    topic = f"{namespace}/orders"
    # 1. apply the cluster, then the Topic, and wait for Ready with kubectl itself
    cluster_doc, topic_doc = cluster_manifests(namespace)
    server_side_apply(cluster, [cluster_doc], namespace)
    wait_ready(cluster, "brokercluster", "demo", namespace)
    applied = time.monotonic()
    server_side_apply(cluster, [topic_doc], namespace)
    wait_ready(cluster, "topic", "orders", namespace)
    figure("Topic apply to Ready (kubectl apply + kubectl wait)", time.monotonic() - applied)
    status = topic_status(cluster, namespace)
    assert status["observedGeneration"] == 1
    assert len(status["partitions"]) == 2
    check_surfaces(operator)

    # 2. produce and consume with acks=all through the pod IPs
    ips = pod_ips(cluster, namespace)
    assert sorted(ips) == [0, 1, 2]
    bootstrap = ",".join(f"{ip}:9092" for ip in ips.values())
    acked = [f"a-{i}" for i in range(100)]
    produce(bootstrap, topic, acked)

    # idle: nothing changes, so the operator writes nothing to headrace objects
    before = writes(str(cluster.kubeconfig), cluster.kubectl)
    operator.quiet_window(f"{QUIET_STEPS} control-loop steps of an idle cluster")
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
    first_container = crash.kill_9(cluster, namespace, leader_pod)
    wait_for("the broker to restart", lambda: restarts(cluster, namespace, leader_pod) >= 1, 60)
    crash.restarted(cluster, namespace, leader_pod, first_container)
    crash.kill_9(cluster, namespace, leader_pod)
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
            "get", "events", "-n", namespace,
            "--field-selector", "involvedObject.kind=Topic,involvedObject.name=orders",
            "-o", "json",
        ).stdout  # fmt: skip
        return [
            e["message"]
            for e in json.loads(out)["items"]
            if e["reason"] == "LeaderElected"
            and "/orders/0:" in e["message"]
            and f"broker {old['leader']} leads" not in e["message"]
        ]

    wait_for("a LeaderElected Event naming another broker", elected_elsewhere, 30)

    def produced(values: list[str]) -> bool:
        return (
            procs.run_headrace(
                "produce", topic, "--acks", "all", "--bootstrap", bootstrap,
                stdin="".join(f"{v}\n" for v in values).encode(), timeout=30,
            ).returncode
            == 0
        )  # fmt: skip

    first = wait_for(
        "a first acks=all produce after the kill",
        lambda: produced(["first"]) and time.monotonic(),
        60,
        every_s=0.2,
    )
    figure("second kill -9 to the first acks=all produce acknowledged", first - killed)
    more = [f"b-{i}" for i in range(100)]
    wait_for("an acks=all produce after the failover", lambda: produced(more), 60, every_s=1.0)
    # Read back once the cluster has settled: the returned broker is back in every LRS
    # and the preferred-leader rebalance has given it its partitions back. (A consume
    # reading *during* that rebalance once went idle for more than its 5 s idle timeout;
    # tests/integration/test_consume_through_hand_back.py reads through one.)
    wait_for(
        "the cluster to settle (preferred leaders, whole LRS)",
        lambda: settled(topic_status(cluster, namespace)),
        90,
    )
    values = consume(bootstrap, topic, "check")
    missing = (set(acked) | set(more)) - values
    if missing:
        # tell a loss from a consumer that stopped early: read it all again
        still = missing - consume(bootstrap, topic, "check-again")
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
        ready = condition(pod) or {}
        return pod["metadata"]["uid"] != old_uid and ready.get("status") == "True"

    wait_for("demo-2 recreated and Ready", recreated_and_ready, 90)
    assert cluster.get("pvc", "data-demo-2", namespace)["spec"]["volumeName"] == claim

    # 7. the operator never wrote spec: applying the same manifests shows no drift
    diff = cluster.kubectl_run(
        "diff", "--server-side", "-n", namespace, "-f", "-",
        input=yaml.safe_dump_all(cluster_manifests(namespace)), check=False,
    )  # fmt: skip
    assert diff.returncode == 0, f"drift:\n{diff.stdout}{diff.stderr}"

    # 5. kill -9 the operator under acks=all load: no leader change, no generation bump
    # (once the killed broker is back in every live replica set and the consumer's cohort
    # is empty, so that the cluster itself is quiet)
    def whole() -> dict[str, Any] | None:
        status = topic_status(cluster, namespace)
        quiet = settled(status) and not any(
            plan.get("assignment") for plan in status.get("cohortPlans", [])
        )
        # (the consumers above have left: their cohorts' plans are empty again)
        return status if quiet else None

    quiet_status = wait_for("every live replica set whole again", whole, 90)
    generation = cluster.get("brokercluster", "demo", namespace)["status"]["topologyGeneration"]
    pod = operator.pod()["metadata"]["name"]
    restarted = operator.restarts()
    with Load(topic, bootstrap) as load:
        wait_for("acknowledged records before the kill", lambda: load.acked, 60)
        # the Lease names the pod (--identity): its restarted container takes it back at once
        crash.kill_9(cluster, namespace, pod)
        wait_for("the operator's container restarted", lambda: operator.restarts() > restarted)
        wait_for("the restarted operator's loop", operator.loop_started, 60)
        acked_at_restart = len(load.acked)
        operator.quiet_window(f"{QUIET_STEPS} steps of the restarted operator")
        wait_for("records acknowledged meanwhile", lambda: len(load.acked) > acked_at_restart, 60)
    assert load.failures == [], load.failures[:3]
    assert leaders(topic_status(cluster, namespace)) == leaders(quiet_status)
    status = cluster.get("brokercluster", "demo", namespace)["status"]
    assert status["topologyGeneration"] == generation

    # 10. scale 3 -> 4 -> 3 (between produces; nothing lost), and a refused 3 -> 2
    def cluster_ready(generation: int) -> Any:
        ready = condition(cluster.get("brokercluster", "demo", namespace)) or {}
        return ready if ready.get("observedGeneration") == generation else None

    def patch(kind: str, name: str, body: dict[str, Any]) -> int:
        cluster.kubectl_run(
            "patch", kind, name, "-n", namespace, "--type=merge", "-p", json.dumps(body)
        )
        return int(cluster.get(kind, name, namespace)["metadata"]["generation"])

    def scale(replicas: int) -> int:
        return patch("brokercluster", "demo", {"spec": {"replicas": replicas}})

    def statefulset_replicas() -> int:
        return int(cluster.get("statefulset", "demo", namespace)["spec"]["replicas"])

    up = scale(4)
    wait_for(
        "4 live brokers", lambda: (cluster_ready(up) or {}).get("reason") == "AllBrokersLive", 120
    )
    produce(bootstrap, topic, [f"c-{i}" for i in range(50)])
    down = scale(3)
    wait_for("the StatefulSet back at 3", lambda: statefulset_replicas() == 3, 60)
    wait_for("demo-3 gone", lambda: 3 not in pod_ips(cluster, namespace), 90)
    wait_for("Ready at 3 brokers", lambda: (cluster_ready(down) or {}).get("status") == "True", 60)
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
    values = consume(bootstrap, topic, "after-scaling")
    batches = (
        acked,
        more,
        load.acked,
        [f"c-{i}" for i in range(50)],
        [f"d-{i}" for i in range(50)],
    )
    for batch in batches:
        assert set(batch) <= values, "an acknowledged record was lost"

    # 8. the pause annotation: a paused Topic's spec change waits, and says so
    cluster.kubectl_run("annotate", "topic", "orders", "-n", namespace, "headrace.dev/paused=true")
    changed = patch("topic", "orders", {"spec": {"minInSync": 3}})

    def paused() -> dict[str, Any] | None:
        found = condition(cluster.get("topic", "orders", namespace), "Paused") or {}
        return found if found.get("observedGeneration") == changed else None

    held = wait_for("the Topic's Paused condition", paused, 60)
    assert held["status"] == "True"
    operator.quiet_window(f"{QUIET_STEPS} steps with the Topic paused")
    assert topic_status(cluster, namespace)["observedGeneration"] == changed - 1
    cluster.kubectl_run("annotate", "topic", "orders", "-n", namespace, "headrace.dev/paused-")
    wait_for(
        "the held spec applied once resumed",
        lambda: topic_status(cluster, namespace)["observedGeneration"] == changed,
        60,
    )
    assert condition(cluster.get("topic", "orders", namespace), "Paused") is None
