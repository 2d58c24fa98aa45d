"""The reconcile step: a fake fleet of brokers on a fake clock, from creation through failures.

Every test drives ``reconcile`` the way the controller does: poll the fleet
(which answers from the state last pushed to it), reconcile, keep the new
state. Then random failure and recovery schedules check the invariants.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from control_fakes import FakeClock, Fleet, beat, info
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from headrace.control import reconcile as rc
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    ClusterState,
    DeletionRequest,
    PartitionState,
    PartitionStatus,
    TopicSpec,
)
from headrace.control.settings import ControlSettings
from headrace.control.topology import cluster_topology, snapshot
from headrace.protocol.coordination import NO_OWNER, ClusterTopology
from headrace.protocol.endpoints import BrokerEndpoint, KafkaAddress

ONLINE, ELECTING, OFFLINE = PartitionState.ONLINE, PartitionState.ELECTING, PartitionState.OFFLINE
SETTINGS = ControlSettings(liveness_ttl_ms=3_000, candidate_wait_ms=5_000, offline_retry_ms=30_000)
POLL = 1_000
T = "default/orders"


class Controller:
    """The controller loop, minus the I/O: poll, reconcile, keep the result."""

    def __init__(self, brokers: int = 3, specs: list[TopicSpec] | None = None) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(brokers, self.clock)
        self.specs = specs if specs is not None else [TopicSpec(T, 3, replicas=3, min_in_sync=2)]
        self.state = ClusterState()
        self.since = self.clock.now_ms
        self.decisions: list[rc.Decision] = []
        self.deletions: set[DeletionRequest] = set()

    def step(self, wait: int = POLL) -> rc.Decision:
        self.clock.advance(wait)
        heartbeats = self.fleet.poll(self.state)
        decision = rc.reconcile(
            rc.StepInputs(
                self.state,
                self.specs,
                heartbeats,
                self.clock.now_ms,
                SETTINGS,
                observing_since_ms=self.since,
                deletions=self.deletions,
            ),
        )
        assert decision.state.generation == self.state.generation + decision.changed
        self.state = decision.state
        self.decisions.append(decision)
        return decision

    def run(self, steps: int) -> list[rc.Decision]:
        return [self.step() for _ in range(steps)]

    def restart(self) -> None:
        """A new controller process: the persisted document, no heartbeats, a fresh start."""
        self.state = CLUSTER_STATE_JSON.load(
            json.loads(json.dumps(CLUSTER_STATE_JSON.dump(self.state)))
        )
        self.fleet.forget()
        self.since = self.clock.now_ms

    def partition(self, p: int, topic: str = T) -> PartitionStatus:
        return self.state.topics[topic].partitions[p]

    def kinds(self, since: int = 0) -> list[str]:
        return [e.kind for d in self.decisions[since:] for e in d.events]


def settled(brokers: int = 3, **kwargs: object) -> Controller:
    c = Controller(brokers, **kwargs)  # type: ignore[arg-type]
    c.run(3)
    return c


# --------------------------------------------------------------------------- creation


def test_first_step_registers_brokers_and_creates_the_topic() -> None:
    c = Controller()
    d = c.step()
    assert d.changed
    assert d.state.generation == 1
    assert d.state.brokers == {b: info(b) for b in range(3)}
    topic = d.state.topics[T]
    assert topic.partitioning_version == 1
    for p in topic.partitions:
        assert (p.state, p.leader, p.leader_epoch) == (ONLINE, p.replicas[0], 1)
        assert p.live_replicas == p.replicas
        assert sorted(p.replicas) == [0, 1, 2]
    assert sorted(p.leader for p in topic.partitions) == [0, 1, 2], "leaders spread"
    assert [e.kind for e in d.events] == ["BrokerRegistered"] * 3 + ["TopicCreated"]


def test_a_steady_cluster_never_bumps_the_generation() -> None:
    c = settled()
    generation = c.state.generation
    for d in c.run(30):  # offsets and receive times change on every poll
        assert not d.changed
        assert d.events == ()
    assert c.state.generation == generation


def test_the_same_inputs_twice_change_nothing() -> None:
    c = settled()
    c.fleet.brokers[0].up = False
    c.step(SETTINGS.liveness_ttl_ms + 1)
    heartbeats = dict(c.fleet.latest)
    again = rc.reconcile(
        rc.StepInputs(
            c.state, c.specs, heartbeats, c.clock.now_ms, SETTINGS, observing_since_ms=c.since
        )
    )
    assert not again.changed
    assert again.state == c.state


def test_too_few_brokers_is_a_problem_until_enough_arrive() -> None:
    c = Controller(brokers=3, specs=[TopicSpec(T, 2, replicas=3)])
    c.fleet.brokers[2].up = False
    c.clock.advance(SETTINGS.liveness_ttl_ms + 1)
    d = c.step()
    assert T not in d.state.topics
    assert [(p.reason, p.topic) for p in d.problems] == [("NotEnoughBrokers", T)]
    assert "3 replicas need 3 eligible brokers, 2 available" in d.problems[0].message
    c.fleet.brokers[2].up = True
    d = c.step()
    assert T in d.state.topics
    assert d.problems == ()


def test_draining_brokers_get_no_new_replicas() -> None:
    c = settled(specs=[])
    c.fleet.brokers[1].draining = True
    c.step()
    c.specs = [TopicSpec(T, 4, replicas=2)]
    d = c.step()
    assert all(1 not in p.replicas for p in d.state.topics[T].partitions)


# --------------------------------------------------------------------------- failures


def test_leader_failover_bumps_the_epoch_and_prefers_the_least_lag() -> None:
    c = settled()
    p0 = c.partition(0)
    dead = p0.leader
    assert dead is not None
    behind, ahead = (b for b in p0.replicas if b != dead)
    c.fleet.brokers[dead].up = False
    c.fleet.brokers[behind].log_end[(T, 0)] -= 5
    before = c.state.generation
    for _ in range(3):  # within the TTL the dead leader stays
        c.step()
        assert (c.partition(0).state, c.partition(0).leader) == (ONLINE, dead)
    d = c.step()
    p = c.partition(0)
    assert (p.state, p.candidate, p.leader_epoch) == (ELECTING, ahead, 2)
    assert ("LeaderLost", f"{T}/0") in [(e.kind, e.subject) for e in d.events]
    d = c.step()  # the candidate saw the push and promoted itself
    p = c.partition(0)
    assert (p.state, p.leader, p.leader_epoch) == (ONLINE, ahead, 2)
    assert ("LeaderElected", f"{T}/0") in [(e.kind, e.subject) for e in d.events]
    c.step()  # the new leader's LRS no longer lists the dead broker
    assert c.partition(0).live_replicas == tuple(b for b in p0.replicas if b != dead)
    assert c.state.generation > before
    assert c.state.topics[T].partitioning_version == 1, "the two counters are not conflated"


def test_a_returning_broker_rejoins_the_lrs_but_does_not_take_leadership_back() -> None:
    c = settled()
    dead = c.partition(0).leader
    assert dead is not None
    c.fleet.brokers[dead].up = False
    c.run(6)
    leader, epoch = c.partition(0).leader, c.partition(0).leader_epoch
    c.fleet.brokers[dead].up = True
    c.run(3)
    assert dead in c.partition(0).live_replicas
    assert (c.partition(0).leader, c.partition(0).leader_epoch) == (leader, epoch)


def test_a_candidate_that_never_promotes_is_replaced_after_the_wait() -> None:
    c = settled()
    dead = c.partition(0).leader
    assert dead is not None
    c.fleet.brokers[dead].up = False
    for b in c.fleet.brokers.values():
        b.promotes = False
    c.run(4)
    first = c.partition(0)
    assert first.state is ELECTING
    c.run(SETTINGS.candidate_wait_ms // POLL - 1)
    assert c.partition(0) == first
    c.step()
    second = c.partition(0)
    assert second.candidate not in (first.candidate, dead)
    assert second.leader_epoch == first.leader_epoch + 1
    assert second.tried == (first.candidate, second.candidate)
    c.fleet.brokers[second.candidate or 0].promotes = True
    c.step()
    assert (c.partition(0).state, c.partition(0).leader) == (ONLINE, second.candidate)


def test_all_in_sync_replicas_lost_goes_offline_and_recovers_when_one_returns() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.up = False
    c.run(5)
    for p in c.state.topics[T].partitions:
        assert (p.state, p.leader) == (OFFLINE, None)
    assert "PartitionsOffline" in [p.reason for p in c.decisions[-1].problems]
    epochs = [p.leader_epoch for p in c.state.topics[T].partitions]
    c.fleet.brokers[2].up = True
    c.run(2)
    for p, epoch in zip(c.state.topics[T].partitions, epochs, strict=True):
        assert (p.state, p.leader) == (ONLINE, 2)
        assert p.leader_epoch == epoch + 1


def test_no_unclean_election() -> None:
    c = Controller(brokers=3, specs=[TopicSpec(T, 1, replicas=3)])
    c.run(3)
    keep = c.partition(0).leader
    assert keep is not None
    others = [b for b in range(3) if b != keep]
    for b in others:  # the followers go, the leader shrinks the LRS to itself
        c.fleet.brokers[b].up = False
    c.run(5)
    assert c.partition(0).live_replicas == (keep,)
    c.fleet.brokers[keep].up = False
    for b in others:
        c.fleet.brokers[b].up = True
    c.run(10)
    assert c.partition(0).state is OFFLINE, "out-of-sync replicas are never elected"
    assert any(p.reason == "PartitionsOffline" for p in c.decisions[-1].problems)


def test_a_draining_leader_hands_off() -> None:
    c = settled()
    leader = c.partition(0).leader
    assert leader is not None
    c.fleet.brokers[leader].draining = True
    c.run(2)
    assert c.partition(0).state is ONLINE
    assert c.partition(0).leader != leader
    assert c.partition(0).leader_epoch == 2
    assert "LeaderDraining" in c.kinds()


def test_below_min_in_sync_is_reported() -> None:
    c = settled()
    c.fleet.brokers[0].up = False
    c.fleet.brokers[1].up = False
    c.run(8)
    assert any(p.reason == "BelowMinInSync" for p in c.decisions[-1].problems)


# --------------------------------------------------------------------------- restart


def test_a_restarted_controller_changes_nothing() -> None:
    c = settled()
    c.fleet.brokers[0].members[(T, "billing")] = {"m1", "m2"}
    c.fleet.brokers[1].members[(T, "billing")] = {"m2", "m3"}
    c.run(2)
    plan = c.state.topics[T].cohort_plans["billing"]
    before = c.state
    c.restart()
    for d in c.run(10):
        assert not d.changed
    assert c.state == before
    assert c.state.topics[T].cohort_plans["billing"] == plan


def test_a_restart_waits_for_unheard_brokers_before_deposing_their_leaders() -> None:
    c = settled()
    c.fleet.brokers[0].members[(T, "billing")] = {"m1"}
    c.run(2)
    before = c.state
    c.restart()
    c.fleet.brokers[0].up = False  # it went down while no controller was watching
    c.specs = [*c.specs, TopicSpec("default/late", 1)]
    d = c.step()
    assert d.liveness.unheard == {0}
    # no deposing, no placement, no replanning while warming up
    assert [p.leader for p in c.state.topics[T].partitions] == [
        p.leader for p in before.topics[T].partitions
    ]
    assert "default/late" not in c.state.topics
    assert ("default/late", "WaitingForBrokers") in [(p.topic, p.reason) for p in d.problems]
    assert c.state.topics[T].cohort_plans == before.topics[T].cohort_plans
    assert {e.kind for e in d.events} == {"LiveReplicasChanged"}, "leaders' news is still news"
    c.run(3)
    assert 0 in c.decisions[-1].liveness.dead
    assert all(p.leader != 0 for p in c.state.topics[T].partitions)
    assert "default/late" in c.state.topics
    assert c.state.topics[T].cohort_plans["billing"].assignment == {}


def test_a_restart_mid_election_carries_on() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.promotes = False
    c.fleet.brokers[0].up = False
    c.run(4)
    electing = c.state
    assert any(p.state is ELECTING for p in electing.topics[T].partitions)
    c.restart()
    assert c.step().state == electing
    c.run(SETTINGS.candidate_wait_ms // POLL)
    for before, after in zip(
        electing.topics[T].partitions, c.state.topics[T].partitions, strict=True
    ):
        if before.state is ELECTING:
            assert after.leader_epoch == before.leader_epoch + 1, "timed out, next candidate"


# --------------------------------------------------------------------------- topics and brokers


def test_a_topic_whose_deletion_is_requested_is_deleted() -> None:
    c = settled(specs=[TopicSpec(T, 1), TopicSpec("default/other", 1)])
    c.fleet.brokers[0].members[("default/other", "c")] = {"m"}
    c.step()
    generation = c.state.generation
    c.specs = [TopicSpec(T, 1)]
    c.deletions = {DeletionRequest("default/other", retain=False)}
    d = c.step()
    assert set(d.state.topics) == {T}
    assert d.state.generation == generation + 1
    assert ("TopicDeleted", "default/other") in [(e.kind, e.subject) for e in d.events]


def test_a_topic_no_spec_asks_for_is_kept_unless_its_deletion_is_requested() -> None:
    """Its Topic may name another cluster now, or a watch may have lost it: absence from
    the specs is never a deletion (the push without it would delete the brokers' copies)."""
    other = TopicSpec("default/other", 1, replicas=3, min_in_sync=2)
    c = settled(specs=[TopicSpec(T, 1), other])
    placed = c.state.topics["default/other"]
    c.specs = [TopicSpec(T, 1)]
    d = c.step()
    assert set(d.state.topics) == {T, "default/other"}
    assert d.state.topics["default/other"] == placed
    assert "TopicDeleted" not in [e.kind for e in d.events]
    assert [(p.topic, p.reason) for p in d.problems] == [("default/other", "TopicUnclaimed")]
    # its leader dies: it is still served (elections run), and still not deleted
    leader = c.partition(0, "default/other").leader
    assert leader is not None
    c.fleet.brokers[leader].up = False
    c.run(10)
    assert c.partition(0, "default/other").leader not in (None, leader)
    # a request for another topic changes nothing for it
    c.deletions = {DeletionRequest("default/third", retain=True)}
    assert "default/other" in c.step().state.topics
    # claimed again: it keeps its placement and loses the problem
    c.specs = [TopicSpec(T, 1), other]
    d = c.step()
    assert d.state.topics["default/other"].partitions[0].replicas == placed.partitions[0].replicas
    assert not [p for p in d.problems if p.reason == "TopicUnclaimed"]


def test_a_replica_change_is_a_problem_not_an_action() -> None:
    c = settled()
    before = c.state
    c.specs = [TopicSpec(T, 3, replicas=2)]
    d = c.step()
    assert not d.changed
    assert d.state == before
    assert {p.reason for p in d.problems} == {"ReplicasChange"}


def test_a_partition_count_edit_starts_a_repartition() -> None:
    c = settled()
    c.specs = [TopicSpec(T, 5, replicas=3, min_in_sync=2)]
    d = c.step()
    topic = d.state.topics[T]
    assert topic.transition is not None and topic.transition.request == "Topic.spec.partitions"
    assert (len(topic.partitions), topic.partitioning_version) == (5, 2)
    assert "Repartitioning" in {p.reason for p in d.problems}


def test_a_duplicate_spec_is_a_problem_and_the_first_wins() -> None:
    c = Controller(specs=[TopicSpec(T, 1), TopicSpec(T, 2)])
    d = c.step()
    assert len(d.state.topics[T].partitions) == 1
    assert [p.reason for p in d.problems] == ["DuplicateSpec"]


def test_a_new_address_is_a_committed_change() -> None:
    c = settled()
    moved = BrokerEndpoint(1, "10.9.9.9", 9092, 9644)
    heartbeats = c.fleet.poll(c.state)
    heartbeats[1] = replace(heartbeats[1], broker=moved)
    d = rc.reconcile(
        rc.StepInputs(
            c.state, c.specs, heartbeats, c.clock.now_ms, SETTINGS, observing_since_ms=c.since
        )
    )
    assert d.changed
    assert d.state.brokers[1] == moved
    assert [e.kind for e in d.events] == ["BrokerAddressChanged"]


def test_a_kafka_listener_in_a_heartbeat_is_committed_and_pushed() -> None:
    c = settled()
    listening = BrokerEndpoint(1, "h1", 9092, 9644, KafkaAddress("h1", 9093))
    heartbeats = c.fleet.poll(c.state)
    heartbeats[1] = replace(
        heartbeats[1], broker=replace(heartbeats[1].broker, kafka=listening.kafka)
    )
    d = rc.reconcile(
        rc.StepInputs(
            c.state, c.specs, heartbeats, c.clock.now_ms, SETTINGS, observing_since_ms=c.since
        )
    )
    assert d.changed and d.state.generation == c.state.generation + 1
    assert d.state.brokers[1].kafka == KafkaAddress("h1", 9093)
    pushed = cluster_topology(d.state, "local")
    assert pushed.broker(1) is not None and pushed.broker(1).kafka == KafkaAddress("h1", 9093)  # type: ignore[union-attr]
    assert pushed.broker(0) is not None and pushed.broker(0).kafka is None  # type: ignore[union-attr]


def test_a_heartbeat_filed_under_the_wrong_id_is_a_bug() -> None:
    with pytest.raises(ValueError, match="filed under"):
        rc.reconcile(
            rc.StepInputs(ClusterState(), [], {1: beat(2, 0)}, 0, SETTINGS, observing_since_ms=0)
        )


def test_the_adoption_floor_counts_live_brokers_only() -> None:
    c = settled()
    c.fleet.brokers[0].adoption = 1
    c.fleet.brokers[1].adoption = 4
    assert c.step().adoption_floor == 1
    c.fleet.brokers[0].up = False
    c.run(3)
    assert c.step().adoption_floor == 4


def test_grow_topic_bumps_the_partitioning_version_and_keeps_partitions() -> None:
    c = settled(specs=[TopicSpec(T, 2, replicas=2)])
    topic = c.state.topics[T]
    grown = rc.grow_topic(topic, 4, [0, 1, 2])
    assert grown.partitioning_version == topic.partitioning_version + 1
    assert grown.partitions[:2] == topic.partitions
    assert [p.leader_epoch for p in grown.partitions[2:]] == [1, 1]
    with pytest.raises(ValueError, match="already has"):
        rc.grow_topic(topic, 2, [0, 1, 2])
    c.state = replace(c.state, topics={T: grown})
    c.specs = [TopicSpec(T, 4, replicas=2)]
    d = c.step()
    assert d.problems == ()


def test_cohort_plans_follow_members_and_bump_only_on_change() -> None:
    c = settled()
    c.fleet.brokers[0].members[(T, "c")] = {"a"}
    c.fleet.brokers[1].members[(T, "c")] = {"a"}
    c.fleet.brokers[2].members[(T, "c")] = {"a"}
    c.step()
    plan = c.state.topics[T].cohort_plans["c"]
    assert (plan.generation, dict(plan.assignment)) == (1, {"a": (0, 1, 2)})
    c.run(3)
    assert c.state.topics[T].cohort_plans["c"] == plan
    for b in c.fleet.brokers.values():
        b.members[(T, "c")] = {"a", "b"}
    d = c.step()
    plan2 = d.state.topics[T].cohort_plans["c"]
    assert plan2.generation == 2
    assert set(plan2.assignment["a"]) < set(plan.assignment["a"]), "a keeps what it can"
    assert "PlanChanged" in [e.kind for e in d.events]


def test_a_cohort_with_no_member_on_a_leader_names_those_partitions() -> None:
    c = settled()
    leaders = {p.partition: p.leader for p in c.state.topics[T].partitions}
    c.fleet.brokers[1].members[(T, "c")] = {"a", "b"}
    d = c.step()
    missing = dict(d.uncovered[f"{T}:c"])
    assert missing, "the partitions brokers 0 and 2 lead have no member"
    assert missing == {
        b: sorted(p for p, leader in leaders.items() if leader == b)
        for b in sorted({leader for leader in leaders.values() if leader != 1})
    }
    for b in c.fleet.brokers.values():
        b.members[(T, "c")] = {"a"}
    assert c.step().uncovered == {}, "a member on every leader: nothing uncovered"
    for b in c.fleet.brokers.values():
        b.members.pop((T, "c"))
    assert c.step().uncovered == {}, "a cohort nobody consumes is not stuck"


def test_topology_snapshot_routes_to_leaders_or_candidates() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.promotes = False
    dead = c.partition(0).leader
    assert dead is not None
    c.fleet.brokers[dead].up = False
    c.run(4)
    snap = snapshot(c.state, "cluster-a")
    assert snap.generation == c.state.generation
    assert [b.id for b in snap.brokers] == [0, 1, 2]
    (route,) = snap.topics
    assert route.partitioning_version == 1
    assert route.owners == [
        p.leader if p.leader is not None else (p.candidate if p.candidate is not None else NO_OWNER)
        for p in c.state.topics[T].partitions
    ]
    assert route.owners[0] == c.partition(0).candidate
    assert route.epochs == [p.leader_epoch for p in c.state.topics[T].partitions]


def test_the_pushed_topology_is_the_client_snapshot_and_names_no_dead_replica() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.promotes = False
    dead = c.partition(0).leader
    assert dead is not None
    c.fleet.brokers[dead].up = False
    d = c.run(4)[-1]
    pushed = cluster_topology(
        c.state, "cluster-a", live=d.liveness.live, min_in_sync={T: 2}, configs={T: {"tiered": 0}}
    )
    assert ClusterTopology.from_json(pushed.to_json()) == pushed
    assert pushed.client_snapshot() == snapshot(c.state, "cluster-a")
    (topic,) = pushed.topics
    assert (topic.min_in_sync, topic.config) == (2, {"tiered": 0})
    assert [a.leader for a in topic.assignments] == [p.owner for p in c.state.topics[T].partitions]
    # the state still lists the dead leader in partition 0's LRS; the push must not
    assert dead in c.partition(0).live_replicas
    assert all(dead not in a.lrs for a in topic.assignments)
    assert any(dead in a.replicas for a in topic.assignments)


# --------------------------------------------------------------------------- random schedules


brokers = st.integers(0, 3)
waits = st.sampled_from([0, POLL, POLL, POLL, POLL, 4_000, 6_000, 31_000])


class Failures(RuleBasedStateMachine):
    """Brokers crash, return, drain, stall and move members; the controller restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.c = Controller(
            brokers=4,
            specs=[TopicSpec(T, 4, replicas=3, min_in_sync=2), TopicSpec("default/b", 2)],
        )
        self.c.run(2)
        self.epochs = self._epochs()

    def _epochs(self) -> dict[tuple[str, int], int]:
        return {
            (t.name, p.partition): p.leader_epoch
            for t in self.c.state.topics.values()
            for p in t.partitions
        }

    # every action is followed by a poll and a reconcile after ``wait`` ms

    @rule(b=brokers, wait=waits)
    def crash(self, b: int, wait: int) -> None:
        self.c.fleet.brokers[b].up = False
        self.step(wait)

    @rule(b=brokers, wait=waits)
    def come_back(self, b: int, wait: int) -> None:
        self.c.fleet.brokers[b].up = True
        self.step(wait)

    @rule(b=brokers, flag=st.booleans(), wait=waits)
    def drain(self, b: int, flag: bool, wait: int) -> None:
        self.c.fleet.brokers[b].draining = flag
        self.step(wait)

    @rule(b=brokers, flag=st.booleans(), wait=waits)
    def stall(self, b: int, flag: bool, wait: int) -> None:
        self.c.fleet.brokers[b].promotes = not flag
        self.step(wait)

    @rule(b=brokers, members=st.sets(st.sampled_from(["m1", "m2", "m3"])), wait=waits)
    def members(self, b: int, members: set[str], wait: int) -> None:
        self.c.fleet.brokers[b].members[(T, "c")] = members
        self.step(wait)

    @rule(wait=waits)
    def restart(self, wait: int) -> None:
        self.c.restart()
        self.step(wait)

    @rule(wait=waits)
    def tick(self, wait: int) -> None:
        self.step(wait)

    def step(self, wait: int) -> None:
        before = self.c.state
        d = self.c.step(wait)
        for e in d.events:
            event(e.kind)
        live = d.liveness.live
        for t in d.state.topics.values():
            for p in t.partitions:
                old = before.topics[t.name].partitions[p.partition]
                if p.leader is not None and p.leader != old.leader:
                    assert p.leader in live, "only a live broker becomes leader"
                    assert p.leader in p.live_replicas, "only an LRS member becomes leader"
                if p.owner is not None and p.owner != old.owner and p.leader != old.candidate:
                    assert p.leader_epoch > old.leader_epoch
        # the same inputs again: no change, no bump
        again = rc.reconcile(
            rc.StepInputs(
                d.state,
                self.c.specs,
                dict(self.c.fleet.latest),
                self.c.clock.now_ms,
                SETTINGS,
                observing_since_ms=self.c.since,
            ),
        )
        assert not again.changed
        assert again.state == d.state
        assert d.changed == (not d.state.same_content(before))

    @invariant()
    def epochs_never_go_back(self) -> None:
        now = self._epochs()
        for key, epoch in now.items():
            assert epoch >= self.epochs.get(key, 0)
        self.epochs = now

    @invariant()
    def leaders_are_lrs_members_and_not_dead(self) -> None:
        decision = self.c.decisions[-1]
        for t in self.c.state.topics.values():
            assert t.partitioning_version == 1
            for p in t.partitions:
                assert set(p.live_replicas) <= set(p.replicas)
                if p.state is ONLINE:
                    assert p.leader in p.live_replicas
                    assert p.leader not in decision.liveness.dead
                else:
                    assert p.leader is None


TestFailures = Failures.TestCase
TestFailures.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
