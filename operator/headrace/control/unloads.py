"""Unloads: moving a tiered topic's partitions to new owners (pure state machine).

Theory of operation
-------------------
Danube's model, with replication. A partition of a tiered topic can change
owners without copying its log, because everything it ever committed can be
in the object store:

1. the controller sets the partition's ``seal`` marker;
2. its leader **seals** it: stops appends, uploads every record to the object
   store, writes the sealed state ``{lastCommittedOffset, broker, epoch,
   moves, cursors, producers}`` there, and reports ``sealed`` (at its epoch
   and incarnation) in its heartbeat;
3. the controller **reassigns** it: a new replica set (the target first, or
   placement's choice), a new leader epoch, the seal cleared, the
   incarnation ``moves`` + 1 and ``startOffset`` = sealed + 1. Every replica
   of the new set, old ones included, drops its local copy and opens the
   partition empty at ``startOffset`` (older offsets are read from the object
   store); the LRS is the new leader alone until its followers catch up;
4. the move **completes** when the new leader reports leading at the new
   epoch and incarnation.

If the leader dies mid-seal and the partition has other in-sync replicas, the
election table promotes one, ``seal`` stays set, and the new leader seals:
nothing special (recorded as recovery from ``Replicas``). If no live replica
can seal it (RF=1 and the owner is dead, or every in-sync replica is dead)
for ``unload_recovery_timeout_ms``, the partition is reassigned with no
``startOffset``: the new owner starts after the last offset durable in the
object store (recovery from the ``ObjectStore``). Records the old owner
acknowledged and had not uploaded are lost: at most one upload interval for
an RF=1 topic.

One table row per transition of one partition's move; a step fires the first
row whose phase and guard match, then the first matching the new move, and so
on until none does (as in ``election``), so a second step on the same evidence
changes nothing::

    phase    guard (first match wins)                             next       effect
    -------  ---------------------------------------------------  ---------  ------------------------------
    PENDING  the Unload was deleted                               FAILED
    PENDING  free to start, the target already leads it           COMPLETED  nothing to move
    PENDING  free to start (not warming up, no other unload       SEALING    seal := True; from := owner;
             moves it, the target is live and not draining)                  moves := moves + 1
    SEALING  the status is already at the new incarnation (a      SEALED     rebuild the move from it
             restart between persisting topic and progress)
    SEALING  the seal marker is missing                           SEALING    seal := True
    SEALING  a live replica reports sealed at the current epoch   SEALED     reassign at sealed + 1
             and incarnation; the new replica set can be placed
    SEALING  no live LRS member; the recovery deadline passed;    SEALED     reassign, start from the object
             the new replica set can be placed                               store
    SEALING  no live LRS member, no deadline                      SEALING    deadline := now + timeout
    SEALING  a live LRS member again, deadline set                SEALING    deadline := None
    SEALED   the status lost the reassignment (a restart)         SEALING
    SEALED   the leader reports leading at the new epoch and      COMPLETED  object store path: sealed :=
             incarnation                                                     startOffset - 1

A move of a deleted topic, or of a partition that no longer exists, fails in
any phase. Between transitions the move's ``message`` says what it waits for.

Moves of one partition never overlap: a move starts only when no other
unload's move is in flight on that partition; requests are served in the
order given (the controller passes them oldest first). A seal marker no move
claims (its Unload was removed mid-move) is adopted by the next move of that
partition, and reported as a problem until then.

An unload is ``Pending`` until a move starts, ``Moving`` until every move
has finished, then ``Completed``, or ``Failed`` if any move failed (the
others still finish). Requests are validated before any move starts: the
topic must exist and be tiered, the partitions in range, the target known.

Placement without a target spreads as topic creation does (``placement``,
counting the topic's other partitions and the other topics), avoiding the
old owner when enough live, non-draining brokers remain (members only, when the
controller knows the cluster's members: a broker being scaled away gets nothing new;
``liveness.placeable``), and never leaves it
leading when another member could. With fewer eligible brokers than
replicas (some are down) it takes them all and fills up with the old
replicas, which follow when they come back: a sealed partition is
unavailable, so it must not wait for a full set. With a target: the target leads, and the
other replicas stay (the old owner makes room if the target was not a
replica). The replication factor never changes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from headrace.control import placement
from headrace.control.liveness import Liveness, placeable
from headrace.control.model import (
    MovePhase,
    MoveProgress,
    PartitionState,
    PartitionStatus,
    RecoverySource,
    TopicSpec,
    TopicStatus,
    UnloadPhase,
    UnloadProgress,
    UnloadRequest,
)
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import PartitionReport, SealReport

PENDING, SEALING, SEALED = MovePhase.PENDING, MovePhase.SEALING, MovePhase.SEALED
COMPLETED, FAILED = MovePhase.COMPLETED, MovePhase.FAILED

#: (kind, message) of an event about one partition
Note = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Seen:
    """One step's evidence about one partition's move."""

    request: UnloadRequest
    #: every topic as decided so far in this step (others' replica lists guide placement)
    topics: Mapping[str, TopicStatus]
    #: the unload whose move is in flight on this partition, if another one's is
    claimed_by: str | None
    liveness: Liveness
    #: broker id -> that broker's report for this partition; live brokers only
    reports: Mapping[int, PartitionReport]
    now_ms: int
    settings: ControlSettings
    #: the brokers the cluster should have (``reconcile``'s ``members``); None: not known
    members: frozenset[int] | None = None
    #: where the brokers run (``placement.Racks``): a new replica set spans the racks
    racks: placement.Racks = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table."""

    name: str
    phase: MovePhase
    guard: Callable[[MoveProgress, PartitionStatus, Seen], bool]
    #: the new move and partition, and what to say about it (event kind, message)
    act: Callable[
        [MoveProgress, PartitionStatus, Seen], tuple[MoveProgress, PartitionStatus, list[Note]]
    ]


# --------------------------------------------------------------------------- evidence


def loss_bound(owner: int | None, replicas: int) -> str:
    """The recovery message: what reopening from the object store may lose."""
    who = f"owner {owner}" if replicas == 1 else f"owner {owner} and every in-sync replica"
    return (
        f"{who} died mid-seal; the new owner starts after the last offset durable in the"
        " object store; records the old owner acknowledged after it and had not uploaded are"
        " lost (at most one upload interval of data, default 30 s, for an RF=1 topic)"
    )


def _pending_wait(m: MoveProgress, p: PartitionStatus, seen: Seen) -> str | None:
    """Why a pending move may not start yet; None if it may."""
    if seen.liveness.warming_up:
        return "waiting to hear from every known broker"
    if seen.claimed_by is not None:
        return f"waiting for unload {seen.claimed_by} to finish moving this partition"
    return _target_wait(seen)


def _target_wait(seen: Seen) -> str | None:
    target = seen.request.target
    if target is None:
        return None
    if target not in seen.liveness.live:
        return f"waiting for target broker {target} to be live"
    if target in seen.liveness.draining:
        return f"waiting: target broker {target} is draining"
    return None


def _seal_report(p: PartitionStatus, seen: Seen) -> tuple[int, SealReport] | None:
    """A live replica's seal at the partition's current epoch and incarnation."""
    for broker in sorted(seen.reports):
        sealed = seen.reports[broker].sealed
        if (
            broker in p.replicas
            and sealed is not None
            and sealed.epoch == p.leader_epoch
            and sealed.moves == p.moves
        ):
            return broker, sealed
    return None


def _sealers_lost(p: PartitionStatus, seen: Seen) -> bool:
    """No LRS member can seal: all are dead (unheard ones are not, yet)."""
    return all(b in seen.liveness.dead for b in p.live_replicas)


def _placement(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[tuple[int, ...] | None, str]:
    """The new replica list, leader first; or None and why not."""
    if seen.liveness.warming_up:
        return None, "waiting to hear from every known broker before placing it"
    wait = _target_wait(seen)
    if wait is not None:
        return None, wait
    rf = p.replication_factor
    target = seen.request.target
    if target is not None:
        if target in p.replicas:
            rest = [b for b in p.replicas if b != target]
        else:  # the old owner makes room
            rest = [b for b in p.replicas if b != m.from_broker][: rf - 1]
        return (target, *rest), ""
    eligible = placeable(seen.liveness, seen.members)
    if not eligible:
        return None, "waiting for a live member broker that is not draining to place it on"
    without_owner = eligible - {m.from_broker}
    pool = without_owner if len(without_owner) >= rf else eligible
    topic = seen.topics[seen.request.topic]
    siblings = [q.replicas for q in topic.partitions if q.partition != p.partition]
    others = [
        q.replicas for t in seen.topics.values() if t.name != topic.name for q in t.partitions
    ]
    # Too few eligible brokers (some are down): all of them, then old replicas to fill up
    # (they follow when they come back). A sealed partition must not wait for a full set.
    take = min(rf, len(pool))
    chosen = list(
        placement.place(
            len(siblings) + 1, take, pool, existing=siblings, others=others, racks=seen.racks
        )[-1]
    )
    chosen += [b for b in p.replicas if b not in chosen and b != m.from_broker]
    if m.from_broker in p.replicas and m.from_broker not in chosen:
        chosen.append(m.from_broker)
    chosen = chosen[:rf]
    successor = next((b for b in chosen[1:] if b in eligible), None)
    if chosen[0] == m.from_broker and successor is not None:
        chosen.remove(successor)  # an unload moves leadership away when it can
        chosen.insert(0, successor)
    return tuple(chosen), ""


def _reassign(
    p: PartitionStatus, replicas: tuple[int, ...], moves: int, start_offset: int | None
) -> PartitionStatus:
    """The new incarnation: ONLINE under the first replica, alone in the LRS, at a new epoch."""
    return replace(
        p,
        replicas=replicas,
        leader=replicas[0],
        leader_epoch=p.leader_epoch + 1,
        live_replicas=(replicas[0],),
        state=PartitionState.ONLINE,
        candidate=None,
        deadline_ms=None,
        tried=(),
        seal=False,
        moves=moves,
        start_offset=start_offset,
    )


def _new_leader_report(m: MoveProgress, p: PartitionStatus, seen: Seen) -> PartitionReport | None:
    if p.moves != m.moves or p.leader is None:
        return None
    report = seen.reports.get(p.leader)
    if (
        report is None
        or report.role != "leader"
        or report.leader_epoch != p.leader_epoch
        or report.moves != p.moves
    ):
        return None
    return report


def _incarnation(m: MoveProgress) -> int:
    if m.moves is None:  # set when the move starts sealing
        raise ValueError(f"move of partition {m.partition} is {m.phase} without an incarnation")
    return m.moves


def _describe(p: PartitionStatus) -> str:
    start = "the object store's end" if p.start_offset is None else f"offset {p.start_offset}"
    return (
        f"replicas {list(p.replicas)}, leader {p.leader} at epoch {p.leader_epoch},"
        f" incarnation {p.moves} starting at {start}"
    )


# --------------------------------------------------------------------------- guards and actions


def _cancelled(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return seen.request.cancelled


def _cancel(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    why = "cancelled: the Unload was deleted before this move started"
    return replace(m, phase=FAILED, message=why), p, [("MoveCancelled", why)]


def _target_leads(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return (
        _pending_wait(m, p, seen) is None
        and seen.request.target is not None
        and p.leader == seen.request.target
        and p.state is PartitionState.ONLINE
        and not p.seal
    )


def _nothing_to_move(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    why = f"broker {p.leader} already leads it: nothing to move"
    done = replace(m, phase=COMPLETED, from_broker=p.leader, to_broker=p.leader, message=why)
    return done, p, [("NothingToMove", why)]


def _may_start(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return _pending_wait(m, p, seen) is None


def _start(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    owner = p.owner if p.owner is not None else p.replicas[0]
    moving = replace(m, phase=SEALING, from_broker=owner, moves=p.moves + 1, message="")
    return (
        moving,
        replace(p, seal=True),
        [("SealRequested", f"broker {owner} seals it at epoch {p.leader_epoch}")],
    )


def _already_reassigned(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return p.moves >= _incarnation(m)


def _rebuild(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    if p.start_offset is None:
        moved = replace(
            m,
            phase=SEALED,
            to_broker=p.replicas[0],
            recovery_source=RecoverySource.OBJECT_STORE,
            recovery_message=loss_bound(m.from_broker, p.replication_factor),
            deadline_ms=None,
        )
    else:
        moved = replace(
            m,
            phase=SEALED,
            to_broker=p.replicas[0],
            sealed_offset=p.start_offset - 1,
            deadline_ms=None,
        )
    return moved, p, [("ReassignmentFound", "already reassigned: " + _describe(p))]


def _seal_missing(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return not p.seal


def _restore_seal(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    return (
        m,
        replace(p, seal=True),
        [("SealRestored", "the seal marker was not persisted: set again")],
    )


def _sealed_and_placeable(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return _seal_report(p, seen) is not None and _placement(m, p, seen)[0] is not None


def _sealed(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    found = _seal_report(p, seen)
    replicas, _ = _placement(m, p, seen)
    if found is None or replicas is None:  # ruled out by the guard
        return m, p, []
    sealer, report = found
    after = _reassign(p, replicas, _incarnation(m), report.last_committed_offset + 1)
    moved = replace(
        m,
        phase=SEALED,
        to_broker=replicas[0],
        sealed_offset=report.last_committed_offset,
        verified=report.verified,
        verification_message=report.message,
        checked_ms=seen.now_ms,
        deadline_ms=None,
    )
    if sealer != m.from_broker:
        moved = replace(
            moved,
            recovery_source=RecoverySource.REPLICAS,
            recovery_message=(
                f"broker {m.from_broker} stopped leading mid-seal; replica {sealer} took over"
                f" at epoch {p.leader_epoch} and sealed it: records acknowledged with acks=all"
                " are kept"
            ),
        )
    verdict = "verified" if report.verified else f"NOT verified: {report.message}"
    return (
        moved,
        after,
        [
            (
                "PartitionSealed",
                f"broker {sealer} sealed it at offset {report.last_committed_offset}"
                f" (epoch {report.epoch}, {verdict})",
            ),
            ("PartitionReassigned", _describe(after)),
        ],
    )


def _recovery_due(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return (
        m.deadline_ms is not None
        and seen.now_ms >= m.deadline_ms
        and _sealers_lost(p, seen)
        and _placement(m, p, seen)[0] is not None
    )


def _reopen_from_object_store(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    replicas, _ = _placement(m, p, seen)
    if replicas is None:  # ruled out by the guard
        return m, p, []
    after = _reassign(p, replicas, _incarnation(m), None)
    why = loss_bound(m.from_broker, p.replication_factor)
    moved = replace(
        m,
        phase=SEALED,
        to_broker=replicas[0],
        recovery_source=RecoverySource.OBJECT_STORE,
        recovery_message=why,
        deadline_ms=None,
    )
    return (
        moved,
        after,
        [("ReopenedFromObjectStore", why), ("PartitionReassigned", _describe(after))],
    )


def _lost_without_deadline(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return m.deadline_ms is None and _sealers_lost(p, seen)


def _start_deadline(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    deadline = seen.now_ms + seen.settings.unload_recovery_timeout_ms
    why = (
        f"no live replica can seal it (live replicas {list(p.live_replicas)} are dead);"
        f" reopening from the object store in {seen.settings.unload_recovery_timeout_ms} ms"
        " unless one comes back"
    )
    return replace(m, deadline_ms=deadline), p, [("SealersLost", why)]


def _sealer_back(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return m.deadline_ms is not None and not _sealers_lost(p, seen)


def _clear_deadline(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    back = sorted(b for b in p.live_replicas if b not in seen.liveness.dead)
    return replace(m, deadline_ms=None), p, [("SealerBack", f"live replicas {back} can seal it")]


def _reassignment_lost(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return p.moves < _incarnation(m)


def _back_to_sealing(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    again = replace(
        m,
        phase=SEALING,
        to_broker=None,
        sealed_offset=None,
        verified=None,
        verification_message="",
        checked_ms=None,
        recovery_source=None,
        recovery_message="",
    )
    return again, p, [("ReassignmentLost", "the reassignment was not persisted: sealing again")]


def _new_leader_serves(m: MoveProgress, p: PartitionStatus, seen: Seen) -> bool:
    return _new_leader_report(m, p, seen) is not None


def _complete(
    m: MoveProgress, p: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, list[Note]]:
    report = _new_leader_report(m, p, seen)
    if report is None:  # ruled out by the guard
        return m, p, []
    done = replace(m, phase=COMPLETED, message="")
    if m.sealed_offset is None:  # the object store path: the new owner found where to start
        done = replace(done, sealed_offset=report.start_offset - 1)
    if p.start_offset is None:
        p = replace(p, start_offset=report.start_offset)
    return (
        done,
        p,
        [
            (
                "MoveCompleted",
                f"broker {p.leader} leads incarnation {p.moves} from offset {report.start_offset}"
                f" at epoch {p.leader_epoch}",
            )
        ],
    )


#: The transition table. ``step_move`` fires the first row whose phase and guard match.
RULES: Final[tuple[Rule, ...]] = (
    Rule("MoveCancelled", PENDING, _cancelled, _cancel),
    Rule("NothingToMove", PENDING, _target_leads, _nothing_to_move),
    Rule("SealRequested", PENDING, _may_start, _start),
    Rule("ReassignmentFound", SEALING, _already_reassigned, _rebuild),
    Rule("SealRestored", SEALING, _seal_missing, _restore_seal),
    Rule("PartitionSealed", SEALING, _sealed_and_placeable, _sealed),
    Rule("ReopenedFromObjectStore", SEALING, _recovery_due, _reopen_from_object_store),
    Rule("SealersLost", SEALING, _lost_without_deadline, _start_deadline),
    Rule("SealerBack", SEALING, _sealer_back, _clear_deadline),
    Rule("ReassignmentLost", SEALED, _reassignment_lost, _back_to_sealing),
    Rule("MoveCompleted", SEALED, _new_leader_serves, _complete),
)

#: more rows than any chain can fire in one step
MAX_ROWS_PER_STEP: Final = 8


def _waiting(m: MoveProgress, p: PartitionStatus, seen: Seen) -> str:
    """What an unfinished move waits for (its ``message``)."""
    if m.phase is PENDING:
        return _pending_wait(m, p, seen) or ""
    if m.phase is SEALED:
        leader = f"broker {p.owner}" if p.owner is not None else "a live replica"
        return f"waiting for {leader} to lead incarnation {p.moves} at epoch {p.leader_epoch}"
    if m.deadline_ms is not None:
        return (
            f"no live replica can seal it; reopening from the object store at {m.deadline_ms} ms"
            " (or when brokers can be placed)"
        )
    if _seal_report(p, seen) is not None:
        return _placement(m, p, seen)[1]
    who = p.owner if p.owner is not None else "an elected leader"
    return f"waiting for broker {who} to seal it at epoch {p.leader_epoch}"


def step_move(
    move: MoveProgress, partition: PartitionStatus, seen: Seen
) -> tuple[MoveProgress, PartitionStatus, tuple[Rule, ...], list[Note]]:
    """The move's and the partition's next state, the rows that fired, and events to report."""
    fired: list[Rule] = []
    notes: list[Note] = []
    while len(fired) < MAX_ROWS_PER_STEP:
        rule = next(
            (r for r in RULES if r.phase is move.phase and r.guard(move, partition, seen)),
            None,
        )
        if rule is None:
            break
        move, partition, said = rule.act(move, partition, seen)
        fired.append(rule)
        notes.extend(said)
    if not move.finished:
        move = replace(move, message=_waiting(move, partition, seen))
    return move, partition, tuple(fired), notes


# --------------------------------------------------------------------------- whole unloads


def _validate(
    request: UnloadRequest,
    spec: TopicSpec | None,
    topic: TopicStatus | None,
    known: frozenset[int],
    liveness: Liveness,
) -> tuple[tuple[MoveProgress, ...] | None, str]:
    """The moves to make, or None and why not (a failure unless it starts with 'waiting')."""
    if request.cancelled:
        return None, "cancelled: the Unload was deleted before it started"
    if spec is None:
        return None, f"topic {request.topic} does not exist"
    if not spec.tiered:
        return None, (
            f"topic {request.topic} has tiered storage disabled: an unload needs every record"
            " in the object store"
        )
    if topic is None:
        return None, f"waiting for topic {request.topic} to be placed"
    count = len(topic.partitions)
    wrong = sorted(p for p in request.partitions if not 0 <= p < count)
    if wrong:
        return None, f"partitions {wrong} out of range: topic {request.topic} has {count}"
    target = request.target
    if target is not None and target not in known:
        if liveness.warming_up:
            return None, "waiting to hear from every known broker"
        return None, f"target broker {target} is unknown (known: {sorted(known)})"
    indexes = sorted(set(request.partitions)) if request.partitions else range(count)
    return tuple(MoveProgress(p) for p in indexes), ""


def _phase(moves: Sequence[MoveProgress]) -> UnloadPhase:
    if all(m.finished for m in moves):
        failed = any(m.phase is FAILED for m in moves)
        return UnloadPhase.FAILED if failed else UnloadPhase.COMPLETED
    if any(m.phase is not PENDING and m.phase is not FAILED for m in moves):
        return UnloadPhase.MOVING
    return UnloadPhase.PENDING


def _summary(progress: UnloadProgress) -> str:
    moves = progress.moves
    if progress.phase is UnloadPhase.COMPLETED:
        return f"{len(moves)} partition(s) moved"
    failed = [m for m in moves if m.phase is FAILED]
    if progress.phase is UnloadPhase.FAILED:
        first = failed[0]
        return f"{len(failed)} of {len(moves)} move(s) failed; partition {first.partition}: {first.message}"
    waiting = [m for m in moves if not m.finished and m.message]
    done = sum(1 for m in moves if m.phase is COMPLETED)
    head = f"{done} of {len(moves)} partition(s) moved"
    if waiting:
        head += f"; partition {waiting[0].partition}: {waiting[0].message}"
    return head


def step(
    topics: dict[str, TopicStatus],
    specs: Mapping[str, TopicSpec],
    requests: Sequence[UnloadRequest],
    progress: Mapping[str, UnloadProgress],
    liveness: Liveness,
    reports: Mapping[tuple[str, int], Mapping[int, PartitionReport]],
    known: frozenset[int],
    now_ms: int,
    settings: ControlSettings,
    members: Collection[int] | None = None,
    racks: placement.Racks = placement.NO_RACKS,
) -> tuple[dict[str, UnloadProgress], list[tuple[str, str, str]]]:
    """Advance every requested unload; updates ``topics`` in place (seal markers, reassignments).

    Returns the new progress by unload name (requests only: progress of a
    request no longer made is dropped) and events as (kind, subject, message).
    Passes over the requests repeat until nothing changes, so a move that
    finishes frees its partition for an earlier request's move in the same
    step, whatever the order (and the step stays idempotent).
    """
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"unloads {twice} requested twice")
    events: list[tuple[str, str, str]] = []
    current = {r.name: progress.get(r.name) or UnloadProgress(r.name) for r in requests}
    for _ in range(len(requests) + 1):
        before = (dict(current), dict(topics))
        _pass(
            requests,
            current,
            topics,
            specs,
            liveness,
            reports,
            known,
            now_ms,
            settings,
            events,
            None if members is None else frozenset(members),
            racks,
        )
        if (current, topics) == before:
            break
    for request in requests:
        old = progress.get(request.name) or UnloadProgress(request.name)
        new = current[request.name]
        subject = f"unload/{request.name}"
        if old.started_ms is None and new.started_ms is not None:
            events.append(("UnloadStarted", subject, f"moving partitions of {request.topic}"))
        if not old.finished and new.finished:
            kind = "UnloadCompleted" if new.phase is UnloadPhase.COMPLETED else "UnloadFailed"
            events.append((kind, subject, new.message))
    return current, events


def _pass(
    requests: Sequence[UnloadRequest],
    current: dict[str, UnloadProgress],
    topics: dict[str, TopicStatus],
    specs: Mapping[str, TopicSpec],
    liveness: Liveness,
    reports: Mapping[tuple[str, int], Mapping[int, PartitionReport]],
    known: frozenset[int],
    now_ms: int,
    settings: ControlSettings,
    events: list[tuple[str, str, str]],
    members: frozenset[int] | None,
    racks: placement.Racks,
) -> None:
    """One pass over the requests, in order; updates ``current`` and ``topics``."""
    claims: dict[tuple[str, int], str] = {}
    for request in requests:
        for m in current[request.name].moves:
            if m.in_flight:
                claims.setdefault((request.topic, m.partition), request.name)
    for request in requests:
        new, said = _step_unload(
            request,
            current[request.name],
            topics,
            specs,
            claims,
            liveness,
            reports,
            known,
            now_ms,
            settings,
            members,
            racks,
        )
        current[request.name] = new
        events.extend(said)


def _step_unload(
    request: UnloadRequest,
    before: UnloadProgress,
    topics: dict[str, TopicStatus],
    specs: Mapping[str, TopicSpec],
    claims: dict[tuple[str, int], str],
    liveness: Liveness,
    reports: Mapping[tuple[str, int], Mapping[int, PartitionReport]],
    known: frozenset[int],
    now_ms: int,
    settings: ControlSettings,
    members: frozenset[int] | None,
    racks: placement.Racks,
) -> tuple[UnloadProgress, list[tuple[str, str, str]]]:
    if before.finished:
        return before, []
    spec = specs.get(request.topic)
    topic = topics.get(request.topic)
    events: list[tuple[str, str, str]] = []
    moves = before.moves
    if not moves:
        made, why = _validate(request, spec, topic, known, liveness)
        if made is None:
            if why.startswith("waiting"):
                return replace(before, phase=UnloadPhase.PENDING, message=why), []
            return replace(before, phase=UnloadPhase.FAILED, completed_ms=now_ms, message=why), []
        moves = made
    if spec is None or topic is None:
        gone = f"topic {request.topic} was deleted"
        moves = tuple(m if m.finished else replace(m, phase=FAILED, message=gone) for m in moves)
        for m in moves:
            if (request.topic, m.partition) in claims and claims[
                (request.topic, m.partition)
            ] == request.name:
                del claims[(request.topic, m.partition)]
    else:
        partitions = list(topic.partitions)
        stepped: list[MoveProgress] = []
        for m in moves:
            key = (request.topic, m.partition)
            if m.finished:
                stepped.append(m)
                continue
            if m.partition >= len(partitions):  # shrunk away meanwhile
                stepped.append(replace(m, phase=FAILED, message="the partition no longer exists"))
                if claims.get(key) == request.name:
                    del claims[key]
                continue
            holder = claims.get(key)
            seen = Seen(
                request,
                topics,
                holder if holder != request.name else None,
                liveness,
                reports.get(key, {}),
                now_ms,
                settings,
                members,
                racks,
            )
            new_move, new_partition, _, notes = step_move(m, partitions[m.partition], seen)
            partitions[m.partition] = new_partition
            topic = replace(topic, partitions=tuple(partitions))
            topics[request.topic] = topic
            if new_move.in_flight:
                claims[key] = request.name
            elif holder == request.name:
                del claims[key]
            for kind, message in notes:
                events.append((kind, f"{request.topic}/{m.partition}", message))
            stepped.append(new_move)
        moves = tuple(stepped)
    phase = _phase(moves)
    started = before.started_ms
    if started is None and any(m.phase is not PENDING and m.phase is not FAILED for m in moves):
        started = now_ms
    completed = now_ms if phase in (UnloadPhase.COMPLETED, UnloadPhase.FAILED) else None
    after = UnloadProgress(request.name, phase, moves, started, completed, "")
    return replace(after, message=_summary(after)), events
