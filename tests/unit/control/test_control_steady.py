"""``SteadySteps`` gives the decisions ``reconcile`` gives, and skips the walk while idle.

A twin controller: one fake fleet, polled once per step, feeds the same
heartbeats to plain ``reconcile`` and to ``SteadySteps``, each keeping its own
state. Random schedules of crashes, returns, drains, stalls, idle spells,
cohort members, spec edits and controller restarts must give equal decisions
at every step, and the idle spells must be skipped.
"""

from __future__ import annotations

import json

from control_fakes import FakeClock, Fleet
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.control import reconcile as rc
from headrace.control.model import CLUSTER_STATE_JSON, ClusterState, TopicSpec
from headrace.control.settings import ControlSettings
from headrace.control.steady import SteadySteps, steady

SETTINGS = ControlSettings(
    liveness_ttl_ms=3_000,
    candidate_wait_ms=5_000,
    offline_retry_ms=30_000,
    preferred_leader_quiet_ms=10_000,
)
POLL = 1_000
T = "default/orders"
SPECS = [TopicSpec(T, 4, replicas=3, min_in_sync=2), TopicSpec("default/b", 2)]


class Twins:
    """Plain ``reconcile`` and ``SteadySteps`` on the same heartbeats, states kept apart."""

    def __init__(self, brokers: int = 4, specs: list[TopicSpec] | None = None) -> None:
        self.clock = FakeClock()
        self.fleet = Fleet(brokers, self.clock)
        self.specs = list(specs if specs is not None else SPECS)
        self.plain = ClusterState()
        self.skipping = ClusterState()
        self.steps = SteadySteps()
        self.since = self.clock.now_ms
        self.last: rc.Decision | None = None

    def step(self, wait: int = POLL) -> rc.Decision:
        self.clock.advance(wait)
        heartbeats = self.fleet.poll(self.plain)
        now = self.clock.now_ms
        expected = rc.reconcile(
            rc.StepInputs(
                self.plain, self.specs, heartbeats, now, SETTINGS, observing_since_ms=self.since
            )
        )
        got = self.steps.reconcile(
            rc.StepInputs(
                self.skipping, self.specs, heartbeats, now, SETTINGS, observing_since_ms=self.since
            )
        )
        assert got == expected
        # the controller keeps its state unless the step changed it
        if expected.changed:
            self.plain = expected.state
        if got.changed:
            self.skipping = got.state
        self.last = expected
        return expected

    def restart(self) -> None:
        """A new controller process: the persisted document, no heartbeats, no memory."""
        persisted = json.loads(json.dumps(CLUSTER_STATE_JSON.dump(self.plain)))
        self.plain = CLUSTER_STATE_JSON.load(persisted)
        self.skipping = CLUSTER_STATE_JSON.load(persisted)
        self.fleet.forget()
        self.steps = SteadySteps()
        self.since = self.clock.now_ms


def idle(twins: Twins) -> None:
    for broker in twins.fleet.brokers.values():
        broker.appends = False


def test_an_idle_cluster_is_skipped_after_one_steady_step() -> None:
    twins = Twins()
    idle(twins)
    for _ in range(6):
        twins.step()
    assert twins.last is not None and steady(twins.last)
    skipped = twins.steps.skipped
    for _ in range(20):
        twins.step()
    assert twins.steps.skipped == skipped + 20


def test_traffic_is_never_skipped() -> None:
    twins = Twins()
    for _ in range(20):
        twins.step()  # every leader appends a record per poll: the reports change
    assert twins.steps.skipped == 0


def test_a_broker_going_quiet_is_noticed_while_skipping() -> None:
    twins = Twins()
    idle(twins)
    for _ in range(8):
        twins.step()
    assert twins.steps.skipped > 0
    victim = twins.plain.topics[T].partitions[0].leader
    assert victim is not None
    twins.fleet.brokers[victim].up = False  # its last heartbeat stays, and ages
    for _ in range(5):
        twins.step()
    assert twins.last is not None and victim in twins.last.liveness.dead
    assert twins.plain.topics[T].partitions[0].leader != victim


def test_a_spec_edit_is_reconciled_while_skipping() -> None:
    twins = Twins()
    idle(twins)
    for _ in range(8):
        twins.step()
    skipped = twins.steps.skipped
    twins.specs.append(TopicSpec("default/new", 3))
    decision = twins.step()
    assert "default/new" in decision.state.topics
    assert twins.steps.skipped == skipped


brokers = st.integers(0, 3)
waits = st.sampled_from([0, POLL, POLL, POLL, POLL, 4_000, 6_000, 11_000, 31_000])


class Schedules(RuleBasedStateMachine):
    """Random faults between idle spells; the twins must never disagree."""

    def __init__(self) -> None:
        super().__init__()
        self.twins = Twins()
        self.twins.step()
        self.twins.step()

    @rule(b=brokers, wait=waits)
    def crash(self, b: int, wait: int) -> None:
        self.twins.fleet.brokers[b].up = False
        self.step(wait)

    @rule(b=brokers, wait=waits)
    def come_back(self, b: int, wait: int) -> None:
        self.twins.fleet.brokers[b].up = True
        self.step(wait)

    @rule(b=brokers, flag=st.booleans(), wait=waits)
    def drain(self, b: int, flag: bool, wait: int) -> None:
        self.twins.fleet.brokers[b].draining = flag
        self.step(wait)

    @rule(b=brokers, flag=st.booleans(), wait=waits)
    def stall(self, b: int, flag: bool, wait: int) -> None:
        self.twins.fleet.brokers[b].promotes = not flag
        self.step(wait)

    @rule(b=brokers, flag=st.booleans(), wait=waits)
    def traffic(self, b: int, flag: bool, wait: int) -> None:
        self.twins.fleet.brokers[b].appends = flag
        self.step(wait)

    @rule(flag=st.booleans(), wait=waits)
    def traffic_everywhere(self, flag: bool, wait: int) -> None:
        for broker in self.twins.fleet.brokers.values():
            broker.appends = flag
        self.step(wait)

    @rule(b=brokers, members=st.sets(st.sampled_from(["m1", "m2", "m3"])), wait=waits)
    def members(self, b: int, members: set[str], wait: int) -> None:
        self.twins.fleet.brokers[b].members[(T, "c")] = members
        self.step(wait)

    @precondition(lambda self: len(self.twins.specs) == len(SPECS))
    @rule(wait=waits)
    def add_topic(self, wait: int) -> None:
        self.twins.specs.append(TopicSpec("default/added", 2, replicas=2))
        self.step(wait)

    @precondition(lambda self: len(self.twins.specs) > len(SPECS))
    @rule(wait=waits)
    def delete_topic(self, wait: int) -> None:
        self.twins.specs.pop()
        self.step(wait)

    @rule(wait=waits)
    def restart(self, wait: int) -> None:
        self.twins.restart()
        self.step(wait)

    @rule(steps=st.integers(1, 6))
    def idle_spell(self, steps: int) -> None:
        for _ in range(steps):
            self.step(POLL)

    def step(self, wait: int) -> None:
        skipped = self.twins.steps.skipped
        self.twins.step(wait)
        if self.twins.steps.skipped > skipped:
            event("skipped")

    @invariant()
    def states_agree(self) -> None:
        assert self.twins.plain == self.twins.skipping


TestSchedules = Schedules.TestCase
TestSchedules.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_heartbeats_rebuilt_every_poll_from_the_same_reports_are_skipped() -> None:
    """What the controller's fleet hands over when a delta is empty: new heartbeat objects
    and new tuples of the same report objects (``bench.steady_step`` builds them so)."""
    from bench.steady_step import measure

    row = measure(300, steps=3)  # raises RuntimeError unless every idle step was skipped
    assert row["partitions"] == 300
