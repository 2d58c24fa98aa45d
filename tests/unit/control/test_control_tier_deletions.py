"""A deleted topic's objects: the record the core keeps until a broker reports them removed.

Driven as ``test_control_reconcile`` drives the step: a fake fleet on a fake clock,
which answers from the state last pushed to it. A fake broker with an object store
removes what the pushed state asks of it at once and reports it on its next poll.
"""

from __future__ import annotations

import json

import pytest
from control_fakes import FakeClock, Fleet

from headrace.control import documents
from headrace.control import reconcile as rc
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    ClusterState,
    DeletedIncarnation,
    DeletionRequest,
    TopicSpec,
)
from headrace.control.settings import ControlSettings
from headrace.control.topology import cluster_topology
from headrace.protocol.coordination import ClusterTopology, IncarnationRemoval

SETTINGS = ControlSettings(liveness_ttl_ms=3_000, candidate_wait_ms=5_000, offline_retry_ms=30_000)
T = "default/orders"
UID = "0b7c-uid"


class Controller:
    """The controller loop, minus the I/O: poll, reconcile, keep the result."""

    def __init__(self, brokers: int = 3, *, store: bool | None = True) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(brokers, self.clock)
        for b in self.fleet.brokers.values():
            b.object_store = store
        self.specs = [TopicSpec(T, 3, replicas=2, creation_id=UID)]
        self.state = ClusterState()
        self.since = self.clock.now_ms
        self.deletions: set[DeletionRequest] = set()
        self.events: list[rc.Event] = []

    def step(self) -> rc.Decision:
        self.clock.advance(1_000)
        decision = rc.reconcile(
            rc.StepInputs(
                self.state,
                self.specs,
                self.fleet.poll(self.state),
                self.clock.now_ms,
                SETTINGS,
                observing_since_ms=self.since,
                deletions=self.deletions,
            )
        )
        self.state = decision.state
        self.events.extend(decision.events)
        return decision

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def delete(self, *, retain: bool = False) -> rc.Decision:
        self.specs = []
        self.deletions = {DeletionRequest(T, retain=retain)}
        return self.step()

    def restart(self) -> None:
        """A new controller process: the persisted documents, no heartbeats."""
        cluster = json.loads(json.dumps(documents.cluster_status(self.state)))
        self.state = documents.restore(cluster, {}).state
        self.fleet.forget()
        self.since = self.clock.now_ms

    @property
    def record(self) -> DeletedIncarnation | None:
        return self.state.deleted.get(UID)


def settled(brokers: int = 3, **kwargs: bool | None) -> Controller:
    c = Controller(brokers, **kwargs)
    c.run(3)
    assert T in c.state.topics
    return c


def test_a_deletion_with_its_data_records_the_incarnation() -> None:
    c = settled()
    d = c.delete()
    assert T not in d.state.topics
    assert d.state.deleted == {
        UID: DeletedIncarnation(T, UID, 3, deleted_generation=d.state.generation)
    }, "no broker yet: the brokers have not applied the deleting generation"
    assert cluster_topology(d.state, "c").removals == []


def test_no_record_for_retain_nor_for_the_legacy_layout() -> None:
    c = settled()
    assert c.delete(retain=True).state.deleted == {}
    legacy = settled()
    legacy.specs = [TopicSpec(T, 3, replicas=2)]  # placed without a creation id
    legacy.state = ClusterState()
    legacy.run(3)
    assert legacy.delete().state.deleted == {}


def test_the_lowest_live_broker_with_a_store_is_asked_once_the_delete_is_applied() -> None:
    c = settled()
    c.fleet.brokers[0].up = False
    c.fleet.brokers[1].object_store = False
    c.run(5)  # broker 0 is dead now
    c.fleet.brokers[2].removes = False
    c.delete()
    c.step()
    assert c.record is not None and c.record.broker == 2
    assert ("TopicObjectsRemoving", f"{T}@{UID}") in [(e.kind, e.subject) for e in c.events]
    pushed = ClusterTopology.from_json(cluster_topology(c.state, "c").to_json())
    assert pushed.removals == [IncarnationRemoval(T, UID, 3, 2)]
    generation = c.state.generation
    c.run(5)
    assert c.record.broker == 2 and c.state.generation == generation, "asked once, kept"


def test_a_broker_that_dies_is_replaced_and_a_report_drops_the_record() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.removes = False
    c.delete()
    c.step()
    assert c.record is not None and c.record.broker == 0
    c.fleet.brokers[0].up = False
    for _ in range(10):
        c.step()
        if c.record is not None and c.record.broker not in (0, None):
            break
    assert c.record is not None and c.record.broker == 1
    c.fleet.brokers[1].removes = True
    c.run(2)
    assert c.record is None
    assert ("TopicObjectsRemoved", f"{T}@{UID}") in [(e.kind, e.subject) for e in c.events]
    assert cluster_topology(c.state, "c").removals == []


def test_the_record_survives_a_controller_restart_and_waits_out_the_warm_up() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.removes = False
    c.delete()
    c.step()
    before = c.record
    assert before is not None and before.broker == 0
    c.fleet.brokers[0].up = False
    c.restart()
    assert c.record == before, "persisted in the cluster document"
    d = c.step()  # broker 0 unheard: warming up, the record is left as it is
    assert d.liveness.warming_up and c.record == before
    c.run(5)
    assert c.record is not None and c.record.broker == 1


def test_brokers_from_before_the_field_are_never_asked_and_the_record_stays() -> None:
    c = settled(store=None)
    c.delete()
    c.run(5)
    assert c.record is not None and c.record.broker is None


def test_a_cluster_without_an_object_store_drops_the_record() -> None:
    c = settled(store=False)
    c.delete()
    c.step()
    assert c.record is None
    assert "TopicObjectsNotStored" in [e.kind for e in c.events]


def test_a_topic_created_again_under_its_name_keeps_the_old_record_apart() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.removes = False
    c.delete()
    c.specs, c.deletions = [TopicSpec(T, 1, creation_id="second")], set()
    c.run(2)
    assert c.state.topics[T].creation_id == "second"
    assert c.record is not None and c.record.broker is not None
    assert set(c.state.deleted) == {UID}


@pytest.mark.parametrize("deleted", [{}, {UID: DeletedIncarnation(T, UID, 3, 7, 1)}])
def test_the_cluster_document_keeps_the_records(deleted: dict[str, DeletedIncarnation]) -> None:
    state = ClusterState(9, {}, {}, deleted)
    cluster = documents.cluster_status(state)
    assert ("deletedTopics" in cluster) == bool(deleted)
    assert documents.restore(cluster, {}).state == state
    assert CLUSTER_STATE_JSON.load(json.loads(json.dumps(CLUSTER_STATE_JSON.dump(state)))) == state


def test_a_cluster_document_from_before_the_records_loads() -> None:
    older = {"topologyGeneration": 4, "topics": [], "brokers": []}
    assert documents.restore(older, {}).state == ClusterState(4)
    assert CLUSTER_STATE_JSON.load({"generation": 4, "brokers": [], "topics": []}) == ClusterState(
        4
    )
