"""What ``headrace local status`` prints: the controller's ``/v1/state`` and the processes
``local.json`` records, as lines of text (or, with ``--json``, ``localBrokers``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headrace.cli.local_record import STATE_FILE
from headrace.cli.processes import alive


def status_lines(doc: dict[str, Any], directory: Path) -> list[str]:
    """The text of ``local status``: generation and live brokers, each broker's process,
    each topic's partitions, problems, moves, Unloads and repartitions."""
    cluster = doc["cluster"]
    lines = [
        f"generation {cluster['generation']}  live brokers {doc['live']}  adoption floor {doc['adoptionFloor']}"
    ]
    lines += broker_lines(directory, doc.get("live", []))
    for topic in cluster.get("topics", []):
        lines.append(f"topic {topic['name']}  version {topic['partitioningVersion']}")
        for p in topic["partitions"]:
            moved = f"  moves {p['moves']} from {p.get('startOffset')}" if p.get("moves") else ""
            lines.append(
                f"  {p['partition']:>3}  leader {p.get('leader')}  epoch {p['leaderEpoch']}"
                f"  replicas {p['replicas']}  lrs {p['liveReplicas']}  {p['state']}"
                + moved
                + ("  SEALED" if p.get("seal") else "")
                + (f"  MOVING to {p['targetReplicas']}" if p.get("targetReplicas") else "")
            )
    for problem in doc.get("problems", []):
        lines.append(f"problem {problem['topic']}: {problem['reason']}: {problem['message']}")
    moving = doc.get("reassignment") or {}
    if doc.get("members") is not None or moving.get("moving") or moving.get("blocked"):
        lines.append(
            f"members {doc.get('members')}  moving {moving.get('moving', 0)}"
            f"  waiting {moving.get('waiting', 0)}"
            + (f"  leaving {moving['evacuating']}" if moving.get("evacuating") else "")
        )
        for why in moving.get("blocked", []):
            lines.append(f"  blocked: {why}")
    lines += unload_lines(doc.get("unloads", []))
    lines += transition_lines(doc.get("transitions", []), doc.get("repartitions", []))
    return lines


def transition_lines(
    transitions: list[dict[str, Any]], repartitions: list[dict[str, Any]]
) -> list[str]:
    """``local status`` lines of the repartitions: each transition in flight with its
    phase, then each Repartition's phase (Finalized ones say how)."""
    lines = []
    for t in transitions:
        released = {r["cohort"]: len(r["partitions"]) for r in t.get("released", [])}
        held = ", ".join(f"{c} {n}/{t['toPartitions']}" for c, n in sorted(released.items()))
        lines.append(
            f"transition {t['topic']}  {t['fromPartitions']} -> {t['toPartitions']} partitions"
            f"  version {t['fromVersion']} -> {t['toVersion']}  {t['phase']}"
            f"  adoption generation {_or_dash(t.get('adoptionGeneration'))}"
            f"  cutover offsets {len(t.get('cutoverOffsets', []))}/{t['fromPartitions']}"
            + (f"  released {held}" if held else "")
            + f"  ({t['request']})"
        )
    for r in repartitions:
        meta, spec, status = r["metadata"], r["spec"], r.get("status") or {}
        ready = next(
            (c for c in status.get("conditions", []) if c.get("type") == "Ready"), {"message": ""}
        )
        by = f"  by {status['finalizedBy']}" if status.get("finalizedBy") else ""
        lines.append(
            f"repartition {meta.get('namespace', 'default')}/{meta['name']}  topic"
            f" {spec['topicRef']['name']}  -> {spec['partitions']}"
            f"  {status.get('phase', 'Pending')}{by}"
            + (f"  {ready['message']}" if ready.get("message") else "")
        )
    return lines


def local_brokers(directory: Path, live: list[int]) -> list[dict[str, Any]]:
    """The brokers ``local.json`` records: id, address, process and liveness.

    ``process`` is ``running``, ``stopped`` (by ``local stop``) or ``exited`` (gone
    without it: killed, crashed); ``local start`` brings back either of the last two."""
    state = directory / STATE_FILE
    if not state.exists():
        return []
    brokers = []
    for b in json.loads(state.read_text()).get("brokers", []):
        pid = b.get("pid")
        process = "stopped" if pid is None else "running" if alive(int(pid)) else "exited"
        brokers.append(
            {
                "id": b["id"],
                "address": f"{b['host']}:{b['port']}",
                "kafka": f"{b['host']}:{b['kafka_port']}" if "kafka_port" in b else None,
                "process": process,
                "pid": pid,
                "live": b["id"] in live,
            }
        )
    return brokers


def broker_lines(directory: Path, live: list[int]) -> list[str]:
    """``local status`` lines of the brokers (``local_brokers``)."""
    lines = []
    brokers = local_brokers(directory, live)
    for b in brokers:
        process = b["process"] if b["pid"] is None else f"{b['process']} (pid {b['pid']})"
        seen = "live" if b["live"] else "not live"
        kafka = f"  kafka {b['kafka']}" if b["kafka"] else ""
        lines.append(f"broker {b['id']}  {b['address']}{kafka}  {process}  {seen}")
    kafka_bootstrap = ",".join(b["kafka"] for b in brokers if b["kafka"])
    if kafka_bootstrap:
        lines.append(f"kafka bootstrap {kafka_bootstrap}")
    return lines


def unload_lines(unloads: list[dict[str, Any]]) -> list[str]:
    """``local status`` lines of the Unloads: phase, then each move's phase, from -> to,
    sealed offset and recovery."""
    lines = []
    for u in unloads:
        meta, spec, status = u["metadata"], u["spec"], u.get("status") or {}
        ready = next(
            (c for c in status.get("conditions", []) if c.get("type") == "Ready"), {"message": ""}
        )
        target = spec.get("targetBroker")
        head = (
            f"unload {meta.get('namespace', 'default')}/{meta['name']}  topic"
            f" {spec['topicRef']['name']}  {status.get('phase', 'Pending')}"
            + (f"  target {target}" if target is not None else "")
            + ("  (deleting)" if meta.get("deletionTimestamp") else "")
        )
        lines.append(head + (f"  {ready['message']}" if ready.get("message") else ""))
        for m in status.get("moves", []):
            arrow = f"{_or_dash(m.get('fromBroker'))} -> {_or_dash(m.get('toBroker'))}"
            line = (
                f"  {m['partition']:>3}  {m.get('phase', 'Pending'):<9}  {arrow}"
                f"  sealed {_or_dash(m.get('sealedOffset'))}"
            )
            verification = m.get("verification")
            if verification:
                line += f"  verified {verification['result']}"
            recovery = m.get("recovery")
            if recovery:
                line += f"  recovery {recovery['source']}: {recovery.get('message', '')}"
            elif m.get("message"):
                line += f"  ({m['message']})"
            lines.append(line)
    return lines


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)
