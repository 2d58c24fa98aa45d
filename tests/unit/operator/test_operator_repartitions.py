"""Repartitions through the operator, over a fake API and a scripted fleet (no control plane).

The transition itself is the core's (``tests/unit/control/test_control_repartitions.py``);
these pin what the operator adds: a Repartition of one of the cluster's Topics reaches
its loop and its status lands on the CR; an edit of ``Topic.spec.partitions`` starts the
same transition instead of being refused; a second request waits; a restarted runtime
resumes from CR status with one version bump; a deleted Repartition leaves the loop and
its transition rolls forward; a Repartition of a missing Topic is failed by the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from operator_fakes import CLUSTER, FakeApi, topic

from headrace.control.model import SPEC_EDIT
from headrace.operator import bodies, handlers, repartition_owners
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet


def repartition(name: str, topic_name: str, partitions: int) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Repartition",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "generation": 1,
            "creationTimestamp": f"2026-01-01T00:00:0{len(name) % 10}Z",
        },
        "spec": {
            "topicRef": {"name": topic_name},
            "partitions": partitions,
            "adoptionTimeoutSeconds": 5,
        },
    }


class Runner:
    """A runtime over ``api``, synced from the API's objects before every step (as kopf's
    indices feed it)."""

    def __init__(self, api: FakeApi, clock: ManualClock, fleet: ScriptedFleet | None = None):
        self.api = api
        self.clock = clock
        self.fleet = fleet or ScriptedFleet(
            tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), clock
        )
        self.runtime = ClusterRuntime(
            DesiredObjects(
                api.body("BrokerCluster", "demo"),
                self.of("Topic"),
                [],
                repartitions=self.of("Repartition"),
            ),
            ClusterPorts(api, clock, fleet=self.fleet),
        )

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [self.api.body(kind, ref.name) for ref in list(self.api.objects) if ref.kind == kind]

    async def steps(self, count: int = 4) -> None:
        for _ in range(count):
            self.runtime.sync(
                self.api.body("BrokerCluster", "demo"),
                self.of("Topic"),
                [],
                self.of("Repartition"),
            )
            await self.runtime.step()
            self.clock.advance(100)


def status(api: FakeApi, kind: str, name: str) -> dict[str, Any]:
    return dict(api.body(kind, name).get("status") or {})


def ready(doc: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in doc["conditions"] if c["type"] == "Ready")


async def test_a_repartition_cuts_over_and_a_second_one_of_the_topic_waits() -> None:
    api = FakeApi(CLUSTER, topic())
    runner = Runner(api, ManualClock())
    await runner.steps(6)
    api.put(repartition("grow", "orders", 4))
    await runner.steps(4)
    grow = status(api, "Repartition", "grow")
    assert grow["phase"] in ("CuttingOver", "Draining")
    assert (grow["fromPartitions"], grow["toPartitions"]) == (2, 4)
    assert (grow["fromVersion"], grow["toVersion"]) == (1, 2)
    assert ready(grow)["reason"] == grow["phase"]
    orders = status(api, "Topic", "orders")
    assert orders["partitioningVersion"] == 2 and len(orders["partitions"]) == 4
    assert orders["transition"]["request"] == "ns/grow"
    assert (ready(orders)["status"], ready(orders)["reason"]) == ("False", "Repartitioning")
    assert all(c["type"] != "Stalled" for c in orders["conditions"])  # waiting fixes it

    api.put(repartition("again", "orders", 6))
    await runner.steps(2)
    again = status(api, "Repartition", "again")
    assert again["phase"] == "Pending"
    assert "waiting: ns/grow is repartitioning ns/orders" in ready(again)["message"]
    assert status(api, "Topic", "orders")["partitioningVersion"] == 2


async def test_bad_repartitions_fail_with_a_reason_and_change_nothing() -> None:
    api = FakeApi(CLUSTER, topic())
    runner = Runner(api, ManualClock())
    await runner.steps(6)
    api.put(repartition("same", "orders", 2))
    await runner.steps(2)
    same = status(api, "Repartition", "same")
    assert same["phase"] == "Failed"
    assert (ready(same)["status"], ready(same)["reason"]) == ("False", "Failed")
    assert "topic ns/orders already has 2 partitions" in ready(same)["message"]
    assert status(api, "Topic", "orders")["partitioningVersion"] == 1


async def test_a_topic_spec_partitions_edit_starts_the_same_transition() -> None:
    api = FakeApi(CLUSTER, topic())
    runner = Runner(api, ManualClock())
    await runner.steps(6)
    assert status(api, "Topic", "orders")["specPartitions"] == 2
    edited = api.body("Topic", "orders")
    edited["spec"]["partitions"] = 3
    edited["metadata"]["generation"] = 2
    api.put(edited)
    await runner.steps(3)
    orders = status(api, "Topic", "orders")
    assert orders["transition"]["request"] == SPEC_EDIT
    assert (orders["transition"]["fromPartitions"], orders["transition"]["toPartitions"]) == (2, 3)
    assert orders["partitioningVersion"] == 2 and orders["specPartitions"] == 3
    assert ready(orders)["reason"] == "Repartitioning"
    assert ready(orders)["observedGeneration"] == 2
    assert all(c["type"] != "Stalled" for c in orders["conditions"])


async def test_a_restarted_runtime_resumes_from_cr_status_without_a_second_bump() -> None:
    api = FakeApi(CLUSTER, topic())
    clock = ManualClock()
    first = Runner(api, clock)
    await first.steps(6)
    api.put(repartition("grow", "orders", 4))
    await first.steps(3)
    assert status(api, "Topic", "orders")["partitioningVersion"] == 2
    # a new operator: everything it knows comes from the CRs (its watch cache)
    second = Runner(api, clock, first.fleet)
    assert second.runtime.loop.repartition_progress["ns/grow"].in_flight
    await second.steps(8)
    orders = status(api, "Topic", "orders")
    assert orders["partitioningVersion"] == 2 and orders["transition"]["toVersion"] == 2
    assert status(api, "Repartition", "grow")["toVersion"] == 2


async def test_a_deleted_repartition_leaves_the_loop_and_its_transition_rolls_forward() -> None:
    api = FakeApi(CLUSTER, topic())
    runner = Runner(api, ManualClock())
    await runner.steps(6)
    api.put(repartition("grow", "orders", 4))
    await runner.steps(3)
    del api.objects[next(r for r in api.objects if r.kind == "Repartition")]
    await runner.steps(2)
    assert runner.runtime.loop.repartitions == {}
    orders = status(api, "Topic", "orders")
    assert orders["transition"]["request"] == "ns/grow"  # the marker carries it on
    assert orders["partitioningVersion"] == 2


async def test_repartitions_of_other_clusters_topics_are_not_this_loops() -> None:
    api = FakeApi(CLUSTER, topic(), repartition("elsewhere", "other", 4))
    runner = Runner(api, ManualClock())
    await runner.steps(2)
    assert runner.runtime.loop.repartitions == {}
    assert "status" not in api.body("Repartition", "elsewhere")


async def test_one_failed_before_its_topic_existed_stays_failed() -> None:
    api = FakeApi(CLUSTER, topic())
    early = repartition("early", "orders", 4)
    early["status"] = {"phase": "Failed", "conditions": []}
    api.put(early)
    runner = Runner(api, ManualClock())
    await runner.steps(6)
    assert status(api, "Repartition", "early")["phase"] == "Failed"
    assert status(api, "Topic", "orders")["partitioningVersion"] == 1


def memo_over(api: FakeApi) -> Any:
    return SimpleNamespace(context=handlers.OperatorContext(api=api, clock=ManualClock()))


async def test_a_repartition_of_a_missing_topic_is_failed_once_by_the_handler() -> None:
    api = FakeApi(CLUSTER, repartition("lost", "nowhere", 4))
    memo = memo_over(api)
    for _ in range(3):  # every event after the write brings the handler back
        body = api.body("Repartition", "lost")
        await handlers.repartition_changed(
            namespace="ns", body=body, memo=memo, type="MODIFIED", topics_index={}
        )
    assert api.writes == [("PUT status", "Repartition", "lost")]
    lost = status(api, "Repartition", "lost")
    assert lost["phase"] == "Failed"
    assert (ready(lost)["status"], ready(lost)["reason"]) == ("False", "Failed")
    assert ready(lost)["message"] == "topic ns/nowhere does not exist"


async def test_a_repartition_of_a_topic_the_index_lags_behind_is_left_to_its_loop() -> None:
    api = FakeApi(CLUSTER, topic(), repartition("grow", "orders", 4))
    memo = memo_over(api)
    body = api.body("Repartition", "grow")
    await handlers.repartition_changed(
        namespace="ns", body=body, memo=memo, type="ADDED", topics_index={}
    )
    indexed = {("ns", "demo"): [api.body("Topic", "orders")]}
    await handlers.repartition_changed(
        namespace="ns", body=body, memo=memo, type="ADDED", topics_index=indexed
    )
    assert api.writes == []


async def test_a_repartition_of_a_topic_whose_cluster_is_missing_waits_for_it() -> None:
    orphan = topic()
    orphan["spec"]["clusterRef"]["name"] = "absent"
    api = FakeApi(CLUSTER, orphan, repartition("grow", "orders", 4))
    memo = memo_over(api)
    indices = {
        "topics_index": {("ns", "absent"): [api.body("Topic", "orders")]},
        "clusters_index": {("ns", "demo"): [CLUSTER]},
    }
    for _ in range(2):
        body = api.body("Repartition", "grow")
        await handlers.repartition_changed(
            namespace="ns", body=body, memo=memo, type="MODIFIED", **indices
        )
    assert api.writes == [("PUT status", "Repartition", "grow")]
    grow = status(api, "Repartition", "grow")
    assert grow["phase"] == "Pending"
    assert ready(grow)["message"] == (
        "waiting: BrokerCluster 'absent' of topic ns/orders does not exist"
    )
    # ... and once the cluster exists, its loop serves it as a new request
    api.put({**CLUSTER, "metadata": {**CLUSTER["metadata"], "name": "absent"}})
    indices["clusters_index"][("ns", "absent")] = [api.body("BrokerCluster", "absent")]
    await handlers.repartition_changed(
        namespace="ns", body=api.body("Repartition", "grow"), memo=memo, **indices
    )
    assert len(api.writes) == 1


async def test_one_told_to_wait_for_its_cluster_runs_once_the_cluster_loop_adopts_it() -> None:
    waiting = repartition("grow", "orders", 4)
    waiting["status"] = repartition_owners.missing_cluster_status(
        bodies.parse_repartition(waiting), "demo", 0
    )
    api = FakeApi(CLUSTER, topic(), waiting)
    runner = Runner(api, ManualClock())
    await runner.steps(8)
    grow = status(api, "Repartition", "grow")
    assert grow["phase"] in ("CuttingOver", "Draining")
    assert status(api, "Topic", "orders")["partitioningVersion"] == 2


async def test_the_daemon_sees_repartitions_indexed_after_it_started() -> None:
    api = FakeApi(CLUSTER, topic())
    memo = memo_over(api)
    repartitions: dict[str, list[dict[str, Any]]] = {}  # empty, as kopf's index may start
    task = asyncio.create_task(
        handlers.cluster_loop(
            namespace="ns",
            name="demo",
            memo=memo,
            clusters_index={("ns", "demo"): [api.body("BrokerCluster", "demo")]},
            topics_index={("ns", "demo"): [api.body("Topic", "orders")]},
            unloads_index={},
            repartitions_index=repartitions,
        )
    )

    async def served() -> None:
        while ("ns", "demo") not in memo.context.loops:
            await asyncio.sleep(0.01)
        runtime = memo.context.loops[("ns", "demo")]
        repartitions["ns"] = [repartition("grow", "orders", 4)]
        runtime.kick()
        while "ns/grow" not in runtime.loop.repartitions:
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(served(), 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
