"""The dashboard's view model: the controller's documents and heartbeats as what the page shows (pure).

``dashboard_view`` is the one place that decides what a person sees: which
brokers are up or down, which partitions are offline or under-replicated, each
cohort's lag per partition, the transitions in flight, and the problems as
sentences. The page (``static/dashboard.js``) only lays the result out, so the
local controller and the kopf operator show the same thing from the same
documents.

Inputs, all of which both controllers have after a control-loop step:

* the state document (``ControlLoop.state_document()``, also ``GET /v1/state``):
  the cluster state, the problems, the Unloads with their status;
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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.control.liveness import Liveness
from headrace.dashboard.rates import leader_reports
from headrace.protocol.coordination import Heartbeat, PartitionReport

#: phases after which an unload is no longer in flight
_FINISHED: Final = frozenset({"Completed", "Failed"})


@dataclass(frozen=True, slots=True)
class Observed:
    """Everything the view is made of (see the module)."""

    #: the state document (``ControlLoop.state_document()``)
    state: Mapping[str, Any]
    #: the latest heartbeat of each broker, by broker id
    heartbeats: Mapping[int, Heartbeat]
    #: the last step's liveness; None before the first step
    liveness: Liveness | None
    now_ms: int
    cluster_id: str = "local"
    #: ``RateHistory.charts``; empty: no charts yet
    charts: Mapping[str, Any] = field(default_factory=dict)


def dashboard_view(observed: Observed) -> dict[str, Any]:
    """The JSON the page renders (its shape is documented in docs/operations.md)."""
    cluster = observed.state.get("cluster") or {}
    topics = list(cluster.get("topics") or [])
    leaders = leader_reports(observed.heartbeats.values())
    brokers = _brokers(observed, topics)
    partitions = _partitions(observed, topics)
    cohorts = _cohorts(observed, topics, leaders)
    unloads = [_unload(u) for u in observed.state.get("unloads") or []]
    problems = _problems(observed, brokers, partitions)
    down = [b for b in brokers if b["health"] == "down"]
    offline = [p for p in partitions if p["offline"]]
    under = [p for p in partitions if p["underReplicated"]]
    return {
        "cluster": {
            "id": observed.cluster_id,
            "generation": cluster.get("generation", 0),
            "steps": observed.state.get("steps", 0),
            "adoptionFloor": observed.state.get("adoptionFloor"),
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
                _transition(t, observed.now_ms) for t in observed.state.get("transitions") or []
            ],
            "finishedRepartitions": [
                r
                for r in (_repartition(d) for d in observed.state.get("repartitions") or [])
                if r["phase"] in ("Finalized", "Failed")
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


def _brokers(observed: Observed, topics: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    known: dict[int, Mapping[str, Any]] = {
        int(b["id"]): b for b in (observed.state.get("cluster") or {}).get("brokers") or []
    }
    leads: dict[int, int] = {}
    hosts: dict[int, int] = {}
    for topic in topics:
        for p in topic.get("partitions") or []:
            if p.get("leader") is not None:
                leads[p["leader"]] = leads.get(p["leader"], 0) + 1
            for r in p.get("replicas") or []:
                hosts[r] = hosts.get(r, 0) + 1
    rows = []
    for broker in sorted(set(known) | set(observed.heartbeats)):
        hb = observed.heartbeats.get(broker)
        endpoint = known.get(broker) or (hb.broker.to_json() if hb else {})
        host, port = endpoint.get("host", "?"), endpoint.get("port")
        rows.append(
            {
                "id": broker,
                "address": f"{host}:{port}" if port is not None and port >= 0 else str(host),
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


def _partitions(observed: Observed, topics: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    live = observed.liveness.live if observed.liveness else frozenset()
    reports = _reports(observed.heartbeats)
    rows = []
    for topic in topics:
        name = topic["name"]
        for p in topic.get("partitions") or []:
            replicas = list(p.get("replicas") or [])
            lrs = list(p.get("liveReplicas") or [])
            leader, candidate = p.get("leader"), p.get("candidate")
            offline = p.get("state") == "Offline" or (leader is None and candidate is None)
            report, source = _best_report(reports.get((name, p["partition"]), []))
            rows.append(
                {
                    "topic": name,
                    "partition": p["partition"],
                    "leader": leader,
                    "candidate": candidate,
                    "replicas": replicas,
                    "lrs": lrs,
                    "epoch": p.get("leaderEpoch"),
                    "state": p.get("state"),
                    "sealed": bool(p.get("seal")),
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
    topics: list[Mapping[str, Any]],
    leaders: Mapping[tuple[str, int], PartitionReport],
) -> list[dict[str, Any]]:
    live = observed.liveness.live if observed.liveness else frozenset()
    members: dict[tuple[str, str], set[str]] = {}
    for broker, hb in observed.heartbeats.items():
        for c in hb.cohorts:
            group = members.setdefault((c.topic, c.cohort), set())
            if broker in live:
                group.update(c.members)
    plans: dict[tuple[str, str], Mapping[str, list[int]]] = {}
    counts: dict[str, int] = {}
    for topic in topics:
        counts[topic["name"]] = len(topic.get("partitions") or [])
        for plan in topic.get("cohortPlans") or []:
            plans[(topic["name"], plan["cohort"])] = plan.get("assignment") or {}
            members.setdefault((topic["name"], plan["cohort"]), set())
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


def _unload(doc: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec, status = doc.get("metadata") or {}, doc.get("spec") or {}, doc.get("status") or {}
    phase = str(status.get("phase", "Pending"))
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return {
        "name": f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}",
        "topic": f"{meta.get('namespace', 'default')}/{(spec.get('topicRef') or {}).get('name', '?')}",
        "phase": phase,
        "inFlight": phase not in _FINISHED,
        "deleting": meta.get("deletionTimestamp") is not None,
        "message": str(ready.get("message") or ""),
        "moves": [
            {
                "partition": m.get("partition"),
                "phase": m.get("phase"),
                "from": m.get("fromBroker"),
                "to": m.get("toBroker"),
                "sealedOffset": m.get("sealedOffset"),
                "verification": (m.get("verification") or {}).get("result"),
                "recovery": (m.get("recovery") or {}).get("source"),
                "message": str((m.get("recovery") or {}).get("message") or m.get("message") or ""),
            }
            for m in status.get("moves") or []
        ],
    }


def _transition(marker: Mapping[str, Any], now_ms: int) -> dict[str, Any]:
    """A repartition in flight, from the topic's transition marker (``state["transitions"]``)."""
    to = int(marker.get("toPartitions", 0))
    released = {
        str(r.get("cohort")): len(r.get("partitions") or []) for r in marker.get("released") or []
    }
    drained = marker.get("drainedMs")
    return {
        "topic": marker.get("topic"),
        "request": marker.get("request"),
        "kind": marker.get("kind"),
        "phase": marker.get("phase"),
        "fromPartitions": marker.get("fromPartitions"),
        "toPartitions": to,
        "fromVersion": marker.get("fromVersion"),
        "toVersion": marker.get("toVersion"),
        "adoptionGeneration": marker.get("adoptionGeneration"),
        "cutoverOffsetsKnown": len(marker.get("cutoverOffsets") or []),
        # cohort -> "released/to": how many new partitions each cohort may read past cutover
        "cohortsReleased": {c: f"{n}/{to}" for c, n in sorted(released.items())},
        "sinceCutoverMs": now_ms - int(marker.get("cutoverMs", now_ms)),
        "adoptionDeadlineInMs": None
        if drained is None
        else int(drained) + int(marker.get("adoptionTimeoutMs", 0)) - now_ms,
    }


def _repartition(doc: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec, status = doc.get("metadata") or {}, doc.get("spec") or {}, doc.get("status") or {}
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return {
        "name": f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}",
        "topic": f"{meta.get('namespace', 'default')}/{(spec.get('topicRef') or {}).get('name', '?')}",
        "partitions": spec.get("partitions"),
        "phase": str(status.get("phase", "Pending")),
        "finalizedBy": status.get("finalizedBy"),
        "message": str(ready.get("message") or ""),
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
    for problem in observed.state.get("problems") or []:
        lines.append(
            f"Topic {problem.get('topic', '?')}: {problem.get('message', '')}"
            f" ({problem.get('reason', 'Problem')})."
        )
    return lines


def _ids(brokers: list[int]) -> str:
    return ", ".join(f"broker {b}" for b in brokers) or "no broker"
