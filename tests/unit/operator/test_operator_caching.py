"""The watch cache of a cluster's workload (``caching``): a step reads no pods and no
StatefulSet from the API while the cache is current, and never acts on a state older than
one it has seen or acted on (it reads the API server instead)."""

from __future__ import annotations

from typing import Any

from operator_fakes import FakeApi

from headrace.operator.caching import Versions, Watched, WorkloadReads
from headrace.operator.kube import ObjectRef


def pod(name: str, uid: str, version: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid,
        "resourceVersion": version,
        "labels": {"apps.kubernetes.io/pod-index": name.rsplit("-", 1)[1]},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": {"podIP": "10.0.0.1"}}


def statefulset(version: str, generation: int, observed: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "demo",
            "namespace": "ns",
            "uid": "sts",
            "resourceVersion": version,
            "generation": generation,
        },
        "status": {"observedGeneration": observed, "updateRevision": f"rev-{generation}"},
    }


class Cache:
    """What the watches hold; the test moves it on, or back."""

    def __init__(self) -> None:
        self.view = Watched()

    def __call__(self) -> Watched:
        return self.view


def reads_over(api: FakeApi) -> tuple[WorkloadReads, Cache]:
    cache = Cache()
    return WorkloadReads(api, "ns", "demo", cache), cache


async def test_a_current_cache_serves_every_read() -> None:
    api = FakeApi()
    reads, cache = reads_over(api)
    cache.view = Watched((pod("demo-0", "a", "1"),), statefulset("5", 1, 1))
    for _ in range(10):
        assert [p["metadata"]["uid"] for p in await reads.pods()] == ["a"]
        assert (await reads.statefulset() or {})["status"]["updateRevision"] == "rev-1"
    assert api.reads == 0
    assert (reads.lists, reads.gets) == (0, 0)


async def test_a_pod_deleted_by_the_step_is_not_served_again_from_a_cache_behind() -> None:
    api = FakeApi()
    reads, cache = reads_over(api)
    before = pod("demo-0", "a", "1")
    cache.view = Watched((before,))
    (seen,) = await reads.pods()
    reads.acted_on_pod(seen)  # the rollout deleted it
    api.pods = [pod("demo-0", "a", "2", deleting=True)]
    # the watch has not delivered the delete yet: the API server is asked instead
    (now,) = await reads.pods()
    assert now["metadata"].get("deletionTimestamp"), "the deleted pod's state, not the old one"
    assert reads.stale_reads == 1
    # still behind: asked again, never the old state
    assert (await reads.pods())[0]["metadata"]["resourceVersion"] == "2"
    # the watch catches up: served from the cache again
    cache.view = Watched((pod("demo-0", "a", "2", deleting=True),))
    lists = reads.lists
    assert (await reads.pods())[0]["metadata"]["resourceVersion"] == "2"
    assert reads.lists == lists


async def test_a_deleted_pod_never_comes_back_without_its_deletion_even_at_a_new_version() -> None:
    api = FakeApi()
    reads, cache = reads_over(api)
    cache.view = Watched((pod("demo-0", "a", "1"),))
    (seen,) = await reads.pods()
    reads.acted_on_pod(seen)
    # a relist from a lagging API server shows a state the operator never saw, before its delete
    cache.view = Watched((pod("demo-0", "a", "0"),))
    api.pods = []  # gone meanwhile
    assert await reads.pods() == []
    assert reads.lists == 1


async def test_a_cache_that_goes_back_to_a_state_it_showed_before_is_stale() -> None:
    api = FakeApi()
    reads, cache = reads_over(api)
    cache.view = Watched((pod("demo-0", "a", "1"),))
    await reads.pods()
    cache.view = Watched((pod("demo-0", "a", "2"),))
    await reads.pods()
    api.pods = [pod("demo-0", "a", "2")]
    cache.view = Watched((pod("demo-0", "a", "1"),))  # a relist from an older API server
    (now,) = await reads.pods()
    assert now["metadata"]["resourceVersion"] == "2"
    assert reads.lists == 1


async def test_after_an_api_read_the_cache_must_show_that_state_before_it_is_trusted() -> None:
    api = FakeApi()
    reads, cache = reads_over(api)
    cache.view = Watched((pod("demo-0", "a", "1"),))
    await reads.pods()
    reads.acted_on_pod(pod("demo-0", "a", "1"))
    api.pods = [pod("demo-0", "a", "3", deleting=True)]
    await reads.pods()  # stale: read from the API (version 3)
    # the cache moves to a state between the two, one the step never saw: still behind
    cache.view = Watched((pod("demo-0", "a", "2", deleting=True),))
    assert (await reads.pods())[0]["metadata"]["resourceVersion"] == "3"
    assert reads.lists == 2


async def test_a_statefulset_whose_generation_went_back_is_read_from_the_api() -> None:
    api = FakeApi()
    api.objects[ObjectRef("apps/v1", "StatefulSet", "ns", "demo")] = statefulset("9", 2, 2)
    reads, cache = reads_over(api)
    cache.view = Watched((), statefulset("8", 2, 2))
    assert (await reads.statefulset() or {})["status"]["updateRevision"] == "rev-2"
    # a relist from an API server behind: the old template, at a version never seen
    cache.view = Watched((), statefulset("7", 1, 1))
    assert (await reads.statefulset() or {})["status"]["updateRevision"] == "rev-2"
    assert reads.gets == 1


async def test_without_a_watch_every_read_goes_to_the_api() -> None:
    api = FakeApi()
    api.pods = [pod("demo-0", "a", "1")]
    reads = WorkloadReads(api, "ns", "demo")
    await reads.pods()
    await reads.pods()
    await reads.statefulset()
    assert (reads.lists, reads.gets) == (2, 1)


def test_versions_forget_pods_that_are_gone_unless_acted_on() -> None:
    versions = Versions()
    versions.take([pod("demo-0", "a", "1"), pod("demo-1", "b", "1")])
    versions.take([pod("demo-0", "a", "2"), pod("demo-1", "b", "2")])
    versions.acted_on(pod("demo-1", "b", "2"))
    versions.take([])
    assert "a" not in versions.past
    assert versions.stale([pod("demo-1", "b", "2", deleting=True)])
    assert versions.stale([pod("demo-1", "b", "5")]), "deleted, shown without its deletion"
