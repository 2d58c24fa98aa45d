"""The rolling restart: ``rollout.next_action`` row by row, and the runtime carrying it out
(drain, delete, wait for the pod and the LRS, the next) over a scripted fleet."""

from __future__ import annotations

import dataclasses
from typing import Any

from operator_fakes import CLUSTER, FakeApi, topic

from headrace.control.looping import Report
from headrace.operator import rollout
from headrace.operator.rollout import Delete, Drain, Idle, PartitionView, PodView, Seen, Wait
from headrace.operator.running import ClusterRuntime
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
    assert rollout.next_action(seen(pods=updated(0, 1, 2))) == Idle()
    assert rollout.next_action(seen(update_revision=None)) == Idle()


def test_the_highest_outdated_ordinal_is_drained_first() -> None:
    assert rollout.next_action(seen()) == Drain(2)
    assert rollout.next_action(seen(pods=updated(2))) == Drain(1)


def test_a_draining_broker_that_still_leads_is_waited_for_then_deleted() -> None:
    draining = seen(draining=frozenset({2}), drains_started_ms={2: 95_000})
    action = rollout.next_action(draining)
    assert isinstance(action, Wait) and action.broker == 2
    moved = [PartitionView("ns/t/0", True, 0, (2, 0, 1), (2, 0, 1))]
    assert rollout.next_action(dataclasses.replace(draining, partitions=moved)) == Delete(2)
    late = dataclasses.replace(draining, now_ms=115_000)
    assert rollout.next_action(late) == Delete(2, ("ns/t/0",))


def test_a_leader_with_no_in_sync_peer_does_not_hold_the_drain() -> None:
    alone = [PartitionView("ns/solo/0", True, 2, (2,), (2,))]
    assert rollout.next_action(seen(draining=frozenset({2}), partitions=alone)) == Delete(2)


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
        assert isinstance(rollout.next_action(case), Wait), case


def test_a_deleted_pod_must_come_back_as_a_new_process_before_anything_else() -> None:
    pods = {**updated(2), 2: PodView(2, "new", True, False, uid="u-old")}
    waiting = seen(pods=pods, restarted={2: "u-old"})
    assert isinstance(rollout.next_action(waiting), Wait)  # the old pod, still listed
    pods[2] = PodView(2, "new", True, False, uid="u-new")
    stale = seen(pods=pods, restarted={2: "u-old"}, draining=frozenset({2}))
    assert isinstance(rollout.next_action(stale), Wait)  # the old process's heartbeat
    fresh = seen(pods=pods, restarted={2: "u-old"})
    assert rollout.back(fresh) == {2}


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
        api,
        api.body("BrokerCluster", "demo"),
        [api.body("Topic", "orders")],
        [],
        clock,
        fleet=fleet,
        events=events.append,
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
        api,
        api.body("BrokerCluster", "demo"),
        [api.body("Topic", "orders")],
        [],
        clock,
        fleet=fleet,
        events=events.append,
    )

    async def step() -> rollout.Action:
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
