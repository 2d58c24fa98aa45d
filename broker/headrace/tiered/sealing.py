"""Sealing and reopening one tiered partition for a move, on one broker (pure state machine).

Theory of operation
-------------------
An unload moves a tiered partition without copying its log (``control.unloads``):
the leader **seals** it (uploads everything, fences appends, writes the sealed state
to the object store), the controller reassigns it, and every replica of the new
assignment **reopens** it empty after the last sealed offset. The broker does the
uploads and writes in tasks (``broker.tier_moves``); this table decides which task
runs, which one is cancelled, and what the partition's seal stage is, so that the
decisions can be read in one place and tested without a loop or a store.

A seal passes through three stages: DRAINING (uploading everything committed while
appends still flow), FENCED (appends refused; in-flight acks settle, the rest is
uploaded, the sealed state written) and SEALED (written; the heartbeat reports it
until the controller reassigns). A reopen in progress also refuses appends and reads.

The broker feeds events with the evidence it holds (is the seal or reopen task still
running, does the partition still have the role the task started with) and performs
the effects in order, after taking the new state. One row fires per event: the first
whose event type and guard match; an event no row matches changes nothing::

    state          event                     guard                            next                 effects
    -------------  ------------------------  -------------------------------  -------------------  -----------------------------
    any            SealAsked(epoch E)        sealing at E, and the seal task  unchanged            -
                                             runs or the seal is written
    any            SealAsked(E)              -                                DRAINING at E        cancel seal; start seal
                                                                              (FENCED if it took
                                                                              over a seal asked of
                                                                              an earlier leader)
    DRAINING       Drained                   -                                FENCED               -
    FENCED         SealWritten(report)       -                                SEALED, report       -
    sealing at E   SealEnded(E, leading)     not SEALED, no longer leading    not sealing          -
                                             at E (the seal is void)
    sealing        SealWithdrawn             -                                not sealing          cancel seal; wake cohorts
    any            ReopenAsked(target)       reopening to the target, and     unchanged            -
                                             the reopen task runs
    any            ReopenAsked(target)       -                                reopening to target  cancel reopen; cancel seal;
                                                                                                   start reopen
    reopening to   Reopened(target)          -                                idle                 -
    target

A reopen does not clear the seal stage when it starts: the partition stays fenced
until the new incarnation is open, and only then is every field reset.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final, Generic, TypeVar

from headrace.protocol.coordination import SealReport

#: (incarnation, start offset or None: derive it from the object store) a reopen opens
ReopenTarget = tuple[int, int | None]


class SealStage(enum.Enum):
    #: uploading everything committed while appends still flow
    DRAINING = "draining"
    #: appends refused; waiting for in-flight acks, uploading the rest, writing the state
    FENCED = "fenced"
    #: the sealed state is written; waiting for the controller to reassign
    SEALED = "sealed"


@dataclass(frozen=True, slots=True)
class Sealing:
    """One partition's seal and reopen state on this broker."""

    #: None: not sealing
    stage: SealStage | None = None
    #: the leader epoch the seal in progress (or done) belongs to; -1 when not sealing
    epoch: int = -1
    #: what the heartbeat reports once the sealed state is written
    sealed: SealReport | None = None
    #: a move's reopen in progress: the incarnation and start offset it reopens to
    reopening: ReopenTarget | None = None

    @property
    def blocks_appends(self) -> bool:
        return self.reopening is not None or self.stage in (SealStage.FENCED, SealStage.SEALED)

    @property
    def busy(self) -> bool:
        """Sealing or reopening: the uploader and the tier's retention leave it alone."""
        return self.stage is not None or self.reopening is not None


IDLE: Final = Sealing()


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class SealAsked:
    """The controller asks this broker, leader at ``epoch``, to seal the partition."""

    epoch: int
    #: this broker became leader with the seal already asked for: it may lack records the
    #: old leader stored, so it accepts no appends at all
    took_over: bool
    #: the last seal task started is still running
    seal_running: bool


@dataclass(frozen=True, slots=True)
class Drained:
    """Less than the fence threshold is left to upload: fence appends."""


@dataclass(frozen=True, slots=True)
class SealWritten:
    """The sealed state is in the object store."""

    report: SealReport


@dataclass(frozen=True, slots=True)
class SealEnded:
    """The seal task for ``epoch`` returned (written, or no longer wanted)."""

    epoch: int
    #: the partition still has the role and epoch the task started with
    still_leading: bool


@dataclass(frozen=True, slots=True)
class SealWithdrawn:
    """The seal request was withdrawn before a reassignment."""


@dataclass(frozen=True, slots=True)
class ReopenAsked:
    """The controller reassigned the partition: open ``target`` empty."""

    target: ReopenTarget
    #: the last reopen task started is still running
    reopen_running: bool


@dataclass(frozen=True, slots=True)
class Reopened:
    """The reopen to ``target`` finished: the new incarnation is open."""

    target: ReopenTarget


Event = SealAsked | Drained | SealWritten | SealEnded | SealWithdrawn | ReopenAsked | Reopened


class Effect(enum.Enum):
    """What the broker does after taking the new state, in the order given."""

    CANCEL_SEAL = "cancel the seal task"
    START_SEAL = "start a seal task"
    CANCEL_REOPEN = "cancel the reopen task"
    START_REOPEN = "start a reopen task"
    #: cohort pumps stopped delivering the partition while it was fenced
    WAKE_COHORTS = "wake the partition's cohorts"


# --------------------------------------------------------------------------- the table

E = TypeVar("E", bound=Event)


@dataclass(frozen=True, slots=True)
class Rule(Generic[E]):
    """One row of the table."""

    name: str
    event: type[E]
    guard: Callable[[Sealing, E], bool]
    act: Callable[[Sealing, E], tuple[Sealing, tuple[Effect, ...]]]


@dataclass(frozen=True, slots=True)
class Step:
    state: Sealing
    effects: tuple[Effect, ...]
    #: the row that fired; None: no row matched, nothing changed
    rule: str | None


def _always(state: Sealing, event: Any) -> bool:
    return True


def _seal_in_hand(state: Sealing, event: SealAsked) -> bool:
    return state.epoch == event.epoch and (event.seal_running or state.stage is SealStage.SEALED)


def _nothing(state: Sealing, event: Any) -> tuple[Sealing, tuple[Effect, ...]]:
    return state, ()


def _start_seal(state: Sealing, event: SealAsked) -> tuple[Sealing, tuple[Effect, ...]]:
    stage = SealStage.FENCED if event.took_over else SealStage.DRAINING
    return (
        replace(state, stage=stage, epoch=event.epoch, sealed=None),
        (Effect.CANCEL_SEAL, Effect.START_SEAL),
    )


def _draining(state: Sealing, event: Drained) -> bool:
    return state.stage is SealStage.DRAINING


def _fence(state: Sealing, event: Drained) -> tuple[Sealing, tuple[Effect, ...]]:
    return replace(state, stage=SealStage.FENCED), ()


def _fenced(state: Sealing, event: SealWritten) -> bool:
    return state.stage is SealStage.FENCED


def _written(state: Sealing, event: SealWritten) -> tuple[Sealing, tuple[Effect, ...]]:
    return replace(state, stage=SealStage.SEALED, sealed=event.report), ()


def _void(state: Sealing, event: SealEnded) -> bool:
    return (
        state.epoch == event.epoch
        and state.stage is not SealStage.SEALED
        and not event.still_leading
    )


def _drop_void_seal(state: Sealing, event: SealEnded) -> tuple[Sealing, tuple[Effect, ...]]:
    return replace(state, stage=None, epoch=-1), ()


def _sealing(state: Sealing, event: SealWithdrawn) -> bool:
    return state.stage is not None


def _unseal(state: Sealing, event: SealWithdrawn) -> tuple[Sealing, tuple[Effect, ...]]:
    return (
        replace(state, stage=None, epoch=-1, sealed=None),
        (Effect.CANCEL_SEAL, Effect.WAKE_COHORTS),
    )


def _reopen_in_hand(state: Sealing, event: ReopenAsked) -> bool:
    return state.reopening == event.target and event.reopen_running


def _start_reopen(state: Sealing, event: ReopenAsked) -> tuple[Sealing, tuple[Effect, ...]]:
    return (
        replace(state, reopening=event.target),
        (Effect.CANCEL_REOPEN, Effect.CANCEL_SEAL, Effect.START_REOPEN),
    )


def _reopening_to(state: Sealing, event: Reopened) -> bool:
    return state.reopening == event.target


def _open(state: Sealing, event: Reopened) -> tuple[Sealing, tuple[Effect, ...]]:
    return IDLE, ()


#: The transition table. ``step`` fires the first row whose event type and guard match.
RULES: Final[tuple[Rule[Any], ...]] = (
    Rule("SealAlreadyInHand", SealAsked, _seal_in_hand, _nothing),
    Rule("SealStarted", SealAsked, _always, _start_seal),
    Rule("Fenced", Drained, _draining, _fence),
    Rule("Sealed", SealWritten, _fenced, _written),
    Rule("SealVoid", SealEnded, _void, _drop_void_seal),
    Rule("Unsealed", SealWithdrawn, _sealing, _unseal),
    Rule("ReopenAlreadyInHand", ReopenAsked, _reopen_in_hand, _nothing),
    Rule("ReopenStarted", ReopenAsked, _always, _start_reopen),
    Rule("Reopened", Reopened, _reopening_to, _open),
)


def step(state: Sealing, event: Event) -> Step:
    """The partition's next state and the effects to perform, in order."""
    for rule in RULES:
        if isinstance(event, rule.event) and rule.guard(state, event):
            new, effects = rule.act(state, event)
            return Step(new, effects, rule.name)
    return Step(state, (), None)
