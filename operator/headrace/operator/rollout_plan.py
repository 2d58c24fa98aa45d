"""Rolling restart of a BrokerCluster's pods, one at a time (pure).

The StatefulSet's ``updateStrategy`` is ``OnDelete``: a change of the pod
template (a ``brokerConfig`` change moves its config-hash annotation; an image
change) makes a new revision, and the StatefulSet controller recreates a pod
at that revision only when the pod is deleted. The operator decides when,
here: ``next_action`` takes what the cluster's loop sees after a step and
returns the one thing to do now; ``rollout_executor.Rollout`` carries it out.

Theory of operation
-------------------
A pod is *outdated* when its ``controller-revision-hash`` label is not the
StatefulSet's ``updateRevision``. Outdated pods are restarted highest
ordinal first (as the StatefulSet controller would), one at a time:

    situation (first match wins)                              action
    --------------------------------------------------------  --------------------------------
    an outdated pod is stuck: not Ready, its broker not live, Delete it (highest ordinal
      not terminating, not the pod this rollout just deleted  first), without a drain or wait
    a pod this rollout deleted is not back (a new pod, ready, Wait
      its broker live and no longer draining)
    no outdated pod                                           Idle
    a pod is terminating, missing, not ready or its broker    Wait (the previous restart is
      is not live                                             not over)
    a partition is not Online, or its LRS is not its whole    Wait (a restart now could take
      replica set                                             a partition's last spare copy)
    the next pod's broker is not draining                     Drain (ask it: ``/v1/drain``)
    it still leads a partition another in-sync replica could  Wait, until ``drain_timeout_ms``
      lead, and the drain started under ``drain_timeout_ms``  after the drain started
      ago
    otherwise                                                 Delete (the preStop hook finds
                                                              nothing left to drain)

A stuck pod is replaced first, as Strimzi's KafkaRoller does: it serves nothing (its
broker is not live: crash-looping, unschedulable, image not pulled), so deleting it costs
no availability, and waiting for it would wait forever when its
revision cannot start (a bad image or ``brokerConfig``: reverting the spec makes a new
``updateRevision``, and ``OnDelete`` replaces the crash-looping pod only when it is
deleted). One broker that stays down would otherwise also block every later rollout,
the one that fixes it included. A stuck pod at the current revision is waited for
(rolling more pods onto a revision that does not start would take the cluster down). A
pod that is not Ready yet but whose broker is live is starting (recovering its logs),
not stuck: it may lead partitions, so it waits for its turn and is drained first.

Every other restart starts only when the previous one is over: its pod recreated,
ready, its broker live and back in every partition's live replica set. A
drain that does not finish in time (a partition whose other replicas are
behind) is no reason to stop: the pod is deleted, and that partition fails
over as in a crash.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

#: the label the StatefulSet controller puts on each pod: the revision it was made from
REVISION_LABEL: Final = "controller-revision-hash"


@dataclass(frozen=True, slots=True)
class PodView:
    """One broker pod as the API shows it."""

    broker: int
    revision: str | None
    ready: bool
    terminating: bool
    uid: str = ""


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as the controller's state holds it."""

    name: str
    online: bool
    leader: int | None
    replicas: tuple[int, ...]
    live_replicas: tuple[int, ...]

    @property
    def whole(self) -> bool:
        return self.online and set(self.live_replicas) == set(self.replicas)


@dataclass(frozen=True, slots=True)
class Seen:
    """What one step shows (see ``next_action``)."""

    #: the StatefulSet's ``status.updateRevision``; None until the controller set it
    update_revision: str | None
    #: the pods the StatefulSet should have: ordinals 0 .. replicas-1
    replicas: int
    pods: Mapping[int, PodView]
    live: Collection[int]
    draining: Collection[int]
    partitions: Collection[PartitionView]
    now_ms: int
    #: broker -> when the operator asked it to drain, or first saw it draining
    drains_started_ms: Mapping[int, int]
    drain_timeout_ms: int
    #: broker -> the uid of the pod this rollout deleted, until its replacement is back
    restarted: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Idle:
    """Every pod runs the current revision."""


@dataclass(frozen=True, slots=True)
class Wait:
    broker: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Drain:
    broker: int


@dataclass(frozen=True, slots=True)
class Delete:
    broker: int
    #: partitions it still led (a drain that timed out): they fail over
    still_leading: tuple[str, ...] = ()
    #: its pod was stuck (not Ready at an outdated revision): replaced without a drain
    stuck: bool = False


Action = Idle | Wait | Drain | Delete


def outdated(seen: Seen) -> list[int]:
    """Brokers whose pods run an older revision, in restart order (highest first)."""
    if seen.update_revision is None:
        return []
    return sorted(
        (b for b, pod in seen.pods.items() if pod.revision != seen.update_revision),
        reverse=True,
    )


def stuck(seen: Seen) -> list[int]:
    """Outdated brokers whose pods are not Ready and whose brokers are not live
    (crash-looping, unschedulable, an image that is not pulled), in restart order
    (highest first). A terminating pod is on its way out already, and the pod this
    rollout deleted (until it goes) is not deleted twice."""
    return [
        b
        for b in outdated(seen)
        if not (pod := seen.pods[b]).ready
        and b not in seen.live
        and not pod.terminating
        and seen.restarted.get(b) != pod.uid
    ]


def movable_leaderships(seen: Seen, broker: int) -> list[str]:
    """Partitions ``broker`` leads that another in-sync replica could lead."""
    return sorted(
        p.name
        for p in seen.partitions
        if p.leader == broker and any(r != broker for r in p.live_replicas)
    )


def back(seen: Seen) -> set[int]:
    """Restarted brokers whose new process is up: a new pod, ready, its broker live and not
    draining (the old process was; so a heartbeat the old one sent cannot pass for it)."""
    return {
        b
        for b, uid in seen.restarted.items()
        if (pod := seen.pods.get(b)) is not None
        and pod.uid != uid
        and pod.ready
        and b in seen.live
        and b not in seen.draining
    }


def next_action(seen: Seen) -> Action:
    """The one thing to do now; see the module's table."""
    pending = outdated(seen)
    replaceable = stuck(seen)
    if replaceable:
        broker = replaceable[0]
        return Delete(broker, tuple(movable_leaderships(seen, broker)), stuck=True)
    returning = sorted(set(seen.restarted) - back(seen))
    if returning:
        b = returning[0]
        return Wait(b, f"waiting for broker {b} to come back in a new pod")
    if not pending:
        return Idle()
    for broker in range(seen.replicas):
        pod = seen.pods.get(broker)
        if pod is None:
            return Wait(broker, f"waiting for pod {broker} to be recreated")
        if pod.terminating:
            return Wait(broker, f"waiting for pod {broker} to terminate")
        if not pod.ready:
            return Wait(broker, f"waiting for pod {broker} to be ready")
        if broker not in seen.live:
            return Wait(broker, f"waiting for broker {broker} to be live")
    short = sorted(p.name for p in seen.partitions if not p.whole)
    if short:
        shown = ", ".join(short[:5]) + (f" and {len(short) - 5} more" if len(short) > 5 else "")
        return Wait(None, f"waiting for every partition's live replica set to be whole: {shown}")
    broker = pending[0]
    if broker not in seen.draining:
        return Drain(broker)
    leading = movable_leaderships(seen, broker)
    started = seen.drains_started_ms.get(broker, seen.now_ms)  # unknown: it starts now
    if leading and seen.now_ms - started < seen.drain_timeout_ms:
        return Wait(broker, f"draining broker {broker}: it still leads {len(leading)} partitions")
    return Delete(broker, tuple(leading))
