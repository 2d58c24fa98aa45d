"""The Unload's finalizer: an Unload deleted mid-move (``kubectl delete``, an Argo CD prune)
stays until its moves in flight finish, so a partition it sealed is reassigned and opened
again, never left sealed (producers would get ``PartitionMoving`` until another Unload of
it came along). A deleted Unload no cluster's loop will serve is let go at once.

Handlers called as kopf calls them, and the runtime, over the operator's real API client
against kmock's API server (``kube_server``)."""

from __future__ import annotations

from typing import Any

from kube_server import ApiServer
from operator_fakes import CLUSTER, memo_over, topic

from headrace.control.model import UnloadPhase
from headrace.operator import finalizing, handlers
from headrace.operator.bodies import meta_of
from headrace.operator.kube import ClientApi, ObjectRef
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet

UNLOADS = "/apis/headrace.dev/v1alpha1/namespaces/ns/unloads"
DELETED_AT = "2026-11-28T10:00:00Z"


def unload(name: str = "move", topic_name: str = "orders", **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Unload",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "generation": 1,
            "creationTimestamp": "2026-11-28T09:00:00Z",
            **metadata,
        },
        "spec": {"topicRef": {"name": topic_name}, "partitions": [0], "targetBroker": 1},
    }


def tiered_topic() -> dict[str, Any]:
    body = topic(partitions=2, replicas=1)
    body["spec"]["tieredStorage"] = {"enabled": True}
    return body


def deleted(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "deletionTimestamp": DELETED_AT}}


async def test_an_unload_gets_the_move_finalizer_at_its_first_event(
    server: ApiServer, api: ClientApi
) -> None:
    seen = server.put(unload())
    await handlers.unload_changed(namespace="ns", body=seen, memo=memo_over(api), type="ADDED")
    (patch,) = server["patch"]  # fenced on the version seen, as the Topic's is
    assert patch.data["metadata"]["resourceVersion"] == seen["metadata"]["resourceVersion"]
    assert server.body("Unload", "move")["metadata"]["finalizers"] == [finalizing.UNLOAD_FINALIZER]


async def test_an_unload_deleted_mid_move_stays_until_the_move_finishes(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(CLUSTER)
    server.put(tiered_topic())
    server.put(unload(finalizers=[finalizing.UNLOAD_FINALIZER]))
    clock = ManualClock()
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    runtime = ClusterRuntime(
        DesiredObjects(server.body("BrokerCluster", "demo"), [server.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet),
    )

    def partition_zero() -> Any:
        return runtime.loop.state.topics["ns/orders"].partitions[0]

    async def step() -> None:
        runtime.sync(
            server.body("BrokerCluster", "demo"),
            [server.body("Topic", "orders")],
            [server.body("Unload", "move")],
        )
        await runtime.step()
        clock.advance(500)

    for _ in range(6):  # placed, and served
        await step()
        if "ns/orders" in runtime.loop.state.topics and partition_zero().leader is not None:
            break
    owner = partition_zero().leader
    assert owner is not None and owner != 1
    fleet.stuck.add(owner)  # it takes its time to seal (uploads)
    for _ in range(4):
        await step()
    assert partition_zero().seal  # mid-move: producers get PartitionMoving
    move = ObjectRef("headrace.dev/v1alpha1", "Unload", "ns", "move")
    await api.delete(move)  # kubectl delete, an Argo CD prune: the finalizer holds it
    for _ in range(4):
        await step()
    held = await api.get(move)
    assert held is not None and meta_of(held).finalizers == (finalizing.UNLOAD_FINALIZER,)
    assert partition_zero().seal  # the move is still in flight
    fleet.stuck.discard(owner)  # it seals; the partition is reassigned and opened again
    for _ in range(20):
        await step()
        if await api.get(move) is None:
            break
    assert await api.get(move) is None  # released, so the API server let it go
    assert not partition_zero().seal
    assert partition_zero().leader == 1  # the move completed, to its target
    statuses = [r.data["status"] for r in server["put"] if r.url.path == f"{UNLOADS}/move/status"]
    assert statuses[-1]["phase"] == UnloadPhase.COMPLETED.value


async def test_a_deleted_unload_no_loop_will_serve_is_let_go_at_once(
    server: ApiServer, api: ClientApi
) -> None:
    going_cluster = deleted(CLUSTER)
    cases = {
        "no-topic": ({}, {("ns", "demo"): [CLUSTER]}, "its topic ns/no-topic does not exist"),
        "cluster-gone": ({("ns", "demo"): [topic("cluster-gone")]}, {}, "does not exist"),
        "cluster-going": (
            {("ns", "demo"): [topic("cluster-going")]},
            {("ns", "demo"): [going_cluster]},
            "BrokerCluster demo of its topic ns/cluster-going is being deleted",
        ),
    }
    memo = memo_over(api)
    for name, (topics, clusters, why) in cases.items():
        body = server.put(
            deleted(unload(name, name, finalizers=[finalizing.UNLOAD_FINALIZER, "x.io/keep"]))
        )
        await handlers.unload_changed(
            namespace="ns",
            body=body,
            memo=memo,
            type="MODIFIED",
            topics_index=topics,
            clusters_index=clusters,
        )
        assert server.body("Unload", name)["metadata"]["finalizers"] == ["x.io/keep"], name
        event = memo.events[-1]
        assert (event.name, event.reason) == (name, "UnloadReleased")
        assert why in event.message


async def test_a_deleted_unload_its_cluster_serves_is_left_to_the_loop(
    server: ApiServer, api: ClientApi
) -> None:
    body = server.put(deleted(unload(finalizers=[finalizing.UNLOAD_FINALIZER])))
    memo = memo_over(api)
    await handlers.unload_changed(
        namespace="ns",
        body=body,
        memo=memo,
        type="MODIFIED",
        topics_index={("ns", "demo"): [topic()]},
        clusters_index={("ns", "demo"): [CLUSTER]},
    )
    assert server.body("Unload", "move")["metadata"]["finalizers"] == [finalizing.UNLOAD_FINALIZER]
    assert list(server["patch"]) == [] and memo.events == []
