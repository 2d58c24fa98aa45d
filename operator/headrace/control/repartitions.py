"""Live repartitions: grow and shrink a topic's partition count (pure state machine).

Theory of operation
-------------------
Fibril's model. Keys are routed by ``crc32(key) % N`` under the topic's
*partitioning version*; a repartition changes ``N`` while producers and
cohorts keep running:

1. **cutover**: one commit writes the transition marker into the topic's
   status (``Transition``), bumps the partitioning version and, for a grow,
   adds the new partitions. Brokers fence on the version: a publish routed
   under the old one is answered ``Redirect`` and never stored. Each old
   partition's leader records its log end offset when it applies the new
   version, its **cutover offset**: records below it were routed under the old
   version, records from it on under the new one. Its followers copy the offset
   with the records, so a leader elected after it reports the same one. A shrink
   keeps every
   partition; only the routing count drops.
2. **stamp**: the next step stamps ``adoptionGeneration``, the topology
   generation the cutover committed at. Not at marker creation (that
   generation does not exist yet) and not later (brokers push clients only
   when their routing content changes, so clients ack the cutover's
   generation and never a later, unrelated one).
3. **drain**: per cohort, new partition ``q`` is *released* once the cohort's
   cursor on every old partition that feeds ``q`` (``Transition.feeders``)
   has passed that partition's cutover offset. Until then the brokers hold
   ``q``'s post-cutover records back from that cohort. This is what keeps
   invariant 6: every pre-cutover record of key K sits below the cutover
   offset of K's old partition, and every post-cutover record of K in ``q``,
   so a cohort gets K's new records only after it acked all its old ones.
   The topic is **drained** when every tracked cohort (one with a plan that
   has members, or already released somewhere) is released everywhere.
4. **finalize** when ``drained and (adopted or adoption timed out)``:
   ``adopted`` is the fleet's adoption floor (live brokers only) at or above
   ``adoptionGeneration``; the timeout runs from drain-complete. A shrink
   retires the partitions beyond the new count here, and only here, for
   routing, not for reading: they stay placed, led and readable
   (``TopicStatus.active_partitions``), and a later grow continues their logs.
   The marker is cleared, and with it every hold.
5. **history**: the finalized transition joins the topic's partitioning history
   (``PartitioningHistory``), kept while a record below one of its cutover
   offsets is readable. A cohort that was not there (created later, or idle
   during it) is held by each kept transition from its position on as a live
   one holds it, and released transition by transition (``advance_history``).
   A grow also measures the retired partitions it routes to again: one held
   from 0 instead of its own log end would deadlock a cohort created after the
   shrink that retired it (see ``docs/repartition.md``).

The table, per topic; a step fires at most one start and advances a marker
once (a marker started in this step is advanced from the next)::

    marker state           guard                                        effect
    ---------------------  -------------------------------------------  -------------------------
    none                   oldest Repartition of the topic unfinished,   marker, version + 1, grow
                           valid, not warming up, no unload              adds partitions (CuttingOver)
    none                   spec.partitions edited (differs from the      the same, request
                           last one acted on) and not the count now      ``Topic.spec.partitions``
    adoptionGeneration ∅   -                                            stamp := input generation
                                                                        (Draining)
    cutover offset ∅       the leader at the current epoch reports one   record it (old partitions
                           for ``toVersion``                             and retired ones routed to
                                                                        again)
    cohort not released    its cursors on q's feeders >= their cutover   release q for it
                           offsets
    drainedMs ∅            every cutover offset known, every tracked     drainedMs := now
                           cohort released on every new partition        (AwaitingAdoption)
    drained                floor >= adoptionGeneration, or now >=        retire, clear, add to the
                           drainedMs + adoption timeout                  history (Finalized)

Bad requests fail with a message and change nothing: a missing topic, the
count it already has, a topic with an Unload in flight. A second request for
a topic waits (Pending, saying for what) until the first finalizes. A
Repartition deleted before its cutover fails; one deleted after rolls forward
to Finalized (the marker carries all it needs), so nothing is left half done.

Cohorts idle at the time (no members) are not waited for; one that comes
back before finalize is held like the others, one that comes back after is
held by the history, as a cohort created after finalize.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from headrace.control import election, placement
from headrace.control.liveness import Liveness, placeable
from headrace.control.model import (
    SPEC_EDIT,
    FinalizedBy,
    RepartitionPhase,
    RepartitionProgress,
    RepartitionRequest,
    TopicSpec,
    TopicStatus,
    Transition,
)
from headrace.control.settings import ControlSettings
from headrace.protocol.coordination import (
    CohortPosition,
    PartitioningHistory,
    PartitionReport,
    PastTransition,
)

#: (kind, subject, message), as the reconcile step's events
EventTuple = tuple[str, str, str]

Reports = Mapping[tuple[str, int], Mapping[int, PartitionReport]]


@dataclass(frozen=True, slots=True)
class Outcome:
    topics: dict[str, TopicStatus]
    progress: dict[str, RepartitionProgress]
    events: list[EventTuple]
    #: topic -> (reason, message) for a topic whose transition is in flight or waits
    problems: dict[str, tuple[str, str]]


def step(
    topics: Mapping[str, TopicStatus],
    wanted: Mapping[str, TopicSpec],
    requests: Sequence[RepartitionRequest],
    progress: Mapping[str, RepartitionProgress],
    *,
    generation: int,
    liveness: Liveness,
    reports: Reports,
    adoption_floor: int | None,
    unloading: Mapping[str, str],
    now_ms: int,
    settings: ControlSettings,
    members: Collection[int] | None = None,
    racks: placement.Racks = placement.NO_RACKS,
) -> Outcome:
    """One step over every topic. ``generation``: the committed topology generation of the
    input state; ``unloading``: topic -> why an Unload makes it busy."""
    out_topics = dict(topics)
    out: dict[str, RepartitionProgress] = {}
    events: list[EventTuple] = []
    problems: dict[str, tuple[str, str]] = {}
    started_by: dict[str, str] = {}  # topic -> request whose marker it carries

    # 1. markers in flight
    finalized: dict[str, tuple[Transition, FinalizedBy]] = {}
    for name in sorted(out_topics):
        topic = out_topics[name]
        if topic.transition is None:
            continue
        # While warming up, unheard brokers' clients are not in the floor: no evidence.
        floor = None if liveness.warming_up else adoption_floor
        after, last, by = _advance(topic, topic.transition, generation, reports, floor, now_ms)
        if by is not None:
            finalized[name] = (last, by)
            events.append(
                (
                    "RepartitionFinalized",
                    name,
                    f"{last.from_partitions} -> {last.to_partitions} partitions ({by.value})",
                )
            )
        else:
            assert after.transition is not None
            started_by[name] = after.transition.request
            problems[name] = ("Repartitioning", _describe(after.transition))
            if after.transition.drained_ms is not None and topic.transition.drained_ms is None:
                events.append(("RepartitionDrained", name, "pre-cutover backlog delivered"))
        out_topics[name] = after

    # 2. the history every finished transition leaves, while its records are readable
    for name in sorted(out_topics):
        out_topics[name] = advance_history(out_topics[name], reports)

    # 3. requests, oldest first
    for request in requests:
        before = progress.get(request.name, RepartitionProgress(request.name))
        target = out_topics.get(request.topic)
        marker = target.transition if target is not None else None
        if marker is not None and marker.request == request.name:
            out[request.name] = _in_flight(before, marker)
            continue
        if request.topic in finalized and finalized[request.topic][0].request == request.name:
            done, by = finalized[request.topic]
            out[request.name] = _finalized(before, done, by, now_ms)
            continue
        if before.finished:
            out[request.name] = before
            continue
        if before.in_flight:
            # Its marker is gone but its finalize was not recorded (a restart in between).
            out[request.name] = replace(
                before,
                phase=RepartitionPhase.FINALIZED,
                finalized_ms=before.finalized_ms or now_ms,
                message="finalized (the record of it was restored after a restart)",
            )
            continue
        failure = _invalid(request, target, wanted, unloading)
        if failure is not None:
            out[request.name] = replace(before, phase=RepartitionPhase.FAILED, message=failure)
            events.append(("RepartitionFailed", f"repartition/{request.name}", failure))
            continue
        if target is None:
            out[request.name] = replace(before, message=f"waiting for {request.topic} to be placed")
            continue
        busy = started_by.get(request.topic)
        if busy is not None or request.topic in finalized:
            waiting = f"waiting: {busy or 'a transition'} is repartitioning {request.topic}"
            out[request.name] = replace(before, message=waiting)
            continue
        started = _start(
            target,
            request.partitions,
            request.name,
            request.adoption_timeout_ms,
            out_topics,
            placeable(liveness, members),
            liveness,
            now_ms,
            racks,
        )
        if isinstance(started, str):
            out[request.name] = replace(before, message=started)
            started_by[request.topic] = request.name  # later requests wait behind it
            continue
        out_topics[request.topic] = started
        started_by[request.topic] = request.name
        assert started.transition is not None
        out[request.name] = _in_flight(before, started.transition)
        events.append(("RepartitionStarted", request.topic, _describe(started.transition)))
        problems[request.topic] = ("Repartitioning", _describe(started.transition))

    # 4. spec edits
    for name in sorted(wanted):
        current = out_topics.get(name)
        if current is None:
            continue
        topic = current
        desired = wanted[name].partitions
        seen = (
            topic.spec_partitions if topic.spec_partitions is not None else topic.routing_partitions
        )
        if desired == seen:
            if topic.spec_partitions is None:
                out_topics[name] = replace(topic, spec_partitions=desired)
            continue
        if name in started_by or name in finalized:
            problems.setdefault(
                name,
                (
                    "RepartitionWaiting",
                    f"spec asks for {desired} partitions: waiting for the transition in flight",
                ),
            )
            continue
        if name in unloading:
            problems[name] = (
                "RepartitionWaiting",
                f"spec asks for {desired} partitions: waiting for {unloading[name]}",
            )
            continue
        if desired == topic.routing_partitions:
            out_topics[name] = replace(topic, spec_partitions=desired)
            continue
        started = _start(
            topic,
            desired,
            SPEC_EDIT,
            settings.repartition_adoption_timeout_ms,
            out_topics,
            placeable(liveness, members),
            liveness,
            now_ms,
            racks,
        )
        if isinstance(started, str):
            problems[name] = ("RepartitionWaiting", started)
            continue
        out_topics[name] = replace(started, spec_partitions=desired)
        assert started.transition is not None
        events.append(("RepartitionStarted", name, _describe(started.transition)))
        problems[name] = ("Repartitioning", _describe(started.transition))
    return Outcome(out_topics, out, events, problems)


# --------------------------------------------------------------------------- the parts


def _invalid(
    request: RepartitionRequest,
    topic: TopicStatus | None,
    wanted: Mapping[str, TopicSpec],
    unloading: Mapping[str, str],
) -> str | None:
    if request.cancelled:
        return "deleted before its cutover: nothing was changed"
    if request.partitions < 1:
        return f"partitions must be at least 1, not {request.partitions}"
    if request.topic not in wanted:
        return f"topic {request.topic} does not exist"
    if topic is None:
        return None  # asked for, not placed yet: the request waits
    if request.partitions == topic.routing_partitions and topic.transition is None:
        return f"topic {request.topic} already has {request.partitions} partitions"
    if request.topic in unloading:
        return (
            f"topic {request.topic} is mid-Unload ({unloading[request.topic]}): apply the"
            " Repartition again once the Unload has finished"
        )
    return None


def _start(
    topic: TopicStatus,
    partitions: int,
    request: str,
    timeout_ms: int,
    topics: Mapping[str, TopicStatus],
    eligible: frozenset[int],
    liveness: Liveness,
    now_ms: int,
    racks: placement.Racks,
) -> TopicStatus | str:
    """The topic with its marker written and its version bumped; or why it must wait.
    ``eligible``: the brokers a grow may place new partitions on (``liveness.placeable``)."""
    if liveness.warming_up:
        return "waiting to hear from every known broker"
    have = topic.routing_partitions
    grown = topic
    # A grow routes to retired partitions again (their logs continue) and places only
    # the partitions that never existed.
    if partitions > len(topic.partitions):
        others = [p.replicas for n, t in topics.items() if n != topic.name for p in t.partitions]
        try:
            grown = add_partitions(topic, partitions, eligible, others, racks)
        except placement.NotEnoughBrokers as exc:
            return f"waiting for brokers: {exc.message}"
    marker = Transition(
        request,
        have,
        partitions,
        topic.partitioning_version,
        topic.partitioning_version + 1,
        now_ms,
        timeout_ms,
        existing_partitions=len(topic.partitions),
    )
    return replace(grown, partitioning_version=marker.to_version, transition=marker)


def add_partitions(
    topic: TopicStatus,
    partitions: int,
    brokers: Iterable[int],
    others: Iterable[Sequence[int]],
    racks: placement.Racks = placement.NO_RACKS,
) -> TopicStatus:
    """The topic with partitions ``len..partitions-1`` placed (existing ones stay, retired
    ones included)."""
    replicas = topic.partitions[0].replication_factor if topic.partitions else 1
    lists = placement.place(
        partitions,
        replicas,
        brokers,
        existing=[p.replicas for p in topic.partitions],
        others=others,
        racks=racks,
    )
    added = tuple(
        election.first_status(i, lists[i]) for i in range(len(topic.partitions), partitions)
    )
    return replace(topic, partitions=(*topic.partitions, *added))


def _advance(
    topic: TopicStatus,
    marker: Transition,
    generation: int,
    reports: Reports,
    floor: int | None,
    now_ms: int,
) -> tuple[TopicStatus, Transition, FinalizedBy | None]:
    """The topic after one step of its marker, the marker as it stood at the end of the
    step (also when this step cleared it), and why it finalized (None: not yet)."""
    if marker.adoption_generation is None:
        # Eager: the input is the state the cutover committed in (see the docstring).
        marker = replace(marker, adoption_generation=generation)
    leaders = _leader_reports(topic, reports, marker.measured)
    offsets = dict(marker.cutover_offsets)
    for index, report in leaders.items():
        if index not in offsets and report.cutover is not None:
            version, offset = report.cutover
            if version == marker.to_version:
                offsets[index] = offset
    tracked = {c for c, plan in topic.cohort_plans.items() if plan.assignment} | set(
        marker.released
    )
    released = {c: set(qs) for c, qs in marker.released.items()}
    for cohort in sorted(tracked):
        done = released.setdefault(cohort, set())
        for q in range(marker.to_partitions):
            if q in done:
                continue
            if all(_drained(p, cohort, offsets, leaders) for p in marker.feeders(q)):
                done.add(q)
    marker = replace(
        marker,
        cutover_offsets=offsets,
        released={c: tuple(sorted(qs)) for c, qs in sorted(released.items())},
    )
    everything = set(range(marker.to_partitions))
    if (
        marker.drained_ms is None
        and all(p in offsets for p in range(marker.measured))
        and all(set(qs) == everything for qs in marker.released.values())
    ):
        marker = replace(marker, drained_ms=now_ms)
    if marker.drained_ms is not None:
        assert marker.adoption_generation is not None
        if floor is not None and floor >= marker.adoption_generation:
            return _retire(topic, marker), marker, FinalizedBy.ADOPTED
        if now_ms - marker.drained_ms >= marker.adoption_timeout_ms:
            return _retire(topic, marker), marker, FinalizedBy.ADOPTION_TIMED_OUT
    return replace(topic, transition=marker), marker, None


def _leader_reports(
    topic: TopicStatus, reports: Reports, below: int | None = None
) -> dict[int, PartitionReport]:
    """The report of each partition's leader at its current epoch (of ``0..below-1``)."""
    leaders: dict[int, PartitionReport] = {}
    for p in topic.partitions[:below]:
        if p.leader is None:
            continue
        report = reports.get((topic.name, p.partition), {}).get(p.leader)
        if report is not None and report.role == "leader" and report.leader_epoch == p.leader_epoch:
            leaders[p.partition] = report
    return leaders


def _drained(
    partition: int, cohort: str, offsets: Mapping[int, int], leaders: Mapping[int, PartitionReport]
) -> bool:
    """The cohort's cursor on old ``partition`` has passed its cutover offset."""
    cut = offsets.get(partition)
    if cut is None:
        return False
    if cut == 0:
        return True
    report = leaders.get(partition)
    cursor = report.cursors.get(cohort) if report is not None else None
    return cursor is not None and cursor >= cut


def _retire(topic: TopicStatus, marker: Transition) -> TopicStatus:
    """Finalize: clear the marker; the partitions beyond the new count stay, *retired*.

    Retired is for routing, not for reading: they take no produce but stay placed, led
    and readable by every cohort, replay and tiered read, so no acknowledged record goes
    before retention removes it; a grow that routes to one again continues its log, so
    no offset is used twice (see ``docs/repartition.md``)."""
    count = len(topic.partitions)
    active = marker.to_partitions if marker.to_partitions < count else None
    return replace(
        topic, active_partitions=active, transition=None, history=_remember(topic, marker)
    )


# --------------------------------------------------------------------------- the history


def _remember(topic: TopicStatus, marker: Transition) -> PartitioningHistory | None:
    """The topic's history with ``marker``, finalizing, added.

    Every cohort the marker tracked is released everywhere under it; one that had passed
    every older kept transition is past the new one too. Any other cohort (idle during
    the transition, or still held by an older one) is held by it from now on."""
    before = topic.history or PartitioningHistory(())
    cohorts = dict(before.cohorts)
    for cohort in marker.released:
        if before.position(cohort).version >= before.past:
            cohorts[cohort] = CohortPosition(marker.to_version + 1)
    return _compact(PartitioningHistory((*before.transitions, marker.past()), cohorts))


def advance_history(topic: TopicStatus, reports: Reports) -> TopicStatus:
    """One step of the topic's partitioning history: forget the transitions none of whose
    pre-cutover records is readable any more, and release each cohort, transition by
    transition, as ``_advance`` releases it from a live one: new partition ``q`` once the
    cohort's cursors on every feeder of ``q`` reached their cutover offsets."""
    history = topic.history
    if history is None:
        return topic
    leaders = _leader_reports(topic, reports)
    kept = tuple(t for t in history.transitions if _readable(t, leaders))
    history = replace(history, transitions=kept)
    named = set(history.cohorts) | {c for c, plan in topic.cohort_plans.items() if plan.assignment}
    named |= {c for report in leaders.values() for c in report.cursors}
    cohorts: dict[str, CohortPosition] = {}
    for cohort in sorted(named):
        at = _aligned(history, history.position(cohort))
        for t in history.transitions:
            if t.to_version < at.version:
                continue
            done = set(at.released)
            for q in range(t.to_partitions):
                if q not in done and all(_passed(t, p, cohort, leaders) for p in t.feeders(q)):
                    done.add(q)
            if len(done) < t.to_partitions:
                at = CohortPosition(t.to_version, tuple(sorted(done)))
                break
            at = CohortPosition(t.to_version + 1)
        cohorts[cohort] = at
    return replace(topic, history=_compact(replace(history, cohorts=cohorts)))


def _passed(
    t: PastTransition, partition: int, cohort: str, leaders: Mapping[int, PartitionReport]
) -> bool:
    """The cohort has nothing left to read of ``partition``'s records from before ``t``:
    its cursor reached the cutover offset, or retention removed every such record."""
    cut = t.cutover_offsets.get(partition, 0)
    if cut == 0:
        return True
    report = leaders.get(partition)
    if report is None:
        return False
    cursor = report.cursors.get(cohort)
    return report.readable_from >= cut or (cursor is not None and cursor >= cut)


def _readable(t: PastTransition, leaders: Mapping[int, PartitionReport]) -> bool:
    """A pre-cutover record of ``t`` may still be readable (its leader's report says
    where reading starts; a partition with no report counts as readable)."""
    return any(
        p not in leaders or leaders[p].readable_from < offset
        for p, offset in t.cutover_offsets.items()
    )


def _aligned(history: PartitioningHistory, at: CohortPosition) -> CohortPosition:
    """``at`` moved to the oldest kept transition it may still be held by: what it had
    released counts only while that transition is still kept."""
    for t in history.transitions:
        if t.to_version >= at.version:
            return at if t.to_version == at.version else CohortPosition(t.to_version)
    return CohortPosition(history.past)


def _compact(history: PartitioningHistory) -> PartitioningHistory | None:
    """None for an empty history; otherwise without the positions that say only what a
    cohort the history does not name is told anyway (held from the oldest transition)."""
    if not history.transitions:
        return None
    start = CohortPosition(history.transitions[0].to_version)
    aligned = {c: _aligned(history, at) for c, at in history.cohorts.items()}
    return replace(history, cohorts={c: at for c, at in aligned.items() if at != start})


def phase_of(marker: Transition) -> RepartitionPhase:
    if marker.adoption_generation is None:
        return RepartitionPhase.CUTTING_OVER
    if marker.drained_ms is None:
        return RepartitionPhase.DRAINING
    return RepartitionPhase.AWAITING_ADOPTION


def _in_flight(before: RepartitionProgress, marker: Transition) -> RepartitionProgress:
    return replace(
        before,
        phase=phase_of(marker),
        from_partitions=marker.from_partitions,
        to_partitions=marker.to_partitions,
        from_version=marker.from_version,
        to_version=marker.to_version,
        adoption_generation=marker.adoption_generation,
        cutover_ms=marker.cutover_ms,
        drained_ms=marker.drained_ms,
        message=_describe(marker),
    )


def _finalized(
    before: RepartitionProgress, marker: Transition, by: FinalizedBy, now_ms: int
) -> RepartitionProgress:
    after = _in_flight(before, marker)
    how = (
        "every live broker's clients acked the new routing"
        if by is FinalizedBy.ADOPTED
        else "the adoption timeout passed (the version fence covers clients that did not ack)"
    )
    return replace(
        after,
        phase=RepartitionPhase.FINALIZED,
        finalized_ms=now_ms,
        finalized_by=by,
        message=f"{marker.from_partitions} -> {marker.to_partitions} partitions: {how}",
    )


def _describe(marker: Transition) -> str:
    phase = phase_of(marker)
    base = (
        f"{marker.from_partitions} -> {marker.to_partitions} partitions, version"
        f" {marker.from_version} -> {marker.to_version}: {phase.value}"
    )
    if phase is RepartitionPhase.DRAINING:
        missing = sum(1 for p in range(marker.measured) if p not in marker.cutover_offsets)
        held = sorted(c for c, qs in marker.released.items() if len(qs) < marker.to_partitions)
        parts = []
        if missing:
            parts.append(f"{missing} cutover offsets not reported yet")
        if held:
            parts.append(f"cohorts {held} still draining")
        return base + (f" ({'; '.join(parts)})" if parts else "")
    if phase is RepartitionPhase.AWAITING_ADOPTION:
        return base + f" (adoption generation {marker.adoption_generation})"
    return base
