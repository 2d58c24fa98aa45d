"""Delivery gates: every row of the transition table, then random event sequences."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from headrace.cohorts import gates as g
from headrace.errors import (
    AlreadyJoined,
    InvalidMemberId,
    MemberIdInUse,
    NotGateHolder,
    UnknownMember,
)

GRACE = 1_000
SESSION = 10_000


def cohort(partitions: int = 4) -> g.CohortGates:
    return g.CohortGates("c", list(range(partitions)), grace_ms=GRACE)


def states(c: g.CohortGates) -> dict[int, tuple[g.GateState, str | None, int]]:
    return {p: (gate.state, gate.holder, gate.epoch) for p, gate in c.gates.items()}


HELD, REVOKING, FREE = g.GateState.HELD, g.GateState.REVOKING, g.GateState.FREE


# --------------------------------------------------------------------------- the table, row by row


def test_free_gate_named_by_the_target_is_held_with_a_new_epoch() -> None:
    c = cohort(2)
    assert states(c) == {0: (FREE, None, 0), 1: (FREE, None, 0)}
    c.join("a", 0, SESSION)
    assert states(c) == {0: (HELD, "a", 1), 1: (HELD, "a", 1)}
    assert [gate.partition for gate in c.deliverable("a")] == [0, 1]


def test_held_gate_named_for_someone_else_is_revoked_with_grace() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 100, SESSION)
    moving = next(iter(c.target["b"]))
    gate = c.gates[moving]
    assert (gate.state, gate.holder, gate.epoch) == (REVOKING, "a", 1)
    assert gate.deadline_ms == 100 + GRACE
    # a stops receiving it, but may still ack what it has
    assert moving not in [x.partition for x in c.deliverable("a")]
    assert c.check_holder("a", moving, 1) is gate
    assert c.view("a") == ({1 - moving: 1}, [moving])
    assert c.view("b") == ({}, [])


def test_held_gate_named_for_nobody_is_revoked() -> None:
    c = cohort(1)
    c.join("a", 0, SESSION)
    c.leave("a", 50)
    assert states(c) == {0: (REVOKING, "a", 1)}
    assert c.members["a"].leaving


def test_revoking_gate_released_goes_to_the_new_target_with_a_new_epoch() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 100, SESSION)
    moving = next(iter(c.target["b"]))
    c.release("a", [moving], 200)
    assert states(c)[moving] == (HELD, "b", 2)
    with pytest.raises(NotGateHolder):
        c.check_holder("a", moving, 1)
    assert c.check_holder("b", moving, 2).holder == "b"


def test_revoking_gate_is_forced_free_when_grace_passes() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 100, SESSION)
    moving = next(iter(c.target["b"]))
    assert c.tick(100 + GRACE - 1) == []
    assert states(c)[moving] == (REVOKING, "a", 1)
    c.tick(100 + GRACE)
    assert states(c)[moving] == (HELD, "b", 2)
    with pytest.raises(NotGateHolder):  # a's late ack is refused
        c.check_holder("a", moving, 1)


def test_revoking_gate_named_for_its_holder_again_resumes_with_the_same_epoch() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 100, SESSION)
    moving = next(iter(c.target["b"]))
    c.disconnect("b", 150)
    assert states(c) == {0: (HELD, "a", 1), 1: (HELD, "a", 1)}
    assert c.check_holder("a", moving, 1).state is HELD
    assert moving in [x.partition for x in c.deliverable("a")]


@pytest.mark.parametrize("revoking", [False, True])
def test_holder_disconnect_frees_its_gates_at_once(revoking: bool) -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 100, SESSION)
    if not revoking:
        c.release("a", sorted(c.target["b"]), 100)
    c.disconnect("a", 200)
    assert "a" not in c.members
    assert {p: (s, h) for p, (s, h, _) in states(c).items()} == {0: (HELD, "b"), 1: (HELD, "b")}
    # every gate b now holds was admitted anew: a higher epoch than a's
    assert all(e == 2 for _, _, e in states(c).values())


def test_holder_session_timeout_frees_its_gates() -> None:
    c = cohort(2)
    c.join("a", 0, 1_000)
    c.join("b", 0, 5_000)
    c.release("a", sorted(c.target["b"]), 0)
    c.heartbeat("b", 900)
    assert c.tick(1_000) == []  # exactly the timeout is still alive
    assert c.tick(1_001) == ["a"]
    assert all(h == "b" for _, h, _ in states(c).values())


def test_polite_leave_stays_until_released_then_goes() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 0, SESSION)
    c.leave("a", 10)
    assert c.members["a"].leaving
    held_by_a = [p for p, (_, h, _) in states(c).items() if h == "a"]
    c.release("a", held_by_a, 20)
    assert "a" not in c.members
    assert all(s is HELD and h == "b" for s, h, _ in states(c).values())


def test_leaving_member_goes_when_grace_passes() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 0, SESSION)
    c.leave("a", 10)
    c.tick(10 + GRACE)
    assert "a" not in c.members
    assert all(s is HELD and h == "b" for s, h, _ in states(c).values())


def test_leave_of_a_member_holding_nothing_drops_it_at_once() -> None:
    c = cohort(1)
    c.join("a", 0, SESSION)
    c.join("b", 0, SESSION)
    c.leave("b", 1)
    assert "b" not in c.members
    assert states(c) == {0: (HELD, "a", 1)}


def test_release_of_a_held_gate_is_ignored() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.release("a", [0, 1, 99], 10)
    assert states(c) == {0: (HELD, "a", 1), 1: (HELD, "a", 1)}


def test_release_by_a_non_holder_is_ignored() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 0, SESSION)
    moving = next(iter(c.target["b"]))
    c.release("b", [moving], 10)
    assert states(c)[moving] == (REVOKING, "a", 1)


def test_rejoin_after_disconnect_gets_a_new_epoch() -> None:
    c = cohort(1)
    c.join("a", 0, SESSION)
    c.disconnect("a", 5)
    assert states(c) == {0: (FREE, None, 1)}
    c.join("a", 6, SESSION)
    assert states(c) == {0: (HELD, "a", 2)}
    with pytest.raises(NotGateHolder):
        c.check_holder("a", 0, 1)


def test_generation_bumps_only_when_the_target_changes() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    assert c.generation == 1
    c.heartbeat("a", 5)
    c.tick(10)
    c.release("a", [0], 20)
    assert c.generation == 1
    c.join("b", 30, SESSION)
    assert c.generation == 2
    c.disconnect("nobody", 40)
    c.leave("nobody", 40)
    assert c.generation == 2


def test_set_partitions_adds_and_removes_gates() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.set_partitions([1, 2, 3], 10)
    assert sorted(c.gates) == [1, 2, 3]
    assert all(s is HELD and h == "a" for s, h, _ in states(c).values())
    assert c.target == {"a": frozenset({1, 2, 3})}


def test_a_partition_that_comes_back_continues_its_epochs() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.disconnect("a", 1)
    c.join("a", 2, SESSION)
    assert states(c)[1] == (HELD, "a", 2)
    c.set_partitions([0], 3)
    c.set_partitions([0, 1], 4)
    assert states(c)[1] == (HELD, "a", 3)
    with pytest.raises(NotGateHolder):  # an ack from the tenure before the move
        c.check_holder("a", 1, 2)


def test_leaving_member_goes_when_its_revoking_partition_goes_away() -> None:
    c = cohort(2)
    c.join("a", 0, SESSION)
    c.join("b", 0, SESSION)
    c.leave("a", 1)
    revoking = c.view("a")[1]
    assert revoking
    c.set_partitions([p for p in c.partitions if p not in revoking], 2)
    assert "a" not in c.members
    c.join("a", 3, SESSION)  # the id is free again


def test_membership_errors() -> None:
    c = cohort(1)
    c.join("a", 0, SESSION)
    with pytest.raises(MemberIdInUse):
        c.join("a", 1, SESSION)
    c.join("b", 1, SESSION)
    c.leave("a", 2)  # a still revoking
    with pytest.raises(MemberIdInUse, match="leaving"):
        c.join("a", 3, SESSION)
    with pytest.raises(UnknownMember):
        c.heartbeat("zed", 4)
    with pytest.raises(NotGateHolder):
        c.check_holder("b", 7, 1)


def test_one_identity_per_connection() -> None:
    g.ensure_single_identity(None, "a")
    with pytest.raises(AlreadyJoined):
        g.ensure_single_identity("a", "b")
    with pytest.raises(InvalidMemberId):
        g.ensure_single_identity(None, "")


@pytest.mark.parametrize(
    "member_id",
    ["a", "A9", "0", "host-1.pod_2:9092@zone", "x" * 128],
)
def test_valid_member_ids(member_id: str) -> None:
    assert g.validate_member_id(member_id) == member_id
    c = cohort(1)
    c.join(member_id, 0, SESSION)
    assert member_id in c.members


@pytest.mark.parametrize(
    "member_id",
    [
        "",
        "x" * 129,
        "-lead",
        ".dot",
        "has space",
        "slash/no",
        "caf\u00e9",
        "tab\t",
        "a\n",
        "a\nb",
        "\n",
    ],
)
def test_invalid_member_ids_are_refused(member_id: str) -> None:
    with pytest.raises(InvalidMemberId):
        g.validate_member_id(member_id)
    c = cohort(1)
    with pytest.raises(InvalidMemberId):
        c.join(member_id, 0, SESSION)
    assert c.members == {}


@pytest.mark.parametrize("name", ["", "a/b", "x" * 129, "ok\n"])
def test_invalid_cohort_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidMemberId):
        g.validate_cohort_name(name)


def test_valid_cohort_name() -> None:
    assert g.validate_cohort_name("billing.v2_x-1") == "billing.v2_x-1"


# --------------------------------------------------------------------------- random sequences

MEMBER_IDS = ["m0", "m1", "m2", "m3", "m4"]


class GateMachine(RuleBasedStateMachine):
    """Random membership events; the table's promises must hold after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.c = g.CohortGates("c", [], grace_ms=GRACE)
        self.now = 0
        self.prev: dict[int, tuple[g.GateState, str | None, int]] = {}
        self.prev_generation = 0
        #: partitions whose holder this step is allowed to lose (else it must keep them)
        self.may_lose: set[int] = set()
        #: highest epoch each partition's gate ever had, even while the gate was gone
        self.highest_epoch: dict[int, int] = {}

    @initialize(partitions=st.integers(1, 7))
    def setup(self, partitions: int) -> None:
        self.c = g.CohortGates("c", list(range(partitions)), grace_ms=GRACE)
        self.prev = states(self.c)

    def _held_by(self, member: str) -> set[int]:
        return {p for p, gate in self.c.gates.items() if gate.holder == member}

    @rule(member=st.sampled_from(MEMBER_IDS), timeout=st.integers(GRACE, 5 * GRACE))
    def join(self, member: str, timeout: int) -> None:
        if member in self.c.members:
            with pytest.raises(MemberIdInUse):
                self.c.join(member, self.now, timeout)
        else:
            self.c.join(member, self.now, timeout)

    @rule(member=st.sampled_from(MEMBER_IDS))
    def heartbeat(self, member: str) -> None:
        if member in self.c.members:
            self.c.heartbeat(member, self.now)
        else:
            with pytest.raises(UnknownMember):
                self.c.heartbeat(member, self.now)

    @rule(member=st.sampled_from(MEMBER_IDS))
    def leave(self, member: str) -> None:
        self.c.leave(member, self.now)

    @rule(member=st.sampled_from(MEMBER_IDS))
    def disconnect(self, member: str) -> None:
        self.may_lose = self._held_by(member)
        self.c.disconnect(member, self.now)
        assert not self._held_by(member)

    @rule(member=st.sampled_from(MEMBER_IDS), data=st.data())
    def release(self, member: str, data: st.DataObject) -> None:
        revoking = sorted(
            p
            for p, gate in self.c.gates.items()
            if gate.holder == member and gate.state is REVOKING
        )
        chosen = data.draw(st.lists(st.sampled_from([*revoking, 99]), max_size=4), label="ps")
        self.may_lose = set(chosen)
        self.c.release(member, chosen, self.now)
        assert not (set(chosen) & self._held_by(member))

    @rule(dt=st.integers(0, 3 * GRACE))
    def tick(self, dt: int) -> None:
        self.now += dt
        silent = {
            m.member_id
            for m in self.c.members.values()
            if self.now - m.last_seen_ms > m.session_timeout_ms
        }
        self.may_lose = {
            p
            for p, gate in self.c.gates.items()
            if gate.holder in silent or (gate.state is REVOKING and self.now >= gate.deadline_ms)
        }
        assert set(self.c.tick(self.now)) == silent

    @rule(partitions=st.sets(st.integers(0, 7), min_size=1))
    def set_partitions(self, partitions: set[int]) -> None:
        # gates of partitions that stay keep their holder; the others vanish
        self.may_lose = set(self.c.gates) - partitions
        self.c.set_partitions(sorted(partitions), self.now)
        assert sorted(self.c.gates) == sorted(partitions)

    @precondition(lambda self: any(not m.leaving for m in self.c.members.values()))
    @rule()
    def everything_settles(self) -> None:
        """Live members and enough time: every partition ends up held, as the target says."""
        for member in list(self.c.members):
            self.c.heartbeat(member, self.now)
        self.may_lose = {p for p, gate in self.c.gates.items() if gate.state is REVOKING}
        self.now += GRACE
        assert self.c.tick(self.now) == []
        wanted = {p: m for m, ps in self.c.target.items() for p in ps}
        assert all(gate.state is HELD for gate in self.c.gates.values())
        assert {p: gate.holder for p, gate in self.c.gates.items()} == wanted
        assert not any(m.leaving for m in self.c.members.values())

    @invariant()
    def gates_are_consistent(self) -> None:
        members = self.c.members
        active = {m for m, v in members.items() if not v.leaving}
        for gate in self.c.gates.values():
            assert (gate.state is FREE) == (gate.holder is None)
            if gate.state is HELD:
                assert gate.holder in active
                assert gate.partition in self.c.target[gate.holder]
            if gate.state is REVOKING:
                assert gate.holder in members
                assert gate.deadline_ms > 0
        for member in MEMBER_IDS:
            held, revoking = self.c.view(member)
            assert sorted(x.partition for x in self.c.deliverable(member)) == sorted(held)
            if member not in members:
                assert held == {}
                assert revoking == []
        if active:
            covered = sorted(p for ps in self.c.target.values() for p in ps)
            assert covered == sorted(self.c.partitions)

    @invariant()
    def one_holder_at_a_time(self) -> None:
        """A gate changes hands only when its holder gave it up, and with a new epoch."""
        now = states(self.c)
        for p, (_, holder, epoch) in now.items():
            before_state, before_holder, before_epoch = self.prev.get(p, (FREE, None, 0))
            before_epoch = max(before_epoch, self.highest_epoch.get(p, 0))
            assert epoch >= before_epoch
            if before_holder is not None and holder != before_holder:
                assert p in self.may_lose, f"gate {p} taken from {before_holder} to {holder}"
            if holder is not None and holder != before_holder:
                assert epoch > before_epoch, "a new tenure needs a new epoch"
            if holder is not None and holder == before_holder and before_state is not FREE:
                assert epoch == before_epoch, "same tenure keeps its epoch"
        assert self.c.generation >= self.prev_generation
        for p, (_, _, epoch) in now.items():
            self.highest_epoch[p] = max(epoch, self.highest_epoch.get(p, 0))
        self.prev = now
        self.prev_generation = self.c.generation
        self.may_lose = set()


TestGateMachine = GateMachine.TestCase
TestGateMachine.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)


def test_gates_start_at_the_epoch_floor_and_a_returning_partition_keeps_its_epochs() -> None:
    """A restarted broker passes a higher floor, so its epochs never repeat the last run's."""
    c = g.CohortGates("c", [0], grace_ms=GRACE, epoch_floor=65536)
    c.join("a", 0, SESSION)
    assert states(c) == {0: (HELD, "a", 65537)}
    c.set_partitions([], 10)
    c.set_partitions([0, 1], 20)
    assert {p: gate.epoch for p, gate in c.gates.items()} == {0: 65538, 1: 65537}
