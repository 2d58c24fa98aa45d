"""The repartition state machine, driven through ``reconcile`` with a fake fleet and clock.

The fleet (``control_fakes.Fleet``) answers from the state last pushed; this
test adds what the repartition needs of a real broker: a leader records its
cutover offset (its log end when it first reports under a new partitioning
version), a follower copies its leader's with the records it copies, a new
leader keeps the copy it holds for the current version (capped at its log end)
and takes its own log end only without one (``Placer._lead``), and a cohort's
cursors, which the test moves by hand.
"""

from __future__ import annotations

import json
from dataclasses import replace

from control_fakes import FakeClock, Fleet
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.control import reconcile as rc
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    ClusterState,
    FinalizedBy,
    RepartitionPhase,
    RepartitionProgress,
    RepartitionRequest,
    TopicSpec,
    UnloadRequest,
)
from headrace.control.settings import ControlSettings
from headrace.control.topology import cluster_topology
from headrace.protocol.coordination import Heartbeat

SETTINGS = ControlSettings(liveness_ttl_ms=3_000, repartition_adoption_timeout_ms=10_000)
POLL = 1_000
T = "default/orders"
COHORT = "billing"
PHASE = RepartitionPhase


class Cluster:
    """The controller loop minus I/O, with brokers that record cutovers and a cohort."""

    def __init__(self, partitions: int = 4, brokers: int = 3, replicas: int = 1) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(brokers, self.clock)
        self.specs = [TopicSpec(T, partitions, replicas=replicas)]
        self.state = ClusterState()
        self.since = self.clock.now_ms
        self.requests: list[RepartitionRequest] = []
        self.unloads: list[UnloadRequest] = []
        self.progress: dict[str, RepartitionProgress] = {}
        #: (broker, topic, partition) -> (version, offset) that copy holds: its own as
        #: leader, its leader's as follower (copied with the records, as replica fetch
        #: answers carry it)
        self.cutovers: dict[tuple[int, str, int], tuple[int, int]] = {}
        #: partition -> the cohort's cursor; None: it keeps up with the log end
        self.cursor: dict[int, int] | None = None
        self.bumps: list[int] = []
        self.decisions: list[rc.Decision] = []
        #: the brokers the cluster should have (None: not said)
        self.members: frozenset[int] | None = None
        #: brokers whose heartbeats no longer reach the controller (they still append and
        #: their followers still copy): it keeps the last one it heard
        self.unheard: set[int] = set()
        self._heard: dict[int, Heartbeat] = {}

    def _heartbeats(self) -> dict[int, Heartbeat]:
        beats = self.fleet.poll(self.state)
        out = {}
        for b, hb in beats.items():
            if hb.received_ms != self.clock.now_ms:
                out[b] = hb  # a stale one, as the controller keeps it
                continue
            reports = []
            for r in hb.partitions:
                topic = self.state.topics.get(r.topic)
                key = (b, r.topic, r.partition)
                if r.role == "follower" and topic is not None:
                    self._copy_cutover(key, topic.partitions[r.partition].owner)
                if r.role == "leader" and topic is not None:
                    version = topic.partitioning_version
                    held = self.cutovers.get(key)
                    if held is None or held[0] != version:
                        self.cutovers[key] = (version, r.log_end_offset)
                    else:
                        self.cutovers[key] = (version, min(held[1], r.log_end_offset))
                    cursor = (
                        r.log_end_offset
                        if self.cursor is None
                        else min(self.cursor.get(r.partition, 0), r.log_end_offset)
                    )
                    r = replace(r, cutover=self.cutovers[key], cursors={COHORT: cursor})
                reports.append(r)
            out[b] = replace(hb, partitions=tuple(reports))
        for b in self.unheard:
            if b in self._heard:
                out[b] = self._heard[b]
            else:
                out.pop(b, None)
        self._heard.update({b: hb for b, hb in out.items() if b not in self.unheard})
        return out

    def _copy_cutover(self, key: tuple[int, str, int], leader: int | None) -> None:
        """A follower takes what its leader holds when it copies its records (the fleet's
        followers copy from a leader that is up)."""
        if leader is None or not self.fleet.brokers[leader].up:
            return
        theirs = self.cutovers.get((leader, key[1], key[2]))
        if theirs is None:
            self.cutovers.pop(key, None)
        else:
            self.cutovers[key] = theirs

    def step(self, wait: int = POLL) -> rc.Decision:
        self.clock.advance(wait)
        d = rc.reconcile(
            rc.StepInputs(
                self.state,
                self.specs,
                self._heartbeats(),
                self.clock.now_ms,
                SETTINGS,
                observing_since_ms=self.since,
                unload_requests=self.unloads,
                repartition_requests=self.requests,
                repartition_progress=self.progress,
                members=self.members,
            ),
        )
        before = self.state.topics.get(T)
        after = d.state.topics.get(T)
        if (
            before is not None
            and after is not None
            and after.partitioning_version != before.partitioning_version
        ):
            self.bumps.append(after.partitioning_version)
        self.state = d.state
        self.progress = dict(d.repartitions)
        self.decisions.append(d)
        return d

    def run_until(self, phase: RepartitionPhase, name: str = "rp", limit: int = 60) -> None:
        for _ in range(limit):
            if name in self.progress and self.progress[name].phase is phase:
                return
            self.step()
        raise AssertionError(f"{name} never reached {phase}: {self.progress.get(name)}")

    def restart(self) -> None:
        self.state = CLUSTER_STATE_JSON.load(
            json.loads(json.dumps(CLUSTER_STATE_JSON.dump(self.state)))
        )
        self.fleet.forget()
        self.since = self.clock.now_ms

    def with_cohort(self) -> None:
        for broker in self.fleet.brokers.values():
            broker.members[(T, COHORT)] = {"m1"}

    def adopt(self, generation: int | None) -> None:
        for broker in self.fleet.brokers.values():
            broker.adoption = generation

    def ask(self, partitions: int, name: str = "rp", topic: str = T, timeout: int = 10_000) -> None:
        self.requests.append(RepartitionRequest(name, topic, partitions, timeout))

    @property
    def topic(self):  # type: ignore[no-untyped-def]
        return self.state.topics[T]


def settled(partitions: int = 4, replicas: int = 1) -> Cluster:
    c = Cluster(partitions, replicas=replicas)
    for _ in range(3):
        c.step()
    return c


def test_a_grow_cuts_over_once_stamps_the_generation_after_and_finalizes_when_adopted() -> None:
    c = settled()
    c.ask(8)
    d = c.step()
    marker = c.topic.transition
    assert marker is not None and marker.adoption_generation is None
    assert (marker.from_partitions, marker.to_partitions) == (4, 8)
    assert (marker.from_version, marker.to_version) == (1, 2)
    assert len(c.topic.partitions) == 8 and c.topic.partitioning_version == 2
    assert c.progress["rp"].phase is PHASE.CUTTING_OVER
    cutover_generation = d.state.generation
    c.step()
    marker = c.topic.transition
    assert marker is not None and marker.adoption_generation == cutover_generation
    c.run_until(PHASE.AWAITING_ADOPTION)
    assert set(c.topic.transition.cutover_offsets) == {0, 1, 2, 3}  # type: ignore[union-attr]
    c.step()
    c.step()
    assert c.progress["rp"].phase is PHASE.AWAITING_ADOPTION  # nobody acked: waits
    c.adopt(cutover_generation)
    c.step()
    done = c.progress["rp"]
    assert done.phase is PHASE.FINALIZED and done.finalized_by is FinalizedBy.ADOPTED
    assert (done.from_version, done.to_version, done.adoption_generation) == (
        1,
        2,
        cutover_generation,
    )
    assert done.cutover_ms is not None and done.drained_ms is not None
    assert done.cutover_ms <= done.drained_ms <= (done.finalized_ms or 0)
    assert c.topic.transition is None and c.bumps == [2]


def test_a_grow_places_new_partitions_on_members_only() -> None:
    # A grow once placed on every live broker, members or not, so a broker
    # being scaled away got new partitions the moves then had to take back
    c = settled()
    c.members = frozenset({0, 1})  # broker 2 is being scaled away, still live
    c.ask(10)
    c.step()
    added = c.topic.partitions[4:]
    assert len(added) == 6
    assert all(set(p.replicas) <= {0, 1} for p in added), [p.replicas for p in added]
    # and the spec-edit path
    c2 = settled()
    c2.members = frozenset({0, 1})
    c2.specs = [TopicSpec(T, 10, replicas=1)]
    c2.step()
    assert len(c2.topic.partitions) == 10
    assert all(set(p.replicas) <= {0, 1} for p in c2.topic.partitions[4:])


def test_the_adoption_timeout_runs_from_drain_complete() -> None:
    c = settled()
    c.ask(6, timeout=5_000)
    c.run_until(PHASE.AWAITING_ADOPTION)
    drained = c.progress["rp"].drained_ms
    assert drained is not None
    while c.clock.now_ms + POLL < drained + 5_000:
        c.step()
        assert c.progress["rp"].phase is PHASE.AWAITING_ADOPTION
    c.step()
    assert c.progress["rp"].phase is PHASE.FINALIZED
    assert c.progress["rp"].finalized_by is FinalizedBy.ADOPTION_TIMED_OUT


def test_a_shrink_retires_partitions_for_routing_and_keeps_them_placed_and_led() -> None:
    c = settled(12)
    c.ask(6)
    c.step()
    assert len(c.topic.partitions) == 12 and c.topic.routing_partitions == 6
    c.run_until(PHASE.AWAITING_ADOPTION)
    assert len(c.topic.partitions) == 12
    c.adopt(c.topic.transition.adoption_generation)  # type: ignore[union-attr]
    c.step()
    assert c.progress["rp"].phase is PHASE.FINALIZED
    # Retired, not dropped: still placed and led (readable), routed to by nobody.
    assert len(c.topic.partitions) == 12 and c.topic.routing_partitions == 6
    assert c.topic.active_partitions == 6 and c.topic.transition is None
    assert all(p.leader is not None for p in c.topic.partitions)
    pushed = next(t for t in cluster_topology(c.state, "local").topics if t.name == T)
    assert pushed.partitions == 12 and pushed.routing_partitions == 6
    assert pushed.active_partitions == 6
    # It survives a restart (persisted), and the count it has is the routing count.
    c.restart()
    assert c.topic.active_partitions == 6
    c.ask(6, name="same")
    c.step()
    assert c.progress["same"].phase is PHASE.FAILED
    assert "already has 6 partitions" in c.progress["same"].message


def test_a_leader_is_not_handed_back_before_the_transition_has_its_cutover_offset() -> None:
    """A preferred-leader hand-back due just as a shrink cuts over must wait until the
    marker has the partition's cutover offset from the leader that moved the fence. The
    next leader knows only its own log end, past the post-cutover records it replicated:
    taken from it, the offset comes out high, and a cohort created later is delivered a
    key's new records there before its old ones elsewhere (the history's holds start at
    that offset)."""
    c = settled(8, replicas=3)
    # a partition whose preferred replica polls after the others: the fake's followers
    # catch up with what the leader appended before them, so it is fully in sync
    p = next(q.partition for q in c.topic.partitions[:6] if q.replicas[0] == 2)
    preferred = c.topic.partitions[p].replicas[0]
    assert c.topic.partitions[p].leader == preferred
    c.fleet.brokers[preferred].up = False
    for _ in range(10):
        c.step()
        if c.topic.partitions[p].leader not in (None, preferred):
            break
    fenced_by = c.topic.partitions[p].leader
    assert fenced_by not in (None, preferred)
    c.fleet.brokers[preferred].up = True
    for _ in range(10):  # back in the live replica set: the quiet period starts
        c.step()
        if c.topic.partitions[p].deadline_ms is not None:
            break
    due = c.topic.partitions[p].deadline_ms
    assert due is not None
    c.step(wait=due - c.clock.now_ms - 1 - POLL)
    assert c.topic.partitions[p].leader == fenced_by
    c.ask(6)
    c.step()  # the cutover, 1 ms before the hand-back is due: the fence moves on the next poll
    assert c.topic.transition is not None
    c.step()  # the hand-back is due now, and the leader reports its cutover offset
    fence = c.cutovers[(fenced_by, T, p)]  # type: ignore[index]
    assert fence[0] == c.topic.partitioning_version
    c.run_until(PHASE.AWAITING_ADOPTION)
    marker = c.topic.transition
    assert marker is not None
    assert marker.cutover_offsets[p] == fence[1]
    for _ in range(20):  # the hand-back happens once the offset is in
        if c.topic.partitions[p].leader == preferred:
            break
        c.step()
    assert c.topic.partitions[p].leader == preferred


def test_a_leader_dead_before_reporting_its_cutover_offset_leaves_the_offset_exact() -> None:
    """The leader moves the fence and appends; its followers copy the records and, with
    them, the cutover; it dies before any heartbeat of it reached the controller. The
    next leader reports the copied cutover, not its own log end (past the post-cutover
    records it copied, which a cohort would then get as pre-cutover ones)."""
    c = settled(8, replicas=3)
    p = next(q.partition for q in c.topic.partitions[:6] if q.replicas[0] == 0)
    leader = c.topic.partitions[p].leader
    assert leader == 0
    c.ask(6)
    c.step()  # the cutover: the fence moves on the leaders' next poll
    c.unheard.add(leader)
    c.step()  # it moves the fence and appends; its followers copy; the controller hears nothing
    c.step()
    fence = c.cutovers[(leader, T, p)]
    assert fence[0] == c.topic.partitioning_version
    c.fleet.brokers[leader].up = False
    c.run_until(PHASE.AWAITING_ADOPTION)
    marker = c.topic.transition
    new_leader = c.topic.partitions[p].leader
    assert marker is not None and new_leader not in (None, leader)
    # its own log end holds post-cutover records: taken from it, the offset comes out high
    assert c.fleet.brokers[new_leader].log_end[(T, p)] > fence[1]
    assert marker.cutover_offsets[p] == fence[1]


def test_a_grow_after_a_shrink_routes_to_the_retired_partitions_again() -> None:
    c = settled(6)
    c.ask(4)
    c.run_until(PHASE.AWAITING_ADOPTION)
    c.adopt(c.topic.transition.adoption_generation)  # type: ignore[union-attr]
    c.run_until(PHASE.FINALIZED)
    retired = c.topic.partitions[4:]
    c.ask(8, name="back")
    c.step()
    marker = c.topic.transition
    assert marker is not None and (marker.from_partitions, marker.to_partitions) == (4, 8)
    # 4 and 5 are the same partitions (same replicas and epochs: their logs continue);
    # only 6 and 7 are placed anew.
    assert c.topic.partitions[4:6] == retired and len(c.topic.partitions) == 8
    c.run_until(PHASE.AWAITING_ADOPTION, name="back")
    c.adopt(c.topic.transition.adoption_generation)  # type: ignore[union-attr]
    c.run_until(PHASE.FINALIZED, name="back")
    assert c.topic.active_partitions is None and c.topic.routing_partitions == 8
    # Back to fewer than exist: only 6 and 7 are retired again.
    c.ask(7, name="some")
    c.run_until(PHASE.AWAITING_ADOPTION, name="some")
    c.adopt(c.topic.transition.adoption_generation)  # type: ignore[union-attr]
    c.run_until(PHASE.FINALIZED, name="some")
    assert c.topic.active_partitions == 7 and len(c.topic.partitions) == 8


def test_a_cohort_is_released_per_new_partition_once_its_feeders_pass_their_cutover() -> None:
    c = settled(8)
    c.with_cohort()
    c.step()
    c.cursor = {p: 0 for p in range(12)}  # the cohort has consumed nothing
    c.ask(12)
    c.run_until(PHASE.DRAINING)
    for _ in range(3):
        c.step()
    marker = c.topic.transition
    assert marker is not None and len(marker.cutover_offsets) == 8
    assert marker.released.get(COHORT, ()) == ()
    # 8 -> 12: gcd 4, so new partition q is fed by old partitions q % 4 and q % 4 + 4.
    assert marker.feeders(1) == (1, 5) and marker.feeders(9) == (1, 5)
    c.cursor = {p: 0 for p in range(12)} | {1: 10_000}
    c.step()
    assert c.topic.transition.released.get(COHORT, ()) == ()  # type: ignore[union-attr]
    c.cursor[5] = 10_000
    c.step()
    assert c.topic.transition.released[COHORT] == (1, 5, 9)  # type: ignore[union-attr]
    assert c.progress["rp"].phase is PHASE.DRAINING
    c.cursor = None
    c.run_until(PHASE.AWAITING_ADOPTION)


def test_the_floor_counts_live_brokers_only_so_a_dead_brokers_frozen_label_cannot_stall() -> None:
    c = settled()
    c.ask(8)
    c.run_until(PHASE.AWAITING_ADOPTION)
    target = c.topic.transition.adoption_generation  # type: ignore[union-attr]
    assert target is not None
    c.adopt(target)
    c.fleet.brokers[2].adoption = target - 1  # its clients never acked ...
    c.step()
    assert c.progress["rp"].phase is PHASE.AWAITING_ADOPTION
    c.fleet.brokers[2].up = False  # ... and it dies: its label freezes
    for _ in range(6):
        c.step()
        if c.progress["rp"].phase is PHASE.FINALIZED:
            break
    assert c.progress["rp"].finalized_by is FinalizedBy.ADOPTED


def test_a_restarted_controller_resumes_without_bumping_the_version_twice() -> None:
    c = settled()
    c.ask(8)
    c.step()
    c.restart()
    c.step()
    c.restart()
    c.run_until(PHASE.AWAITING_ADOPTION)
    c.restart()
    c.run_until(PHASE.FINALIZED)
    assert c.bumps == [2] and len(c.topic.partitions) == 8


def test_bad_requests_fail_with_a_reason_and_change_nothing() -> None:
    c = settled()
    before = c.topic
    c.ask(4, name="same")
    c.ask(8, name="missing", topic="default/nope")
    c.unloads = [UnloadRequest("default/move", T, (0,))]
    c.ask(8, name="unloading")
    c.step()
    assert c.progress["same"].phase is PHASE.FAILED
    assert "already has 4 partitions" in c.progress["same"].message
    assert c.progress["missing"].phase is PHASE.FAILED
    assert "does not exist" in c.progress["missing"].message
    assert c.progress["unloading"].phase is PHASE.FAILED
    assert "mid-Unload" in c.progress["unloading"].message
    assert c.topic.partitioning_version == before.partitioning_version
    assert c.topic.transition is None


def test_one_transition_at_a_time_the_second_waits_then_runs() -> None:
    c = settled()
    c.ask(8, name="first")
    c.ask(6, name="second")
    c.step()
    assert c.progress["first"].phase is PHASE.CUTTING_OVER
    assert c.progress["second"].phase is PHASE.PENDING
    assert "waiting: first is repartitioning" in c.progress["second"].message
    c.adopt(10**9)
    c.run_until(PHASE.FINALIZED, "first")
    c.run_until(PHASE.FINALIZED, "second")
    # 4 -> 8 -> 6: 6 and 7 are retired, not dropped.
    assert c.topic.routing_partitions == 6 and len(c.topic.partitions) == 8
    assert c.bumps == [2, 3]


def test_a_repartition_deleted_mid_flight_rolls_forward() -> None:
    c = settled()
    c.ask(8)
    c.step()
    c.requests = [replace(c.requests[0], cancelled=True)]
    c.adopt(10**9)
    c.run_until(PHASE.FINALIZED)
    assert len(c.topic.partitions) == 8


def test_a_spec_edit_drives_the_same_transition_and_a_lagging_spec_drives_none() -> None:
    c = settled()
    c.specs = [TopicSpec(T, 8, replicas=1)]
    c.step()
    assert c.topic.transition is not None
    assert c.topic.transition.request == "Topic.spec.partitions"
    c.adopt(10**9)
    for _ in range(10):
        c.step()
    assert c.topic.transition is None and len(c.topic.partitions) == 8
    # A Repartition changes the count; the spec (still 8) is not an edit: nothing follows.
    c.ask(12)
    c.run_until(PHASE.FINALIZED)
    for _ in range(3):
        c.step()
    assert len(c.topic.partitions) == 12 and c.topic.transition is None


class Schedules(RuleBasedStateMachine):
    """Random interleavings of requests, polls, cohort progress, adoption, deaths and
    controller restarts: the counters stay apart and every transition ends well."""

    def __init__(self) -> None:
        super().__init__()
        self.c = settled()
        self.c.with_cohort()
        self.c.cursor = {}
        self.asked = 0
        self.started_versions: list[int] = []
        self.most_partitions = len(self.c.topic.partitions)

    @precondition(lambda self: self.asked < 3)
    @rule(partitions=st.integers(1, 12))
    def request(self, partitions: int) -> None:
        self.asked += 1
        self.c.ask(partitions, name=f"r{self.asked}", timeout=3_000)

    @rule(wait=st.sampled_from([100, 1_000, 4_000]))
    def poll(self, wait: int) -> None:
        before = self.c.topic
        self.c.step(wait)
        after = self.c.topic
        if after.partitioning_version != before.partitioning_version:
            assert after.partitioning_version == before.partitioning_version + 1
            assert after.transition is not None

    @rule(partition=st.integers(0, 11))
    def consume(self, partition: int) -> None:
        assert self.c.cursor is not None
        self.c.cursor[partition] = 10**6

    @rule(generation=st.integers(0, 40))
    def ack(self, generation: int) -> None:
        self.c.adopt(generation)

    @rule(broker=st.integers(0, 2))
    def toggle(self, broker: int) -> None:
        b = self.c.fleet.brokers[broker]
        b.up = not b.up

    @rule()
    def restart(self) -> None:
        self.c.restart()

    @invariant()
    def one_marker_and_the_counters_apart(self) -> None:
        topic = self.c.topic
        marker = topic.transition
        if marker is None:
            return
        assert topic.partitioning_version == marker.to_version == marker.from_version + 1
        assert len(topic.partitions) >= max(marker.from_partitions, marker.to_partitions)
        assert topic.routing_partitions == marker.to_partitions
        if marker.adoption_generation is not None:
            assert marker.adoption_generation <= self.c.state.generation
        for qs in marker.released.values():
            assert all(0 <= q < marker.to_partitions for q in qs)

    @invariant()
    def no_partition_is_ever_dropped(self) -> None:
        # A shrink retires partitions for routing only: their records stay readable and
        # a grow back continues their offsets.
        count = len(self.c.topic.partitions)
        assert count >= self.most_partitions
        self.most_partitions = count
        assert 1 <= self.c.topic.routing_partitions <= count

    @invariant()
    def finalized_ones_were_drained(self) -> None:
        for p in self.c.progress.values():
            if p.phase is PHASE.FINALIZED:
                assert p.drained_ms is not None
                assert p.finalized_by is not None
                assert p.cutover_ms is not None and p.cutover_ms <= p.drained_ms

    def teardown(self) -> None:
        # Everything ends once every broker is up, the cohort keeps up and clients ack.
        for b in self.c.fleet.brokers.values():
            b.up = True
        self.c.cursor = None
        self.c.adopt(10**9)
        for _ in range(80):
            self.c.step()
        for name, p in self.c.progress.items():
            assert p.finished, (name, p)
        assert self.c.topic.transition is None


Schedules.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
test_schedules = Schedules.TestCase
