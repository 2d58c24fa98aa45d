"""One reconcile step of the control core: (status, specs, heartbeats, clock) -> decision (pure).

Theory of operation
-------------------
The controller polls every broker's heartbeat (default every second), keeps
the latest one per broker, and after each poll calls ``reconcile`` with the
persisted ``ClusterState``, the desired ``TopicSpec``s and the current time.
The step:

1. **liveness**: classifies every known broker live, dead or unheard
   (``liveness``) and computes the adoption floor from live brokers only;
2. **brokers**: records the advertised address of every live broker, so
   known brokers survive restarts and can be waited for;
3. **topics**: deletes the topics whose deletion was requested (``deletions``, and only
   those: a topic no spec asks for and no request names is *unclaimed*, kept as placed,
   its elections run, reported as ``TopicUnclaimed``), and keeps a record of each one
   deleted with its data until a broker has removed its objects (``tier_deletions``); places and creates new ones
   (every partition ONLINE under its first replica at epoch 1, partitioning
   version 1); runs every partition's election table (``election``), which
   also records the LRS its leader reports;
4. **unloads**: advances every requested Unload (``unloads``): sets seal
   markers, reassigns sealed partitions to their new replica sets, and
   returns the unloads' progress, which the controller persists with the
   Unloads (not in the cluster state, so progress alone bumps nothing);
5. **moves**: with ``members`` given (the brokers the cluster should have), moves
   replicas off brokers being removed and spreads topics onto new members, and
   advances every move in flight (``moves``), after the repartitions and before
   the cohort plans, so plans follow moved leaders;
6. **cohort plans**: replans every cohort that live brokers report members
   for or that has a plan (``cohort_plans``), after the unloads so plans
   follow moved owners;
7. **generation**: bumps the topology generation by one if and only if the
   result differs from the input in anything persisted. Heartbeats carry
   samples (offsets, watermarks, receive times) the status never stores, so
   a heartbeat that brings no news bumps nothing. Seal markers and
   reassignments are topic status, so they do bump it.

The step is deterministic and idempotent: the same inputs at the same time
give the same result, and feeding a result back with the same inputs
changes nothing. That, and the rules below, make a controller restart (load
the persisted state, start polling) a non-event.

While **warming up** (some known broker not heard from since the controller
started observing, for at most one liveness TTL) the step acts only on
positive evidence: promotions, LRS reports, registrations and deletions.
It does not depose silent leaders (they are not dead, merely unheard), create
topics (placement would skip the unheard brokers) or replan cohorts (their
members may be connected to the unheard brokers).

The partitioning version is a separate, per-topic counter: it is set to 1
when a topic is created and changed only by a repartition's cutover
(``repartitions``, which runs after the unloads and before the cohort plans,
so plans follow the new partition set), never by the generation bump. An
edit of a spec's partition count starts a repartition; a replication factor
that differs from the topic's is reported as a problem and left alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Final

from headrace.control import (
    cohort_plans,
    election,
    moves,
    placement,
    repartitions,
    tier_deletions,
    unloads,
)
from headrace.control.liveness import Liveness, adoption_floor, assess, placeable
from headrace.control.model import (
    ClusterState,
    CohortPlan,
    DeletedIncarnation,
    DeletionRequest,
    PartitionState,
    PartitionStatus,
    RepartitionProgress,
    RepartitionRequest,
    RestoreStage,
    TopicSpec,
    TopicStatus,
    UnloadProgress,
    UnloadRequest,
)
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import Heartbeat, PartitionReport
from headrace.protocol.endpoints import BrokerEndpoint

DEFAULT_SETTINGS: Final = ControlSettings()

#: why an unclaimed topic is kept (its Problem's message)
UNCLAIMED: Final = (
    "no spec of this cluster asks for it and no deletion of it was requested (its Topic"
    " names another cluster, or is gone without its finalizer): its data is kept and served"
    " as placed; apply a Topic of this name for this cluster to claim it again, and delete"
    " that Topic to delete the data"
)


@dataclass(frozen=True, slots=True)
class Event:
    """Something the step did, for logs and Kubernetes Events."""

    #: CamelCase: an election or unload rule name, or TopicCreated, TopicDeleted,
    #: PlanChanged, PartitionReassigned, UnloadStarted, UnloadCompleted, UnloadFailed, ...
    kind: str
    #: "broker/<id>", "<ns>/<topic>", "<ns>/<topic>/<partition>", "<ns>/<topic>:<cohort>"
    #: or "unload/<ns>/<name>"
    subject: str
    message: str


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a topic is not (entirely) as asked: its Ready condition's reason and message."""

    topic: str
    #: CamelCase: WaitingForBrokers, NotEnoughBrokers, Repartitioning, RepartitionWaiting,
    #: ReplicasChange, PartitionsOffline, BelowMinInSync, DuplicateSpec, PartitionsMoving,
    #: UnclaimedSeal, TopicUnclaimed, WaitingForRestore; and InvalidSpec, which the control
    #: loop adds for a Topic whose stored spec does not parse
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    #: the state to persist and to push to brokers (only if ``changed``)
    state: ClusterState
    #: True iff anything persisted changed; then ``state.generation`` is the commit
    #: generation (by default one higher)
    changed: bool
    liveness: Liveness
    #: lowest topology generation acked by clients of live brokers; None if none acked
    adoption_floor: int | None
    events: tuple[Event, ...]
    problems: tuple[Problem, ...]
    #: the progress of every requested unload, by name (persisted apart from ``state``)
    unloads: Mapping[str, UnloadProgress] = field(default_factory=dict)
    #: True iff ``unloads`` differs from the progress passed in (no generation bump by itself)
    unloads_changed: bool = False
    #: the progress of every Repartition, by name (persisted with them, like ``unloads``)
    repartitions: Mapping[str, RepartitionProgress] = field(default_factory=dict)
    repartitions_changed: bool = False
    #: how replica moves are going (scale up/down); derived, never persisted by itself
    reassignment: moves.Summary = field(default_factory=moves.Summary)
    #: "<ns>/<topic>:<cohort>" -> owner -> the partitions it serves that no member of
    #: that cohort is connected to (``cohort_plans.uncovered``); only cohorts with such
    #: partitions. Derived from the heartbeats, never persisted.
    uncovered: Mapping[str, Mapping[int, Sequence[int]]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepInputs:
    """Everything one step reads: the persisted state, what is asked for, what the brokers
    say, and the time. ``SteadySteps`` compares two of them to skip a step that would change
    nothing.

    ``heartbeats`` holds the latest heartbeat per broker id, stale ones included (liveness
    decides what they are worth). ``observing_since_ms``: when this controller started polling
    brokers. ``unload_requests`` are the Unloads, oldest first; ``unload_progress`` their
    persisted progress by name (see ``unloads``); the same for Repartitions. ``members``: the
    brokers the cluster should have; when given, replicas move off the others and are spread
    over new members (``moves``). ``commit_generation``: the generation a changed state is
    committed and pushed at (default one above ``state.generation``; a controller whose last
    commit failed must go higher). ``deletions``: the topics whose deletion was asked for
    explicitly; a topic leaves the state (and its brokers' copies go, or move aside) only when
    named there and asked for by no spec. Absence from ``specs`` alone deletes nothing (see the
    module). ``racks``: where the brokers run (``placement.Racks``); new replica sets span them.
    """

    state: ClusterState
    specs: Sequence[TopicSpec]
    heartbeats: Mapping[int, Heartbeat]
    now_ms: int
    settings: ControlSettings = DEFAULT_SETTINGS
    _: KW_ONLY
    observing_since_ms: int
    unload_requests: Sequence[UnloadRequest] = ()
    unload_progress: Mapping[str, UnloadProgress] | None = None
    repartition_requests: Sequence[RepartitionRequest] = ()
    repartition_progress: Mapping[str, RepartitionProgress] | None = None
    members: Collection[int] | None = None
    commit_generation: int | None = None
    deletions: Collection[DeletionRequest] = ()
    racks: placement.Racks = field(default_factory=lambda: placement.NO_RACKS)


def reconcile(inputs: StepInputs) -> Decision:
    """One step over ``inputs`` (``StepInputs`` says what each one means)."""
    state, specs, heartbeats, now_ms, settings = (
        inputs.state,
        inputs.specs,
        inputs.heartbeats,
        inputs.now_ms,
        inputs.settings,
    )
    observing_since_ms = inputs.observing_since_ms
    unload_requests, unload_progress = inputs.unload_requests, inputs.unload_progress
    repartition_requests = inputs.repartition_requests
    repartition_progress = inputs.repartition_progress
    members, commit_generation = inputs.members, inputs.commit_generation
    deletions, racks = inputs.deletions, inputs.racks
    if commit_generation is None:
        commit_generation = state.generation + 1
    if commit_generation <= state.generation:
        raise ValueError(f"commit generation {commit_generation} is not above {state.generation}")
    for broker_id, hb in heartbeats.items():
        if hb.broker_id != broker_id:
            raise ValueError(f"heartbeat of broker {hb.broker_id} filed under {broker_id}")
    known = set(state.brokers) | {
        b for t in state.topics.values() for p in t.partitions for b in p.replicas
    }
    liveness = assess(known, heartbeats, now_ms, settings.liveness_ttl_ms, observing_since_ms)
    events: list[Event] = []
    problems: list[Problem] = []
    live_heartbeats = [heartbeats[b] for b in sorted(liveness.live)]

    brokers = _register(state.brokers, live_heartbeats, events)
    reports, connections = _index(live_heartbeats)
    #: the generation each live broker applied (moves and the LRS a leader reports: F1)
    applied = {b: heartbeats[b].generation for b in liveness.live}

    wanted: dict[str, TopicSpec] = {}
    for spec in specs:
        if spec.name in wanted:
            problems.append(Problem(spec.name, "DuplicateSpec", "more than one spec names it"))
        else:
            wanted[spec.name] = spec

    # The one place a topic leaves the state: its deletion was requested, no spec asks for
    # it. A topic that is only missing from the specs keeps its data where it is.
    deleted = {d.topic for d in deletions}
    retained = {d.topic for d in deletions if d.retain}
    topics: dict[str, TopicStatus] = {}
    unclaimed: list[str] = []
    remains: list[DeletedIncarnation] = []
    for name in sorted(state.topics):
        if name in wanted:
            topics[name] = state.topics[name]
        elif name in deleted:
            events.append(Event("TopicDeleted", name, "its deletion was requested"))
            gone = tier_deletions.record(state.topics[name], commit_generation)
            if gone is not None and name not in retained:
                remains.append(gone)
        else:
            unclaimed.append(name)
            topics[name] = state.topics[name]
    # its objects in the store, until a broker reports them removed
    removing, notes = tier_deletions.step(state.deleted, remains, liveness, heartbeats)
    events.extend(Event(kind, subject, message) for kind, subject, message in notes)

    for name in sorted(wanted):
        spec = wanted[name]
        topic = topics.get(name)
        if topic is None:
            created = _create(spec, topics, liveness, problems, members, racks)
            if created is not None:
                topics[name] = created
                events.append(Event("TopicCreated", name, _describe_placement(created)))
            continue
        topic = _elect(topic, liveness, reports, now_ms, settings, events, applied)
        problems.extend(_check(spec, topic))
        topics[name] = topic
    for name in unclaimed:
        # served as placed (leaders still fail over), never deleted for being unasked
        topics[name] = _elect(topics[name], liveness, reports, now_ms, settings, events, applied)
        problems.append(Problem(name, "TopicUnclaimed", UNCLAIMED))

    before_unloads = dict(unload_progress or {})
    progress, unload_events = unloads.step(
        topics,
        wanted,
        unload_requests,
        before_unloads,
        liveness,
        reports,
        frozenset(known | set(brokers)),
        now_ms,
        settings,
        members=members,
        racks=racks,
    )
    events.extend(Event(kind, subject, message) for kind, subject, message in unload_events)
    problems.extend(_check_seals(topics, progress, unload_requests))

    floor = adoption_floor(heartbeats, liveness.live)
    before_repartitions = dict(repartition_progress or {})
    moved = repartitions.step(
        topics,
        wanted,
        repartition_requests,
        before_repartitions,
        generation=state.generation,
        liveness=liveness,
        reports=reports,
        adoption_floor=floor,
        unloading=_unloading(topics, unload_requests, progress),
        now_ms=now_ms,
        settings=settings,
        members=members,
        racks=racks,
    )
    topics = moved.topics
    events.extend(Event(kind, subject, message) for kind, subject, message in moved.events)
    problems.extend(Problem(t, *moved.problems[t]) for t in sorted(moved.problems))

    busy = set(_unloading(topics, unload_requests, progress))
    busy |= {name for name, t in topics.items() if t.transition is not None}
    reassigned = moves.step(
        topics,
        members=members,
        liveness=liveness,
        reports=reports,
        busy=busy,
        now_ms=now_ms,
        settings=settings,
        pushed_at=commit_generation,
        applied=applied,
        racks=racks,
    )
    topics = reassigned.topics
    events.extend(Event(kind, subject, message) for kind, subject, message in reassigned.events)

    uncovered: dict[str, dict[int, list[int]]] = {}
    if not liveness.warming_up:
        for name in sorted(topics):
            topics[name] = _replan(topics[name], connections, events)
            owners = [p.owner for p in topics[name].partitions]
            for (of_topic, cohort), connected in sorted(connections.items()):
                if of_topic == name and (missing := cohort_plans.uncovered(owners, connected)):
                    uncovered[f"{name}:{cohort}"] = missing

    result = ClusterState(state.generation, brokers, topics, removing)
    changed = not result.same_content(state)
    if changed:
        result = replace(result, generation=commit_generation)
    return Decision(
        result,
        changed,
        liveness,
        floor,
        tuple(events),
        tuple(problems),
        progress,
        any(before_unloads.get(name) != p for name, p in progress.items()),
        moved.progress,
        any(before_repartitions.get(name) != p for name, p in moved.progress.items()),
        reassigned.summary,
        uncovered,
    )


def _unloading(
    topics: Mapping[str, TopicStatus],
    requests: Sequence[UnloadRequest],
    progress: Mapping[str, UnloadProgress],
) -> dict[str, str]:
    """Topic -> the Unload (or seal) that makes it busy: no repartition starts on it."""
    busy: dict[str, str] = {}
    for r in requests:
        p = progress.get(r.name)
        if p is None or not p.finished:
            busy.setdefault(r.topic, f"Unload {r.name}")
    for name, topic in topics.items():
        if any(p.seal for p in topic.partitions):
            busy.setdefault(name, "a sealed partition")
    return busy


def grow_topic(
    topic: TopicStatus,
    partitions: int,
    brokers: Iterable[int],
    *,
    others: Iterable[Sequence[int]] = (),
) -> TopicStatus:
    """Add partitions and bump the version (no marker: ``repartitions`` writes one).

    ``brokers`` are the eligible brokers (live, not draining); raises
    ``NotEnoughBrokers`` when too few.
    """
    if partitions <= len(topic.partitions):
        raise ValueError(f"topic {topic.name!r} already has {len(topic.partitions)} partitions")
    grown = repartitions.add_partitions(topic, partitions, brokers, others)
    return replace(grown, partitioning_version=topic.partitioning_version + 1)


# --------------------------------------------------------------------------- the step's parts


def _register(
    known: Mapping[int, BrokerEndpoint], live: Sequence[Heartbeat], events: list[Event]
) -> dict[int, BrokerEndpoint]:
    brokers = dict(known)
    for hb in live:
        before = brokers.get(hb.broker_id)
        if before != hb.broker:
            brokers[hb.broker_id] = hb.broker
            kind = "BrokerRegistered" if before is None else "BrokerAddressChanged"
            where = f"{hb.broker.host}:{hb.broker.port} (admin {hb.broker.admin_port})"
            events.append(Event(kind, f"broker/{hb.broker_id}", where))
    return dict(sorted(brokers.items()))


_Reports = dict[tuple[str, int], dict[int, PartitionReport]]
_Connections = dict[tuple[str, str], dict[str, frozenset[int]]]


def _index(live: Sequence[Heartbeat]) -> tuple[_Reports, _Connections]:
    reports: _Reports = defaultdict(dict)
    members: dict[tuple[str, str], dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for hb in live:
        for report in hb.partitions:
            reports[(report.topic, report.partition)][hb.broker_id] = report
        for cohort in hb.cohorts:
            for member in cohort.members:
                members[(cohort.topic, cohort.cohort)][member].add(hb.broker_id)
    connections: _Connections = {
        key: {m: frozenset(bs) for m, bs in by_member.items()} for key, by_member in members.items()
    }
    return reports, connections


def _create(
    spec: TopicSpec,
    topics: Mapping[str, TopicStatus],
    liveness: Liveness,
    problems: list[Problem],
    members: Collection[int] | None,
    racks: placement.Racks,
) -> TopicStatus | None:
    if liveness.warming_up:
        problems.append(
            Problem(spec.name, "WaitingForBrokers", "waiting to hear from every known broker")
        )
        return None
    if spec.restore is RestoreStage.PENDING:
        problems.append(
            Problem(spec.name, "WaitingForRestore", "its restore from a snapshot is being written")
        )
        return None
    others = [p.replicas for t in topics.values() for p in t.partitions]
    try:
        # a broker being removed gets no new topic
        eligible = placeable(liveness, members)
        lists = placement.place(
            spec.partitions, spec.replicas, eligible, others=others, racks=racks
        )
    except placement.NotEnoughBrokers as exc:
        problems.append(Problem(spec.name, "NotEnoughBrokers", exc.message))
        return None
    partitions = tuple(election.first_status(i, r) for i, r in enumerate(lists))
    if spec.restore is RestoreStage.WRITTEN:
        # incarnation 1, start unknown here: each replica opens the partition empty at the
        # restore's sealed state (its cut + 1, its cursors) and reads below from the store
        partitions = tuple(replace(p, moves=1, start_offset=None) for p in partitions)
    return TopicStatus(
        spec.name,
        1,
        partitions,
        {},
        spec_partitions=spec.partitions,
        creation_id=spec.creation_id,
    )


def _elect(
    topic: TopicStatus,
    liveness: Liveness,
    reports: _Reports,
    now_ms: int,
    settings: ControlSettings,
    events: list[Event],
    applied: Mapping[int, int],
) -> TopicStatus:
    marker = topic.transition
    # only the leader that moved a repartition's fence knows the partition's cutover offset
    unmeasured = (
        set() if marker is None else set(range(marker.measured)) - set(marker.cutover_offsets)
    )
    partitions: list[PartitionStatus] = []
    for before in topic.partitions:
        seen = reports.get((topic.name, before.partition), {})
        after, rules = election.step(
            before,
            liveness,
            seen,
            now_ms,
            settings,
            applied,
            cutover_pending=before.partition in unmeasured,
        )
        if rules:
            subject = f"{topic.name}/{before.partition}"
            chain = "".join(f"{r.name}, then " for r in rules[:-1])
            message = chain + _describe_election(before, after)
            events.append(Event(rules[-1].name, subject, message))
        partitions.append(after)
    return replace(topic, partitions=tuple(partitions))


def _replan(topic: TopicStatus, connections: _Connections, events: list[Event]) -> TopicStatus:
    names = set(topic.cohort_plans) | {c for (t, c) in connections if t == topic.name}
    owners = [p.owner for p in topic.partitions]
    plans: dict[str, CohortPlan] = {}
    for cohort in sorted(names):
        previous = topic.cohort_plans.get(cohort)
        new = cohort_plans.plan(cohort, owners, connections.get((topic.name, cohort), {}), previous)
        if new is None:
            continue
        if new is not previous:
            held = ", ".join(f"{m} {len(ps)}" for m, ps in new.assignment.items()) or "no members"
            message = f"generation {new.generation}: {held}"
            events.append(Event("PlanChanged", f"{topic.name}:{cohort}", message))
        plans[cohort] = new
    return replace(topic, cohort_plans=plans)


def _check(spec: TopicSpec, topic: TopicStatus) -> list[Problem]:
    # A partition count that differs from the spec is not a problem here: an edit of it is
    # a repartition (``repartitions``), and after a Repartition the spec may lag the count.
    problems: list[Problem] = []
    if topic.partitions and spec.replicas != topic.partitions[0].replication_factor:
        problems.append(
            Problem(
                spec.name,
                "ReplicasChange",
                f"spec asks for {spec.replicas} replicas, the topic has"
                f" {topic.partitions[0].replication_factor}: changing it is not supported",
            )
        )
    offline = [p.partition for p in topic.partitions if p.state is PartitionState.OFFLINE]
    if offline:
        problems.append(
            Problem(spec.name, "PartitionsOffline", f"no eligible leader for partitions {offline}")
        )
    thin = [
        p.partition
        for p in topic.partitions
        if p.state is PartitionState.ONLINE and len(p.live_replicas) < spec.min_in_sync
    ]
    if thin:
        problems.append(
            Problem(
                spec.name,
                "BelowMinInSync",
                f"fewer than {spec.min_in_sync} live replicas for partitions {thin}",
            )
        )
    return problems


def _check_seals(
    topics: Mapping[str, TopicStatus],
    progress: Mapping[str, UnloadProgress],
    requests: Sequence[UnloadRequest],
) -> list[Problem]:
    """Sealed partitions are unavailable: say so, and shout if no unload will finish them."""
    claimed = {
        (r.topic, m.partition)
        for r in requests
        if r.name in progress
        for m in progress[r.name].moves
        if m.in_flight
    }
    problems: list[Problem] = []
    for name in sorted(topics):
        sealed = [p.partition for p in topics[name].partitions if p.seal]
        unclaimed = [p for p in sealed if (name, p) not in claimed]
        if unclaimed:
            problems.append(
                Problem(
                    name,
                    "UnclaimedSeal",
                    f"partitions {unclaimed} are sealed but no Unload is moving them: they stay"
                    " unavailable until an Unload of them is applied",
                )
            )
        elif sealed:
            problems.append(
                Problem(name, "PartitionsMoving", f"partitions {sealed} are being unloaded")
            )
    return problems


def _describe_placement(topic: TopicStatus) -> str:
    return "placed " + ", ".join(f"{p.partition}:{list(p.replicas)}" for p in topic.partitions)


def _describe_election(before: PartitionStatus, after: PartitionStatus) -> str:
    if after.state is PartitionState.ONLINE and before.state is PartitionState.ONLINE:
        return f"live replicas {list(before.live_replicas)} -> {list(after.live_replicas)}"
    if after.state is PartitionState.ONLINE:
        return f"broker {after.leader} leads at epoch {after.leader_epoch}"
    if after.state is PartitionState.ELECTING:
        return f"nominated broker {after.candidate} for epoch {after.leader_epoch}"
    return f"no eligible replica among live replicas {list(after.live_replicas)}: Offline"
