"""The dashboard's view model: the controller's documents and heartbeats as what the page shows (pure).

``dashboard_view`` is the one place that decides what a person sees: which
brokers are up or down, which partitions are offline or under-replicated, each
cohort's lag per partition, the transitions in flight, and the problems as
sentences. The page (``static/dashboard.js``) only lays the result out, so the
local controller and the kopf operator show the same thing from the same
documents.

Inputs, all of which both controllers have after a control-loop step, as the loop's
own typed values (``observing.observed`` reads them off the loop):

* the ``ClusterState``, the step's problems and adoption floor, and every Unload
  and Repartition the loop serves with its progress (the same values the state
  document, ``GET /v1/state``, is written from); a repartition in flight is its
  topic's transition marker;
* the latest heartbeat of each broker (``ControlLoop.heartbeats``, plus the last
  one of a broker the loop has stopped hearing from): offsets, cursors, cohort
  members; offsets from a broker that is not live are shown as stale;
* the step's ``Liveness`` (live, dead, not yet heard from, draining);
* the charts from ``rates.RateHistory.charts``.

Health of a broker: ``up`` while its heartbeat is within the liveness TTL
(``draining`` if it says it is shutting down), ``down`` once the controller
declares it dead, ``waiting`` for a known broker not heard from since the
controller started. A partition is **offline** when it has no leader and no
candidate; **under-replicated** when its live replica set (LRS) is smaller than
its replica set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.control.liveness import Liveness
from headrace.control.model import (
    ClusterState,
    PartitionState,
    RepartitionProgress,
    RepartitionRequest,
    TopicStatus,
    Transition,
    UnloadPhase,
    UnloadProgress,
    UnloadRequest,
)
from headrace.control.reconcile import Problem
from headrace.control.repartitions import phase_of
from headrace.dashboard.rates import leader_reports
from headrace.protocol.coordination import Heartbeat, PartitionReport


@dataclass(frozen=True, slots=True)
class Observed:
    """Everything the view is made of (see the module): what the control loop holds after
    a step, with the heartbeats, the time and the charts."""

    #: the cluster state the control loop holds (``ControlLoop.state``)
    state: ClusterState
    #: the latest heartbeat of each broker, by broker id
    heartbeats: Mapping[int, Heartbeat]
    #: the last step's liveness; None before the first step
    liveness: Liveness | None
    now_ms: int
    cluster_id: str = "local"
    #: ``RateHistory.charts``; empty: no charts yet
    charts: Mapping[str, Any] = field(default_factory=dict)
    #: what the last step reported per topic (``Decision.problems``)
    problems: Sequence[Problem] = ()
    #: the last step's ``Decision.adoption_floor``; None before the first step
    adoption_floor: int | None = None
    #: the control-loop steps run so far
    steps: int = 0
    #: each Unload the loop serves and its progress (None: not taken up yet)
    unloads: Sequence[tuple[UnloadRequest, UnloadProgress | None]] = ()
    #: each Repartition the loop serves and its progress (None: not taken up yet)
    repartitions: Sequence[tuple[RepartitionRequest, RepartitionProgress | None]] = ()


def dashboard_view(observed: Observed) -> dict[str, Any]:
    """The JSON the page renders (its shape is documented in docs/operations.md)."""
    topics = [observed.state.topics[name] for name in sorted(observed.state.topics)]
    leaders = leader_reports(observed.heartbeats.values())
    brokers = _brokers(observed, topics)
    partitions = _partitions(observed, topics)
    cohorts = _cohorts(observed, topics, leaders)
    unloads = [_unload(r, p) for r, p in sorted(observed.unloads, key=lambda u: u[0].name)]
    problems = _problems(observed, brokers, partitions)
    down = [b for b in brokers if b["health"] == "down"]
    offline = [p for p in partitions if p["offline"]]
    under = [p for p in partitions if p["underReplicated"]]
    return {
        "cluster": {
            "id": observed.cluster_id,
            "generation": observed.state.generation,
            "steps": observed.steps,
            "adoptionFloor": observed.adoption_floor,
            "nowMs": observed.now_ms,
        },
        "summary": {
            "brokers": len(brokers),
            "brokersUp": sum(1 for b in brokers if b["health"] in ("up", "draining")),
            "brokersDown": len(down),
            "topics": len(topics),
            "partitions": len(partitions),
            "offline": len(offline),
            "underReplicated": len(under),
            "problems": len(problems),
            "healthy": not (down or offline or under or problems),
        },
        "brokers": brokers,
        "partitions": partitions,
        "cohorts": cohorts,
        "transitions": {
            "unloads": [u for u in unloads if u["inFlight"]],
            "finishedUnloads": [u for u in unloads if not u["inFlight"]],
            "repartitions": [
                _transition(t.name, t.transition, observed.now_ms)
                for t in topics
                if t.transition is not None
            ],
            "finishedRepartitions": [
                _repartition(request, progress)
                for request, progress in sorted(observed.repartitions, key=lambda r: r[0].name)
                if progress is not None and progress.finished
            ],
        },
        "problems": problems,
        "charts": dict(observed.charts),
    }


def _health(broker: int, liveness: Liveness | None) -> str:
    if liveness is None:
        return "waiting"
    if broker in liveness.draining:
        return "draining"
    if broker in liveness.live:
        return "up"
    if broker in liveness.dead:
        return "down"
    return "waiting"


def _brokers(observed: Observed, topics: list[TopicStatus]) -> list[dict[str, Any]]:
    known = observed.state.brokers
    leads: dict[int, int] = {}
    hosts: dict[int, int] = {}
    for topic in topics:
        for p in topic.partitions:
            if p.leader is not None:
                leads[p.leader] = leads.get(p.leader, 0) + 1
            for r in p.replicas:
                hosts[r] = hosts.get(r, 0) + 1
    rows = []
    for broker in sorted(set(known) | set(observed.heartbeats)):
        hb = observed.heartbeats.get(broker)
        endpoint = known.get(broker) or (hb.broker if hb else None)
        host, port = ("?", None) if endpoint is None else (endpoint.host, endpoint.port)
        rows.append(
            {
                "id": broker,
                "address": f"{host}:{port}" if port is not None and port >= 0 else host,
                "health": _health(broker, observed.liveness),
                "lastHeartbeatAgoMs": None if hb is None else observed.now_ms - hb.received_ms,
                "generation": None if hb is None else hb.generation,
                "connections": None if hb is None else hb.connections,
                "leaderOf": leads.get(broker, 0),
                "replicaOf": hosts.get(broker, 0),
            }
        )
    return rows


def _reports(
    heartbeats: Mapping[int, Heartbeat],
) -> dict[tuple[str, int], list[tuple[int, PartitionReport]]]:
    """Every report of each partition, with the broker that sent it (one pass, not one per row)."""
    reports: dict[tuple[str, int], list[tuple[int, PartitionReport]]] = {}
    for broker, hb in heartbeats.items():
        for r in hb.partitions:
            reports.setdefault((r.topic, r.partition), []).append((broker, r))
    return reports


def _best_report(
    reports: list[tuple[int, PartitionReport]],
) -> tuple[PartitionReport | None, int | None]:
    """The leader's report (the highest epoch, if two claim it), else the most advanced
    one of a replica (an offline partition): the last known; and who sent it."""
    leading = [(r.leader_epoch, b, r) for b, r in reports if r.role == "leader"]
    if leading:
        _, broker, report = max(leading, key=lambda entry: (entry[0], -entry[1]))
        return report, broker
    if not reports:
        return None, None
    broker, report = max(reports, key=lambda entry: (entry[1].high_watermark, -entry[0]))
    return report, broker


def _partitions(observed: Observed, topics: list[TopicStatus]) -> list[dict[str, Any]]:
    live = observed.liveness.live if observed.liveness else frozenset()
    reports = _reports(observed.heartbeats)
    rows = []
    for topic in topics:
        name = topic.name
        for p in topic.partitions:
            replicas, lrs = list(p.replicas), list(p.live_replicas)
            leader, candidate = p.leader, p.candidate
            offline = p.state is PartitionState.OFFLINE or (leader is None and candidate is None)
            report, source = _best_report(reports.get((name, p.partition), []))
            rows.append(
                {
                    "topic": name,
                    "partition": p.partition,
                    "leader": leader,
                    "candidate": candidate,
                    "replicas": replicas,
                    "lrs": lrs,
                    "epoch": p.leader_epoch,
                    "state": p.state.value,
                    "sealed": p.seal,
                    "offline": offline,
                    "underReplicated": not offline and len(lrs) < len(replicas),
                    "highWatermark": None if report is None else report.high_watermark,
                    "logStartOffset": None if report is None else report.log_start_offset,
                    "logEndOffset": None if report is None else report.log_end_offset,
                    "storedThrough": None if report is None else report.stored_through,
                    # offsets from a broker that is not live are its last word: say so
                    "offsetsStale": report is not None and source not in live,
                }
            )
    return rows


def _cohorts(
    observed: Observed,
    topics: list[TopicStatus],
    leaders: Mapping[tuple[str, int], PartitionReport],
) -> list[dict[str, Any]]:
    live = observed.liveness.live if observed.liveness else frozenset()
    members: dict[tuple[str, str], set[str]] = {}
    for broker, hb in observed.heartbeats.items():
        for c in hb.cohorts:
            group = members.setdefault((c.topic, c.cohort), set())
            if broker in live:
                group.update(c.members)
    plans: dict[tuple[str, str], Mapping[str, tuple[int, ...]]] = {}
    counts: dict[str, int] = {}
    for topic in topics:
        counts[topic.name] = len(topic.partitions)
        for plan in topic.cohort_plans.values():
            plans[(topic.name, plan.cohort)] = plan.assignment
            members.setdefault((topic.name, plan.cohort), set())
    for (topic_name, _), leading in leaders.items():
        for cohort in leading.cursors:
            members.setdefault((topic_name, cohort), set())
    rows = []
    for topic_name, cohort in sorted(members):
        holder = {
            partition: member
            for member, held in plans.get((topic_name, cohort), {}).items()
            for partition in held
        }
        partitions: list[dict[str, Any]] = []
        for index in range(counts.get(topic_name, 0)):
            report = leaders.get((topic_name, index))
            cursor = None if report is None else report.cursors.get(cohort)
            hw = None if report is None else report.high_watermark
            partitions.append(
                {
                    "partition": index,
                    "member": holder.get(index),
                    "cursor": cursor,
                    "highWatermark": hw,
                    "lag": None if cursor is None or hw is None else max(hw - cursor, 0),
                }
            )
        lags = [p["lag"] for p in partitions if p["lag"] is not None]
        rows.append(
            {
                "topic": topic_name,
                "cohort": cohort,
                "members": sorted(members[(topic_name, cohort)]),
                "lag": sum(lags) if lags else None,
                "partitions": partitions,
            }
        )
    return rows


def _unload(request: UnloadRequest, progress: UnloadProgress | None) -> dict[str, Any]:
    phase = UnloadPhase.PENDING if progress is None else progress.phase
    return {
        "name": request.name,
        "topic": request.topic,
        "phase": phase.value,
        "inFlight": progress is None or not progress.finished,
        "deleting": request.cancelled,
        "message": "" if progress is None else progress.message,
        "moves": [
            {
                "partition": m.partition,
                "phase": m.phase.value,
                "from": m.from_broker,
                "to": m.to_broker,
                "sealedOffset": m.sealed_offset,
                "verification": None if m.verified is None else _VERIFICATION[m.verified],
                "recovery": None if m.recovery_source is None else m.recovery_source.value,
                "message": m.recovery_message or m.message,
            }
            for m in (() if progress is None else progress.moves)
        ],
    }


#: a move's verification as its Unload's status names it
_VERIFICATION: Final = {True: "Passed", False: "Failed"}


def _transition(topic: str, marker: Transition, now_ms: int) -> dict[str, Any]:
    """A repartition in flight, from its topic's transition marker."""
    to = marker.to_partitions
    drained = marker.drained_ms
    return {
        "topic": topic,
        "request": marker.request,
        "kind": "Grow" if to > marker.from_partitions else "Shrink",
        "phase": phase_of(marker).value,
        "fromPartitions": marker.from_partitions,
        "toPartitions": to,
        "fromVersion": marker.from_version,
        "toVersion": marker.to_version,
        "adoptionGeneration": marker.adoption_generation,
        "cutoverOffsetsKnown": len(marker.cutover_offsets),
        # cohort -> "released/to": how many new partitions each cohort may read past cutover
        "cohortsReleased": {
            cohort: f"{len(partitions)}/{to}"
            for cohort, partitions in sorted(marker.released.items())
        },
        "sinceCutoverMs": now_ms - marker.cutover_ms,
        "adoptionDeadlineInMs": None
        if drained is None
        else drained + marker.adoption_timeout_ms - now_ms,
    }


def _repartition(request: RepartitionRequest, progress: RepartitionProgress) -> dict[str, Any]:
    return {
        "name": request.name,
        "topic": request.topic,
        "partitions": request.partitions,
        "phase": progress.phase.value,
        "finalizedBy": None if progress.finalized_by is None else progress.finalized_by.value,
        "message": progress.message,
    }


def _problems(
    observed: Observed, brokers: list[dict[str, Any]], partitions: list[dict[str, Any]]
) -> list[str]:
    """Sentences, most serious first: brokers down, partitions offline, under-replicated,
    then what the control core reported per topic."""
    lines = []
    for b in brokers:
        if b["health"] == "down":
            ago = b["lastHeartbeatAgoMs"]
            since = "" if ago is None else f" (last heartbeat {ago / 1000:.1f} s ago)"
            lines.append(f"Broker {b['id']} at {b['address']} is down{since}.")
    for p in partitions:
        if p["offline"]:
            lines.append(
                f"Partition {p['partition']} of {p['topic']} is offline: no live replica"
                f" of {_ids(p['replicas'])} can lead it."
            )
    for p in partitions:
        if p["underReplicated"]:
            lines.append(
                f"Partition {p['partition']} of {p['topic']} is under-replicated:"
                f" {len(p['lrs'])} of {len(p['replicas'])} replicas live ({_ids(p['lrs'])})."
            )
    for problem in observed.problems:
        lines.append(f"Topic {problem.topic}: {problem.message} ({problem.reason}).")
    return lines


def _ids(brokers: list[int]) -> str:
    return ", ".join(f"broker {b}" for b in brokers) or "no broker"
