"""The kopf handlers at the handler level: called as kopf calls them, writing through the
operator's real ``ClientApi`` to kmock's Kubernetes API emulator over HTTP (``server``,
``kube_server``; no control plane): the workload they apply, a bad spec, the kicks, the
status of an orphan Topic; and the Lease rule."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER, memo_over, topic

from headrace.operator import bodies, conditions, finalizing, handlers, workloads
from headrace.operator.kube import ClientApi
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from tests.unit.controller.controller_fakes import ManualClock


def applied(server: ApiServer) -> list[dict[str, Any]]:
    """The manifests server-side applied so far, in order."""
    return [request.data for request in server["patch"]]


def writes(server: ApiServer) -> list[str]:
    """Every request that writes, as 'METHOD path'."""
    return [
        f"{request.method.value} {request.url.path}"
        for request in server
        if request.method.value not in ("GET", "HEAD")
    ]


def cluster(**spec: Any) -> dict[str, Any]:
    return {**CLUSTER, "spec": {**CLUSTER["spec"], **spec}}  # type: ignore[dict-item]


async def test_a_broker_cluster_becomes_its_workload_owned_by_it(
    server: ApiServer, api: ClientApi
) -> None:
    memo = memo_over(api)
    await handlers.cluster_workload(body=cluster(), namespace="ns", name="demo", memo=memo)
    kinds = [(m["kind"], m["metadata"]["name"]) for m in applied(server)]
    assert kinds == [
        ("ConfigMap", "demo-config"),
        ("Service", "demo-brokers"),
        ("Service", "demo"),
        ("PodDisruptionBudget", "demo"),
        ("StatefulSet", "demo"),
    ]
    for request in server["patch"]:
        # server-side apply, as the operator's field manager, taking over conflicting fields
        assert request.headers["Content-Type"].startswith("application/apply-patch+yaml")
        assert request.params == {"fieldManager": "headrace-operator", "force": "true"}
        (owner,) = request.data["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("BrokerCluster", "demo", "uid-1")
        assert request.data["metadata"]["namespace"] == "ns"
    # ... and the server has them
    stored = server.objects["apps/v1/statefulsets", "ns", "demo"]
    assert stored["spec"]["serviceName"] == "demo-brokers"
    sts = applied(server)[-1]["spec"]
    assert sts["replicas"] == 3
    assert sts["serviceName"] == "demo-brokers"
    (container,) = sts["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    args = container["args"]
    assert args[args.index("--broker-id") + 1] == "$(HEADRACE_BROKER_ID)"
    env = {e["name"]: e for e in container["env"]}
    assert env["HEADRACE_BROKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.labels['{workloads.POD_INDEX_LABEL}']"
    )
    assert sts["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert container["volumeMounts"][0]["mountPath"] == workloads.DATA_DIR
    assert applied(server)[1]["spec"]["clusterIP"] == "None"
    assert applied(server)[3]["spec"]["maxUnavailable"] == 1


async def test_a_broker_config_change_rolls_the_pods_and_nothing_else(
    server: ApiServer, api: ClientApi
) -> None:
    memo = memo_over(api)
    await handlers.cluster_workload(body=cluster(), namespace="ns", name="demo", memo=memo)
    before = applied(server)
    await handlers.cluster_workload(
        body=cluster(brokerConfig={"segmentBytes": 4096}), namespace="ns", name="demo", memo=memo
    )
    after_all = applied(server)[len(before) :]
    # the ConfigMap and the StatefulSet's pod template change; Services and PDB do not
    changed = [m["kind"] for m, was in zip(after_all, before, strict=True) if m != was]
    assert changed == ["ConfigMap", "StatefulSet"]
    before, after = before[-1], after_all[-1]
    annotation = workloads.CONFIG_HASH_ANNOTATION
    template = ("spec", "template", "metadata", "annotations")

    def dig(doc: Any) -> Any:
        for key in template:
            doc = doc[key]
        return doc[annotation]

    assert dig(before) != dig(after)
    args = after["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--segment-bytes") + 1] == "4096"


async def test_an_invalid_spec_is_a_permanent_error_and_applies_nothing(
    server: ApiServer, api: ClientApi
) -> None:
    with pytest.raises(kopf.PermanentError, match="replicas"):
        await handlers.cluster_workload(
            body=cluster(replicas=0), namespace="ns", name="demo", memo=memo_over(api)
        )
    assert writes(server) == []


async def test_a_topic_event_kicks_its_clusters_loop_only(
    server: ApiServer, api: ClientApi
) -> None:
    memo = memo_over(api)
    loops = memo.context.loops
    for name in ("demo", "other"):
        body = {**CLUSTER, "metadata": {**CLUSTER["metadata"], "name": name}}
        ports = ClusterPorts(api, ManualClock(), fleet=object())  # type: ignore[arg-type]
        loops[("ns", name)] = ClusterRuntime(DesiredObjects(body), ports)
    body = topic()
    body["metadata"]["finalizers"] = [finalizing.TOPIC_FINALIZER]  # given at its first event
    await handlers.topic_changed(namespace="ns", spec=body["spec"], body=body, memo=memo)
    assert loops[("ns", "demo")].kicked.is_set()
    assert not loops[("ns", "other")].kicked.is_set()
    assert writes(server) == []


async def test_a_topic_of_a_missing_cluster_is_told_so_once(
    server: ApiServer, api: ClientApi
) -> None:
    orphan = topic()
    orphan["spec"]["clusterRef"]["name"] = "absent"
    orphan_version = server.put(orphan)["metadata"]["resourceVersion"]
    memo = memo_over(api)
    indices = {"clusters_index": {("ns", "demo"): [CLUSTER]}}
    for _ in range(3):  # every event after the write brings the handler back
        body = server.body("Topic", "orders")
        await handlers.topic_changed(
            namespace="ns", spec=body["spec"], body=body, memo=memo, type="MODIFIED", **indices
        )
    # the data finalizer first (fenced on the version seen), then the status
    path = "/apis/headrace.dev/v1alpha1/namespaces/ns/topics/orders"
    assert writes(server) == [f"PATCH {path}", f"PUT {path}/status"]
    (patch,) = server["patch"]
    assert patch.data["metadata"]["resourceVersion"] == orphan_version
    assert server.body("Topic", "orders")["metadata"]["finalizers"] == [finalizing.TOPIC_FINALIZER]
    status = server.body("Topic", "orders")["status"]
    ready, stalled = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "ClusterNotFound")
    # kstatus's Failed: waiting does not make the cluster exist
    assert (stalled["type"], stalled["status"], stalled["reason"]) == (
        "Stalled",
        "True",
        "ClusterNotFound",
    )
    assert ready["observedGeneration"] == status["observedGeneration"] == 1
    assert server.body("Topic", "orders")["spec"] == orphan["spec"]


async def test_an_orphan_topic_that_changed_meanwhile_is_left_to_its_next_event(
    server: ApiServer, api: ClientApi
) -> None:
    orphan = topic()
    orphan["spec"]["clusterRef"]["name"] = "absent"
    seen = server.put(orphan)
    server.put(seen)  # someone writes after the event the handler was given
    memo = memo_over(api)
    await handlers.topic_changed(
        namespace="ns", spec=seen["spec"], body=seen, memo=memo, type="MODIFIED",
        clusters_index={},
    )  # fmt: skip
    # the fenced finalizer patch is refused (409) and not retried: the next event retries
    (patch,) = server["patch"]
    assert patch.data["metadata"]["resourceVersion"] == seen["metadata"]["resourceVersion"]
    assert "finalizers" not in server.body("Topic", "orders")["metadata"]
    # ... and so is a status write from a stale event
    held = server.put(
        {**seen, "metadata": {**seen["metadata"], "finalizers": [finalizing.TOPIC_FINALIZER]}}
    )
    server.put(held)
    await handlers.topic_changed(
        namespace="ns", spec=held["spec"], body=held, memo=memo, type="MODIFIED",
        clusters_index={},
    )  # fmt: skip
    (put,) = server["put"]
    assert put.data["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    assert "status" not in server.body("Topic", "orders")


async def test_the_daemon_runs_the_loop_from_the_indices_until_cancelled(
    server: ApiServer, api: ClientApi
) -> None:
    memo = memo_over(api)
    body = server.put(CLUSTER)
    indices = {
        "clusters_index": {("ns", "demo"): [body]},
        "topics_index": {},
        "unloads_index": {},
    }
    task = asyncio.create_task(
        handlers.cluster_loop(namespace="ns", name="demo", memo=memo, **indices)
    )

    async def started() -> None:
        while ("ns", "demo") not in memo.context.loops:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(started(), 5)
    # its first step looked for the cluster's pods (there are none yet)
    await asyncio.wait_for(pods_listed(server), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert memo.context.loops == {}


async def test_a_scale_down_that_would_remove_replicas_keeps_those_brokers(
    server: ApiServer, api: ClientApi
) -> None:
    placed = topic()
    placed["status"] = {
        "partitions": [
            {"partition": 0, "replicas": [0, 1, 2]},
            {"partition": 1, "replicas": [1, 2, 3]},
        ]
    }
    indices = {"topics_index": {("ns", "demo"): [placed]}}
    memo = memo_over(api)
    await handlers.cluster_workload(
        body=cluster(replicas=2), namespace="ns", name="demo", memo=memo, **indices
    )
    assert applied(server)[-1]["spec"]["replicas"] == 4  # brokers 2 and 3 hold replicas
    placed["status"]["partitions"][1]["replicas"] = [1, 0, 2]  # partition 1 moved off 3
    await handlers.cluster_workload(
        body=cluster(replicas=3), namespace="ns", name="demo", memo=memo, **indices
    )
    assert applied(server)[-1]["spec"]["replicas"] == 3
    assert server.objects["apps/v1/statefulsets", "ns", "demo"]["spec"]["replicas"] == 3


def test_a_blocked_scale_down_is_the_clusters_ready_condition() -> None:
    blockers = workloads.scale_down_blockers(
        2, [{"name": "ns/orders", "partitions": [{"partition": 0, "replicas": [2, 0]}]}]
    )
    assert blockers == {2: ["ns/orders/0"]}
    status = conditions.cluster_conditions(
        bodies.parse_cluster(cluster(replicas=2)), {0, 1, 2}, "2026-01-01T00:00:00Z", blockers
    )
    ready, stalled = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "ScaleDownBlocked")
    assert "broker 2: ns/orders/0" in ready["message"]
    assert (stalled["type"], stalled["status"], stalled["reason"]) == (
        "Stalled",
        "True",
        "ScaleDownBlocked",
    )


def test_broker_ids_come_from_the_pod_ordinal() -> None:
    labelled = {"metadata": {"name": "demo-7", "labels": {workloads.POD_INDEX_LABEL: "2"}}}
    assert workloads.broker_id_of(labelled) == 2
    assert workloads.broker_id_of({"metadata": {"name": "demo-7"}}) == 7
    assert workloads.broker_id_of({"metadata": {"name": "demo"}}) is None


async def pods_listed(server: ApiServer) -> None:
    """Until the server has served a list of the cluster's pods (by its label)."""
    selector = f"{workloads.CLUSTER_LABEL}=demo"
    while not any(r.params.get("labelSelector") == selector for r in server["get"]):
        await asyncio.sleep(0.01)


async def test_a_deleted_topic_of_a_missing_cluster_is_let_go_at_once(
    server: ApiServer, api: ClientApi
) -> None:
    orphan = topic()
    orphan["spec"]["clusterRef"]["name"] = "absent"
    orphan["metadata"]["finalizers"] = [finalizing.TOPIC_FINALIZER, "example.com/other"]
    orphan["metadata"]["deletionTimestamp"] = "2026-11-24T10:00:00Z"
    body = server.put(orphan)
    await handlers.topic_changed(
        namespace="ns",
        spec=body["spec"],
        body=body,
        memo=memo_over(api),
        type="MODIFIED",
        clusters_index={("ns", "demo"): [CLUSTER]},
    )
    (patch,) = server["patch"]  # a merge patch of the list: ours gone, the other kept
    assert patch.headers["Content-Type"].startswith("application/merge-patch+json")
    assert patch.data == {
        "metadata": {
            "finalizers": ["example.com/other"],
            "resourceVersion": body["metadata"]["resourceVersion"],  # fenced
        }
    }
    assert server.body("Topic", "orders")["metadata"]["finalizers"] == ["example.com/other"]


async def test_a_paused_cluster_keeps_its_workload_until_the_pause_is_lifted(
    server: ApiServer, api: ClientApi
) -> None:
    memo = memo_over(api)
    body = cluster(replicas=5)
    body["metadata"] = {**body["metadata"], "annotations": {conditions.PAUSED_ANNOTATION: "true"}}
    with pytest.raises(kopf.TemporaryError, match="paused"):  # kopf retries it
        await handlers.cluster_workload(body=body, namespace="ns", name="demo", memo=memo)
    assert applied(server) == []  # nothing touched while paused
    body["metadata"]["annotations"] = {}
    await handlers.cluster_workload(body=body, namespace="ns", name="demo", memo=memo)
    (sts,) = [m for m in applied(server) if m["kind"] == "StatefulSet"]
    assert sts["spec"]["replicas"] == 5  # the spec it has now, a change made while paused
