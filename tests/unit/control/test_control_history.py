"""A topic's partitioning history: the holds that keep each key in order for a cohort
created after a transition (``repartitions.advance_history``, ``PartitioningHistory``).

The simulation keeps real logs of keyed records routed by ``crc32(key) % N`` through a
run of transitions, records each transition as the controller does (cutover offsets of
every old partition and of every retired one a grow routes to again), and lets a new
cohort read under the holds, in an order a hypothesis strategy picks, with the
controller's history step run between reads. It checks each key's records arrive in
the order they were appended, and that the cohort reads everything (no deadlock).
"""

from __future__ import annotations

import itertools
import json
import random
import zlib
from dataclasses import dataclass, field, replace

from control_fakes import FakeClock, Fleet
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.control import election
from headrace.control import reconcile as rc
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    TOPIC_STATUS_JSON,
    ClusterState,
    RepartitionPhase,
    RepartitionProgress,
    RepartitionRequest,
    TopicSpec,
    TopicStatus,
    Transition,
)
from headrace.control.repartitions import advance_history
from headrace.control.settings import ControlSettings
from headrace.control.topology import cluster_topology
from headrace.protocol.coordination import (
    CohortPosition,
    PartitioningHistory,
    PartitionReport,
    PastTransition,
    TopicPlacement,
)

T = "default/history"
LATE = "late"


def key_of(i: int) -> bytes:
    return f"k{i:03d}".encode()


@dataclass
class Simulated:
    """Logs of keyed records through a run of transitions, as brokers would store them."""

    keys: int
    #: partition -> [(key, seq)] in offset order
    logs: list[list[tuple[int, int]]] = field(default_factory=list)
    transitions: list[PastTransition] = field(default_factory=list)
    routing: int = 0
    seqs: dict[int, int] = field(default_factory=dict)

    def produce(self, rounds: int) -> None:
        for _ in range(rounds):
            for k in range(self.keys):
                p = zlib.crc32(key_of(k)) % self.routing
                seq = self.seqs.get(k, 0)
                self.seqs[k] = seq + 1
                self.logs[p].append((k, seq))

    def start(self, partitions: int) -> None:
        self.logs = [[] for _ in range(partitions)]
        self.routing = partitions

    def repartition(self, to: int, *, measure_retired: bool = True) -> None:
        """What the controller keeps of a transition ``routing -> to`` at its finalize."""
        existing = len(self.logs) if measure_retired else None
        marker = Transition(
            "r",
            self.routing,
            to,
            len(self.transitions) + 1,
            len(self.transitions) + 2,
            0,
            1,
            existing_partitions=existing,
        )
        offsets = {p: len(self.logs[p]) for p in range(marker.measured)}
        self.transitions.append(replace(marker, cutover_offsets=offsets).past())
        while len(self.logs) < to:
            self.logs.append([])
        self.routing = to

    def topic(self) -> TopicStatus:
        partitions = tuple(election.first_status(p, (0,)) for p in range(len(self.logs)))
        history = PartitioningHistory(tuple(self.transitions))
        return TopicStatus(T, len(self.transitions) + 1, partitions, history=history)


def reports(sim: Simulated, cursors: list[int], start: int = 0) -> dict:  # type: ignore[type-arg]
    return {
        (T, p): {
            0: PartitionReport(
                T,
                p,
                "leader",
                1,
                len(log),
                len(log),
                log_start_offset=start,
                cursors={LATE: cursors[p]},
            )
        }
        for p, log in enumerate(sim.logs)
    }


def read_as_a_new_cohort(sim: Simulated, rng: random.Random) -> tuple[list[tuple[int, int]], bool]:
    """What a new cohort is delivered, in bursts of one partition's records, from partitions
    ``rng`` picks among those the holds let deliver; and whether it got every record."""
    topic = sim.topic()
    cursors = [0] * len(sim.logs)
    delivered: list[tuple[int, int]] = []
    total = sum(len(log) for log in sim.logs)
    while len(delivered) < total:
        history = topic.history
        bounds = {}
        for p, log in enumerate(sim.logs):
            held = None if history is None else history.hold(LATE, p)
            bound = len(log) if held is None else min(held, len(log))
            if cursors[p] < bound:
                bounds[p] = bound
        ready = sorted(bounds)
        if not ready:
            after = advance_history(topic, reports(sim, cursors))
            if after == topic:
                return delivered, False  # nothing deliverable and nothing to release
            topic = after
            continue
        p = rng.choice(ready)
        for _ in range(rng.randint(1, 25)):  # a burst of one partition, as a fetch brings
            if cursors[p] == bounds[p]:
                break
            delivered.append(sim.logs[p][cursors[p]])
            cursors[p] += 1  # delivered and acked
        if rng.random() < 0.2:
            topic = advance_history(topic, reports(sim, cursors))
    return delivered, True


def out_of_order(delivered: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    last: dict[int, int] = {}
    bad = []
    for key, seq in delivered:
        if seq < last.get(key, -1):
            bad.append((key, last[key], seq))
        last[key] = max(seq, last.get(key, -1))
    return bad


def run(counts: list[int], rounds: int = 3, **how: bool) -> Simulated:
    sim = Simulated(keys=40)
    sim.start(counts[0])
    sim.produce(rounds)
    for to in counts[1:]:
        sim.repartition(to, **how)
        sim.produce(rounds)
    return sim


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 8), min_size=2, max_size=5).filter(
        lambda cs: all(a != b for a, b in itertools.pairwise(cs))
    ),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
)
def test_a_new_cohort_reads_every_key_in_order_across_any_history(
    counts: list[int], rounds: int, rng: random.Random
) -> None:
    sim = run(counts, rounds)
    delivered, complete = read_as_a_new_cohort(sim, rng)
    assert complete, f"{counts}: a new cohort stopped after {len(delivered)} records"
    assert not out_of_order(delivered), (counts, out_of_order(delivered)[:3])


def test_a_shrink_then_a_grow_back_does_not_deadlock_a_new_cohort() -> None:
    # 8 -> 6 -> 8: under the grow, 7 is fed by 1, 3 and 5 (gcd 2); under the shrink, 1, 3
    # and 5 are fed by 7 among others. Held from 0 under the grow (as a partition it
    # added), 7 could never be read up to its shrink cutover, which 1, 3 and 5 wait for.
    for seed in range(5):
        delivered, complete = read_as_a_new_cohort(run([8, 6, 8]), random.Random(seed))
        assert complete and not out_of_order(delivered)
    stuck, complete = read_as_a_new_cohort(run([8, 6, 8], measure_retired=False), random.Random(0))
    assert not complete, "without the retired partitions' cutover offsets it deadlocks"
    assert 0 < len(stuck) < sum(len(log) for log in run([8, 6, 8]).logs)


def test_a_cohort_is_held_from_its_position_on_and_a_cohort_past_the_history_by_nothing() -> None:
    shrink = PastTransition(4, 2, 2, {0: 10, 1: 10, 2: 7, 3: 5})
    grow = PastTransition(2, 4, 3, {0: 20, 1: 20, 2: 7, 3: 5})
    history = PartitioningHistory(
        (shrink, grow),
        {"half": CohortPosition(2, (0,)), "later": CohortPosition(3), "past": CohortPosition(4)},
    )
    assert [history.hold("new", p) for p in range(4)] == [10, 10, 7, 5]  # shrink: 0, 1
    assert [history.hold("half", p) for p in range(4)] == [20, 10, 7, 5]
    assert [history.hold("later", p) for p in range(4)] == [20, 20, 7, 5]
    assert [history.hold("past", p) for p in range(4)] == [None] * 4
    assert history.holds("new") and history.holds("later") and not history.holds("past")


def test_a_transition_is_forgotten_once_retention_passed_its_cutover_offsets() -> None:
    sim = run([4, 2, 4], rounds=2)
    topic = sim.topic()
    assert topic.history is not None and len(topic.history.transitions) == 2
    shrink, grow = topic.history.transitions
    below_shrink = max(shrink.cutover_offsets.values())
    cursors = [0] * 4
    # Retention passed the shrink's cutovers only: the shrink is forgotten, the grow kept.
    kept = advance_history(topic, reports(sim, cursors, start=below_shrink))
    assert kept.history is not None and kept.history.transitions == (grow,)
    # Past every cutover: nothing is kept, and nothing is held.
    gone = advance_history(topic, reports(sim, cursors, start=10**6))
    assert gone.history is None


def test_a_cohort_that_read_past_the_history_costs_nothing() -> None:
    sim = run([4, 2], rounds=2)
    ends = [len(log) for log in sim.logs]
    topic = advance_history(sim.topic(), reports(sim, ends))
    assert topic.history is not None
    assert topic.history.cohorts == {LATE: CohortPosition(topic.history.past)}
    assert all(topic.history.hold(LATE, p) is None for p in range(4))
    # An unknown cohort is not written down: it starts at the oldest transition.
    assert advance_history(sim.topic(), reports(sim, [0] * 4)).history == sim.topic().history


def test_the_history_travels_in_the_status_and_the_topology() -> None:
    sim = run([4, 2, 4], rounds=1)
    topic = replace(
        sim.topic(),
        history=replace(sim.topic().history, cohorts={"c": CohortPosition(2, (1,))}),  # type: ignore[type-var]
    )
    assert TOPIC_STATUS_JSON.load(json.loads(json.dumps(TOPIC_STATUS_JSON.dump(topic)))) == topic
    state = ClusterState(1, {}, {T: topic})
    pushed = next(t for t in cluster_topology(state, "local").topics if t.name == T)
    assert pushed.history == topic.history
    assert TopicPlacement.from_json(json.loads(json.dumps(pushed.to_json()))) == pushed


# ------------------------------------------------------------------ through the controller

SETTINGS = ControlSettings(liveness_ttl_ms=3_000, repartition_adoption_timeout_ms=1_000)


class Controller:
    """reconcile over the fake fleet (a leader appends a record per poll), as the control
    tests' ``Cluster`` does, with each leader's cutover recorded like a broker's."""

    def __init__(self, partitions: int) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(3, self.clock)
        self.specs = [TopicSpec(T, partitions)]
        self.state = ClusterState()
        self.since = self.clock.now_ms
        self.requests: list[RepartitionRequest] = []
        self.progress: dict[str, RepartitionProgress] = {}
        self.cutovers: dict[int, tuple[int, int]] = {}
        for _ in range(3):
            self.step()

    def step(self) -> None:
        self.clock.advance(1_000)
        beats = {}
        for b, hb in self.fleet.poll(self.state).items():
            out = []
            for r in hb.partitions:
                topic = self.state.topics.get(r.topic)
                if r.role == "leader" and topic is not None and hb.received_ms == self.clock.now_ms:
                    if self.cutovers.get(r.partition, (0, 0))[0] != topic.partitioning_version:
                        self.cutovers[r.partition] = (topic.partitioning_version, r.log_end_offset)
                    r = replace(r, cutover=self.cutovers[r.partition])
                out.append(r)
            beats[b] = replace(hb, partitions=tuple(out))
        d = rc.reconcile(
            rc.StepInputs(
                self.state,
                self.specs,
                beats,
                self.clock.now_ms,
                SETTINGS,
                observing_since_ms=self.since,
                repartition_requests=self.requests,
                repartition_progress=self.progress,
            ),
        )
        self.state, self.progress = d.state, dict(d.repartitions)

    def repartition(self, name: str, partitions: int) -> None:
        self.requests.append(RepartitionRequest(name, T, partitions, 1_000))
        for _ in range(40):
            if self.progress.get(name, RepartitionProgress(name)).phase is (
                RepartitionPhase.FINALIZED
            ):
                return
            self.step()
        raise AssertionError(f"{name}: {self.progress.get(name)}")


def test_the_controller_keeps_each_finalized_transition_with_its_retired_partitions() -> None:
    c = Controller(6)
    c.repartition("shrink", 4)
    topic = c.state.topics[T]
    assert topic.history is not None
    (shrink,) = topic.history.transitions
    assert (shrink.from_partitions, shrink.to_partitions) == (6, 4)
    assert set(shrink.cutover_offsets) == set(range(6))  # every old partition had records
    c.repartition("back", 8)
    topic = c.state.topics[T]
    assert topic.history is not None
    shrink_kept, grow = topic.history.transitions
    assert shrink_kept == shrink
    # The grow measured 4 and 5 (retired, routed to again) at their own log ends; 6 and 7
    # were placed new.
    assert set(grow.cutover_offsets) == set(range(6))
    assert grow.cutover_offsets[4] >= shrink.cutover_offsets[4]
    # A restarted controller reads it back as it was.
    again = CLUSTER_STATE_JSON.load(json.loads(json.dumps(CLUSTER_STATE_JSON.dump(c.state))))
    assert again.topics[T].history == topic.history
