"""Each broker's rack on Kubernetes: the zone of its pod's node, read by the operator
(``zones``), so the broker pods need no API access."""

from __future__ import annotations

from typing import Any

from operator_fakes import CLUSTER, FakeApi, topic

from headrace.operator.kube import KubeApiError, ObjectRef
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects, RuntimeSettings
from headrace.operator.zones import ZONE_LABEL, NodeZones
from tests.unit.controller.controller_fakes import ManualClock


def node(name: str, zone: str | None) -> dict[str, Any]:
    labels = {ZONE_LABEL: zone} if zone else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def broker_pod(ordinal: int, node_name: str | None) -> dict[str, Any]:
    spec = {"nodeName": node_name} if node_name else {}
    return {
        "metadata": {
            "name": f"demo-{ordinal}",
            "labels": {"apps.kubernetes.io/pod-index": str(ordinal)},
        },
        "spec": spec,
    }


def api_with_nodes(*nodes: dict[str, Any]) -> FakeApi:
    api = FakeApi()
    for n in nodes:
        api.objects[ObjectRef("v1", "Node", "", n["metadata"]["name"])] = n
    return api


async def test_each_scheduled_broker_gets_its_nodes_zone_read_once() -> None:
    api = api_with_nodes(node("n1", "eu-1a"), node("n2", "eu-1b"), node("bare", None))
    zones = NodeZones(api, refresh_ms=60_000)
    pods = [broker_pod(0, "n1"), broker_pod(1, "n2"), broker_pod(2, "n1"), broker_pod(3, None)]
    pods.append(broker_pod(4, "bare"))
    assert await zones.racks(pods, 0) == {0: "eu-1a", 1: "eu-1b", 2: "eu-1a"}
    assert await zones.racks(pods, 30_000) == {0: "eu-1a", 1: "eu-1b", 2: "eu-1a"}
    assert zones.reads == 3, "each node once, until the refresh"
    await zones.racks(pods, 61_000)
    assert zones.reads == 6


class ForbiddenNodes(FakeApi):
    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        if ref.kind == "Node":
            raise KubeApiError("get Node: 403 Forbidden", code=403, reason="Forbidden")
        return await super().get(ref)


async def test_nodes_the_operator_may_not_read_give_no_rack() -> None:
    zones = NodeZones(ForbiddenNodes())
    assert await zones.racks([broker_pod(0, "n1")], 0) == {}


async def test_the_runtime_hands_the_loop_each_brokers_zone() -> None:
    api = api_with_nodes(node("n1", "eu-1a"), node("n2", "eu-1b"))
    api.put(CLUSTER)
    api.put(topic())
    # nothing listens on the pods' address: the polls are refused at once
    api.pods = [
        {**broker_pod(i, n), "status": {"podIP": "127.0.0.1"}}
        for i, n in enumerate(["n1", "n2", "n1"])
    ]
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, ManualClock()),
        RuntimeSettings(poll_timeout_ms=500),
    )
    assert runtime.pods is not None
    await runtime.pods.start()
    try:
        await runtime.step()
    finally:
        await runtime.pods.close()
    assert runtime.loop.racks == {0: "eu-1a", 1: "eu-1b", 2: "eu-1a"}
