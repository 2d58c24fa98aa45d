"""The rolling restart: ``rollout_plan.next_action`` row by row, and the runtime carrying it out
(drain, delete, wait for the pod and the LRS, the next) over a scripted fleet."""

from __future__ import annotations

import dataclasses
from typing import Any

from kube_server import ApiServer
from operator_fakes import CLUSTER, FakeApi, topic

from headrace.control.looping import Report
from headrace.operator import rollout_plan, workloads
from headrace.operator.kube import ClientApi
from headrace.operator.rollout_plan import Delete, Drain, Idle, PartitionView, PodView, Seen, Wait
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet


def seen(**changes: Any) -> Seen:
    base = Seen(
        update_revision="new",
        replicas=3,
        pods={b: PodView(b, "old", ready=True, terminating=False) for b in range(3)},
        live=frozenset({0, 1, 2}),
        draining=frozenset(),
        partitions=[
            PartitionView("ns/t/0", True, 2, (2, 0, 1), (2, 0, 1)),
            PartitionView("ns/t/1", True, 0, (0, 1, 2), (0, 1, 2)),
        ],
        now_ms=100_000,
        drains_started_ms={},
        drain_timeout_ms=20_000,
    )
    return dataclasses.replace(base, **changes)


def updated(*brokers: int) -> dict[int, PodView]:
    return {b: PodView(b, "new" if b in brokers else "old", True, False) for b in range(3)}


def test_nothing_outdated_is_idle() -> None:
    assert rollout_plan.next_action(seen(pods=updated(0, 1, 2))) == Idle()
    assert rollout_plan.next_action(seen(update_revision=None)) == Idle()


def test_the_highest_outdated_ordinal_is_drained_first() -> None:
    assert rollout_plan.next_action(seen()) == Drain(2)
    assert rollout_plan.next_action(seen(pods=updated(2))) == Drain(1)


def test_a_draining_broker_that_still_leads_is_waited_for_then_deleted() -> None:
    draining = seen(draining=frozenset({2}), drains_started_ms={2: 95_000})
    action = rollout_plan.next_action(draining)
    assert isinstance(action, Wait) and action.broker == 2
    moved = [PartitionView("ns/t/0", True, 0, (2, 0, 1), (2, 0, 1))]
    assert rollout_plan.next_action(dataclasses.replace(draining, partitions=moved)) == Delete(2)
    late = dataclasses.replace(draining, now_ms=115_000)
    assert rollout_plan.next_action(late) == Delete(2, ("ns/t/0",))


def test_a_leader_with_no_in_sync_peer_does_not_hold_the_drain() -> None:
    alone = [PartitionView("ns/solo/0", True, 2, (2,), (2,))]
    assert rollout_plan.next_action(seen(draining=frozenset({2}), partitions=alone)) == Delete(2)


def test_the_next_restart_waits_for_the_previous_pod_and_a_whole_lrs() -> None:
    pods = updated(2)
    gone = {b: p for b, p in pods.items() if b != 2}
    for case in (
        seen(pods=gone),
        seen(pods={**pods, 2: PodView(2, "new", False, False)}),
        seen(pods={**pods, 2: PodView(2, "old", True, True)}),
        seen(pods=pods, live=frozenset({0, 1})),
        seen(pods=pods, partitions=[PartitionView("ns/t/0", True, 0, (2, 0, 1), (0, 1))]),
        seen(pods=pods, partitions=[PartitionView("ns/t/0", False, None, (2, 0, 1), (0,))]),
    ):
        assert isinstance(rollout_plan.next_action(case), Wait), case


def test_a_deleted_pod_must_come_back_as_a_new_process_before_anything_else() -> None:
    pods = {**updated(2), 2: PodView(2, "new", True, False, uid="u-old")}
    waiting = seen(pods=pods, restarted={2: "u-old"})
    assert isinstance(rollout_plan.next_action(waiting), Wait)  # the old pod, still listed
    pods[2] = PodView(2, "new", True, False, uid="u-new")
    stale = seen(pods=pods, restarted={2: "u-old"}, draining=frozenset({2}))
    assert isinstance(rollout_plan.next_action(stale), Wait)  # the old process's heartbeat
    fresh = seen(pods=pods, restarted={2: "u-old"})
    assert rollout_plan.back(fresh) == {2}


def test_a_stuck_outdated_pod_is_replaced_first_without_a_drain_or_a_wait() -> None:
    # a bad image rolled to broker 2 crash-loops; the spec goes back to the old revision
    crashing = {**updated(), 2: PodView(2, "bad", ready=False, terminating=False, uid="u-bad")}
    failed_over = [PartitionView("ns/t/0", True, 0, (2, 0, 1), (0, 1))]
    reverted = seen(
        update_revision="old", pods=crashing, live=frozenset({0, 1}), partitions=failed_over
    )
    assert rollout_plan.stuck(reverted) == [2]
    assert rollout_plan.next_action(reverted) == Delete(2, stuck=True)
    # ... also while this rollout still waits for that broker to come back
    waiting = dataclasses.replace(reverted, restarted={2: "u-good"})
    assert rollout_plan.next_action(waiting) == Delete(2, stuck=True)


def test_only_outdated_pods_not_ready_whose_brokers_are_down_are_stuck() -> None:
    pods = {
        0: PodView(0, "old", ready=False, terminating=False, uid="a"),  # stuck
        1: PodView(1, "old", ready=False, terminating=True, uid="b"),  # going already
        2: PodView(2, "new", ready=False, terminating=False, uid="c"),  # current: waited for
    }
    down = frozenset({2})
    assert rollout_plan.stuck(seen(pods=pods, live=down)) == [0]
    assert rollout_plan.stuck(seen(pods=pods, live=down, restarted={0: "a"})) == []  # deleted by us
    assert rollout_plan.stuck(seen(pods=updated(), live=down)) == []  # ready: restarted in turn
    action = rollout_plan.next_action(seen(pods=pods, live=down))
    assert isinstance(action, Delete) and (action.broker, action.stuck) == (0, True)


def test_a_pod_still_starting_at_an_outdated_revision_is_drained_in_its_turn() -> None:
    # its broker is live (it may lead) and its readiness is not there yet: not stuck
    starting = {**updated(), 2: PodView(2, "old", ready=False, terminating=False, uid="u")}
    assert rollout_plan.stuck(seen(pods=starting)) == []
    assert isinstance(rollout_plan.next_action(seen(pods=starting)), Wait)
    assert rollout_plan.next_action(seen()) == Drain(2)  # once Ready, drained first


def test_a_stuck_pod_at_the_current_revision_holds_the_rollout() -> None:
    # the new revision does not start: rolling more pods onto it would take the cluster down
    pods = {**updated(), 2: PodView(2, "new", ready=False, terminating=False, uid="u-new")}
    action = rollout_plan.next_action(
        seen(pods=pods, live=frozenset({0, 1}), restarted={2: "u-old"})
    )
    assert isinstance(action, Wait) and action.broker == 2


def test_a_permanently_dead_broker_does_not_block_the_rollout_that_fixes_it() -> None:
    dead = {**updated(), 0: PodView(0, "old", ready=False, terminating=False, uid="u-0")}
    failed_over = [PartitionView("ns/t/1", True, 1, (0, 1, 2), (1, 2))]
    action = rollout_plan.next_action(
        seen(pods=dead, live=frozenset({1, 2}), partitions=failed_over)
    )
    assert action == Delete(0, stuck=True)


# --------------------------------------------------------------------------- the runtime


class DrainingFleet(ScriptedFleet):
    """Brokers in ``draining`` say so in their heartbeats."""

    draining: set[int]

    def _report(self, broker_id: int) -> Report:
        report = super()._report(broker_id)
        if broker_id not in getattr(self, "draining", set()):
            return report
        return dataclasses.replace(
            report, heartbeat=dataclasses.replace(report.heartbeat, draining=True)
        )


def pod(broker: int, revision: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"demo-{broker}",
            "uid": f"uid-{broker}-{revision}",
            "labels": {
                "apps.kubernetes.io/pod-index": str(broker),
                "controller-revision-hash": revision,
            },
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def statefulset_at(revision: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": {"replicas": 3},
        "status": {"updateRevision": revision},
    }


async def test_a_drain_is_called_off_when_the_template_goes_back() -> None:
    api = FakeApi(CLUSTER, topic(partitions=3), statefulset_at("r2"))
    api.pods = [pod(b, "r1") for b in range(3)]
    clock = ManualClock()
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    events: list[Any] = []
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet, events=events.append),
    )
    for _ in range(6):
        runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
        await runtime.step()
        clock.advance(500)
    assert runtime.rollout.asked == {2}
    api.put(statefulset_at("r1"))
    await runtime.step()
    assert runtime.rollout.asked == set()
    assert any("drain called off" in e.message for e in events)


async def test_a_new_revision_rolls_every_pod_one_at_a_time_draining_each_first() -> None:
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": {"replicas": 3},
        "status": {"updateRevision": "r1"},
    }
    api = FakeApi(CLUSTER, topic(partitions=3), statefulset)
    api.pods = [pod(b, "r1") for b in range(3)]
    clock = ManualClock()
    fleet = DrainingFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    fleet.draining = set()
    events: list[Any] = []
    runtime = ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet, events=events.append),
    )

    async def step() -> rollout_plan.Action:
        runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
        await runtime.step()
        clock.advance(500)
        return runtime.rollout.last

    for _ in range(4):
        assert await step() == Idle()
    api.put({**statefulset, "status": {"updateRevision": "r2"}})  # a brokerConfig change
    deleted = []
    for _ in range(60):
        action = await step()
        if isinstance(action, Drain):
            fleet.draining.add(action.broker)  # the broker raises its flag
        if isinstance(action, Delete):
            leaders = {p.leader for t in runtime.loop.state.topics.values() for p in t.partitions}
            assert action.broker not in leaders  # its leadership moved off first
            assert action.still_leading == ()
            deleted.append(action.broker)
            fleet.draining.discard(action.broker)
            api.pods.append(pod(action.broker, "r2"))  # the StatefulSet recreates it
        if action == Idle() and deleted:
            break
    assert deleted == [2, 1, 0]
    cluster = api.body("BrokerCluster", "demo")["status"]
    restarting = next(c for c in cluster["conditions"] if c["type"] == "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("False", "RolloutComplete")
    assert ("DELETE", "Pod", "demo-2") in api.writes
    assert [e.kind for e in events if e.kind.startswith("RollingRestart")][
        -1
    ] == "RollingRestartDone"


def listed_pod(broker: int, revision: str, *, ready: bool = True, uid: str = "") -> dict[str, Any]:
    """A broker pod as the API server lists it (``ready`` False: its container crash-loops)."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", **pod(broker, revision)}
    body["metadata"]["labels"][workloads.CLUSTER_LABEL] = "demo"
    body["metadata"]["namespace"] = "ns"
    if uid:
        body["metadata"]["uid"] = uid
    if not ready:
        body["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
    return body


async def test_a_bad_revision_is_rolled_back_by_reverting_the_spec_alone(
    server: ApiServer, api: ClientApi
) -> None:
    """A pod template that cannot start (a bad image) rolls to the first pod and stops there;
    reverting the spec replaces that crash-looping pod, and no other pod is touched. Runs
    the runtime over the operator's real API client, against kmock's API server."""
    server.put(CLUSTER)
    server.put(topic(partitions=3))
    server.put(statefulset_at("r1"))
    for b in range(3):
        server.put(listed_pod(b, "r1"))
    clock = ManualClock()
    fleet = DrainingFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    fleet.draining = set()
    runtime = ClusterRuntime(
        DesiredObjects(server.body("BrokerCluster", "demo"), [server.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet),
    )

    def deleted_pods() -> list[str]:
        return [r.name for r in server if r.method.value == "DELETE" and r.resource is not None]

    async def step() -> rollout_plan.Action:
        runtime.sync(server.body("BrokerCluster", "demo"), [server.body("Topic", "orders")])
        await runtime.step()
        clock.advance(500)
        action = runtime.rollout.last
        if isinstance(action, Drain):
            fleet.draining.add(action.broker)
        return action

    for _ in range(4):
        assert await step() == Idle()
    server.put(statefulset_at("r2"))  # spec.image: an image that cannot start
    for _ in range(30):
        if isinstance(await step(), Delete):
            break
    assert deleted_pods() == ["demo-2"]
    fleet.draining.discard(2)
    fleet.down.add(2)  # the StatefulSet recreates it at r2, and it crash-loops
    server.put(listed_pod(2, "r2", ready=False))
    for _ in range(10):
        action = await step()
        assert isinstance(action, Wait) and action.broker == 2, action
    server.put(statefulset_at("r1"))  # the spec reverted: the old revision is current again
    action = await step()
    assert isinstance(action, Delete) and (action.broker, action.stuck) == (2, True)
    assert deleted_pods() == ["demo-2", "demo-2"]
    fleet.down.discard(2)
    # recreated from r1 again: the StatefulSet reuses the revision of an identical template
    server.put(listed_pod(2, "r1", uid="uid-2-back"))
    for _ in range(20):
        if await step() == Idle():
            break
    assert runtime.rollout.last == Idle()
    assert deleted_pods() == ["demo-2", "demo-2"]  # pods 0 and 1 were never restarted
    status = server.body("BrokerCluster", "demo")["status"]
    restarting = next(c for c in status["conditions"] if c["type"] == "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("False", "RolloutComplete")
