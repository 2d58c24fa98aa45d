"""Skip the walk over every partition while nothing happens (pure).

``reconcile`` walks every partition of every topic on every step: the election
table, the unload, repartition and move passes, the cohort plans. On an idle
cluster of 10,000 partitions that is most of the controller's CPU, spent once
a second to learn that nothing changed.

``SteadySteps`` remembers the last step that was **steady**: it changed nothing
(no generation bump, no event, no progress of an Unload or a Repartition) and
left nothing waiting on the clock. A later step whose inputs equal that step's
returns the same decision without reconciling.

Why equal inputs give an equal decision. ``reconcile`` is a function of its
inputs and ``now_ms``. The clock reaches a decision in two ways only:

1. through liveness (a heartbeat ages past the TTL; the warm-up ends). The
   skip recomputes liveness, which costs one pass over the brokers, and
   requires it to equal the steady step's;
2. through deadlines: an election's candidate wait, an offline retry, a
   preferred leader's quiet period, an Unload's recovery timeout, a
   Repartition's adoption timeout, a move's candidate wait. A steady step has
   none armed: every partition is ONLINE with no ``deadline_ms``, no seal and no
   move target, no topic is in a transition, every Unload and Repartition is
   finished, no replica move is moving or waiting, and no broker is unheard.

Comparing the inputs is cheap when nothing changed: the controller's fleet
keeps the same ``PartitionReport`` objects for partitions whose report did not
change (heartbeat deltas), and tuple comparison checks identity before value,
so an unchanged heartbeat compares at C speed. Any difference at all (an
offset that moved, a spec edit, a broker gone quiet) reconciles in full.
``tests/unit/control/test_control_steady.py`` drives random schedules through
a controller with and without the skip and requires identical decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from headrace.control.liveness import assess
from headrace.control.model import (
    ClusterState,
    DeletionRequest,
    PartitionState,
    RepartitionProgress,
    RepartitionRequest,
    TopicSpec,
    UnloadProgress,
    UnloadRequest,
)
from headrace.control.reconcile import Decision, StepInputs, reconcile
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import Heartbeat


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What a step reads, except the clock and the heartbeats' receive times."""

    state: ClusterState
    specs: tuple[TopicSpec, ...]
    #: each heartbeat without ``received_ms`` and ``journal`` (liveness covers the first;
    #: the second only says where the delta stood)
    heartbeats: tuple[tuple[int, Heartbeat], ...]
    settings: ControlSettings
    observing_since_ms: int
    unload_requests: tuple[UnloadRequest, ...]
    unload_progress: tuple[tuple[str, UnloadProgress], ...]
    repartition_requests: tuple[RepartitionRequest, ...]
    repartition_progress: tuple[tuple[str, RepartitionProgress], ...]
    members: frozenset[int] | None
    commit_generation: int | None
    deletions: frozenset[DeletionRequest]
    racks: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class _Steady:
    inputs: _Inputs
    #: the brokers the state knows (liveness classifies them)
    known: frozenset[int]
    decision: Decision


class SteadySteps:
    """``reconcile``, skipped while the inputs equal those of the last steady step."""

    def __init__(self) -> None:
        self._last: _Steady | None = None
        #: steps answered without reconciling (for the controller's metrics and tests)
        self.skipped = 0

    def reconcile(self, step: StepInputs) -> Decision:
        """The same contract as ``reconcile.reconcile``."""
        inputs = _Inputs(
            step.state,
            tuple(step.specs),
            tuple(
                (b, replace(hb, received_ms=0, journal=None))
                for b, hb in sorted(step.heartbeats.items())
            ),
            step.settings,
            step.observing_since_ms,
            tuple(step.unload_requests),
            tuple(sorted((step.unload_progress or {}).items())),
            tuple(step.repartition_requests),
            tuple(sorted((step.repartition_progress or {}).items())),
            frozenset(step.members) if step.members is not None else None,
            step.commit_generation,
            frozenset(step.deletions),
            tuple(sorted(step.racks.items())),
        )
        last = self._last
        if last is not None and inputs == last.inputs:
            liveness = assess(
                last.known,
                step.heartbeats,
                step.now_ms,
                step.settings.liveness_ttl_ms,
                step.observing_since_ms,
            )
            if liveness == last.decision.liveness:
                self.skipped += 1
                return last.decision
        decision = reconcile(step)
        self._last = _Steady(inputs, _known(step.state), decision) if steady(decision) else None
        return decision


def _known(state: ClusterState) -> frozenset[int]:
    """The brokers ``reconcile`` classifies: registered, or named as a replica."""
    named = {b for t in state.topics.values() for p in t.partitions for b in p.replicas}
    return frozenset(state.brokers) | named


def steady(decision: Decision) -> bool:
    """The step changed nothing and armed nothing the clock could fire (see the module)."""
    if (
        decision.changed
        or decision.events
        or decision.unloads_changed
        or decision.repartitions_changed
        or decision.liveness.warming_up
        or decision.reassignment.rebalancing
    ):
        return False
    if not all(p.finished for p in decision.unloads.values()):
        return False
    if not all(p.finished for p in decision.repartitions.values()):
        return False
    for topic in decision.state.topics.values():
        if topic.transition is not None:
            return False
        for p in topic.partitions:
            if (
                p.state is not PartitionState.ONLINE
                or p.deadline_ms is not None
                or p.seal
                or p.target
            ):
                return False
    return True
