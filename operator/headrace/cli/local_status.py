"""What ``headrace local status`` prints: the controller's ``/v1/state`` and the processes
``local.json`` records, as lines of text (or, with ``--json``, ``localBrokers``).

The state's ``cluster`` document is read through the control core's codec
(``CLUSTER_STATE_JSON``), so topics, partitions and transitions are typed values here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headrace.cli.local_record import STATE_FILE
from headrace.cli.processes import alive
from headrace.control.model import CLUSTER_STATE_JSON, PartitionStatus, TopicStatus
from headrace.control.repartitions import phase_of


def status_lines(doc: dict[str, Any], directory: Path) -> list[str]:
    """The text of ``local status``: generation and live brokers, each broker's process,
    each topic's partitions, problems, moves, Unloads and repartitions."""
    state = CLUSTER_STATE_JSON.load(doc["cluster"])
    lines = [
        f"generation {state.generation}  live brokers {doc['live']}  adoption floor {doc['adoptionFloor']}"
    ]
    lines += broker_lines(directory, doc.get("live", []))
    for name, topic in sorted(state.topics.items()):
        lines.append(f"topic {name}  version {topic.partitioning_version}")
        lines += [_partition_line(p) for p in topic.partitions]
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
    lines += transition_lines(state.topics, doc.get("repartitions", []))
    return lines


def _partition_line(p: PartitionStatus) -> str:
    moved = f"  moves {p.moves} from {p.start_offset}" if p.moves else ""
    return (
        f"  {p.partition:>3}  leader {p.leader}  epoch {p.leader_epoch}"
        f"  replicas {list(p.replicas)}  lrs {list(p.live_replicas)}  {p.state.value}"
        + moved
        + ("  SEALED" if p.seal else "")
        + (f"  MOVING to {list(p.target)}" if p.target else "")
    )


def transition_lines(
    topics: Mapping[str, TopicStatus], repartitions: list[dict[str, Any]]
) -> list[str]:
    """``local status`` lines of the repartitions: each topic's transition in flight with
    its phase, then each Repartition's phase (Finalized ones say how)."""
    lines = []
    for name, topic in sorted(topics.items()):
        t = topic.transition
        if t is None:
            continue
        held = ", ".join(f"{c} {len(ps)}/{t.to_partitions}" for c, ps in sorted(t.released.items()))
        lines.append(
            f"transition {name}  {t.from_partitions} -> {t.to_partitions} partitions"
            f"  version {t.from_version} -> {t.to_version}  {phase_of(t).value}"
            f"  adoption generation {_or_dash(t.adoption_generation)}"
            f"  cutover offsets {len(t.cutover_offsets)}/{t.from_partitions}"
            + (f"  released {held}" if held else "")
            + f"  ({t.request})"
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
