"""A Topic held by its data finalizer when its BrokerCluster is deleted with it (a namespace
delete, an Argo CD app delete). kopf stops the cluster's loop as the cluster's deletion
starts, so no step of it will release the Topic, and no later event of the Topic need
come: it would stay Terminating for ever. What happens instead: its finalizer is removed,
its data stays where it is (the brokers' PersistentVolumeClaims, the object store), and
an Event on the Topic says where.

Handlers called as kopf calls them, over the operator's real API client against kmock's
API server (``kube_server``)."""

from __future__ import annotations

from typing import Any

from kube_server import ApiServer
from operator_fakes import CLUSTER, memo_over, topic

from headrace.operator import finalizing, handlers
from headrace.operator.kube import ClientApi, ObjectRef
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects

DELETED_AT = "2026-11-28T10:00:00Z"
KOPF_FINALIZER = "operator.headrace.dev/finalizer"


def deleted(body: dict[str, Any], *finalizers: str) -> dict[str, Any]:
    meta = {**body["metadata"], "deletionTimestamp": DELETED_AT, "finalizers": list(finalizers)}
    return {**body, "metadata": meta}


def topic_ref(name: str) -> ObjectRef:
    return ObjectRef("headrace.dev/v1alpha1", "Topic", "ns", name)


def held_topic(name: str = "orders", **spec: Any) -> dict[str, Any]:
    """A Topic placed on brokers 0-2 whose deletion its finalizer holds."""
    body = topic(name, partitions=2)
    body["spec"].update(spec)
    body["status"] = {
        "partitions": [
            {"partition": 0, "replicas": [0, 1, 2]},
            {"partition": 1, "replicas": [1, 2, 0]},
        ]
    }
    return deleted(body, finalizing.TOPIC_FINALIZER)


async def cluster_deleted(
    api: ClientApi,
    going: dict[str, Any],
    topics: list[dict[str, Any]],
    unloads: dict[str, list[dict[str, Any]]] | None = None,
) -> Any:
    """kopf's call of the cluster's deletion handler, with these Topics in its index; the
    memo it posted its Events to."""
    memo = memo_over(api)
    await handlers.cluster_deleted(
        namespace="ns",
        name="demo",
        body=going,
        memo=memo,
        topics_index={("ns", "demo"): topics} if topics else {},
        unloads_index=unloads or {},
    )
    return memo


async def test_a_retain_topic_held_when_its_cluster_is_deleted_is_let_go_where_its_data_is(
    server: ApiServer, api: ClientApi
) -> None:
    going = server.put(deleted(CLUSTER, KOPF_FINALIZER))
    held = server.put(held_topic())
    memo = await cluster_deleted(api, going, [held])
    (patch,) = server["patch"]  # only our finalizer goes; the Topic with it
    assert patch.data["metadata"]["finalizers"] == []
    assert await api.get(topic_ref("orders")) is None
    (event,) = memo.events
    assert (event.kind, event.name, event.type, event.reason) == (
        "Topic",
        "orders",
        "Normal",
        "TopicDataRetained",
    )
    for where in ("data-demo-0", "data-demo-1", "data-demo-2", "topics/ns/orders", "retained/"):
        assert where in event.message
    assert "BrokerCluster demo is being deleted" in event.message


async def test_a_topic_deleted_as_its_cluster_goes_is_let_go_though_the_loop_is_registered(
    server: ApiServer, api: ClientApi
) -> None:
    """The namespace delete marked the Topic after the cluster: its event finds the cluster
    going (its loop stopping, still registered) rather than gone."""
    going = server.put(deleted(CLUSTER, KOPF_FINALIZER))
    body = server.put(held_topic())
    memo = memo_over(api)
    ports = ClusterPorts(api, memo.context.clock, fleet=object())  # type: ignore[arg-type]
    stopping = ClusterRuntime(DesiredObjects(going), ports)
    memo.context.loops[("ns", "demo")] = stopping
    await handlers.topic_changed(
        namespace="ns",
        spec=body["spec"],
        body=body,
        memo=memo,
        type="MODIFIED",
        clusters_index={("ns", "demo"): [going]},
    )
    assert await api.get(topic_ref("orders")) is None
    assert [e.reason for e in memo.events] == ["TopicDataRetained"]


async def test_a_delete_topic_whose_cluster_is_gone_keeps_its_data_and_says_so(
    server: ApiServer, api: ClientApi
) -> None:
    store = {"endpoint": "http://minio:9000", "bucket": "tiers"}
    going = server.put(deleted({**CLUSTER, "spec": {"replicas": 3, "objectStore": store}}))
    body = server.put(held_topic(deletionPolicy="Delete", tieredStorage={"enabled": True}))
    memo = await cluster_deleted(api, going, [body])
    assert await api.get(topic_ref("orders")) is None
    (event,) = memo.events
    assert (event.type, event.reason) == ("Warning", "TopicDataNotDeleted")
    assert "bucket tiers, under demo/ns/orders/" in event.message
    assert "data-demo-0" in event.message
    # gone already: the Topic's own event lets it go, with the same Event
    later = server.put(held_topic("late", deletionPolicy="Delete"))
    await handlers.topic_changed(
        namespace="ns",
        spec=later["spec"],
        body=later,
        memo=memo,
        type="MODIFIED",
        clusters_index={},
    )
    assert await api.get(topic_ref("late")) is None
    assert memo.events[-1].reason == "TopicDataNotDeleted"
    assert "BrokerCluster demo was deleted" in memo.events[-1].message


async def test_unloads_held_when_their_cluster_is_deleted_are_let_go(
    server: ApiServer, api: ClientApi
) -> None:
    going = server.put(deleted(CLUSTER, KOPF_FINALIZER))
    orders = server.put(topic())
    mine = server.put(
        deleted(
            {
                "apiVersion": "headrace.dev/v1alpha1",
                "kind": "Unload",
                "metadata": {"name": "move", "namespace": "ns"},
                "spec": {"topicRef": {"name": "orders"}, "partitions": [0]},
            },
            finalizing.UNLOAD_FINALIZER,
        )
    )
    other = server.put(
        {**mine, "metadata": {**mine["metadata"], "name": "other"}, "spec": {
            "topicRef": {"name": "elsewhere"}, "partitions": [0]}}
    )  # fmt: skip
    memo = await cluster_deleted(api, going, [orders], {"ns": [mine, other]})
    assert [(e.name, e.reason) for e in memo.events] == [("move", "UnloadReleased")]
    unloads = "/apis/headrace.dev/v1alpha1/namespaces/ns/unloads"
    assert [r.url.path for r in server["patch"]] == [f"{unloads}/move"]


async def test_a_tiered_retain_topic_whose_cluster_is_gone_names_its_objects_prefix(
    server: ApiServer, api: ClientApi
) -> None:
    """The objects stay (nothing is left to remove them, whatever the policy): the Event
    names the bucket and the incarnation's prefix, and that its snapshots stay with it."""
    store = {"endpoint": "http://minio:9000", "bucket": "tiers"}
    going = server.put(deleted({**CLUSTER, "spec": {"replicas": 3, "objectStore": store}}))
    body = held_topic(tieredStorage={"enabled": True})
    body["status"]["creationId"] = "5c0e9c1e-3b5a-4a8f-9b43-1f2a7d9e0c11"
    held = server.put(body)
    memo = await cluster_deleted(api, going, [held])
    assert await api.get(topic_ref("orders")) is None
    (event,) = memo.events
    assert (event.type, event.reason) == ("Normal", "TopicDataRetained")
    prefix = "demo/ns/orders/5c0e9c1e-3b5a-4a8f-9b43-1f2a7d9e0c11/"
    assert f"bucket tiers, under {prefix}" in event.message
    assert f"{prefix}snapshots/" in event.message


async def test_a_cluster_deleted_while_removing_deleted_topics_objects_says_where_they_stay(
    server: ApiServer, api: ClientApi
) -> None:
    store = {"endpoint": "http://minio:9000", "bucket": "tiers"}
    removing = {
        "topic": "ns/old",
        "creationId": "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d",
        "partitions": 2,
        "deletedGeneration": 7,
        "broker": 1,
    }
    going = server.put(
        deleted(
            {
                **CLUSTER,
                "spec": {"replicas": 3, "objectStore": store},
                "status": {"deletedTopics": [removing]},
            },
            KOPF_FINALIZER,
        )
    )
    memo = await cluster_deleted(api, going, [])
    (event,) = memo.events
    assert (event.kind, event.name, event.type, event.reason) == (
        "BrokerCluster",
        "demo",
        "Warning",
        "TopicObjectsNotDeleted",
    )
    assert "bucket tiers, under demo/ns/old/0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d/" in event.message


async def test_a_cluster_deleted_with_no_removal_under_way_posts_nothing_about_objects(
    server: ApiServer, api: ClientApi
) -> None:
    going = server.put(deleted(CLUSTER, KOPF_FINALIZER))
    memo = await cluster_deleted(api, going, [])
    assert memo.events == []
