"""Replica reassignment: moving partition replicas between brokers (pure).

Theory of operation
-------------------
Kafka's KIP-455, fitted to our core. A partition's replica set changes only
through a *move*, whose one durable record is the partition's ``target``
(``PartitionStatus.target``): the replica set it ends with, preferred leader
first; empty when no move runs. While a move runs, ``replicas`` is the
*union* of the old set and the target (the old set, then the adding
replicas), so brokers open the adding replicas as followers, which fetch
from the leader's log start, and the election table may elect any LRS member
of either set. Every phase is derived from the persisted status, so a
restarted controller resumes a move exactly where it was::

    phase      condition (per partition, target non-empty)           step
    ---------  ----------------------------------------------------  ---------------------------
    Adding     a target member is not in the LRS                     wait: the new followers fetch
                                                                     until the leader admits them
    Handoff    every target member in the LRS, the leader is not in  nominate the first eligible
               the target (ONLINE, no seal)                           target member at epoch + 1
    Removing   every target member in the LRS and live, the leader    replicas := target,
               in the target, ONLINE, no seal                         LRS := LRS within target,
                                                                     target := () (Done)

The LRS a phase reads is the leader's report, so it counts only from a leader
that applied the push that started the move (``target_generation``, persisted
with the target; its heartbeat's ``generation`` at or past it). A leader that
missed the push removing broker B from the partition, then got the one adding
B back, would otherwise still report B in sync with the progress B had before
it dropped its copy, and the move would complete on an empty replica. The push
carries the generation too, and a leader seeing a move
start makes every follower outside the controller's LRS fetch again before it
counts as in sync (``replication.leader``), so a report from a leader at that
generation no longer names B until B has caught up. A move recorded without a
generation (by an older controller) is not fenced.

Removing is one status write: the next topology push names only the target,
so removed replicas stop serving and drop their copy (``replication.assigning``
``Drop``), and the leader forgets their progress. Acknowledged data stays on
at least ``minInSync`` in-sync copies throughout: a leader admits a follower
to its LRS only once it has fetched up to the high watermark (it holds every
acknowledged record), the set only shrinks to a target whose members are all
in the LRS, and an election only nominates LRS members.

A **handoff** moves leadership off a replica that is being removed, through
the same path as a preferred-leader hand-back: epoch + 1, only a live,
non-draining target member of the LRS that reports itself a follower at the
current epoch with a log end at or above the leader's reported high watermark
(defence in depth), promotion confirmed by its own report. If it fails to
promote in time the election table's next candidate takes over and the next
step hands off again.

Targets
-------
Targets are planned only when the controller is told the cluster's
``members`` (the broker ids the cluster should have: a BrokerCluster's
ordinals ``0..replicas-1``, or the brokers of a local cluster). Then:

1. **Evacuate**: a partition holding a replica on a non-member (a broker being
   removed) gets a target that replaces each such replica, in place, by the
   eligible member (live, not draining) in a rack none of the partition's other
   replicas is in (``placement.Racks``), then holding fewest of the topic's
   replicas, then fewest cluster-wide, then the lowest id. If no member can
   take it, or the partition's only in-sync replica is on a removed broker
   that is down (its data cannot be copied), the scale-down is *blocked* and
   the step says why.
2. **Balance** (only once nothing needs evacuating, every member is live and
   not draining, and the controller is not warming up): per topic, while the
   member holding most of its replicas holds two more than the one holding
   fewest, one replica moves from the first to the second, in place (so the
   new broker inherits the position, and the preferred leadership when it was
   first). Among the candidates a partition the source leads is chosen when
   it leads more of the topic than the destination, so new brokers also get
   leaderships; then the lowest partition. A move that would leave a partition
   over fewer racks than it covers is never a balancing move (a broker alone in
   its rack holds more than the others, by design of ``placement``).

Only the replicas that must go (evacuation) or that even out a topic move:
every other replica stays where it is when brokers join or leave.

A move whose target names a broker that stopped being a member is retargeted
from its current union. At most ``max_concurrent_moves`` moves run at once
cluster-wide (each copies a partition's whole log); partitions of a topic that
an unload or repartition is busy with start no move.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from headrace.control import placement
from headrace.control.liveness import Liveness, placeable
from headrace.control.model import PartitionState, PartitionStatus, TopicStatus, normalise_lrs
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import PartitionReport

ONLINE, ELECTING = PartitionState.ONLINE, PartitionState.ELECTING

#: (topic, partition) -> broker id -> that live broker's report
Reports = Mapping[tuple[str, int], Mapping[int, PartitionReport]]


@dataclass(frozen=True, slots=True)
class Summary:
    """How reassignment is going, cluster-wide (for a BrokerCluster's ``Rebalancing``
    condition and the local controller's log): not persisted, derived every step."""

    #: partitions with a move in flight
    moving: int = 0
    #: partitions that need a move that has not started (over the concurrency cap, or
    #: their topic is busy); a blocked scale-down's partitions are not counted
    waiting: int = 0
    #: why a needed move cannot start (a scale-down that would lose data); empty if none
    blocked: tuple[str, ...] = ()
    #: brokers that are not members and hold no replica any more: safe to stop
    released: frozenset[int] = frozenset()
    #: brokers that are not members and still hold replicas
    evacuating: frozenset[int] = frozenset()

    @property
    def rebalancing(self) -> bool:
        return bool(self.moving or self.waiting)

    def to_json(self) -> dict[str, Any]:
        return {
            "moving": self.moving,
            "waiting": self.waiting,
            "blocked": list(self.blocked),
            "released": sorted(self.released),
            "evacuating": sorted(self.evacuating),
        }


@dataclass(frozen=True, slots=True)
class Moved:
    topics: dict[str, TopicStatus]
    #: (kind, subject, message)
    events: tuple[tuple[str, str, str], ...]
    summary: Summary


#: plan-and-advance rounds per step; each round that changes something starts or finishes
#: a move, so a handful reach the fixpoint in practice
_MAX_ROUNDS: Final = 8


def step(
    topics: Mapping[str, TopicStatus],
    *,
    members: Collection[int] | None,
    liveness: Liveness,
    reports: Reports,
    busy: Collection[str],
    now_ms: int,
    settings: ControlSettings,
    pushed_at: int,
    applied: Mapping[int, int],
    racks: placement.Racks = placement.NO_RACKS,
) -> Moved:
    """Advance every move in flight, then start new ones (see the module doc).

    ``members``: the brokers the cluster should have; None plans no new moves
    (moves in flight still finish). ``busy``: topics an unload or repartition
    is working on; no move starts there. ``pushed_at``: the topology generation the
    result is pushed at (a move started here records it). ``applied``: the generation
    each live broker's heartbeat says it applied. ``racks``: where the brokers run.
    """
    events: list[tuple[str, str, str]] = []
    out = dict(topics)
    summary = Summary()
    # Plan, then advance, until neither changes anything: a fresh target already in sync
    # completes in this very step, and the budget a completed move frees is used now, so
    # a second step on the same evidence changes nothing.
    for _ in range(_MAX_ROUNDS):
        before = dict(out)
        if members is not None:
            summary = _plan(
                out, frozenset(members), liveness, busy, settings, pushed_at, events, racks
            )
        for name in sorted(out):
            topic = out[name]
            parts = tuple(
                _advance(
                    name,
                    p,
                    liveness,
                    reports.get((name, p.partition), {}),
                    applied,
                    now_ms,
                    settings,
                    events,
                )
                for p in topic.partitions
            )
            if parts != topic.partitions:
                out[name] = replace(topic, partitions=parts)
        if out == before:
            break
    moving = sum(1 for t in out.values() for p in t.partitions if p.target)
    summary = replace(summary, moving=moving)
    if members is not None:
        holders = {b for t in out.values() for p in t.partitions for b in p.replicas}
        known = liveness.live | liveness.dead | liveness.unheard
        outsiders = {b for b in known if b not in members}
        summary = replace(
            summary,
            released=frozenset(outsiders - holders),
            evacuating=frozenset(outsiders & holders),
        )
    return Moved(out, tuple(events), summary)


# --------------------------------------------------------------------------- advancing


def _advance(
    topic: str,
    p: PartitionStatus,
    liveness: Liveness,
    seen: Mapping[int, PartitionReport],
    applied: Mapping[int, int],
    now_ms: int,
    settings: ControlSettings,
    events: list[tuple[str, str, str]],
) -> PartitionStatus:
    if p.target and not set(p.target) <= set(p.replicas):
        # something else reassigned the partition (an unload): the move is void
        events.append(("MoveAbandoned", f"{topic}/{p.partition}", "reassigned meanwhile"))
        return replace(p, target=(), target_generation=0)
    if not p.target or p.seal or p.state is not ONLINE or p.leader is None:
        return p
    subject = f"{topic}/{p.partition}"
    if applied.get(p.leader, 0) < p.target_generation:
        return p  # the leader has not applied the move's push: its LRS may be stale
    if not set(p.target) <= set(p.live_replicas):
        return p  # Adding: the new followers are still catching up
    if p.leader not in p.target:
        candidate = _handoff_candidate(p, liveness, seen)
        if candidate is None:
            return p
        events.append(
            (
                "MoveLeaderHandoff",
                subject,
                f"broker {p.leader} leaves the replica set: broker {candidate} nominated"
                f" for epoch {p.leader_epoch + 1}",
            )
        )
        return replace(
            p,
            state=ELECTING,
            leader=None,
            candidate=candidate,
            leader_epoch=p.leader_epoch + 1,
            deadline_ms=now_ms + settings.candidate_wait_ms,
            tried=(candidate,),
        )
    if not all(b in liveness.live for b in p.target):
        # the LRS is the leader's last report: a target member that died since would leave
        # the partition with fewer live in-sync copies than the replica it replaces gave
        return p
    removed = [b for b in p.replicas if b not in p.target]
    events.append(
        (
            "MoveCompleted",
            subject,
            f"replicas {list(p.replicas)} -> {list(p.target)}"
            + (f" (removed {removed})" if removed else ""),
        )
    )
    return replace(
        p,
        replicas=p.target,
        live_replicas=normalise_lrs(p.target, p.live_replicas, p.leader),
        target=(),
        target_generation=0,
        deadline_ms=None,
        tried=(),
    )


def _handoff_candidate(
    p: PartitionStatus, liveness: Liveness, seen: Mapping[int, PartitionReport]
) -> int | None:
    """The first target member that could take the leadership now, or None."""
    if liveness.warming_up:
        return None
    current = seen.get(p.leader) if p.leader is not None else None
    if current is None or current.role != "leader" or current.leader_epoch != p.leader_epoch:
        return None
    for b in p.target:
        report = seen.get(b)
        if (
            b in p.live_replicas
            and b in liveness.live
            and b not in liveness.draining
            and report is not None
            and report.role == "follower"
            and report.leader_epoch == p.leader_epoch
            and report.log_end_offset >= current.high_watermark
        ):
            return b
    return None


# --------------------------------------------------------------------------- planning


@dataclass
class _Load:
    """Replica and leadership counts the planner keeps up to date as it plans."""

    topic_holds: Counter[int]
    topic_leads: Counter[int]
    cluster_holds: Counter[int]


def _final(p: PartitionStatus) -> tuple[int, ...]:
    """The replica set the partition ends with: its target, or its replicas."""
    return p.target or p.replicas


def _plan(
    topics: dict[str, TopicStatus],
    members: frozenset[int],
    liveness: Liveness,
    busy: Collection[str],
    settings: ControlSettings,
    pushed_at: int,
    events: list[tuple[str, str, str]],
    racks: placement.Racks,
) -> Summary:
    """Start moves in ``topics`` (updated in place); the summary, minus ``moving``.
    ``pushed_at``: the generation the moves started here are pushed at."""
    eligible = sorted(placeable(liveness, members))
    cluster_holds: Counter[int] = Counter(
        b for t in topics.values() for p in t.partitions for b in _final(p)
    )
    in_flight = sum(1 for t in topics.values() for p in t.partitions if p.target)
    budget = max(0, settings.max_concurrent_moves - in_flight)
    waiting = 0
    blocked: list[str] = []
    warming = liveness.warming_up

    # 1. evacuate non-members (and retarget moves onto brokers that stopped being members)
    # A scale-down is all or nothing: while any partition cannot leave, none starts to (a
    # half-evacuated broker helps nobody), and the summary says why.
    evacuees = [
        (name, i)
        for name in sorted(topics)
        for i, p in enumerate(topics[name].partitions)
        if not all(b in members for b in p.replicas)
    ]
    for name, i in evacuees:
        p = topics[name].partitions[i]
        why = _stranded(p, members, liveness) or _too_few(p, members, eligible)
        if why:
            gone = sorted(b for b in p.replicas if b not in members)
            blocked.append(f"partition {name}/{p.partition} cannot leave brokers {gone}: {why}")
    for name, i in evacuees if not blocked else ():
        topic = topics[name]
        p = topic.partitions[i]
        if all(b in members for b in _final(p)):
            continue  # its move is already on its way off them
        if warming or name in busy or p.seal or (not p.target and budget == 0):
            waiting += 1
            continue
        load = _load(topic, cluster_holds)
        target = _evacuation_target(p, members, eligible, load, racks)
        if target is None:  # ruled out by _too_few
            continue
        if not p.target:
            budget -= 1
        parts = list(topic.partitions)
        parts[i] = _retarget(p, target, load, cluster_holds, pushed_at)
        topics[name] = replace(topic, partitions=tuple(parts))
        events.append(
            (
                "MoveStarted",
                f"{name}/{p.partition}",
                f"evacuating: replicas {list(p.replicas)} -> target {list(target)}",
            )
        )
    needs_evacuation = bool(evacuees)

    # 2. balance members' shares of every topic
    if not needs_evacuation and not warming and set(eligible) == members:
        for name in sorted(topics):
            if name in busy:
                continue
            topic = topics[name]
            parts = list(topic.partitions)
            load = _load(topic, cluster_holds)
            while True:
                move = _balancing_move(parts, members, load, racks)
                if move is None:
                    break
                if budget == 0:
                    waiting += 1
                    break
                i, source, dest = move
                p = parts[i]
                target = tuple(dest if b == source else b for b in p.replicas)
                budget -= 1
                parts[i] = _retarget(p, target, load, cluster_holds, pushed_at)
                events.append(
                    (
                        "MoveStarted",
                        f"{name}/{p.partition}",
                        f"balancing: broker {source} -> broker {dest}, target {list(target)}",
                    )
                )
            topics[name] = replace(topic, partitions=tuple(parts))

    return Summary(waiting=waiting, blocked=tuple(blocked))


def _load(topic: TopicStatus, cluster_holds: Counter[int]) -> _Load:
    return _Load(
        Counter(b for p in topic.partitions for b in _final(p)),
        Counter(_final(p)[0] for p in topic.partitions if _final(p)),
        cluster_holds,
    )


def _stranded(p: PartitionStatus, members: frozenset[int], liveness: Liveness) -> str | None:
    """Why ``p``'s data cannot be copied off its removed brokers now, or None."""
    live_copies = [b for b in p.live_replicas if b in liveness.live]
    if live_copies:
        return None
    gone = sorted(b for b in p.live_replicas if b not in members)
    if gone:
        return (
            f"its in-sync replicas {list(p.live_replicas)} are down and {gone} are being"
            " removed: removing them would lose its last in-sync replica; bring them back"
        )
    return None


def _too_few(p: PartitionStatus, members: frozenset[int], eligible: list[int]) -> str | None:
    """Why ``p`` cannot have all its replicas on members, or None."""
    rf = len(_final(p))
    usable = set(eligible) | {b for b in _final(p) if b in members}
    if len(usable) < rf:
        return (
            f"{rf} replicas need {rf} live members, {len(usable)} available"
            f" ({sorted(usable)}): a scale-down below the replication factor is refused"
        )
    return None


def _evacuation_target(
    p: PartitionStatus,
    members: frozenset[int],
    eligible: list[int],
    load: _Load,
    racks: placement.Racks,
) -> tuple[int, ...] | None:
    """``p``'s target with every non-member replaced in place, or None if too few members."""
    rf = len(p.target) if p.target else len(p.replicas)
    # keep what is already planned or held on members, in the order the target had it
    keep = [b for b in (*p.target, *p.replicas) if b in members]
    chosen: list[int] = list(dict.fromkeys(keep))[:rf]
    base = list(p.target or p.replicas)
    result: list[int | None] = [b if b in chosen else None for b in base]
    extra = [b for b in chosen if b not in result]
    for slot in range(len(result)):
        if result[slot] is None and extra:
            result[slot] = extra.pop(0)
    for slot in range(len(result)):
        if result[slot] is not None:
            continue
        pool = [b for b in eligible if b not in result]
        if not pool:
            return None
        used = {placement.rack_of(b, racks) for b in result if b is not None}
        best = min(
            pool,
            key=lambda b: (
                placement.rack_of(b, racks) in used,
                load.topic_holds[b],
                load.cluster_holds[b],
                b,
            ),
        )
        result[slot] = best
    final = tuple(b for b in result if b is not None)
    return final if len(final) == rf else None


def _balancing_move(
    parts: list[PartitionStatus], members: frozenset[int], load: _Load, racks: placement.Racks
) -> tuple[int, int, int] | None:
    """(partition index, source, destination) of the next balancing move, or None.

    The most loaded member gives to the least loaded; when no partition can go between
    them without covering fewer racks, the next pair two or more apart is tried."""
    sources = sorted(members, key=lambda b: (-load.topic_holds[b], b))
    destinations = sorted(members, key=lambda b: (load.topic_holds[b], b))
    for most in sources:
        for least in destinations:
            if load.topic_holds[most] - load.topic_holds[least] <= 1:
                break
            prefer_lead = load.topic_leads[most] > load.topic_leads[least]
            candidates = [
                i
                for i, p in enumerate(parts)
                if not p.target
                and not p.seal
                and most in p.replicas
                and least not in p.replicas
                and placement.rack_span((least if b == most else b for b in p.replicas), racks)
                >= placement.rack_span(p.replicas, racks)
            ]
            if candidates:
                best = min(
                    candidates, key=lambda i: ((parts[i].replicas[0] == most) != prefer_lead, i)
                )
                return best, most, least
    return None


def _retarget(
    p: PartitionStatus,
    target: tuple[int, ...],
    load: _Load,
    cluster_holds: Counter[int],
    pushed_at: int,
) -> PartitionStatus:
    """``p`` moving to ``target`` from generation ``pushed_at``: replicas become the union;
    counts follow the new target."""
    before = _final(p)
    for b in before:
        load.topic_holds[b] -= 1
        cluster_holds[b] -= 1
    if before:
        load.topic_leads[before[0]] -= 1
    for b in target:
        load.topic_holds[b] += 1
        cluster_holds[b] += 1
    load.topic_leads[target[0]] += 1
    union = (*p.replicas, *(b for b in target if b not in p.replicas))
    return replace(p, replicas=union, target=target, target_generation=pushed_at)
