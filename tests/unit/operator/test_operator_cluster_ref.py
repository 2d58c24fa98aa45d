"""A Topic that leaves a cluster's index without being deleted never loses its data there.

The handlers index Topics by ``clusterRef`` (``handlers.topics_index``), and each cluster's
loop takes its index entry as its desired Topics. An edit of ``clusterRef`` (refused by the
CRD's CEL rule, but an API server with an older CRD, or a Topic written around it, lets it
through) makes the Topic vanish from the old cluster's entry while the object still exists.
These tests run that path with the operator's real ``ClientApi`` against kmock's emulator
(``server``) and a scripted fleet of brokers: no topology the old cluster pushes may leave
the topic out unless it also lists it under ``retained`` (a push without either is what
makes brokers delete their copies and the leaders the topic's objects).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kube_server import ApiServer
from operator_fakes import CLUSTER, topic

from headrace.operator import handlers
from headrace.operator.kube import ClientApi
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet

ORDERS = "ns/orders"


def topics_index(server: ApiServer) -> dict[Any, list[dict[str, Any]]]:
    """The Topics index as kopf builds it from the stored Topics (``handlers.topics_index``)."""
    index: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for (plural, namespace, name), stored in list(server.objects.items()):
        if plural != "headrace.dev/v1alpha1/topics" or stored.deleted:
            continue  # (deleted: gone with its last finalizer)
        body = server.body("Topic", name, namespace)
        entry = handlers.topics_index(namespace=namespace, spec=body["spec"], body=body)
        for key, value in entry.items():
            index[key].append(value)
    return index


def fleet_of(clock: ManualClock) -> ScriptedFleet:
    endpoints = tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3))
    return ScriptedFleet(endpoints, clock)


async def run(
    runtime: ClusterRuntime, server: ApiServer, clock: ManualClock, steps: int = 6
) -> None:
    """Steps of the cluster ``demo``'s loop, each from the index as the watch has it now."""
    for _ in range(steps):
        runtime.sync(server.body("BrokerCluster", "demo"), topics_index(server)[("ns", "demo")])
        await runtime.step()
        clock.advance(1000)


def deleting_pushes(fleet: ScriptedFleet, since: int = 0) -> list[int]:
    """The generations of pushes that would have the brokers delete the topic's data."""
    return [
        int(doc["generation"])
        for doc in fleet.pushed[since:]
        if ORDERS not in {t["name"] for t in doc["topics"]}
        and ORDERS not in doc.get("retained", [])
    ]


async def test_a_cluster_ref_edit_deletes_nothing_on_the_old_cluster(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(CLUSTER)
    server.put(topic())
    clock = ManualClock()
    fleet = fleet_of(clock)
    index = topics_index(server)
    runtime = ClusterRuntime(
        DesiredObjects(server.body("BrokerCluster", "demo"), index[("ns", "demo")]),
        ClusterPorts(api, clock, fleet=fleet),
    )
    await run(runtime, server, clock)
    assert ORDERS in runtime.loop.state.topics
    placed = runtime.loop.state.topics[ORDERS]
    pushed = len(fleet.pushed)

    # kubectl patch topic orders --type merge -p '{"spec":{"clusterRef":{"name":"other"}}}'
    moved = server.body("Topic", "orders")
    moved["spec"]["clusterRef"] = {"name": "other"}
    moved["metadata"]["generation"] += 1
    server.put(moved)
    assert ("ns", "demo") not in topics_index(server)  # gone from the old cluster's entry
    await run(runtime, server, clock)

    assert deleting_pushes(fleet, pushed) == []
    assert runtime.loop.state.topics[ORDERS].partitions == placed.partitions
    for broker in range(3):  # every broker still holds it as it was placed
        held = {t["name"] for t in fleet.held[broker]["topics"]}
        assert ORDERS in held
    problems = runtime.loop.last_decision.problems if runtime.loop.last_decision else ()
    assert ("TopicUnclaimed", ORDERS) in [(p.reason, p.topic) for p in problems]

    # the operator restarts: the old cluster's loop starts from its index (without the
    # Topic) and the stored statuses. It cannot place the topic any more, but it keeps the
    # brokers' copies aside (retained), durably, instead of deleting them
    pushed = len(fleet.pushed)
    restarted = ClusterRuntime(
        DesiredObjects(server.body("BrokerCluster", "demo")), ClusterPorts(api, clock, fleet=fleet)
    )
    await run(restarted, server, clock)
    assert deleting_pushes(fleet, pushed) == []
    assert fleet.pushed[pushed:], "the restarted loop pushed"
    assert ORDERS in fleet.pushed[-1]["retained"]
    assert server.body("BrokerCluster", "demo")["status"]["retainedTopics"] == [ORDERS]

    # and again: the record of it survives a second restart
    pushed = len(fleet.pushed)
    again = ClusterRuntime(
        DesiredObjects(server.body("BrokerCluster", "demo")), ClusterPorts(api, clock, fleet=fleet)
    )
    await run(again, server, clock)
    assert deleting_pushes(fleet, pushed) == []
    assert ORDERS in again.loop.topology_document()["retained"]


async def test_a_deleted_topic_is_deleted_as_its_policy_says(
    server: ApiServer, api: ClientApi
) -> None:
    """The explicit request: the Topic object is being deleted (its finalizer holds it)."""
    server.put(CLUSTER)
    body = topic()
    body["spec"]["deletionPolicy"] = "Delete"
    server.put(body)
    clock = ManualClock()
    fleet = fleet_of(clock)
    runtime = ClusterRuntime(
        DesiredObjects(server.body("BrokerCluster", "demo"), topics_index(server)[("ns", "demo")]),
        ClusterPorts(api, clock, fleet=fleet),
    )
    await run(runtime, server, clock)
    assert ORDERS in runtime.loop.state.topics
    deleted = server.body("Topic", "orders")
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleted["metadata"]["finalizers"] = ["headrace.dev/topic-data"]
    server.put(deleted)
    pushed = len(fleet.pushed)
    await run(runtime, server, clock)
    assert ORDERS not in runtime.loop.state.topics
    assert deleting_pushes(fleet, pushed), "a push without it: the brokers delete their copies"
