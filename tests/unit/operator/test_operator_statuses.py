"""KubeStatusStore: compare-and-swap on resourceVersion, conflicts re-read and retried,
no API call for a status that is already stored, never a spec write."""

from __future__ import annotations

from typing import Any

import pytest
from operator_fakes import CLUSTER, FakeApi, topic

from headrace.operator.kube import KubeApiError
from headrace.operator.statuses import MAX_CONFLICTS, KubeStatusStore, Superseded

STATUS = {"observedGeneration": 1, "topologyGeneration": 2, "partitions": []}


def store_over(api: FakeApi) -> KubeStatusStore:
    return KubeStatusStore(api, api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])


async def test_a_status_is_written_once_and_an_equal_one_costs_no_api_call() -> None:
    api = FakeApi(CLUSTER, topic())
    store = store_over(api)
    await store.write_topic_status("ns/orders", STATUS)
    assert api.writes == [("PUT status", "Topic", "orders")]
    assert api.body("Topic", "orders")["status"] == STATUS
    reads = api.reads
    for _ in range(3):
        await store.write_topic_status("ns/orders", dict(STATUS))
    assert api.writes == [("PUT status", "Topic", "orders")]
    assert api.reads == reads  # not even a read


async def test_the_loaded_status_counts_as_written() -> None:
    api = FakeApi(CLUSTER, {**topic(), "status": STATUS})
    store = store_over(api)
    assert store.load().topics["ns/orders"]["status"] == STATUS
    await store.write_topic_status("ns/orders", STATUS)
    assert api.writes == []


async def test_a_conflict_is_reread_and_retried_with_the_fresh_version() -> None:
    api = FakeApi(CLUSTER, topic())
    store = store_over(api)
    # someone else (kopf's annotations, a person) changes the object after the store saw it
    api.put(
        {**api.body("Topic", "orders"), "metadata": {**topic()["metadata"], "labels": {"a": "b"}}}
    )
    await store.write_topic_status("ns/orders", STATUS)
    assert api.writes == [("PUT status", "Topic", "orders")] * 2  # 409, then the retry
    stored = api.body("Topic", "orders")
    assert stored["status"] == STATUS
    assert stored["metadata"]["labels"] == {"a": "b"}  # only the status was replaced
    assert stored["spec"] == topic()["spec"]


async def test_a_conflict_with_an_equal_status_needs_no_retry() -> None:
    api = FakeApi(CLUSTER, topic())
    store = store_over(api)
    api.put({**api.body("Topic", "orders"), "status": STATUS})
    await store.write_topic_status("ns/orders", STATUS)
    assert api.writes == [("PUT status", "Topic", "orders")]  # the 409 only


async def test_a_newer_commit_is_never_overwritten() -> None:
    api = FakeApi(CLUSTER, topic())
    store = store_over(api)
    newer = {**STATUS, "topologyGeneration": 7}
    api.put({**api.body("Topic", "orders"), "status": newer})  # another controller was active
    with pytest.raises(Superseded):
        await store.write_topic_status("ns/orders", STATUS)
    assert api.body("Topic", "orders")["status"] == newer


async def test_endless_conflicts_give_up_with_a_clear_error() -> None:
    api = FakeApi(CLUSTER, topic())
    store = store_over(api)

    async def moving(ref: Any) -> Any:
        body = api.objects[ref]
        api.put(body)  # it moves on between every read and write
        return {**body, "metadata": {**body["metadata"], "resourceVersion": "0"}}

    api.get = moving  # type: ignore[method-assign]
    api.put(api.body("Topic", "orders"))
    with pytest.raises(KubeApiError, match="conflicts in a row"):
        await store.write_topic_status("ns/orders", STATUS)
    assert len(api.writes) == MAX_CONFLICTS


async def test_a_deleted_resource_takes_its_status_with_it() -> None:
    api = FakeApi(CLUSTER, topic())
    store = store_over(api)
    api.objects.clear()
    await store.write_topic_status("ns/orders", STATUS)  # no error, nothing stored
    assert api.objects == {}


async def test_the_cluster_status_keeps_the_workload_conditions_beside_the_loop_document() -> None:
    api = FakeApi(CLUSTER)
    store = KubeStatusStore(api, api.body("BrokerCluster", "demo"))
    conditions = {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}
    await store.write_workload_status(conditions)
    await store.write_cluster_status({"topologyGeneration": 3, "topics": [], "brokers": []})
    status = api.body("BrokerCluster", "demo")["status"]
    assert status == {**conditions, "topologyGeneration": 3, "topics": [], "brokers": []}
    # the loop's load sees its own document only
    reloaded = KubeStatusStore(api, api.body("BrokerCluster", "demo"))
    assert reloaded.load().cluster == {"topologyGeneration": 3, "topics": [], "brokers": []}
    await reloaded.write_workload_status(conditions)
    assert len(api.writes) == 2
