"""The Topic finalizer: a deleted Topic stays until the brokers dealt with its data as its
``deletionPolicy`` says (``headrace.operator.finalizing``), over a scripted fleet."""

from __future__ import annotations

from typing import Any

from kube_server import ApiServer
from operator_fakes import CLUSTER, FakeApi, topic

from headrace.operator import finalizing
from headrace.operator.bodies import meta_of, parse_topic
from headrace.operator.kube import ClientApi, ObjectRef
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.coordination import Heartbeat
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.resources.topics import DeletionPolicy
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet


def deleted(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        **body,
        "metadata": {
            **meta,
            "deletionTimestamp": "2026-11-24T10:00:00Z",
            "finalizers": [finalizing.TOPIC_FINALIZER],
        },
    }


async def run(policy: str, *, down: frozenset[int] = frozenset()) -> tuple[Any, ...]:
    api = FakeApi(CLUSTER, {**topic(), "spec": {**topic()["spec"], "deletionPolicy": policy}})
    clock = ManualClock()
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    events: list[Any] = []
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet, events=events.append),
    )
    for _ in range(4):
        runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
        await runtime.step()
        clock.advance(1000)
    assert "ns/orders" in runtime.loop.state.topics
    api.put(deleted(api.body("Topic", "orders")))
    fleet.down |= down
    for _ in range(4):
        runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
        await runtime.step()
        clock.advance(1000)
    return api, fleet, runtime, events


def finalizers_of(api: FakeApi) -> list[str]:
    return list(api.body("Topic", "orders")["metadata"].get("finalizers") or [])


async def test_delete_takes_the_topic_off_every_broker_then_lets_the_topic_go() -> None:
    api, fleet, runtime, events = await run("Delete")
    assert "ns/orders" not in runtime.loop.state.topics
    last = fleet.pushed[-1]
    assert last["topics"] == [] and "retained" not in last
    assert finalizers_of(api) == []
    assert [e.kind for e in events if e.subject == "ns/orders"][-1] == "TopicDataDeleted"


async def test_retain_pushes_the_name_as_retained_and_waits_for_every_broker() -> None:
    api, fleet, runtime, events = await run("Retain", down={2})
    assert fleet.pushed[-1]["retained"] == ["ns/orders"]
    assert finalizers_of(api) == [finalizing.TOPIC_FINALIZER]  # broker 2 would delete it
    assert "brokers [2]" in events[-1].message
    fleet.down.clear()
    for _ in range(3):
        runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
        await runtime.step()
    assert finalizers_of(api) == []
    assert events[-1].kind == "TopicDataRetained"


def test_the_policy_defaults_to_retain_and_the_finalizer_is_added_once() -> None:
    body = topic()
    assert finalizing.policy_of(parse_topic(body)) is DeletionPolicy.RETAIN
    assert finalizing.needs_finalizer(meta_of(body))
    assert not finalizing.needs_finalizer(meta_of(deleted(body)))
    assert finalizing.held(meta_of(deleted(body)))


def test_retain_does_not_wait_for_a_broker_the_cluster_scaled_away() -> None:
    """After a scale 3 -> 4 -> 3, broker 3 is known to the controller but down for good (its
    replicas moved off before its pod went): a Retain deletion must not wait for it, while
    a member that is down is still waited for."""
    empty = {b: Heartbeat(BrokerEndpoint(b, f"10.0.0.{b}", 9092, 9644)) for b in range(4)}

    def verdict(
        members: frozenset[int] | None, live: set[int], holders: frozenset[int] = frozenset()
    ) -> finalizing.Progress:
        return finalizing.progress(
            "ns/orders",
            DeletionPolicy.RETAIN,
            placed=False,
            generation=5,
            brokers=[0, 1, 2, 3],
            live=live,
            heartbeats=empty,
            applied=dict.fromkeys(range(4), 5),
            members=members,
            holders=holders,
        )

    assert not verdict(None, {0, 1, 2}).done  # every known broker counts: 3 is waited for
    assert "[3]" in verdict(None, {0, 1, 2}).message
    assert verdict(frozenset({0, 1, 2}), {0, 1, 2}).done  # 3 left the cluster
    waiting = verdict(frozenset({0, 1, 2}), {0, 1})  # a member down is still waited for
    assert not waiting.done and "[2]" in waiting.message
    # a scale down to 3 blocked on broker 3 (down, the topic's only in-sync copy): the
    # deletion waits for it, or it would delete that copy when it comes back
    blocked = verdict(frozenset({0, 1, 2}), {0, 1, 2}, holders=frozenset({1, 3}))
    assert not blocked.done and "[3]" in blocked.message
    partition = {"partition": 0, "replicas": [0, 3], "targetReplicas": [0, 1]}
    body = {**topic(), "status": {"partitions": [partition]}}
    assert finalizing.replica_holders(parse_topic(body)) == {0, 1, 3}


async def test_a_release_keeps_a_finalizer_added_after_the_object_was_read(
    server: ApiServer, api: ClientApi
) -> None:
    # A merge patch replaces the whole list: computed from a stale read, it would drop a
    # finalizer another controller added since. Fenced on the version it was computed
    # from, it is refused (409) and computed again from a fresh read.
    seen = server.put(
        {**topic(), "metadata": {**topic()["metadata"], "finalizers": [finalizing.TOPIC_FINALIZER]}}
    )
    now = server.body("Topic", "orders")
    now["metadata"]["finalizers"] = [finalizing.TOPIC_FINALIZER, "example.com/backup"]
    server.put(now)
    await finalizing.release(api, ObjectRef.of(seen), meta_of(seen))
    assert server.body("Topic", "orders")["metadata"]["finalizers"] == ["example.com/backup"]
