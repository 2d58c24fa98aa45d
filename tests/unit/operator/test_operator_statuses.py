"""KubeStatusStore over the operator's ``ClientApi`` and kmock's API emulator (``server``):
compare-and-swap on resourceVersion, conflicts re-read and retried, no API call for a
status that is already stored, never a spec write."""

from __future__ import annotations

import kmock
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER, topic

from headrace.operator.kube import ClientApi, KubeApiError
from headrace.operator.statuses import MAX_CONFLICTS, KubeStatusStore, Superseded

STATUS = {"observedGeneration": 1, "topologyGeneration": 2, "partitions": []}
TOPIC_STATUS = kmock.resource("headrace.dev/v1alpha1/topics"), kmock.subresource("status")


def store_over(server: ApiServer, api: ClientApi) -> KubeStatusStore:
    return KubeStatusStore(
        api, server.body("BrokerCluster", "demo"), [server.body("Topic", "orders")]
    )


@pytest.fixture
def objects(server: ApiServer) -> None:
    server.put(CLUSTER)
    server.put(topic())


def status_puts(server: ApiServer) -> int:
    return len(server["put", kmock.subresource("status")])


async def test_a_status_is_written_once_and_an_equal_one_costs_no_api_call(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    await store.write_topic_status("ns/orders", STATUS)
    (put,) = server["put", *TOPIC_STATUS]
    assert put.data["status"] == STATUS
    assert server.body("Topic", "orders")["status"] == STATUS
    requests = len(server)
    for _ in range(3):
        await store.write_topic_status("ns/orders", dict(STATUS))
    assert len(server) == requests  # not even a read


async def test_the_loaded_status_counts_as_written(server: ApiServer, api: ClientApi) -> None:
    server.put(CLUSTER)
    server.put({**topic(), "status": STATUS})
    store = store_over(server, api)
    assert store.load().topics["ns/orders"]["status"] == STATUS
    await store.write_topic_status("ns/orders", STATUS)
    assert status_puts(server) == 0


async def test_a_conflict_is_reread_and_retried_with_the_fresh_version(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    seen = server.body("Topic", "orders")["metadata"]["resourceVersion"]
    # someone else (kopf's annotations, a person) changes the object after the store saw it
    body = server.body("Topic", "orders")
    server.put({**body, "metadata": {**body["metadata"], "labels": {"a": "b"}}})
    await store.write_topic_status("ns/orders", STATUS)
    stale, retried = server["put", *TOPIC_STATUS]  # 409, then the retry
    assert stale.data["metadata"]["resourceVersion"] == seen
    assert retried.data["metadata"]["resourceVersion"] != seen
    assert len(server["get", kmock.name("orders")]) == 1  # the re-read in between
    stored = server.body("Topic", "orders")
    assert stored["status"] == STATUS
    assert stored["metadata"]["labels"] == {"a": "b"}  # only the status was replaced
    assert stored["spec"] == topic()["spec"]
    assert store.conflicts == 1


async def test_a_conflict_with_an_equal_status_needs_no_retry(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    server.put({**server.body("Topic", "orders"), "status": STATUS})
    await store.write_topic_status("ns/orders", STATUS)
    assert status_puts(server) == 1  # the 409 only


async def test_a_newer_commit_is_never_overwritten(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    newer = {**STATUS, "topologyGeneration": 7}
    server.put({**server.body("Topic", "orders"), "status": newer})  # another controller
    with pytest.raises(Superseded):
        await store.write_topic_status("ns/orders", STATUS)
    assert server.body("Topic", "orders")["status"] == newer


async def test_endless_conflicts_give_up_with_a_clear_error(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    # the object moves on between every read and write: every status PUT is refused
    server["put", *TOPIC_STATUS] << kmock.KubernetesError(409, "Conflict", "modified")
    with pytest.raises(KubeApiError, match="conflicts in a row"):
        await store.write_topic_status("ns/orders", STATUS)
    assert status_puts(server) == MAX_CONFLICTS


async def test_a_deleted_resource_takes_its_status_with_it(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    server.objects["headrace.dev/v1alpha1/topics", "ns", "orders"].delete()
    await store.write_topic_status("ns/orders", STATUS)  # no error, nothing stored
    assert status_puts(server) == 1
    assert server.objects["headrace.dev/v1alpha1/topics", "ns", "orders"].deleted


async def test_the_cluster_status_keeps_the_workload_conditions_beside_the_loop_document(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(CLUSTER)
    store = KubeStatusStore(api, server.body("BrokerCluster", "demo"))
    conditions = {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}
    await store.write_workload_status(conditions)
    await store.write_cluster_status({"topologyGeneration": 3, "topics": [], "brokers": []})
    status = server.body("BrokerCluster", "demo")["status"]
    assert status == {**conditions, "topologyGeneration": 3, "topics": [], "brokers": []}
    # the loop's load sees its own document only
    reloaded = KubeStatusStore(api, server.body("BrokerCluster", "demo"))
    assert reloaded.load().cluster == {"topologyGeneration": 3, "topics": [], "brokers": []}
    await reloaded.write_workload_status(conditions)
    assert status_puts(server) == 2


async def test_an_unload_is_released_by_removing_the_operators_finalizer_only(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(CLUSTER)
    unload = {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Unload",
        "metadata": {"name": "u", "namespace": "ns", "finalizers": ["mine", "someone.else/f"]},
        "spec": {"topic": "orders"},
    }
    server.put(unload)
    store = KubeStatusStore(
        api, server.body("BrokerCluster", "demo"), unloads=[unload], finalizer="mine"
    )
    await store.release_unload("ns/u")
    (patch,) = server["patch"]
    assert patch.headers["Content-Type"].startswith("application/merge-patch+json")
    assert patch.data == {"metadata": {"finalizers": ["someone.else/f"]}}
    stored = server.body("Unload", "u")
    assert stored["metadata"]["finalizers"] == ["someone.else/f"]
    assert store.writes == 1


COMMIT = {"topologyGeneration": 4, "topics": [], "brokers": [{"id": 0}]}


async def test_another_commit_at_the_same_generation_is_never_overwritten(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    await store.write_cluster_status(COMMIT)
    # a second controller (the Lease's old holder, woken from a pause) commits generation 5
    theirs = {**COMMIT, "topologyGeneration": 5, "brokers": [{"id": 1}]}
    server.put({**server.body("BrokerCluster", "demo"), "status": theirs})
    with pytest.raises(Superseded, match="another controller committed"):
        await store.write_cluster_status({**COMMIT, "topologyGeneration": 5})
    assert server.body("BrokerCluster", "demo")["status"] == theirs


async def test_a_commit_seen_through_the_watch_is_not_overwritten_either(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    await store.write_cluster_status(COMMIT)
    theirs = {**COMMIT, "topologyGeneration": 5, "brokers": [{"id": 1}]}
    store.remember(server.put({**server.body("BrokerCluster", "demo"), "status": theirs}))
    with pytest.raises(Superseded):
        await store.write_cluster_status({**COMMIT, "topologyGeneration": 5})
    assert server.body("BrokerCluster", "demo")["status"] == theirs


async def test_the_workload_conditions_written_beside_a_commit_are_no_rival_commit(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    await store.write_cluster_status(COMMIT)
    body = server.body("BrokerCluster", "demo")
    conditions = [{"type": "Ready", "status": "False", "reason": "TokenUnreadable"}]
    server.put({**body, "status": {**body["status"], "conditions": conditions}})
    await store.write_cluster_status({**COMMIT, "topologyGeneration": 5})
    assert server.body("BrokerCluster", "demo")["status"]["topologyGeneration"] == 5


async def test_a_late_watch_event_does_not_move_the_store_back(
    server: ApiServer, api: ClientApi, objects: None
) -> None:
    store = store_over(server, api)
    before = server.body("Topic", "orders")
    await store.write_topic_status("ns/orders", STATUS)
    store.remember(before)  # the index delivers the object as it was before that write
    await store.write_topic_status("ns/orders", {**STATUS, "topologyGeneration": 3})
    assert store.conflicts == 0
    assert server.body("Topic", "orders")["status"]["topologyGeneration"] == 3
