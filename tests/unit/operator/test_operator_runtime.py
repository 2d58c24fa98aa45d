"""ClusterRuntime: the shared ControlLoop over CR status, with a scripted fleet and a fake API.

The loop's own behaviour is tested with the local controller; these pin what the
operator adds: statuses land on the CRs, an idle cluster writes nothing, the
BrokerCluster's Ready condition keeps its lastTransitionTime, pause stops
reconciling, deleted Topics leave the loop.
"""

from __future__ import annotations

from typing import Any

from operator_fakes import CLUSTER, FakeApi, topic

from headrace.operator.conditions import PAUSED_ANNOTATION, WorkloadOutcome
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects, WorkloadLink
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet


def runtime_over(api: FakeApi, clock: ManualClock) -> tuple[ClusterRuntime, ScriptedFleet]:
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet),
    )
    return runtime, fleet


async def settle(runtime: ClusterRuntime, api: FakeApi, clock: ManualClock, steps: int = 6) -> None:
    for _ in range(steps):
        runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
        await runtime.step()
        clock.advance(1000)


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


async def test_a_topic_is_placed_and_its_status_written_then_an_idle_cluster_writes_nothing() -> (
    None
):
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    await settle(runtime, api, clock)
    status = api.body("Topic", "orders")["status"]
    assert ready(status)["status"] == "True"
    assert ready(status)["observedGeneration"] == 1
    assert [p["leader"] for p in status["partitions"]] != [None, None]
    cluster = api.body("BrokerCluster", "demo")["status"]
    assert cluster["topologyGeneration"] == status["topologyGeneration"]
    assert ready(cluster)["reason"] == "AllBrokersLive"
    assert cluster["observedGeneration"] == 1
    assert api.body("Topic", "orders")["spec"] == topic()["spec"]  # never a spec write

    writes = list(api.writes)
    await settle(runtime, api, clock, steps=20)
    assert api.writes == writes, "an idle cluster must cost no API writes"


async def test_the_cluster_ready_condition_moves_only_when_its_status_does() -> None:
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, fleet = runtime_over(api, clock)
    await settle(runtime, api, clock)
    first = ready(api.body("BrokerCluster", "demo")["status"])
    clock.advance(5000)
    await settle(runtime, api, clock)
    assert ready(api.body("BrokerCluster", "demo")["status"]) == first

    fleet.down.add(2)
    await settle(runtime, api, clock, steps=12)
    down = ready(api.body("BrokerCluster", "demo")["status"])
    assert (down["status"], down["reason"]) == ("False", "BrokersNotLive")
    assert down["lastTransitionTime"] > first["lastTransitionTime"]


async def test_a_paused_topic_keeps_the_spec_it_had_until_it_is_resumed() -> None:
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    await settle(runtime, api, clock)
    body = api.body("Topic", "orders")
    body["metadata"]["annotations"] = {PAUSED_ANNOTATION: "true"}
    body["metadata"]["generation"] = 2
    body["spec"]["minInSync"] = 3
    api.put(body)
    await settle(runtime, api, clock)
    assert runtime.loop.topics["ns/orders"]["metadata"]["generation"] == 1
    status = api.body("Topic", "orders")["status"]
    assert status["observedGeneration"] == 1
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Paused"]["status"] == "True"
    assert conditions["Paused"]["observedGeneration"] == 2
    assert conditions["Ready"]["status"] == "True"
    writes = list(api.writes)
    await settle(runtime, api, clock)
    assert api.writes == writes  # the condition is written once, not every step

    body = api.body("Topic", "orders")
    body["metadata"]["annotations"] = {}
    api.put(body)
    await settle(runtime, api, clock)
    status = api.body("Topic", "orders")["status"]
    assert status["observedGeneration"] == 2
    assert [c["type"] for c in status["conditions"]] == ["Ready"]


async def test_a_paused_cluster_takes_no_steps_and_says_so() -> None:
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    await settle(runtime, api, clock)
    steps = runtime.loop.steps
    body = api.body("BrokerCluster", "demo")
    body["metadata"]["annotations"] = {PAUSED_ANNOTATION: "true"}
    api.put(body)
    await settle(runtime, api, clock)
    assert runtime.loop.steps == steps
    conditions = {c["type"]: c for c in api.body("BrokerCluster", "demo")["status"]["conditions"]}
    assert conditions["Paused"]["status"] == "True"
    assert conditions["Ready"]["status"] == "True"  # the last observation, kept


async def test_a_deleted_topic_leaves_the_loop() -> None:
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    await settle(runtime, api, clock)
    assert "ns/orders" in runtime.loop.state.topics
    deleted = api.body("Topic", "orders")
    deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    for _ in range(3):
        runtime.sync(api.body("BrokerCluster", "demo"), [deleted])
        await runtime.step()
        clock.advance(1000)
    assert "ns/orders" not in runtime.loop.state.topics
    assert "ns/orders" not in api.body("BrokerCluster", "demo")["status"]["topics"]


async def test_a_topic_that_only_left_the_index_stays_in_the_loop() -> None:
    """Not a deletion: its Topic names another cluster now, or the watch lost it."""
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    await settle(runtime, api, clock)
    for _ in range(3):
        runtime.sync(api.body("BrokerCluster", "demo"), [])
        await runtime.step()
        clock.advance(1000)
    assert "ns/orders" in runtime.loop.state.topics
    assert "ns/orders" in api.body("BrokerCluster", "demo")["status"]["topics"]


async def test_topics_of_other_clusters_and_namespaces_are_not_this_loops() -> None:
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    other = topic("elsewhere")
    other["spec"]["clusterRef"]["name"] = "other"
    foreign = topic("foreign")
    foreign["metadata"]["namespace"] = "ns2"
    runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders"), other, foreign])
    assert set(runtime.wanted_topics) == {"ns/orders"}


async def test_a_scale_down_below_placed_replicas_is_refused_and_reapplied_when_it_changes() -> (
    None
):
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    calls: list[list[dict[str, Any]]] = []

    async def reapply(statuses: list[dict[str, Any]]) -> None:
        calls.append(statuses)

    runtime.reapply = reapply
    await settle(runtime, api, clock)
    assert calls == []  # 3 brokers wanted, 3 placed: nothing to keep
    body = api.body("BrokerCluster", "demo")
    body["spec"]["replicas"] = 2
    body["metadata"]["generation"] = 2
    api.put(body)
    await settle(runtime, api, clock)
    assert len(calls) == 1  # once, when the set of brokers to keep changed
    assert set(runtime.blockers) == {2}
    conditions = api.body("BrokerCluster", "demo")["status"]["conditions"]
    ready, stalled, rebalancing = conditions
    assert (ready["reason"], ready["observedGeneration"]) == ("ScaleDownBlocked", 2)
    assert "below the replication factor" in ready["message"]
    assert (rebalancing["type"], rebalancing["status"]) == ("Rebalancing", "False")
    assert (stalled["type"], stalled["status"], stalled["reason"]) == (
        "Stalled",
        "True",
        "ScaleDownBlocked",
    )
    clock.advance(60_000)
    writes = list(api.writes)
    await settle(runtime, api, clock)  # no-op reconciles: the condition stays as it was
    assert api.body("BrokerCluster", "demo")["status"]["conditions"][1] == stalled
    assert api.writes == writes

    body = api.body("BrokerCluster", "demo")
    body["spec"]["replicas"] = 3  # honoured again: no longer stalled
    body["metadata"]["generation"] = 3
    api.put(body)
    await settle(runtime, api, clock)
    ready, rebalancing = api.body("BrokerCluster", "demo")["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "AllBrokersLive")
    assert (rebalancing["status"], rebalancing["reason"]) == ("False", "Balanced")


async def test_a_scale_down_moves_replicas_off_first_then_shrinks_the_statefulset() -> None:
    four = {**CLUSTER, "spec": {"replicas": 4}}
    api = FakeApi(four, topic(partitions=4))
    clock = ManualClock()
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(4)), clock
    )
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet),
    )
    calls: list[list[dict[str, Any]]] = []

    async def reapply(statuses: list[dict[str, Any]]) -> None:
        calls.append(statuses)

    runtime.reapply = reapply
    await settle(runtime, api, clock)
    held = [p["replicas"] for p in api.body("Topic", "orders")["status"]["partitions"]]
    assert any(3 in r for r in held)
    body = api.body("BrokerCluster", "demo")
    body["spec"]["replicas"] = 3
    body["metadata"]["generation"] = 2
    api.put(body)
    runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
    await runtime.step()
    status = api.body("BrokerCluster", "demo")["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["reason"] == "ScalingDown", conditions["Ready"]
    assert "Stalled" not in conditions, "moving replicas off is progress, not a refusal"
    assert conditions["Rebalancing"]["status"] == "True"
    await settle(runtime, api, clock, steps=10)
    held = [p["replicas"] for p in api.body("Topic", "orders")["status"]["partitions"]]
    assert all(3 not in r and len(r) == 3 for r in held), held
    assert runtime.blockers == {}
    assert len(calls) == 2, "kept broker 3, then let it go: the StatefulSet shrinks"
    conditions = {c["type"]: c for c in api.body("BrokerCluster", "demo")["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "AllBrokersLive"
    assert conditions["Rebalancing"]["reason"] == "Balanced"


async def test_a_topic_spec_the_loop_refuses_is_stalled_until_it_is_fixed() -> None:
    api = FakeApi(CLUSTER, topic(replicas=5))
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    await settle(runtime, api, clock)
    conditions = {c["type"]: c for c in api.body("Topic", "orders")["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == (
        "False",
        "NotEnoughBrokers",
    )
    stalled = conditions["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "NotEnoughBrokers")
    clock.advance(60_000)
    await settle(runtime, api, clock)
    again = {c["type"]: c for c in api.body("Topic", "orders")["status"]["conditions"]}
    assert again["Stalled"] == stalled  # lastTransitionTime kept

    body = api.body("Topic", "orders")
    body["spec"]["replicas"] = 3
    body["metadata"]["generation"] = 2
    api.put(body)
    await settle(runtime, api, clock)
    fixed = api.body("Topic", "orders")["status"]["conditions"]
    assert [c["type"] for c in fixed] == ["Ready"]
    assert fixed[0]["status"] == "True"


async def test_too_few_brokers_up_yet_is_not_stalled() -> None:
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    runtime, fleet = runtime_over(api, clock)
    fleet.down.update({0, 1, 2})  # a cluster starting: no broker up yet
    await settle(runtime, api, clock)
    conditions = api.body("Topic", "orders")["status"]["conditions"]
    assert [(c["type"], c["reason"]) for c in conditions] == [("Ready", "NotEnoughBrokers")]


async def test_a_push_to_a_broker_whose_pod_is_gone_is_a_failed_push() -> None:
    from headrace.operator.pods import PodFleet

    api = FakeApi()
    api.pods = [
        {
            "metadata": {"name": "demo-0", "labels": {"apps.kubernetes.io/pod-index": "0"}},
            "status": {"podIP": "10.0.0.9"},
        }
    ]
    fleet = PodFleet(api, "ns", "demo", ManualClock(), 100)
    await fleet.refresh()
    assert set(fleet.http.brokers) == {0}
    assert fleet.http.brokers[0].admin_url == "http://10.0.0.9:9644"
    assert await fleet.push(1, {"generation": 3}) is None


def unload_body(name: str = "move", topic_name: str = "orders") -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Unload",
        "metadata": {"name": name, "namespace": "ns", "generation": 1},
        "spec": {"topicRef": {"name": topic_name}, "partitions": [0], "targetBroker": 1},
    }


async def test_unloads_of_this_clusters_topics_reach_the_loop_and_leave_it_when_deleted() -> None:
    api = FakeApi(CLUSTER, topic(), unload_body(), unload_body("other", "elsewhere"))
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    cluster = api.body("BrokerCluster", "demo")
    topics = [api.body("Topic", "orders")]
    runtime.sync(cluster, topics, [api.body("Unload", "move"), api.body("Unload", "other")])
    assert runtime.desired_state is not None
    assert set(runtime.desired_state.unloads) == {"ns/move"}  # "elsewhere" is not this cluster's
    deleting = api.body("Unload", "move")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    runtime.sync(cluster, topics, [deleting])
    assert runtime.desired_state.unloads["ns/move"]["metadata"]["deletionTimestamp"] is not None
    runtime.sync(cluster, topics, [])
    assert runtime.desired_state.unloads == {}


async def test_a_new_operator_shrinks_the_statefulset_its_resume_apply_kept_large() -> None:
    """A kill -9 of the operator mid scale down (found by the operator campaign): the new
    process's resume apply read Topic statuses in which broker 3 still held replicas, and
    kept 4 pods; by its loop's first step the moves are over. The loop never saw broker 3
    held, yet the StatefulSet it finds applied keeps a pod the spec does not ask for: it
    applies the workload again (and only once)."""
    api = FakeApi(CLUSTER, topic())  # spec.replicas 3; the topic on brokers 0..2
    clock = ManualClock()
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(4)), clock
    )
    outcome = WorkloadOutcome(applied=1, replicas=4)
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet),
        workload=WorkloadLink(outcome=lambda: outcome),
    )
    calls: list[list[dict[str, Any]]] = []

    async def reapply(statuses: list[dict[str, Any]]) -> None:
        calls.append(statuses)
        outcome.replicas = 3  # what apply_workload records: no broker to keep

    runtime.reapply = reapply
    await settle(runtime, api, clock)
    assert len(calls) == 1, "the StatefulSet kept broker 3's pod: applied again, once"
    assert runtime.blockers == {}


async def test_the_loop_takes_the_synced_desired_state_whole_at_its_step() -> None:
    api = FakeApi(CLUSTER, topic(), unload_body())
    clock = ManualClock()
    runtime, _ = runtime_over(api, clock)
    cluster = api.body("BrokerCluster", "demo")
    runtime.sync(cluster, [api.body("Topic", "orders")], [api.body("Unload", "move")])
    assert runtime.loop.unloads == {}, "nothing reaches the loop until its step"
    synced = runtime.desired_state
    assert synced is not None
    await runtime.step()
    assert runtime.loop.topics == synced.topics
    assert runtime.loop.unloads == synced.unloads
    assert runtime.loop.members == frozenset(range(3))  # the StatefulSet's ordinals
    runtime.sync(cluster, [api.body("Topic", "orders")], [])
    assert set(runtime.loop.unloads) == {"ns/move"}, "the loop keeps it until its next step"
    await runtime.step()
    assert runtime.loop.unloads == {}
