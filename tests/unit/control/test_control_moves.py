"""Replica moves (``control.moves``) through ``reconcile``, on a fleet that copies data.

The fleet here models what a move is about, which ``control_fakes.Fleet`` does
not: a replica's log end per broker. A leader admits a follower to its LRS only
once it has fetched up to the high watermark, acks a record only once every LRS
member holds it and the LRS has ``minInSync`` members, and new followers copy a
few records per poll, so an adding replica really has to catch up. A replica a
push no longer names drops its copy. The checks: an acknowledged record is
always held by at least ``minInSync`` replicas of the current replica set, every
leader holds every acknowledged record, and every move finishes once the
brokers are live.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from control_fakes import FakeClock, info
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.control import reconcile as rc
from headrace.control import topology
from headrace.control.liveness import Liveness
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    PARTITION_STATUS_JSON,
    ClusterState,
    PartitionState,
    PartitionStatus,
    TopicSpec,
    TopicStatus,
)
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import Heartbeat, PartitionReport

ONLINE, ELECTING = PartitionState.ONLINE, PartitionState.ELECTING
SETTINGS = ControlSettings(
    liveness_ttl_ms=3_000,
    candidate_wait_ms=5_000,
    offline_retry_ms=30_000,
    preferred_leader_quiet_ms=10_000,
    max_concurrent_moves=3,
)
POLL = 1_000
T = "default/orders"
U = "default/audit"
Key = tuple[str, int]


@dataclass
class Node:
    id: int
    up: bool = False
    #: promotes itself when nominated
    promotes: bool = True
    #: (topic, partition) -> log end offset of the copy held here
    logs: dict[Key, int] = field(default_factory=dict)
    #: misses the controller's pushes: as a leader it keeps the replica set (and the LRS
    #: over it) of the last push it applied
    deaf: bool = False
    #: the topology generation it applied last (its heartbeat says so)
    applied: int = 0


@dataclass
class Leading:
    broker: int
    epoch: int
    lrs: set[int]
    hw: int
    #: the replica set as this leader last applied it (stale while it is deaf)
    replicas: tuple[int, ...] = ()
    #: the move generation it last applied (``replication.leader``)
    move_generation: int = 0


class CopyingFleet:
    """Brokers that replicate records the way ``replication.leader`` does (see the module doc)."""

    #: records a follower copies per poll: more than the leader appends, so it catches up
    COPY_RATE = 3

    def __init__(self, brokers: int, clock: FakeClock, min_in_sync: dict[str, int]) -> None:
        self.clock = clock
        self.nodes = {b: Node(b) for b in range(brokers)}
        self.min_in_sync = min_in_sync
        self.latest: dict[int, Heartbeat] = {}
        self.leading: dict[Key, Leading] = {}
        #: the highest offset + 1 ever acknowledged, per partition
        self.acked: dict[Key, int] = {}
        #: acknowledged records a leader lacked when it took over (must stay empty)
        self.lost: list[str] = []

    def forget(self) -> None:
        self.latest = {}

    def poll(self, state: ClusterState) -> dict[int, Heartbeat]:
        reports: dict[int, list[PartitionReport]] = {b: [] for b in self.nodes}
        for node in self.nodes.values():
            if node.up and not node.deaf:
                node.applied = state.generation
        for topic in state.topics.values():
            for p in topic.partitions:
                key = (topic.name, p.partition)
                for node in self.nodes.values():
                    if not node.up:
                        continue
                    if node.id in p.replicas:
                        node.logs.setdefault(key, 0)
                    else:
                        node.logs.pop(key, None)  # Drop: the push no longer names it here
                self._replicate(topic.name, p, reports)
        for b, node in self.nodes.items():
            if node.up:
                self.latest[b] = Heartbeat(
                    info(b),
                    self.clock.now_ms,
                    None,
                    False,
                    tuple(reports[b]),
                    (),
                    generation=node.applied,
                )
        return dict(self.latest)

    def _replicate(
        self, topic: str, p: PartitionStatus, reports: dict[int, list[PartitionReport]]
    ) -> None:
        key = (topic, p.partition)
        acting = None
        if p.state is ONLINE and p.leader is not None:
            acting = p.leader
        elif p.state is ELECTING and p.candidate is not None and self.nodes[p.candidate].promotes:
            acting = p.candidate
        if acting is not None and not self.nodes[acting].up:
            acting = None
        lead = self.leading.get(key)
        if lead is not None and (acting is None or lead.broker != acting):
            self.leading.pop(key)
            lead = None
        if acting is not None and lead is None:
            mine = self.nodes[acting].logs[key]
            if mine < self.acked.get(key, 0):
                self.lost.append(
                    f"{key}: broker {acting} leads at epoch {p.leader_epoch} with log end"
                    f" {mine} < acknowledged {self.acked[key]}"
                )
            # a new leader seeds its LRS from the pushed one; followers truncate to it
            for b in p.replicas:
                node = self.nodes[b]
                if key in node.logs and node.logs[key] > mine:
                    node.logs[key] = mine
            moving = p.target_generation if p.target else 0
            lead = Leading(
                acting, p.leader_epoch, set(p.live_replicas) | {acting}, 0, p.replicas, moving
            )
            lead.lrs &= set(p.replicas)
            lead.hw = min(self.nodes[b].logs.get(key, 0) for b in lead.lrs)
            self.leading[key] = lead
        if lead is None:
            return
        if not self.nodes[lead.broker].deaf:
            # the push applied: a move it has not seen makes followers outside the
            # controller's LRS start over (they re-enter below once they hold the HW)
            lead.replicas = p.replicas
            moving = p.target_generation if p.target else 0
            if moving and moving != lead.move_generation:
                lead.lrs = {b for b in lead.lrs if b in p.live_replicas} | {lead.broker}
            lead.move_generation = moving
        leader_log = self.nodes[lead.broker].logs
        for b in p.replicas:
            node = self.nodes[b]
            if b == lead.broker or not node.up:
                continue
            node.logs[key] = min(leader_log[key], node.logs[key] + self.COPY_RATE)
        # a deaf leader still counts a replica the controller removed (and whose copy is
        # gone) by its old progress: the controller must not trust that LRS
        followers_up = {b for b in lead.replicas if self.nodes[b].up}
        lead.lrs = {b for b in lead.lrs if b in followers_up} | {lead.broker}
        lead.lrs |= {
            b for b in followers_up if b in p.replicas and self.nodes[b].logs[key] >= lead.hw
        }
        if len(lead.lrs) >= self.min_in_sync[topic]:
            leader_log[key] += 1  # one produce per poll
        lead.hw = max(lead.hw, min(self.nodes[b].logs.get(key, 0) for b in lead.lrs))
        if len(lead.lrs) >= self.min_in_sync[topic]:
            self.acked[key] = max(self.acked.get(key, 0), lead.hw)
        for b in p.replicas:
            node = self.nodes[b]
            if not node.up:
                continue
            if b == lead.broker:
                report = PartitionReport(
                    topic,
                    p.partition,
                    "leader",
                    p.leader_epoch,
                    leader_log[key],
                    lead.hw,
                    tuple(sorted(lead.lrs)),
                )
            else:
                report = PartitionReport(
                    topic, p.partition, "follower", p.leader_epoch, node.logs[key], 0, ()
                )
            reports[b].append(report)


class Controller:
    def __init__(self, brokers: int = 5, members: set[int] | None = None) -> None:
        self.clock = FakeClock()
        self.specs = [
            TopicSpec(T, 6, replicas=3, min_in_sync=2),
            TopicSpec(U, 2, replicas=2, min_in_sync=1),
        ]
        self.fleet = CopyingFleet(brokers, self.clock, {s.name: s.min_in_sync for s in self.specs})
        self.members = {0, 1, 2} if members is None else members
        for b in self.members:
            self.fleet.nodes[b].up = True
        self.state = ClusterState()
        self.since = self.clock.now_ms
        self.decisions: list[rc.Decision] = []
        self.settings = SETTINGS

    def step(self, wait: int = POLL) -> rc.Decision:
        self.clock.advance(wait)
        heartbeats = self.fleet.poll(self.state)
        d = rc.reconcile(
            rc.StepInputs(
                self.state,
                self.specs,
                heartbeats,
                self.clock.now_ms,
                self.settings,
                observing_since_ms=self.since,
                members=frozenset(self.members),
            ),
        )
        self.state = d.state
        self.decisions.append(d)
        return d

    def run(self, steps: int) -> rc.Decision:
        for _ in range(steps):
            d = self.step()
        return d

    def restart(self) -> None:
        self.state = CLUSTER_STATE_JSON.load(
            json.loads(json.dumps(CLUSTER_STATE_JSON.dump(self.state)))
        )
        self.fleet.forget()
        self.since = self.clock.now_ms

    def partitions(self) -> list[tuple[str, PartitionStatus]]:
        return [(t.name, p) for t in self.state.topics.values() for p in t.partitions]

    def holds(self, topic: str) -> dict[int, int]:
        counts = dict.fromkeys(sorted(self.members), 0)
        for p in self.state.topics[topic].partitions:
            for b in p.replicas:
                counts[b] = counts.get(b, 0) + 1
        return counts

    def settle(self, limit: int = 120) -> rc.Decision:
        """Steps until no move is in flight or waiting (at most ``limit``)."""
        for _ in range(limit):
            d = self.step()
            if not d.reassignment.rebalancing and not any(p.target for _, p in self.partitions()):
                return d
        raise AssertionError(f"moves did not finish: {CLUSTER_STATE_JSON.dump(self.state)}")

    def kinds(self) -> list[str]:
        return [e.kind for d in self.decisions for e in d.events]


def check_copies(c: Controller) -> None:
    """Every acknowledged record is on at least minInSync replicas of the current set."""
    min_in_sync = {s.name: s.min_in_sync for s in c.specs}
    for name, p in c.partitions():
        key = (name, p.partition)
        acked = c.fleet.acked.get(key, 0)
        holders = [b for b in p.replicas if c.fleet.nodes[b].logs.get(key, -1) >= acked]
        assert len(holders) >= min_in_sync[name], (key, acked, p, holders)
    assert not c.fleet.lost, c.fleet.lost


def check_completed(c: Controller, completed: rc.Event) -> None:
    """A move completed onto replicas that all hold every acknowledged record,
    not onto one that a stale LRS names after it dropped its copy."""
    name, _, index = completed.subject.rpartition("/")
    key = (name, int(index))
    # "replicas [old union] -> [target]": a move started in the same step may have made a
    # new union since, so the target comes from the event
    target = json.loads(completed.message.split(" -> ")[1].split(" (")[0])
    acked = c.fleet.acked.get(key, 0)
    ends = {b: c.fleet.nodes[b].logs.get(key, -1) for b in target}
    assert all(end >= acked for end in ends.values()), (completed, acked, ends)


# --------------------------------------------------------------------------- examples


def test_without_members_nothing_moves() -> None:
    c = Controller()
    c.run(3)
    c.fleet.nodes[3].up = True
    d = rc.reconcile(
        rc.StepInputs(
            c.state,
            c.specs,
            c.fleet.poll(c.state),
            c.clock.advance(POLL),
            SETTINGS,
            observing_since_ms=c.since,
        ),
    )
    assert not any(p.target for t in d.state.topics.values() for p in t.partitions)
    assert d.reassignment == rc.moves.Summary()


# The LRS a move reads is the leader's report, so it counts only from a
# leader that applied the push that started the move.

LIVE = Liveness(frozenset({0, 1, 2, 3}), frozenset(), frozenset(), frozenset())


def stale_lrs_move() -> dict[str, TopicStatus]:
    """Broker 3 comes back into partition 0 (balancing) at generation 7; the leader's last
    report still names it in sync, from before it was removed and dropped its copy."""
    p = PartitionStatus(
        0,
        replicas=(0, 1, 2, 3),
        leader=0,
        leader_epoch=2,
        live_replicas=(0, 1, 2, 3),
        state=ONLINE,
        target=(0, 1, 3),
        target_generation=7,
    )
    return {T: TopicStatus(T, 1, (p,), {})}


def advance(topics: dict[str, TopicStatus], applied: dict[int, int]) -> rc.moves.Moved:
    return rc.moves.step(
        topics,
        members=None,
        liveness=LIVE,
        reports={},
        busy=(),
        now_ms=0,
        settings=SETTINGS,
        pushed_at=8,
        applied=applied,
    )


def test_a_move_waits_for_a_leader_that_has_not_applied_its_push() -> None:
    topics = stale_lrs_move()
    waiting = advance(topics, {0: 6, 1: 7, 2: 7, 3: 7})
    assert waiting.topics == topics and not waiting.events, "a stale LRS completes nothing"
    done = advance(topics, {0: 7, 1: 7, 2: 7, 3: 7})
    (p,) = done.topics[T].partitions
    assert (p.replicas, p.target, p.target_generation) == ((0, 1, 3), (), 0)
    assert [e[0] for e in done.events] == ["MoveCompleted"]


def test_a_move_recorded_without_a_generation_is_not_fenced() -> None:
    # a Topic status written by an operator from before the fence
    topics = stale_lrs_move()
    (p,) = topics[T].partitions
    old = {T: replace(topics[T], partitions=(replace(p, target_generation=0),))}
    assert [e[0] for e in advance(old, {}).events] == ["MoveCompleted"]


def test_a_started_move_records_the_generation_it_is_pushed_at_and_keeps_it() -> None:
    c = Controller()
    c.run(5)
    c.members = {0, 1, 2, 3}
    c.fleet.nodes[3].up = True
    d = c.step()
    moving = [p for _, p in c.partitions() if p.target]
    assert moving and all(p.target_generation == d.state.generation for p in moving)
    pushed = topology.cluster_topology(d.state, "test")
    generations = {a.move_generation for t in pushed.topics for a in t.assignments}
    assert generations == {0, d.state.generation}, "the push tells leaders a move started"
    doc = json.loads(json.dumps(CLUSTER_STATE_JSON.dump(d.state)))
    assert CLUSTER_STATE_JSON.load(doc) == d.state, "targetGeneration is persisted"
    assert all(
        "targetGeneration" not in p
        for t in doc["topics"]
        for p in t["partitions"]
        if not p.get("targetReplicas")
    ), "a partition with no move has no targetGeneration"


def test_scale_up_moves_replicas_and_some_leaderships_onto_the_new_broker() -> None:
    c = Controller()
    c.run(5)
    assert c.holds(T) == {0: 6, 1: 6, 2: 6}
    c.members = {0, 1, 2, 3}
    c.fleet.nodes[3].up = True
    d = c.step()
    started = [e for e in d.events if e.kind == "MoveStarted"]
    assert len(started) == SETTINGS.max_concurrent_moves, "the cap holds"
    moving = [p for _, p in c.partitions() if p.target]
    for p in moving:  # adding: the union is pushed, the target not yet in sync
        assert set(p.target) < set(p.replicas)
    seen_moving = 0
    for _ in range(120):
        d = c.step()
        check_copies(c)
        seen_moving = max(seen_moving, sum(1 for _, p in c.partitions() if p.target))
        if not d.reassignment.rebalancing and not any(p.target for _, p in c.partitions()):
            break
    assert seen_moving <= SETTINGS.max_concurrent_moves
    holds = c.holds(T)
    assert max(holds.values()) - min(holds.values()) <= 1, holds
    assert holds[3] >= 4
    assert c.holds(U)[3] >= 1
    c.run(15)  # preferred-leader hand-backs, if any, settle
    leaders = [p.leader for name, p in c.partitions() if name == T]
    assert 3 in leaders, "the new broker leads some partitions"
    assert "MoveCompleted" in c.kinds()
    for _, p in c.partitions():
        assert p.state is ONLINE and set(p.live_replicas) == set(p.replicas)
    reasons = {pr.reason for d in c.decisions for pr in d.problems}
    assert "ReplicasChange" not in reasons, "a move's union is not a replication factor change"
    check_copies(c)


def test_scale_down_moves_replicas_off_first_then_releases_the_broker() -> None:
    c = Controller(members={0, 1, 2, 3})
    c.run(5)
    assert all(c.holds(T)[b] > 0 for b in range(4))
    c.members = {0, 1, 2}
    d = c.step()
    assert d.reassignment.evacuating == {3}
    assert d.reassignment.released == frozenset()
    for _ in range(120):
        d = c.step()
        check_copies(c)
        if d.reassignment.released == {3}:
            break
    assert d.reassignment.released == {3}
    assert not d.reassignment.blocked
    assert all(3 not in p.replicas and not p.target for _, p in c.partitions())
    assert "MoveLeaderHandoff" in c.kinds(), "leaderships on broker 3 moved through an election"
    c.fleet.nodes[3].up = False  # now it can go
    c.run(8)
    for _, p in c.partitions():
        assert p.state is ONLINE
    check_copies(c)


def test_a_scale_down_below_the_replication_factor_is_blocked_and_changes_nothing() -> None:
    c = Controller()
    c.run(5)
    before = c.state
    c.members = {0, 1}
    d = c.step()
    assert d.reassignment.blocked
    assert "cannot leave brokers [2]" in d.reassignment.blocked[0]
    assert "below the replication factor" in d.reassignment.blocked[0]
    assert d.reassignment.evacuating == {2}
    assert not any(p.target for _, p in c.partitions())
    assert [p.replicas for t in before.topics.values() for p in t.partitions] == [
        p.replicas for _, p in c.partitions()
    ]


def test_removing_a_dead_broker_that_held_the_last_in_sync_replica_is_blocked() -> None:
    c = Controller(members={0, 1, 2, 3})
    c.run(5)
    c.specs = [TopicSpec(T, 6, replicas=3, min_in_sync=2), TopicSpec(U, 2, replicas=2)]
    # partition U/k whose LRS shrank to broker 3 alone, which then died
    c.fleet.nodes[0].up = c.fleet.nodes[1].up = c.fleet.nodes[2].up = True
    victim = next(p for n, p in c.partitions() if n == U and 3 in p.replicas)
    others = [b for b in victim.replicas if b != 3]
    for b in others:
        c.fleet.nodes[b].up = False
    c.run(5)
    assert c.state.topics[U].partitions[victim.partition].live_replicas == (3,)
    c.fleet.nodes[3].up = False
    for b in others:
        c.fleet.nodes[b].up = True
    c.members = {0, 1, 2}
    d = c.run(6)
    assert any(
        f"{U}/{victim.partition}" in msg and "last in-sync replica" in msg
        for msg in d.reassignment.blocked
    ), d.reassignment.blocked
    assert 3 in c.state.topics[U].partitions[victim.partition].replicas
    c.fleet.nodes[3].up = True  # it comes back: the move goes ahead
    c.settle()
    assert all(3 not in p.replicas for _, p in c.partitions())
    check_copies(c)


def test_a_restarted_controller_resumes_a_move_without_redoing_it() -> None:
    c = Controller()
    c.run(5)
    c.members = {0, 1, 2, 3}
    c.fleet.nodes[3].up = True
    c.run(2)
    targets = {(n, p.partition): p.target for n, p in c.partitions() if p.target}
    assert targets
    c.restart()
    d = c.step()
    assert not any(e.kind == "MoveStarted" for e in d.events), "nothing new while warming up"
    for (n, i), target in targets.items():
        p = c.state.topics[n].partitions[i]
        assert p.target in (target, ())
    c.settle()
    check_copies(c)


def test_a_broker_removed_while_it_is_being_added_is_retargeted() -> None:
    c = Controller()
    c.run(5)
    c.members = {0, 1, 2, 3}
    c.fleet.nodes[3].up = True
    c.step()
    assert any(3 in p.target for _, p in c.partitions())
    c.members = {0, 1, 2}
    c.settle()
    assert all(3 not in p.replicas for _, p in c.partitions())
    assert all(set(p.replicas) <= {0, 1, 2} for _, p in c.partitions())
    check_copies(c)


def test_the_same_inputs_twice_change_nothing_mid_move() -> None:
    c = Controller()
    c.run(5)
    c.members = {0, 1, 2, 3}
    c.fleet.nodes[3].up = True
    for _ in range(12):
        d = c.step()
        again = rc.reconcile(
            rc.StepInputs(
                d.state,
                c.specs,
                dict(c.fleet.latest),
                c.clock.now_ms,
                SETTINGS,
                observing_since_ms=c.since,
                members=frozenset(c.members),
            ),
        )
        assert not again.changed, [e.kind for e in again.events]


def test_a_leader_that_missed_the_removal_cannot_complete_the_move_adding_it_back() -> None:
    # End to end on the copying fleet: every leader applies the pushes
    # that start the evacuation of broker 3, then misses every push after (so it keeps 3
    # in its replica set and LRS while 3 drops its copies); broker 3 is then added back.
    c = Controller(members={0, 1, 2, 3})
    c.settings = replace(SETTINGS, max_concurrent_moves=20)  # every evacuation at once
    c.run(5)
    held = {p.partition for name, p in c.partitions() if name == T and 3 in p.replicas}
    c.members = {0, 1, 2}
    c.step()  # the evacuation starts
    c.step()  # every leader applies it
    for b in (0, 1, 2):
        c.fleet.nodes[b].deaf = True
    c.settle()
    assert all(3 not in p.replicas for _, p in c.partitions())
    c.members = {0, 1, 2, 3}
    readded = set()
    for _ in range(15):
        d = c.step()
        assert "MoveCompleted" not in [e.kind for e in d.events], "a stale LRS completed it"
        readded |= {p.partition for name, p in c.partitions() if name == T and 3 in p.target}
    assert readded & held, "broker 3 comes back into a partition its old copy was in"
    for b in (0, 1, 2):
        c.fleet.nodes[b].deaf = False
    for _ in range(60):
        d = c.step()
        for e in d.events:
            if e.kind == "MoveCompleted":
                check_completed(c, e)
        check_copies(c)
        if not d.reassignment.rebalancing and not any(p.target for _, p in c.partitions()):
            break
    assert c.holds(T)[3] >= 4


def test_a_deaf_leaders_report_does_not_put_a_re_added_replica_in_the_lrs() -> None:
    # F1's fence, the controller's side: while the leader has not applied the push that
    # started the move (its heartbeat's generation is below the move's), its report of
    # the LRS still counts broker 3 by the progress it had before it dropped its copy. If
    # the controller recorded that LRS, every later push would carry 3 as in sync, and a
    # leader applying such a push (having missed the one that started the move) would not
    # reset 3: the move would complete on 3 by its stale progress.
    c = Controller(members={0, 1, 2, 3})
    c.settings = replace(SETTINGS, max_concurrent_moves=20)
    c.run(5)
    held = {p.partition for name, p in c.partitions() if name == T and 3 in p.replicas}
    c.members = {0, 1, 2}
    c.step()
    c.step()
    for b in (0, 1, 2):
        c.fleet.nodes[b].deaf = True
    c.settle()
    c.members = {0, 1, 2, 3}
    readded = set()
    for _ in range(15):
        c.step()
        for name, p in c.partitions():
            if name != T or 3 not in p.target or p.partition not in held:
                continue
            readded.add(p.partition)
            assert p.leader is not None
            if c.fleet.nodes[p.leader].applied < p.target_generation:
                assert 3 not in p.live_replicas, (p, c.fleet.nodes[p.leader].applied)
    assert readded, "broker 3 comes back into a partition its old copy was in"


def test_target_round_trips_and_is_absent_without_a_move() -> None:
    p = PartitionStatus(0, (0, 1, 2, 3), 0, 4, (0, 1, 2), ONLINE, target=(3, 1, 2))
    doc = json.loads(json.dumps(PARTITION_STATUS_JSON.dump(p)))
    assert doc["targetReplicas"] == [3, 1, 2]
    assert PARTITION_STATUS_JSON.load(doc) == p
    assert "targetReplicas" not in PARTITION_STATUS_JSON.dump(replace(p, target=()))


# --------------------------------------------------------------------------- random schedules


brokers = st.integers(0, 4)
waits = st.sampled_from([POLL, POLL, POLL, 4_000, 6_000])


class Scaling(RuleBasedStateMachine):
    """Members change (scale up and down), brokers crash and return, the controller restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.c = Controller()
        self.c.run(4)

    @rule(b=brokers, wait=waits)
    def crash(self, b: int, wait: int) -> None:
        self.c.fleet.nodes[b].up = False
        self.step(wait)

    @rule(b=brokers, wait=waits)
    def come_back(self, b: int, wait: int) -> None:
        if b in self.c.members or b in self.c.state.brokers:
            self.c.fleet.nodes[b].up = True
        self.step(wait)

    @rule(b=brokers, stall=st.booleans(), wait=waits)
    def stall(self, b: int, stall: bool, wait: int) -> None:
        self.c.fleet.nodes[b].promotes = not stall
        self.step(wait)

    @precondition(lambda self: len(self.c.members) < 5)
    @rule(wait=waits)
    def scale_up(self, wait: int) -> None:
        new = len(self.c.members)
        self.c.members = set(range(new + 1))
        self.c.fleet.nodes[new].up = True
        self.step(wait)

    @precondition(lambda self: len(self.c.members) > 3)
    @rule(wait=waits)
    def scale_down(self, wait: int) -> None:
        self.c.members = set(range(len(self.c.members) - 1))
        self.step(wait)

    @rule(b=brokers, deaf=st.booleans(), wait=waits)
    def miss_pushes(self, b: int, deaf: bool, wait: int) -> None:
        """Broker ``b`` stops (or resumes) applying the controller's pushes."""
        self.c.fleet.nodes[b].deaf = deaf
        self.step(wait)

    @rule(wait=waits)
    def restart(self, wait: int) -> None:
        self.c.restart()
        self.step(wait)

    @rule(wait=waits)
    def tick(self, wait: int) -> None:
        self.step(wait)

    def step(self, wait: int) -> None:
        d = self.c.step(wait)
        for e in d.events:
            event(e.kind)
            if e.kind == "MoveCompleted":
                check_completed(self.c, e)
        # a released broker holds nothing: stopping it loses nothing
        for b in d.reassignment.released:
            assert all(b not in p.replicas for _, p in self.c.partitions())
        check_copies(self.c)

    @invariant()
    def move_shapes(self) -> None:
        moving = sum(1 for _, p in self.c.partitions() if p.target)
        assert moving <= SETTINGS.max_concurrent_moves
        for _, p in self.c.partitions():
            if p.target:
                assert set(p.target) <= set(p.replicas)
                assert len(set(p.target)) == len(p.target)
            assert len(p.target or p.replicas) in (2, 3)

    def teardown(self) -> None:
        # every member (and every broker still holding data) live again: every move finishes
        for node in self.c.fleet.nodes.values():
            node.promotes = True
            node.deaf = False
            if node.id in self.c.members:
                node.up = True
        for _ in range(200):
            d = self.c.step()
            check_copies(self.c)
            for b in d.reassignment.released:
                self.c.fleet.nodes[b].up = False
            outside = any(not set(p.replicas) <= self.c.members for _, p in self.c.partitions())
            if d.reassignment.blocked:
                # only a removed broker that is down can block: bring the data back
                for b in d.reassignment.evacuating:
                    self.c.fleet.nodes[b].up = True
            moving = any(p.target for _, p in self.c.partitions())
            # warming up (after a restart, a removed broker that stays down is unheard for
            # one TTL) the controller plans no move: nothing to conclude from that step
            settled = not outside and not moving and not d.reassignment.rebalancing
            if settled and not d.liveness.warming_up:
                break
        else:
            raise AssertionError(f"moves never finished: {CLUSTER_STATE_JSON.dump(self.c.state)}")
        for name in (T, U):
            holds = self.c.holds(name)
            assert max(holds.values()) - min(holds.values()) <= 1, (name, holds)


TestScaling = Scaling.TestCase
TestScaling.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# --------------------------------------------------------------------------- racks


def plan(
    partitions: list[tuple[int, ...]], members: set[int], racks: dict[int, str]
) -> dict[int, tuple[int, ...]]:
    """The targets ``moves.step`` starts on one topic placed as ``partitions``."""
    topic = TopicStatus(
        T,
        1,
        tuple(PartitionStatus(i, r, r[0], 1, r, ONLINE) for i, r in enumerate(partitions)),
        {},
    )
    moved = rc.moves.step(
        {T: topic},
        members=members,
        liveness=LIVE,
        reports={},
        busy=(),
        now_ms=0,
        settings=replace(SETTINGS, max_concurrent_moves=100),
        pushed_at=8,
        applied={b: 7 for b in LIVE.live},
        racks=racks,
    )
    return {p.partition: p.target for p in moved.topics[T].partitions if p.target}


def test_an_evacuated_replica_goes_to_the_rack_the_partition_lacks() -> None:
    # broker 1 (rack b) leaves: its replacement is 3, the other broker of rack b, though
    # 2 (rack a) has the lower id and holds as few
    racks = {0: "a", 1: "b", 2: "a", 3: "b"}
    assert plan([(0, 1)], {0, 2, 3}, racks) == {0: (0, 3)}
    assert plan([(0, 1)], {0, 2, 3}, {}) == {0: (0, 2)}, "without racks, the lowest id"


def test_balancing_never_narrows_a_partition_over_racks() -> None:
    # broker 2 is alone in rack b, so it holds every partition by design; rack a's
    # brokers even out between themselves, and 2 keeps its replicas
    racks = {0: "a", 1: "a", 2: "b"}
    targets = plan([(2, 0), (2, 0), (2, 0), (1, 2)], {0, 1, 2}, racks)
    assert targets == {0: (2, 1)}
    assert all(len({racks[b] for b in t}) == 2 for t in targets.values())
    # without racks, broker 2 gives up replicas to broker 1
    assert any(2 not in t for t in plan([(2, 0), (2, 0), (2, 0), (1, 2)], {0, 1, 2}, {}).values())
