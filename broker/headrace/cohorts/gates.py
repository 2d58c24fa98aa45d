"""Delivery gates of one cohort on one broker (pure state machine).

Theory of operation
-------------------
Each partition the broker owns has one *gate* per cohort. A gate admits
exactly one member at a time; only the admitted member is sent records of
that partition and only its acks move the partition's cursor. The cohort's
*target* assignment (sticky, balanced; see ``assignment``) says who should
hold each gate; the gates move towards the target without ever admitting two
members at once:

    state     event                          next       effect
    --------  -----------------------------  ---------  -----------------------------------
    FREE      target names M                 HELD(M)    epoch += 1; deliver from the cursor
    HELD(M)   target names someone else/none REVOKING   stop sending; tell M; start grace
    REVOKING  M releases                     FREE       (then FREE -> HELD for the new target)
    REVOKING  grace deadline passes          FREE       forced: M's late acks are refused
    REVOKING  target names M again           HELD(M)    resume, same epoch
    HELD/REV  M disconnects or times out     FREE       unacked records go to the next holder

Where the target comes from: on a cluster broker, the controller's cohort
plan (``set_plan``), which spans every broker's partitions; it is advisory
and may lag a heartbeat, which is safe because gates still move only through
the table above. Without a plan (standalone, or before the first plan) the
broker assigns its own partitions among the members connected to it.

A member that *leaves* politely stays in the member list as ``leaving`` until
its gates are released (or their grace expires), so its in-flight records can
be acked; a member that disconnects is gone at once. The ``epoch`` of a gate
increases on every admission; deliveries carry it and acks must echo it, so
an ack from an earlier tenure can never move the cursor.

Inputs are events with the current time; outputs are the new state, which the
adapter (``broker/cohorting.py``) turns into pushes and delivery.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

from headrace.cohorts.assignment import assign
from headrace.errors import (
    AlreadyJoined,
    InvalidMemberId,
    MemberIdInUse,
    NotGateHolder,
    UnknownMember,
)

#: letters, digits, '.', '_', '-', ':' and '@'; 1-128 chars; starts with a letter or digit
MEMBER_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
COHORT_NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_member_id(member_id: str) -> str:
    if not MEMBER_ID_PATTERN.fullmatch(member_id):
        raise InvalidMemberId(
            f"invalid member id {member_id!r}: 1-128 characters of letters, digits, '.', '_', '-', ':', '@',"
            " starting with a letter or digit"
        )
    return member_id


def validate_cohort_name(name: str) -> str:
    if not COHORT_NAME_PATTERN.fullmatch(name):
        raise InvalidMemberId(f"invalid cohort name {name!r}")
    return name


class GateState(enum.Enum):
    FREE = "free"
    HELD = "held"
    REVOKING = "revoking"


@dataclass(slots=True)
class Gate:
    partition: int
    state: GateState = GateState.FREE
    holder: str | None = None
    epoch: int = 0
    #: ms deadline of a REVOKING gate's grace period
    deadline_ms: int = 0


@dataclass(slots=True)
class Member:
    member_id: str
    joined_ms: int
    last_seen_ms: int
    session_timeout_ms: int
    leaving: bool = False


@dataclass(slots=True)
class CohortGates:
    """All gates of one cohort for the partitions this broker owns."""

    name: str
    partitions: list[int]
    grace_ms: int = 10_000
    members: dict[str, Member] = field(default_factory=dict)
    gates: dict[int, Gate] = field(default_factory=dict)
    target: dict[str, frozenset[int]] = field(default_factory=dict)
    #: the controller's plan (member -> partitions), or None to assign locally
    plan: dict[str, frozenset[int]] | None = None
    #: bumped only when the target assignment's content changes
    generation: int = 0
    #: last epoch of gates whose partition went away, so a returning gate never reuses one
    retired_epochs: dict[int, int] = field(default_factory=dict)
    #: where new gates' epochs start (their first admission is ``epoch_floor + 1``). The
    #: broker raises it on every restart (``Broker.gate_epoch_floor``), so a gate of a new
    #: incarnation never hands out an epoch the previous one used.
    epoch_floor: int = 0

    def __post_init__(self) -> None:
        for p in self.partitions:
            self.gates.setdefault(p, Gate(p, epoch=self.epoch_floor))

    # ------------------------------------------------------------------ membership events

    def join(self, member_id: str, now_ms: int, session_timeout_ms: int) -> None:
        validate_member_id(member_id)
        existing = self.members.get(member_id)
        if existing is not None:
            if existing.leaving:
                raise MemberIdInUse(f"member {member_id!r} is still leaving cohort {self.name!r}")
            raise MemberIdInUse(f"member {member_id!r} is already in cohort {self.name!r}")
        self.members[member_id] = Member(member_id, now_ms, now_ms, session_timeout_ms)
        self._rebalance(now_ms)

    def heartbeat(self, member_id: str, now_ms: int) -> None:
        member = self.members.get(member_id)
        if member is None:
            raise UnknownMember(f"member {member_id!r} is not in cohort {self.name!r}")
        member.last_seen_ms = now_ms

    def leave(self, member_id: str, now_ms: int) -> None:
        """Polite leave: partitions are revoked with grace; the member goes when they are released."""
        member = self.members.get(member_id)
        if member is None:
            return
        member.leaving = True
        self._rebalance(now_ms)
        self._drop_if_done(member_id, now_ms)

    def disconnect(self, member_id: str, now_ms: int) -> None:
        """The member's connection is gone: free its gates now."""
        if self.members.pop(member_id, None) is None:
            return
        for gate in self.gates.values():
            if gate.holder == member_id:
                self._free(gate)
        self._rebalance(now_ms)

    def release(self, member_id: str, partitions: list[int], now_ms: int) -> None:
        for p in partitions:
            gate = self.gates.get(p)
            if gate is not None and gate.holder == member_id and gate.state is GateState.REVOKING:
                self._free(gate)
        self._settle(now_ms)
        self._drop_if_done(member_id, now_ms)

    def tick(self, now_ms: int) -> list[str]:
        """Expire sessions and grace periods. Returns members dropped for silence."""
        expired = [
            m.member_id
            for m in self.members.values()
            if now_ms - m.last_seen_ms > m.session_timeout_ms
        ]
        for member_id in expired:
            self.disconnect(member_id, now_ms)
        changed = False
        for gate in self.gates.values():
            if gate.state is GateState.REVOKING and now_ms >= gate.deadline_ms:
                self._free(gate)
                changed = True
        if changed:
            self._settle(now_ms)
            for member_id in [m for m, v in self.members.items() if v.leaving]:
                self._drop_if_done(member_id, now_ms)
        return expired

    # ------------------------------------------------------------------ partition set changes

    def set_partitions(self, partitions: list[int], now_ms: int) -> None:
        """The broker's owned partitions changed (topic grew, leadership moved)."""
        self.partitions = sorted(partitions)
        for p in self.partitions:
            if p not in self.gates:
                self.gates[p] = Gate(p, epoch=self.retired_epochs.pop(p, self.epoch_floor))
        for p in [p for p in self.gates if p not in self.partitions]:
            self.retired_epochs[p] = self.gates.pop(p).epoch
        self._rebalance(now_ms)
        # a leaving member whose last revoking gate just went away is done
        for member_id in [m for m, v in self.members.items() if v.leaving]:
            self._drop_if_done(member_id, now_ms)

    # ------------------------------------------------------------------ queries

    def check_holder(self, member_id: str, partition: int, epoch: int) -> Gate:
        """The gate if ``member_id`` holds it under ``epoch`` (held or finishing), else NotGateHolder."""
        gate = self.gates.get(partition)
        if (
            gate is None
            or gate.holder != member_id
            or gate.epoch != epoch
            or gate.state is GateState.FREE
        ):
            raise NotGateHolder(
                f"member {member_id!r} does not hold partition {partition} at epoch {epoch}"
            )
        return gate

    def deliverable(self, member_id: str) -> list[Gate]:
        """Gates whose records may be sent to ``member_id`` now."""
        return [
            g for g in self.gates.values() if g.state is GateState.HELD and g.holder == member_id
        ]

    def view(self, member_id: str) -> tuple[dict[int, int], list[int]]:
        """(held partition -> epoch, revoking partitions) for one member's Assignment push."""
        held = {
            g.partition: g.epoch
            for g in self.gates.values()
            if g.holder == member_id and g.state is GateState.HELD
        }
        revoking = sorted(
            g.partition
            for g in self.gates.values()
            if g.holder == member_id and g.state is GateState.REVOKING
        )
        return held, revoking

    def holders(self) -> dict[int, str | None]:
        return {p: g.holder for p, g in self.gates.items()}

    # ------------------------------------------------------------------ internals

    def _active_members(self) -> list[str]:
        ordered = sorted(self.members.values(), key=lambda m: (m.joined_ms, m.member_id))
        return [m.member_id for m in ordered if not m.leaving]

    def set_plan(self, plan: Mapping[str, Collection[int]] | None, now_ms: int) -> None:
        """Follow a controller's cohort plan (advisory), or the local assignment if None.

        With a plan, a gate goes to its planned member only if that member is
        connected here; a partition planned for someone absent pauses until the
        next plan rather than going to anyone else (never two holders across
        brokers). A member missing from the plan gets nothing until it appears.
        """
        self.plan = None if plan is None else {m: frozenset(ps) for m, ps in plan.items()}
        self._rebalance(now_ms)

    def _rebalance(self, now_ms: int) -> None:
        if self.plan is not None:
            active = set(self._active_members())
            local = set(self.partitions)
            new_target = {
                m: ps & local for m, ps in self.plan.items() if m in active and ps & local
            }
        else:
            new_target = assign(self.partitions, self._active_members(), self.target)
        if new_target != self.target:
            self.generation += 1
            self.target = new_target
        self._settle(now_ms)

    def _settle(self, now_ms: int) -> None:
        """Move every gate one safe step towards the target."""
        wanted = {p: m for m, ps in self.target.items() for p in ps}
        for gate in self.gates.values():
            want = wanted.get(gate.partition)
            if gate.state is GateState.FREE:
                if want is not None:
                    gate.state = GateState.HELD
                    gate.holder = want
                    gate.epoch += 1
            elif gate.state is GateState.HELD:
                if gate.holder != want:
                    gate.state = GateState.REVOKING
                    gate.deadline_ms = now_ms + self.grace_ms
            elif gate.state is GateState.REVOKING and gate.holder == want:
                gate.state = GateState.HELD

    def _free(self, gate: Gate) -> None:
        gate.state = GateState.FREE
        gate.holder = None
        gate.deadline_ms = 0

    def _drop_if_done(self, member_id: str, now_ms: int) -> None:
        member = self.members.get(member_id)
        if member is None or not member.leaving:
            return
        if any(g.holder == member_id for g in self.gates.values()):
            return
        del self.members[member_id]
        self._rebalance(now_ms)


def ensure_single_identity(current: str | None, requested: str) -> None:
    """One member identity per connection."""
    if current is not None:
        raise AlreadyJoined(f"this connection already joined as {current!r}")
    validate_member_id(requested)
