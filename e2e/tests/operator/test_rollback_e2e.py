"""A pod template that cannot start rolls back by reverting the spec alone: the rollout
stops at the first pod rolled onto it, and once the spec goes back, the operator
replaces that stuck pod (not Ready at an outdated revision) first, without waiting for
it. No ``kubectl delete pod``; the other pods are never restarted.

The issue's case is an image that cannot start. The test bed's stand-in ignores images
(it runs the container's command as a host process), so the template here cannot start
another way every node reproduces: a ``nodeSelector`` no node matches, so the rolled pod
stays Pending, never Ready, as a pod in ``ImagePullBackOff`` or ``CrashLoopBackOff``
does. The operator sees the same thing in both cases: a pod at the StatefulSet's
revision that is not Ready.

It reads the pods' uids and the operator's Events through the API only, so it runs on
any provider.
"""

from __future__ import annotations

import json
from typing import Any

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import InstalledOperator
from e2e.tests.operator.test_lifecycle_e2e import events, start_cluster, topic_doc
from e2e.tests.operator.test_pod_delete_e2e import broker_pods

#: a node label no node of the test bed carries
UNSCHEDULABLE = {"scheduling": {"nodeSelector": {"headrace.dev/e2e-no-such-node": "true"}}}


def restarting(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    body = cluster.get("brokercluster", "demo", namespace)
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Restarting"), None)


def patch_spec(cluster: Cluster, namespace: str, spec: dict[str, Any]) -> None:
    cluster.kubectl_run(
        "patch", "brokercluster", "demo", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": spec}),
    )  # fmt: skip


def test_a_template_that_cannot_start_is_rolled_back_by_reverting_the_spec(
    cluster: Cluster, namespace: str, operator: InstalledOperator
) -> None:
    start_cluster(cluster, namespace, topic_doc("rollback", namespace, 3))
    before = {name: p["metadata"]["uid"] for name, p in broker_pods(cluster, namespace).items()}
    assert sorted(before) == ["demo-0", "demo-1", "demo-2"]

    patch_spec(cluster, namespace, UNSCHEDULABLE)

    def first_pod_failed() -> dict[str, Any] | None:
        pod = broker_pods(cluster, namespace).get("demo-2")
        if pod is None or pod["metadata"]["uid"] == before["demo-2"]:
            return None
        scheduled = next(
            (c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), {}
        )
        return pod if scheduled.get("reason") == "Unschedulable" else None

    stuck = wait_for("demo-2 recreated from the new template, unschedulable", first_pod_failed, 180)
    # the rollout holds there: no second pod is rolled onto a template that does not start
    holding = wait_for(
        "the rollout to wait for demo-2",
        lambda: (
            (c := restarting(cluster, namespace)) is not None
            and c["status"] == "True"
            and "broker 2" in c["message"]
            and c
        ),
        60,
    )
    pods = broker_pods(cluster, namespace)
    assert [pods[n]["metadata"]["uid"] for n in ("demo-0", "demo-1")] == [
        before["demo-0"],
        before["demo-1"],
    ], holding

    patch_spec(cluster, namespace, {"scheduling": None})  # the revert, as a GitOps revert does

    def rolled_back() -> bool:
        condition = restarting(cluster, namespace)
        if condition is None or condition["reason"] != "RolloutComplete":
            return False
        pods = broker_pods(cluster, namespace)
        return sorted(pods) == ["demo-0", "demo-1", "demo-2"] and all(
            any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions", [])
            )
            for p in pods.values()
        )

    wait_for("every pod Ready again, the rollout complete", rolled_back, 240, every_s=1.0)
    after = {name: p["metadata"]["uid"] for name, p in broker_pods(cluster, namespace).items()}
    assert after["demo-2"] not in (before["demo-2"], stuck["metadata"]["uid"])
    assert (after["demo-0"], after["demo-1"]) == (before["demo-0"], before["demo-1"])
    messages = [
        e["message"]
        for e in events(cluster, namespace, "BrokerCluster", "demo")
        if e["reason"] == "RollingRestart"
    ]
    deletes = [m for m in messages if "deleting pod demo-" in m]
    # the first restart was an ordinary one (demo-2 drained, Ready, its broker live); the
    # second replaced the stuck pod it left
    assert len(deletes) == 2 and "not Ready" not in deletes[0], messages
    assert "demo-2: it is not Ready at an outdated revision" in deletes[1], messages
    cluster.kubectl_run(
        "wait", "--for=condition=Ready", "topic/rollback", "-n", namespace, "--timeout=120s",
        timeout=150,
    )  # fmt: skip
