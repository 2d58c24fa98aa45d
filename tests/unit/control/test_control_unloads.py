"""Unloads: a fake fleet that seals and reopens, a fake clock, and the reconcile step.

Every test drives ``reconcile`` the way the controller does: poll the fleet
(which answers from the state last pushed to it), reconcile with the unload
requests and their persisted progress, keep both results. Each step also
checks the step's own rules: the same inputs again change nothing, and the
generation bumps exactly when the persisted topic/cluster content changed.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from control_fakes import FakeClock, Fleet
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from headrace.control import reconcile as rc
from headrace.control import unloads
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    UNLOAD_PROGRESS_JSON,
    ClusterState,
    MovePhase,
    MoveProgress,
    PartitionState,
    PartitionStatus,
    RecoverySource,
    TopicSpec,
    UnloadPhase,
    UnloadProgress,
    UnloadRequest,
)
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import Heartbeat, SealReport

SETTINGS = ControlSettings(
    liveness_ttl_ms=3_000,
    candidate_wait_ms=5_000,
    offline_retry_ms=30_000,
    unload_recovery_timeout_ms=5_000,
)
POLL = 1_000
T = "default/orders"
ONLINE = PartitionState.ONLINE
PENDING, SEALING, SEALED = MovePhase.PENDING, MovePhase.SEALING, MovePhase.SEALED
COMPLETED, FAILED = MovePhase.COMPLETED, MovePhase.FAILED


class Controller:
    """The controller loop with unloads, minus the I/O."""

    def __init__(self, brokers: int = 3, specs: list[TopicSpec] | None = None, rf: int = 1) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(brokers, self.clock)
        self.specs = specs if specs is not None else [TopicSpec(T, 3, replicas=rf)]
        self.state = ClusterState()
        self.since = self.clock.now_ms
        self.requests: list[UnloadRequest] = []
        self.progress: dict[str, UnloadProgress] = {}
        self.decisions: list[rc.Decision] = []
        #: the brokers the cluster should have (None: not said, nothing moves)
        self.members: frozenset[int] | None = None

    def reconcile(self, heartbeats: dict[int, Heartbeat]) -> rc.Decision:
        return rc.reconcile(
            rc.StepInputs(
                self.state,
                self.specs,
                heartbeats,
                self.clock.now_ms,
                SETTINGS,
                observing_since_ms=self.since,
                unload_requests=self.requests,
                unload_progress=self.progress,
                members=self.members,
            ),
        )

    def step(self, wait: int = POLL, heartbeats: dict[int, Heartbeat] | None = None) -> rc.Decision:
        self.clock.advance(wait)
        if heartbeats is None:
            heartbeats = self.fleet.poll(self.state)
        decision = self.reconcile(heartbeats)
        assert decision.changed == (not decision.state.same_content(self.state))
        assert decision.state.generation == self.state.generation + decision.changed
        assert decision.unloads_changed == any(
            self.progress.get(n) != p for n, p in decision.unloads.items()
        )
        self.state, self.progress = decision.state, dict(decision.unloads)
        again = self.reconcile(heartbeats)
        assert not again.changed, "the same inputs twice change nothing"
        assert again.state == decision.state
        assert not again.unloads_changed
        assert again.unloads == decision.unloads
        self.decisions.append(decision)
        return decision

    def run(self, steps: int) -> list[rc.Decision]:
        return [self.step() for _ in range(steps)]

    def restart(self) -> None:
        """A new controller process: persisted documents only, no heartbeats."""
        self.state = CLUSTER_STATE_JSON.load(
            json.loads(json.dumps(CLUSTER_STATE_JSON.dump(self.state)))
        )
        self.progress = {
            n: UNLOAD_PROGRESS_JSON.load(json.loads(json.dumps(UNLOAD_PROGRESS_JSON.dump(p))))
            for n, p in self.progress.items()
        }
        self.fleet.forget()
        self.since = self.clock.now_ms

    def unload(
        self, name: str, partitions: tuple[int, ...] = (), target: int | None = None
    ) -> None:
        self.requests.append(UnloadRequest(f"default/{name}", T, partitions, target))

    def partition(self, p: int = 0, topic: str = T) -> PartitionStatus:
        return self.state.topics[topic].partitions[p]

    def of(self, name: str) -> UnloadProgress:
        return self.progress[f"default/{name}"]

    def move(self, name: str, partition: int = 0) -> MoveProgress:
        return next(m for m in self.of(name).moves if m.partition == partition)

    def kinds(self, since: int = 0) -> list[str]:
        return [e.kind for d in self.decisions[since:] for e in d.events]

    def until(self, predicate: object, steps: int = 30) -> None:
        """Step until ``predicate()`` holds (at least one step)."""
        for _ in range(steps):
            self.step()
            if predicate():  # type: ignore[operator]
                return
        raise AssertionError("condition not reached")


def settled(brokers: int = 3, rf: int = 1, **kwargs: object) -> Controller:
    c = Controller(brokers, rf=rf, **kwargs)  # type: ignore[arg-type]
    c.run(3)
    return c


def log_end(c: Controller, broker: int, partition: int = 0) -> int:
    return c.fleet.brokers[broker].log_end[(T, partition)]


# --------------------------------------------------------------------------- happy paths


def test_rf1_move_to_a_target_seals_reassigns_at_sealed_plus_one_and_completes() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    target = (owner + 1) % 3
    c.unload("to-target", (0,), target)
    generation = c.state.generation

    d = c.step()  # the seal marker
    assert d.changed and c.state.generation == generation + 1
    assert c.partition().seal
    move = c.move("to-target")
    assert (move.phase, move.from_broker, move.moves) == (SEALING, owner, 1)
    assert c.of("to-target").phase is UnloadPhase.MOVING
    assert {"SealRequested", "UnloadStarted"} <= set(c.kinds(-1))

    d = c.step()  # the owner seals in this poll; the controller reassigns
    sealed = log_end(c, owner) - 1
    p = c.partition()
    assert (p.replicas, p.leader, p.leader_epoch, p.live_replicas) == (
        (target,),
        target,
        2,
        (target,),
    )
    assert (p.seal, p.moves, p.start_offset, p.state) == (False, 1, sealed + 1, ONLINE)
    move = c.move("to-target")
    assert (move.phase, move.to_broker, move.sealed_offset, move.verified) == (
        SEALED,
        target,
        sealed,
        True,
    )
    assert move.checked_ms == c.clock.now_ms
    assert move.recovery_source is None
    assert [e.kind for e in d.events] == ["PartitionSealed", "PartitionReassigned"]
    assert all(e.subject == f"{T}/0" for e in d.events)

    d = c.step()  # the target opens the new incarnation and reports it
    assert c.move("to-target").phase is COMPLETED
    assert c.of("to-target").phase is UnloadPhase.COMPLETED
    assert c.of("to-target").completed_ms == c.clock.now_ms
    assert [e.kind for e in d.events] == ["MoveCompleted", "UnloadCompleted"]
    report = c.fleet.latest[target].partitions[0]
    assert (report.moves, report.start_offset) == (1, sealed + 1)
    assert log_end(c, target) == sealed + 2, "offsets continue after the sealed one"
    generation = c.state.generation
    for d in c.run(5):
        assert not d.changed and not d.unloads_changed and d.events == ()
    assert c.state.generation == generation


def test_rf3_move_without_a_target_keeps_the_set_moves_leadership_and_regrows_the_lrs() -> None:
    c = settled(rf=3)
    owner = c.partition().leader
    c.unload("spread")
    c.until(lambda: c.of("spread").phase is UnloadPhase.COMPLETED)
    for p, before in zip(c.state.topics[T].partitions, range(3), strict=True):
        assert sorted(p.replicas) == [0, 1, 2], "RF=3 on 3 brokers: the set cannot change"
        assert p.moves == 1 and not p.seal
        move = c.move("spread", before)
        assert move.to_broker == p.leader != move.from_broker, "leadership leaves the old owner"
        assert p.start_offset == move.sealed_offset + 1  # type: ignore[operator]
    assert c.move("spread", 0).from_broker == owner
    c.run(2)
    assert all(p.live_replicas == p.replicas for p in c.state.topics[T].partitions), (
        "followers of the new incarnation rejoin the LRS"
    )
    assert "LiveReplicasChanged" in c.kinds()


def test_rf2_move_to_a_target_outside_the_set_replaces_the_old_owner() -> None:
    c = settled(brokers=3, specs=[TopicSpec(T, 1, replicas=2)])
    p = c.partition()
    outside = next(b for b in range(3) if b not in p.replicas)
    c.unload("out", target=outside)
    c.until(lambda: c.of("out").phase is UnloadPhase.COMPLETED)
    follower = next(b for b in p.replicas if b != p.leader)
    assert c.partition().replicas == (outside, follower)


def test_rf3_move_to_a_target_inside_the_set_reorders_it() -> None:
    c = settled(rf=3)
    p = c.partition()
    target = p.replicas[2]
    c.unload("inside", (0,), target)
    c.until(lambda: c.of("inside").phase is UnloadPhase.COMPLETED)
    assert c.partition().replicas == (target, *(b for b in p.replicas if b != target))


def test_placement_avoids_the_old_owner_and_is_deterministic() -> None:
    results = []
    for _ in range(2):
        c = settled(brokers=4, specs=[TopicSpec(T, 4, replicas=2)])
        c.unload("all")
        c.until(lambda c=c: c.of("all").phase is UnloadPhase.COMPLETED)  # type: ignore[misc]
        for m in c.of("all").moves:
            p = c.partition(m.partition)
            assert m.from_broker not in p.replicas, "4 brokers: room to leave the old owner out"
            assert len(p.replicas) == 2
        results.append((c.state, c.progress))
    assert results[0] == results[1]


def test_placement_leaves_out_a_broker_being_scaled_away() -> None:
    # An unload once placed on every live broker, members or not, and the
    # moves then had to take back what it had just placed
    c = settled(brokers=4, specs=[TopicSpec(T, 4, replicas=2)])
    assert any(3 in c.partition(i).replicas for i in range(4))
    c.members = frozenset({0, 1, 2})  # broker 3 is being scaled away, still live
    c.unload("all")
    for _ in range(30):
        c.step()
        for i in range(4):
            p = c.partition(i)
            if p.moves:  # reassigned by the unload
                assert 3 not in p.replicas, p
        if c.of("all").phase is UnloadPhase.COMPLETED:
            break
    assert c.of("all").phase is UnloadPhase.COMPLETED
    assert "MoveStarted" not in c.kinds(), "nothing left on broker 3 to move off"


def test_a_single_broker_reopens_the_partition_where_it_is() -> None:
    c = settled(brokers=1)
    c.unload("same")
    c.until(lambda: c.of("same").phase is UnloadPhase.COMPLETED)
    p = c.partition()
    assert (p.replicas, p.moves) == ((0,), 1)
    assert p.start_offset == c.move("same").sealed_offset + 1  # type: ignore[operator]


def test_a_target_that_already_leads_has_nothing_to_move() -> None:
    c = settled()
    owner = c.partition().leader
    generation = c.state.generation
    c.unload("noop", (0,), owner)
    d = c.step()
    assert not d.changed and c.state.generation == generation, "no seal, no bump"
    move = c.move("noop")
    assert (move.phase, move.to_broker, move.sealed_offset) == (COMPLETED, owner, None)
    assert "already leads" in move.message
    assert c.of("noop").phase is UnloadPhase.COMPLETED


def test_cohort_plans_follow_the_moved_owner() -> None:
    c = settled()
    for b in c.fleet.brokers.values():
        b.members[(T, "g")] = {"m"}
    c.step()
    owner = c.partition().leader
    assert owner is not None
    c.unload("plan", (0,), (owner + 1) % 3)
    c.until(lambda: c.of("plan").phase is UnloadPhase.COMPLETED)
    assert c.state.topics[T].cohort_plans["g"].assignment == {"m": (0, 1, 2)}


# --------------------------------------------------------------------------- concurrency


def test_concurrent_unloads_of_one_partition_take_turns_in_request_order() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.unload("first", (0,), (owner + 1) % 3)
    c.unload("second", (0, 1), (owner + 2) % 3)
    c.step()
    assert c.move("first").phase is SEALING
    assert c.move("second", 0).phase is PENDING
    assert "waiting for unload default/first" in c.move("second", 0).message
    assert c.move("second", 1).phase is not PENDING, "other partitions do not wait"
    c.until(lambda: c.of("first").phase is UnloadPhase.COMPLETED)
    c.until(lambda: c.of("second").phase is UnloadPhase.COMPLETED)
    p = c.partition()
    assert (p.moves, p.leader) == (2, (owner + 2) % 3), "two incarnations, one after the other"
    first, second = c.move("first"), c.move("second", 0)
    assert second.from_broker == first.to_broker
    assert second.sealed_offset is not None and first.sealed_offset is not None
    assert second.sealed_offset > first.sealed_offset


def test_a_later_request_does_not_jump_the_queue_after_a_restart() -> None:
    c = settled()
    c.unload("a", (0,))
    c.unload("b", (0,))
    c.step()
    c.restart()
    c.requests.reverse()  # whatever the order now, the in-flight move keeps the partition
    c.run(4)
    assert c.move("a").phase is SEALING or c.move("a").phase is SEALED or c.move("a").finished
    assert c.move("b").phase is PENDING or c.move("a").finished


# --------------------------------------------------------------------------- recovery


def test_rf1_owner_dies_mid_seal_then_the_object_store_path_after_the_timeout() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    key = (T, 0)
    c.fleet.brokers[owner].seals = False  # stuck uploading
    c.unload("rescue", (0,))
    c.step()
    c.run(3)
    acked = log_end(c, owner)
    c.fleet.uploaded[key] = acked - 2  # two records never reached the object store
    c.fleet.brokers[owner].up = False
    c.run(SETTINGS.liveness_ttl_ms // POLL + 1)
    move = c.move("rescue")
    assert move.phase is SEALING and move.deadline_ms is not None
    assert "SealersLost" in c.kinds()
    while c.clock.now_ms + POLL < move.deadline_ms:
        d = c.step()
        assert c.move("rescue").phase is SEALING, "not before the timeout"
        assert not d.changed
    c.until(lambda: c.move("rescue").phase is not SEALING)
    move = c.move("rescue")
    p = c.partition()
    assert move.phase is SEALED
    assert move.recovery_source is RecoverySource.OBJECT_STORE
    assert move.recovery_message.startswith(f"owner {owner} died mid-seal")
    assert "at most one upload interval" in move.recovery_message
    assert (p.start_offset, p.moves, p.seal) == (None, 1, False)
    assert p.leader != owner and p.leader is not None
    assert "ReopenedFromObjectStore" in c.kinds()
    c.until(lambda: c.move("rescue").phase is COMPLETED)
    move = c.move("rescue")
    assert move.sealed_offset == acked - 3, "the new owner started after the object store's end"
    assert c.partition().start_offset == acked - 2, "the derived start is recorded"
    assert c.of("rescue").phase is UnloadPhase.COMPLETED


def test_an_owner_back_before_the_deadline_seals_itself_with_no_loss() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.fleet.brokers[owner].seals = False
    c.unload("patient", (0,))
    c.step()
    c.fleet.brokers[owner].up = False
    c.run(SETTINGS.liveness_ttl_ms // POLL + 1)
    assert c.move("patient").deadline_ms is not None
    c.fleet.brokers[owner].up = True
    c.fleet.brokers[owner].seals = True
    c.step()
    assert "SealerBack" in c.kinds() or c.move("patient").phase is SEALED
    c.until(lambda: c.move("patient").phase is COMPLETED)
    move = c.move("patient")
    assert move.recovery_source is None and move.deadline_ms is None
    assert move.sealed_offset is not None and move.verified


def test_rf3_leader_dies_mid_seal_and_another_replica_seals_with_no_object_store_path() -> None:
    c = settled(rf=3)
    owner = c.partition().leader
    assert owner is not None
    c.fleet.brokers[owner].seals = False
    c.unload("failover", (0,))
    c.step()
    c.run(2)
    acked = log_end(c, owner)
    c.fleet.brokers[owner].up = False
    c.until(lambda: c.move("failover").phase is not SEALING)
    move = c.move("failover")
    assert move.phase is SEALED
    assert move.recovery_source is RecoverySource.REPLICAS
    assert f"broker {owner} stopped leading mid-seal" in move.recovery_message
    assert move.sealed_offset == acked - 1, "the new leader had every record"
    assert "ReopenedFromObjectStore" not in c.kinds()
    assert "LeaderLost" in c.kinds()
    p = c.partition()
    assert owner in p.replicas, "no target, 3 brokers: the dead owner stays a replica"
    assert p.leader != owner
    c.until(lambda: c.move("failover").phase is COMPLETED)


def test_rf3_every_replica_dead_takes_the_object_store_path() -> None:
    c = settled(brokers=5, specs=[TopicSpec(T, 1, replicas=3)])
    p = c.partition()
    for b in p.replicas:
        c.fleet.brokers[b].seals = False
    c.unload("all-dead", (0,))
    c.step()
    for b in p.replicas:
        c.fleet.brokers[b].up = False
    c.until(lambda: c.move("all-dead").phase is not SEALING, steps=20)
    move = c.move("all-dead")
    assert move.recovery_source is RecoverySource.OBJECT_STORE
    assert "every in-sync replica" in move.recovery_message
    new = c.partition()
    assert len(new.replicas) == 3 and new.leader in (3, 4)
    assert new.start_offset is None


def test_an_unload_rescues_a_partition_whose_only_replica_is_already_dead() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.fleet.uploaded[(T, 0)] = 2
    c.fleet.brokers[owner].up = False
    c.run(SETTINGS.liveness_ttl_ms // POLL + 1)
    assert c.partition().state is PartitionState.OFFLINE
    c.unload("rescue", (0,))
    c.until(lambda: c.move("rescue").phase is COMPLETED, steps=15)
    move = c.move("rescue")
    assert (move.from_broker, move.sealed_offset) == (owner, 1)
    assert move.recovery_source is RecoverySource.OBJECT_STORE
    assert c.partition().state is ONLINE and c.partition().leader != owner


def test_stale_seal_reports_are_ignored() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.fleet.brokers[owner].seals = False
    c.unload("careful", (0,))
    c.step()
    epoch, moves = c.partition().leader_epoch, c.partition().moves

    def with_seal(seal: SealReport) -> dict[int, Heartbeat]:
        beats = c.fleet.poll(c.state)
        hb = beats[owner]
        beats[owner] = replace(hb, partitions=(replace(hb.partitions[0], sealed=seal),))
        return beats

    for stale in (SealReport(9, epoch - 1, moves, True), SealReport(9, epoch, moves + 1, True)):
        d = c.step(heartbeats=with_seal(stale))
        assert not d.changed and c.move("careful").phase is SEALING
    d = c.step(heartbeats=with_seal(SealReport(9, epoch, moves, False, "manifest ends at 7")))
    move = c.move("careful")
    assert (move.phase, move.sealed_offset, move.verified) == (SEALED, 9, False)
    assert move.verification_message == "manifest ends at 7"
    assert c.partition().start_offset == 10
    assert "NOT verified" in d.events[0].message


def test_a_seal_report_from_a_non_replica_is_ignored() -> None:
    c = settled(brokers=4)
    owner = c.partition().leader
    assert owner is not None
    c.fleet.brokers[owner].seals = False
    c.unload("strict", (0,))
    c.step()
    p = c.partition()
    stranger = next(b for b in range(4) if b not in p.replicas)
    beats = c.fleet.poll(c.state)
    hb = beats[stranger]
    forged = replace(
        c.fleet.latest[owner].partitions[0],
        sealed=SealReport(5, p.leader_epoch, p.moves, True),
    )
    beats[stranger] = replace(hb, partitions=(*hb.partitions, forged))
    c.step(heartbeats=beats)
    assert c.move("strict").phase is SEALING


# --------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("phase", [SEALING, SEALED])
def test_a_controller_restart_mid_unload_changes_nothing(phase: MovePhase) -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.fleet.brokers[owner].seals = phase is SEALED
    target = (owner + 1) % 3
    c.fleet.brokers[target].promotes = False
    c.unload("restart", (0,), target)
    c.until(lambda: c.move("restart").phase is phase)
    if phase is SEALED:  # keep the new leader from reporting, so the move stays Sealed
        c.fleet.brokers[target].up = False
        c.step()
        c.fleet.brokers[target].up = True
        c.fleet.latest.pop(target, None)
    state, progress = c.state, c.progress
    c.restart()
    c.fleet.brokers[target].up = phase is SEALING
    d = c.step()
    assert d.state == state, "warming up: nothing persisted changes"
    assert not d.changed
    assert dict(d.unloads) == progress or phase is SEALING
    c.fleet.brokers[target].up = True
    c.fleet.brokers[owner].seals = True
    c.until(lambda: c.move("restart").phase is COMPLETED)
    assert c.partition().moves == 1, "moved exactly once"


def test_restart_after_the_topic_was_persisted_but_not_the_progress() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.fleet.brokers[owner].seals = False
    c.unload("crash", (0,))
    c.step()  # seal marker
    assert c.partition().seal
    c.progress = {}  # the progress write was lost
    c.restart()
    c.run(2)
    assert c.move("crash").phase is SEALING, "the seal marker is adopted"
    assert c.move("crash").moves == 1
    sealing = dict(c.progress)
    c.fleet.brokers[owner].seals = True
    c.until(lambda: c.move("crash").phase is SEALED)
    c.progress = sealing  # lost again: the reassignment is persisted, the progress says Sealing
    c.restart()
    c.run(SETTINGS.liveness_ttl_ms // POLL + 1)
    assert c.move("crash").phase is COMPLETED
    assert "ReassignmentFound" in c.kinds()
    assert c.partition().moves == 1
    assert c.move("crash").sealed_offset == c.partition().start_offset - 1  # type: ignore[operator]


def test_a_lost_reassignment_is_made_again() -> None:
    c = settled()
    owner = c.partition().leader
    c.unload("redo", (0,))
    c.step()
    sealing_state = c.state
    c.step()
    assert c.move("redo").phase is SEALED
    c.state = replace(c.state, topics=sealing_state.topics)  # the topic write was lost
    c.restart()
    c.until(lambda: c.move("redo").phase is COMPLETED)
    assert "ReassignmentLost" in c.kinds()
    assert c.partition().moves == 1 and c.partition().leader != owner


def test_a_restart_while_pending_waits_out_the_warm_up() -> None:
    c = settled()
    silent = next(b for b in range(3) if b != c.partition().leader)
    c.fleet.brokers[silent].up = False
    c.restart()
    c.unload("later", (0,))
    d = c.step()
    assert c.move("later").phase is PENDING
    assert "hear from every known broker" in c.move("later").message
    assert not d.changed
    c.run(SETTINGS.liveness_ttl_ms // POLL)
    assert c.move("later").phase is not PENDING, "the silent broker is dead now: no more warm-up"


# --------------------------------------------------------------------------- waiting and failing


def test_a_dead_target_is_waited_for() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    target = (owner + 1) % 3
    c.fleet.brokers[target].up = False
    c.run(SETTINGS.liveness_ttl_ms // POLL + 1)
    c.unload("wait", (0,), target)
    c.run(3)
    assert c.move("wait").phase is PENDING
    assert f"target broker {target} to be live" in c.move("wait").message
    assert not c.partition().seal
    c.fleet.brokers[target].up = True
    c.until(lambda: c.move("wait").phase is COMPLETED)


def test_a_draining_target_is_not_moved_to() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    target = (owner + 1) % 3
    c.fleet.brokers[target].draining = True
    c.unload("drain", (0,), target)
    c.run(2)
    assert c.move("drain").phase is PENDING
    assert "draining" in c.move("drain").message


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (UnloadRequest("default/u", "default/nope", ()), "does not exist"),
        (UnloadRequest("default/u", "default/cold", ()), "tiered storage disabled"),
        (UnloadRequest("default/u", T, (1, 7, 3)), "partitions [3, 7] out of range"),
        (UnloadRequest("default/u", T, (), target=9), "target broker 9 is unknown"),
        (UnloadRequest("default/u", T, (), cancelled=True), "deleted before it started"),
    ],
)
def test_bad_requests_fail_before_anything_moves(request_: UnloadRequest, words: str) -> None:
    c = settled(specs=[TopicSpec(T, 3), TopicSpec("default/cold", 1, tiered=False)])
    generation = c.state.generation
    c.requests.append(request_)
    d = c.step()
    progress = c.progress["default/u"]
    assert progress.phase is UnloadPhase.FAILED
    assert words in progress.message
    assert progress.moves == ()
    assert not d.changed and c.state.generation == generation
    assert d.unloads_changed
    assert [e.kind for e in d.events] == ["UnloadFailed"]
    assert not c.step().unloads_changed, "a finished unload stays as it is"


def test_an_unplaced_topic_is_waited_for_not_failed() -> None:
    c = settled()
    c.specs.append(TopicSpec("default/big", 1, replicas=5))  # cannot be placed on 3 brokers
    c.requests.append(UnloadRequest("default/u", "default/big"))
    c.step()
    assert c.progress["default/u"].phase is UnloadPhase.PENDING
    assert "to be placed" in c.progress["default/u"].message


def test_a_topic_deleted_mid_move_fails_its_moves() -> None:
    c = settled()
    c.fleet.brokers[c.partition().leader].seals = False  # type: ignore[index]
    c.unload("orphaned")
    c.step()
    c.specs = []
    d = c.step()
    assert c.of("orphaned").phase is UnloadPhase.FAILED
    assert all(m.phase is FAILED and "was deleted" in m.message for m in c.of("orphaned").moves)
    assert "UnloadFailed" in [e.kind for e in d.events]


def test_a_move_of_a_partition_that_no_longer_exists_fails() -> None:
    c = settled()
    c.fleet.brokers[c.partition(2).leader].seals = False  # type: ignore[index]
    c.unload("shrunk", (2,))
    c.step()
    topic = c.state.topics[T]
    c.state = replace(c.state, topics={T: replace(topic, partitions=topic.partitions[:2])})
    c.specs = [TopicSpec(T, 2)]
    c.step()
    assert c.move("shrunk", 2).phase is FAILED
    assert c.of("shrunk").phase is UnloadPhase.FAILED


def test_cancelling_fails_the_moves_not_started_and_lets_started_ones_finish() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.unload("blocker", (0,))
    c.unload("victim", (0, 1))
    c.step()
    assert c.move("victim", 0).phase is PENDING
    c.requests[1] = replace(c.requests[1], cancelled=True)
    c.until(lambda: c.of("victim").finished)
    assert c.move("victim", 0).phase is FAILED
    assert "cancelled" in c.move("victim", 0).message
    assert c.move("victim", 1).phase is COMPLETED
    assert c.of("victim").phase is UnloadPhase.FAILED
    assert "1 of 2 move(s) failed" in c.of("victim").message


def test_a_seal_no_unload_claims_is_a_problem_until_one_adopts_it() -> None:
    c = settled()
    c.fleet.brokers[c.partition().leader].seals = False  # type: ignore[index]
    c.unload("gone", (0,))
    c.step()
    assert [p.reason for p in c.step().problems] == ["PartitionsMoving"]
    c.requests.clear()
    d = c.step()
    assert "default/gone" not in d.unloads
    assert [p.reason for p in d.problems] == ["UnclaimedSeal"]
    assert c.partition().seal
    c.fleet.brokers[c.partition().leader].seals = True  # type: ignore[index]
    c.unload("adopter", (0,))
    c.until(lambda: c.move("adopter").phase is COMPLETED)
    assert c.partition().moves == 1
    assert c.decisions[-1].problems == ()


def test_progress_alone_never_bumps_the_generation() -> None:
    c = settled()
    owner = c.partition().leader
    assert owner is not None
    c.fleet.brokers[(owner + 1) % 3].up = False
    c.run(SETTINGS.liveness_ttl_ms // POLL + 1)
    generation = c.state.generation
    c.unload("idle", (0,), (owner + 1) % 3)
    d = c.step()
    assert d.unloads_changed and not d.changed
    assert c.state.generation == generation


def test_a_move_table_row_needs_an_incarnation() -> None:
    c = settled()
    seen = unloads.Seen(
        UnloadRequest("default/x", T),
        c.state.topics,
        None,
        c.decisions[-1].liveness,
        {},
        c.clock.now_ms,
        SETTINGS,
    )
    with pytest.raises(ValueError, match="without an incarnation"):
        unloads.step_move(MoveProgress(0, SEALING), c.partition(), seen)


def test_a_request_named_twice_is_a_bug() -> None:
    c = settled()
    c.unload("twice")
    c.unload("twice")
    with pytest.raises(ValueError, match="requested twice"):
        c.step()


# --------------------------------------------------------------------------- random schedules


brokers = st.integers(0, 3)
waits = st.sampled_from([0, POLL, POLL, POLL, 4_000, 6_000])


class Moves(RuleBasedStateMachine):
    """Unloads are requested while brokers crash, return, stall and the controller restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.c = Controller(brokers=4, specs=[TopicSpec(T, 3, replicas=2, min_in_sync=1)])
        self.c.run(2)
        self.n = 0
        self.seen: dict[tuple[str, int], tuple[int, int]] = {}

    @rule(
        parts=st.lists(st.integers(0, 2), max_size=2, unique=True),
        to=st.none() | brokers,
        wait=waits,
    )
    def request(self, parts: list[int], to: int | None, wait: int) -> None:
        self.n += 1
        self.c.unload(f"u{self.n}", tuple(parts), to)
        self.step(wait)

    @rule(b=brokers, wait=waits)
    def crash(self, b: int, wait: int) -> None:
        self.c.fleet.brokers[b].up = False
        self.step(wait)

    @rule(b=brokers, wait=waits)
    def come_back(self, b: int, wait: int) -> None:
        self.c.fleet.brokers[b].up = True
        self.step(wait)

    @rule(b=brokers, flag=st.booleans(), wait=waits)
    def stall_seals(self, b: int, flag: bool, wait: int) -> None:
        self.c.fleet.brokers[b].seals = not flag
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
        for p in d.state.topics[T].partitions:
            old = before.topics[T].partitions[p.partition] if T in before.topics else None
            if old is not None and p.leader is not None and p.leader != old.leader:
                assert p.leader in d.liveness.live, "only a live broker becomes leader"

    @invariant()
    def one_move_in_flight_per_partition(self) -> None:
        flying = [
            (r.topic, m.partition)
            for r in self.c.requests
            for m in self.c.progress.get(r.name, UnloadProgress(r.name)).moves
            if m.in_flight
        ]
        assert len(flying) == len(set(flying))

    @invariant()
    def incarnations_and_epochs_only_grow(self) -> None:
        for p in self.c.state.topics[T].partitions:
            key = (T, p.partition)
            moves, epoch = self.seen.get(key, (0, 0))
            assert p.moves >= moves and p.leader_epoch >= epoch
            if p.moves > moves:
                assert p.leader_epoch > epoch, "a new incarnation has a new epoch"
            self.seen[key] = (p.moves, p.leader_epoch)
            assert len(p.replicas) == 2 and len(set(p.replicas)) == 2
            if p.state is ONLINE:
                assert p.leader in p.live_replicas

    @invariant()
    def sealed_moves_start_after_their_seal(self) -> None:
        for r in self.c.requests:
            progress = self.c.progress.get(r.name)
            for m in progress.moves if progress else ():
                if m.phase is COMPLETED and m.sealed_offset is not None and m.moves:
                    assert m.to_broker is not None
                if m.phase is SEALED and m.sealed_offset is not None:
                    p = self.c.partition(m.partition)
                    if p.moves == m.moves:
                        assert p.start_offset == m.sealed_offset + 1


TestMoves = Moves.TestCase
TestMoves.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
