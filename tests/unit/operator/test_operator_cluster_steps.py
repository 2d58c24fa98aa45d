"""The named steps of a cluster's loop (``running.STEPS``), each run alone on a fake API.

The whole pipeline is covered by the runtime's tests; these pin that a step can be run
by itself, given the ``Round`` the steps before it would have filled in.
"""

from __future__ import annotations

from typing import Any

from operator_fakes import CLUSTER, FakeApi, topic

from headrace.operator import running
from headrace.operator.conditions import PAUSED_ANNOTATION, WorkloadOutcome
from headrace.operator.running import (
    ClusterPorts,
    ClusterRuntime,
    DesiredObjects,
    Round,
    WorkloadLink,
)
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet

NOW = "2026-01-01T00:00:00Z"


def runtime_over(api: FakeApi, workload: WorkloadLink | None = None) -> ClusterRuntime:
    clock = ManualClock()
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
    )
    return ClusterRuntime(
        DesiredObjects(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")]),
        ClusterPorts(api, clock, fleet=fleet),
        workload=workload,
    )


def held_by(broker: int) -> list[dict[str, Any]]:
    """Topic statuses as ``step_loop`` leaves them: one partition on ``broker`` and 0."""
    return [{"name": "ns/orders", "partitions": [{"partition": 0, "replicas": [0, broker]}]}]


async def test_membership_is_the_statefulsets_ordinals() -> None:
    api = FakeApi({**CLUSTER, "spec": {**CLUSTER["spec"], "replicas": 5}}, topic())
    runtime = runtime_over(api)
    found = Round(NOW)
    await running.set_membership(runtime, found)
    assert found.members == frozenset(range(5))
    assert runtime.loop.members is None, "the loop takes it with the rest, at its step"


async def test_a_broker_that_holds_a_replica_is_kept_and_the_workload_applied_again() -> None:
    api = FakeApi(CLUSTER, topic())
    applied: list[list[dict[str, Any]]] = []

    async def reapply(statuses: list[dict[str, Any]]) -> None:
        applied.append(statuses)

    runtime = runtime_over(api, WorkloadLink(reapply=reapply))
    found = Round(NOW, statuses=held_by(3))
    await running.resize_workload(runtime, found)
    assert runtime.blockers == {3: ["ns/orders/0"]}
    assert applied == [found.statuses]

    await running.resize_workload(runtime, found)
    assert len(applied) == 1, "the same brokers to keep: no second apply"


async def test_a_statefulset_applied_larger_than_needed_is_applied_again() -> None:
    api = FakeApi(CLUSTER, topic())
    applied: list[list[dict[str, Any]]] = []

    async def reapply(statuses: list[dict[str, Any]]) -> None:
        applied.append(statuses)

    outcome = WorkloadOutcome(applied=1, replicas=5)
    runtime = runtime_over(api, WorkloadLink(reapply=reapply, outcome=lambda: outcome))
    await running.resize_workload(runtime, Round(NOW, statuses=held_by(1)))
    assert runtime.blockers == {}
    assert len(applied) == 1, "5 pods applied, 3 needed: the StatefulSet shrinks"


async def test_a_cluster_without_an_object_store_has_no_store_health() -> None:
    api = FakeApi(CLUSTER, topic())
    runtime = runtime_over(api)
    found = Round(NOW)
    await running.check_object_store(runtime, found)
    assert found.store is None


async def test_a_paused_cluster_writes_its_paused_condition_only() -> None:
    paused = {**CLUSTER, "metadata": {**CLUSTER["metadata"], "annotations": {}}}
    paused["metadata"]["annotations"][PAUSED_ANNOTATION] = "true"
    api = FakeApi(paused, topic())
    runtime = runtime_over(api)
    await running.write_paused_status(runtime, Round(NOW))
    conditions = api.body("BrokerCluster", "demo")["status"]["conditions"]
    assert [(c["type"], c["status"]) for c in conditions] == [("Paused", "True")]
