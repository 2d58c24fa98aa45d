"""The seal and reopen table: every row, then random event sequences against the code it replaced.

The stateful test drives two models of one partition with the same calls: the table
(``tiered.sealing.step``, with its effects run over fake tasks) and the imperative
code the table replaced (six mutable fields and the tasks themselves), copied here
as the reference. After every call both must hold the same state and the same tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headrace.protocol.coordination import SealReport
from headrace.tiered import sealing as s
from headrace.tiered.sealing import Effect, Sealing, SealStage

DRAINING, FENCED, SEALED = SealStage.DRAINING, SealStage.FENCED, SealStage.SEALED
REPORT = SealReport(41, 3, 0, True)
TARGET = (1, 42)
OTHER = (1, None)


# --------------------------------------------------------------------------- the table, row by row

ROWS = [
    # (state, event, rule that fires, next state, effects)
    (
        Sealing(DRAINING, 3),
        s.SealAsked(3, took_over=False, seal_running=True),
        "SealAlreadyInHand",
        Sealing(DRAINING, 3),
        (),
    ),
    (
        Sealing(SEALED, 3, REPORT),
        s.SealAsked(3, took_over=False, seal_running=False),
        "SealAlreadyInHand",
        Sealing(SEALED, 3, REPORT),
        (),
    ),
    (
        s.IDLE,
        s.SealAsked(3, took_over=False, seal_running=False),
        "SealStarted",
        Sealing(DRAINING, 3),
        (Effect.CANCEL_SEAL, Effect.START_SEAL),
    ),
    (
        s.IDLE,
        s.SealAsked(3, took_over=True, seal_running=False),
        "SealStarted",
        Sealing(FENCED, 3),
        (Effect.CANCEL_SEAL, Effect.START_SEAL),
    ),
    # the same epoch, but the seal task died before writing: start it again
    (
        Sealing(FENCED, 3),
        s.SealAsked(3, took_over=False, seal_running=False),
        "SealStarted",
        Sealing(DRAINING, 3),
        (Effect.CANCEL_SEAL, Effect.START_SEAL),
    ),
    # a new leader epoch: the seal written under the old one is void
    (
        Sealing(SEALED, 3, REPORT),
        s.SealAsked(4, took_over=True, seal_running=True),
        "SealStarted",
        Sealing(FENCED, 4),
        (Effect.CANCEL_SEAL, Effect.START_SEAL),
    ),
    # a seal asked while reopening keeps the reopen
    (
        Sealing(reopening=TARGET),
        s.SealAsked(5, took_over=False, seal_running=False),
        "SealStarted",
        Sealing(DRAINING, 5, reopening=TARGET),
        (Effect.CANCEL_SEAL, Effect.START_SEAL),
    ),
    (Sealing(DRAINING, 3), s.Drained(), "Fenced", Sealing(FENCED, 3), ()),
    (Sealing(FENCED, 3), s.Drained(), None, Sealing(FENCED, 3), ()),
    (Sealing(FENCED, 3), s.SealWritten(REPORT), "Sealed", Sealing(SEALED, 3, REPORT), ()),
    (Sealing(DRAINING, 3), s.SealWritten(REPORT), None, Sealing(DRAINING, 3), ()),
    (Sealing(FENCED, 3), s.SealEnded(3, still_leading=False), "SealVoid", s.IDLE, ()),
    (
        Sealing(FENCED, 3, reopening=TARGET),
        s.SealEnded(3, still_leading=False),
        "SealVoid",
        Sealing(reopening=TARGET),
        (),
    ),
    (Sealing(FENCED, 3), s.SealEnded(3, still_leading=True), None, Sealing(FENCED, 3), ()),
    (
        Sealing(SEALED, 3, REPORT),
        s.SealEnded(3, still_leading=False),
        None,
        Sealing(SEALED, 3, REPORT),
        (),
    ),
    # a seal task of an earlier epoch ends after a newer seal started: the newer one stays
    (Sealing(DRAINING, 4), s.SealEnded(3, still_leading=False), None, Sealing(DRAINING, 4), ()),
    (
        Sealing(SEALED, 3, REPORT),
        s.SealWithdrawn(),
        "Unsealed",
        s.IDLE,
        (Effect.CANCEL_SEAL, Effect.WAKE_COHORTS),
    ),
    (
        Sealing(DRAINING, 3, reopening=TARGET),
        s.SealWithdrawn(),
        "Unsealed",
        Sealing(reopening=TARGET),
        (Effect.CANCEL_SEAL, Effect.WAKE_COHORTS),
    ),
    (s.IDLE, s.SealWithdrawn(), None, s.IDLE, ()),
    (
        Sealing(reopening=TARGET),
        s.ReopenAsked(TARGET, reopen_running=True),
        "ReopenAlreadyInHand",
        Sealing(reopening=TARGET),
        (),
    ),
    # the seal stage stays until the new incarnation is open: appends stay refused
    (
        Sealing(SEALED, 3, REPORT),
        s.ReopenAsked(TARGET, reopen_running=False),
        "ReopenStarted",
        Sealing(SEALED, 3, REPORT, TARGET),
        (Effect.CANCEL_REOPEN, Effect.CANCEL_SEAL, Effect.START_REOPEN),
    ),
    # the same target, but its task ended without opening it: start it again
    (
        Sealing(reopening=TARGET),
        s.ReopenAsked(TARGET, reopen_running=False),
        "ReopenStarted",
        Sealing(reopening=TARGET),
        (Effect.CANCEL_REOPEN, Effect.CANCEL_SEAL, Effect.START_REOPEN),
    ),
    (
        Sealing(reopening=TARGET),
        s.ReopenAsked(OTHER, reopen_running=True),
        "ReopenStarted",
        Sealing(reopening=OTHER),
        (Effect.CANCEL_REOPEN, Effect.CANCEL_SEAL, Effect.START_REOPEN),
    ),
    (Sealing(SEALED, 3, REPORT, TARGET), s.Reopened(TARGET), "Reopened", s.IDLE, ()),
    (
        Sealing(reopening=OTHER),
        s.Reopened(TARGET),
        None,
        Sealing(reopening=OTHER),
        (),
    ),
]


@pytest.mark.parametrize(("state", "event", "fired", "after", "effects"), ROWS)
def test_each_row(
    state: Sealing,
    event: s.Event,
    fired: str | None,
    after: Sealing,
    effects: tuple[Effect, ...],
) -> None:
    assert s.step(state, event) == s.Step(after, effects, fired)


def test_every_row_is_covered() -> None:
    assert {rule.name for rule in s.RULES} == {fired for _, _, fired, _, _ in ROWS} - {None}


@pytest.mark.parametrize(
    ("state", "blocks"),
    [
        (s.IDLE, False),
        (Sealing(DRAINING, 3), False),
        (Sealing(FENCED, 3), True),
        (Sealing(SEALED, 3, REPORT), True),
        (Sealing(reopening=TARGET), True),
    ],
)
def test_appends_are_refused_once_fenced_and_while_reopening(state: Sealing, blocks: bool) -> None:
    assert state.blocks_appends is blocks
    assert state.busy is (state != s.IDLE)


# --------------------------------------------------------------------------- random sequences


@dataclass
class FakeTask:
    kind: str
    #: the seal's leader epoch, or the reopen's target
    param: int | tuple[int, int | None] | None
    cancelled: bool = False
    finished: bool = False

    def done(self) -> bool:
        return self.finished

    def cancel(self) -> None:
        self.cancelled = True  # done once the loop runs it (``settle``)


class Imperative:
    """The seal and reopen code before the table: six fields, set in place."""

    def __init__(self) -> None:
        self.seal_stage: SealStage | None = None
        self.seal_epoch = -1
        self.sealed: SealReport | None = None
        self.reopening: tuple[int, int | None] | None = None
        self.seal_task: FakeTask | None = None
        self.reopen_task: FakeTask | None = None
        self.tasks: list[FakeTask] = []
        self.woken = 0

    def _spawn(self, kind: str, param: int | tuple[int, int | None]) -> FakeTask:
        task = FakeTask(kind, param)
        self.tasks.append(task)
        return task

    def seal(self, epoch: int, took_over: bool) -> None:
        running = self.seal_task is not None and not self.seal_task.done()
        if self.seal_epoch == epoch and (running or self.seal_stage is SEALED):
            return
        if self.seal_task is not None:
            self.seal_task.cancel()
        self.seal_epoch = epoch
        self.sealed = None
        self.seal_stage = FENCED if took_over else DRAINING
        self.seal_task = self._spawn("seal", epoch)

    def unseal(self) -> None:
        if self.seal_stage is None:
            return
        if self.seal_task is not None:
            self.seal_task.cancel()
        self.seal_stage = None
        self.seal_epoch = -1
        self.sealed = None
        self.woken += 1

    def drained(self) -> None:
        self.seal_stage = FENCED

    def written(self, report: SealReport) -> None:
        self.seal_stage = SEALED
        self.sealed = report

    def seal_ended(self, epoch: int, still_leading: bool) -> None:
        if self.seal_epoch == epoch and self.seal_stage is not SEALED and not still_leading:
            self.seal_stage = None
            self.seal_epoch = -1

    def reopen(self, target: tuple[int, int | None]) -> None:
        running = self.reopen_task is not None and not self.reopen_task.done()
        if self.reopening == target and running:
            return
        if self.reopen_task is not None:
            self.reopen_task.cancel()
        if self.seal_task is not None:
            self.seal_task.cancel()
        self.reopening = target
        self.reopen_task = self._spawn("reopen", target)

    def reopened(self) -> None:
        self.seal_stage = None
        self.seal_epoch = -1
        self.sealed = None
        self.reopening = None

    def view(self) -> Sealing:
        return Sealing(self.seal_stage, self.seal_epoch, self.sealed, self.reopening)


class Table:
    """The table, its effects run over fake tasks as ``broker.tier_moves`` runs them."""

    def __init__(self) -> None:
        self.state = s.IDLE
        self.seal_task: FakeTask | None = None
        self.reopen_task: FakeTask | None = None
        self.tasks: list[FakeTask] = []
        self.woken = 0

    def feed(self, event: s.Event) -> s.Step:
        result = s.step(self.state, event)
        self.state = result.state
        for effect in result.effects:
            if effect is Effect.CANCEL_SEAL and self.seal_task is not None:
                self.seal_task.cancel()
            elif effect is Effect.START_SEAL:
                self.seal_task = FakeTask("seal", self.state.epoch)
                self.tasks.append(self.seal_task)
            elif effect is Effect.CANCEL_REOPEN and self.reopen_task is not None:
                self.reopen_task.cancel()
            elif effect is Effect.START_REOPEN:
                self.reopen_task = FakeTask("reopen", self.state.reopening)
                self.tasks.append(self.reopen_task)
            elif effect is Effect.WAKE_COHORTS:
                self.woken += 1
        return result


def _running(task: FakeTask | None) -> bool:
    return task is not None and not task.done()


def _live(task: FakeTask | None) -> bool:
    """Still doing its work: not cancelled, not finished."""
    return task is not None and not task.cancelled and not task.finished


epochs = st.integers(min_value=0, max_value=1)  # few: a seal is asked again at its epoch
targets = st.sampled_from([(1, 10), (1, None)])


class SealingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.old = Imperative()
        self.new = Table()

    @rule(epoch=epochs, took_over=st.booleans())
    def seal_asked(self, epoch: int, took_over: bool) -> None:
        self.old.seal(epoch, took_over)
        self.new.feed(s.SealAsked(epoch, took_over, _running(self.new.seal_task)))

    @rule()
    def seal_withdrawn(self) -> None:
        self.old.unseal()
        self.new.feed(s.SealWithdrawn())

    @rule(to=targets)
    def reopen_asked(self, to: tuple[int, int | None]) -> None:
        self.old.reopen(to)
        self.new.feed(s.ReopenAsked(to, _running(self.new.reopen_task)))

    # the seal task's steps: only a live task takes them (a cancelled one stops at its await)

    @precondition(lambda self: _live(self.old.seal_task) and self.old.seal_stage is DRAINING)
    @rule()
    def seal_drained(self) -> None:
        self.old.drained()
        assert self.new.feed(s.Drained()).rule == "Fenced"

    @precondition(lambda self: _live(self.old.seal_task) and self.old.seal_stage is FENCED)
    @rule(moves=st.integers(min_value=0, max_value=2))
    def seal_written(self, moves: int) -> None:
        assert self.old.seal_task is not None and isinstance(self.old.seal_task.param, int)
        report = SealReport(41, self.old.seal_task.param, moves, True)
        self.old.written(report)
        assert self.new.feed(s.SealWritten(report)).rule == "Sealed"

    @precondition(lambda self: _live(self.old.seal_task))
    @rule(still_leading=st.booleans())
    def seal_task_returns(self, still_leading: bool) -> None:
        assert self.old.seal_task is not None and self.new.seal_task is not None
        epoch = self.old.seal_task.param
        assert isinstance(epoch, int)
        self.old.seal_ended(epoch, still_leading)
        self.new.feed(s.SealEnded(epoch, still_leading))
        self.old.seal_task.finished = self.new.seal_task.finished = True

    @precondition(
        lambda self: (
            _live(self.old.reopen_task) and self.old.reopening == self.old.reopen_task.param
        )
    )
    @rule()
    def reopen_task_opens(self) -> None:
        assert self.old.reopen_task is not None and self.new.reopen_task is not None
        target = self.old.reopen_task.param
        assert isinstance(target, tuple)
        self.old.reopened()
        assert self.new.feed(s.Reopened(target)).rule == "Reopened"
        self.old.reopen_task.finished = self.new.reopen_task.finished = True

    @rule()
    def settle(self) -> None:
        """The loop runs: cancelled tasks finish."""
        for task in self.old.tasks + self.new.tasks:
            if task.cancelled:
                task.finished = True

    @invariant()
    def the_table_does_what_the_fields_did(self) -> None:
        assert self.new.state == self.old.view()
        assert self.new.tasks == self.old.tasks
        assert self.new.woken == self.old.woken

    @invariant()
    def at_most_one_seal_and_one_reopen_do_work(self) -> None:
        for kind in ("seal", "reopen"):
            assert sum(1 for t in self.new.tasks if t.kind == kind and _live(t)) <= 1

    @invariant()
    def a_report_only_once_sealed(self) -> None:
        state = self.new.state
        assert (state.sealed is not None) == (state.stage is SEALED)
        assert (state.stage is None) == (state.epoch == -1)
        if state.sealed is not None:
            assert state.sealed.epoch == state.epoch


TestSealingMachine = SealingMachine.TestCase
TestSealingMachine.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
