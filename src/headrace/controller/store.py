"""The local state store: the controller's durable decisions, as documents.

Local mode keeps in a directory what Kubernetes keeps in custom resources:

    <dir>/topics/<namespace>.<name>.json   a Topic resource: apiVersion, kind,
                                           metadata, spec (as applied) and status
                                           (the control core's TopicStatus document)
    <dir>/cluster.json                     the cluster status: generation, brokers

Only durable decisions are written (assignments, epochs, LRS, plans, the
generation), never heartbeat samples. Writes are atomic (temp file, fsync,
rename), so a controller killed mid-write leaves the previous document.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headrace.control.model import BrokerInfo, ClusterState, TopicSpec, TopicStatus


def _write_atomic(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _topic_file(root: Path, name: str) -> Path:
    return root / "topics" / (name.replace("/", ".") + ".json")


def spec_of(resource: dict[str, Any]) -> TopicSpec:
    meta = resource["metadata"]
    spec = resource["spec"]
    replicas = int(spec.get("replicas", 1))
    return TopicSpec(
        f"{meta.get('namespace', 'default')}/{meta['name']}",
        int(spec["partitions"]),
        replicas,
        int(spec.get("minInSync", min(2, replicas))),
    )


def _ready_condition(
    status: TopicStatus | None,
    problem: tuple[str, str] | None,
    previous: dict[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The Ready condition in metav1.Condition shape (what GitOps tools read)."""
    if status is None:
        value, reason, message = (
            "False",
            problem[0] if problem else "Pending",
            (problem[1] if problem else "waiting for placement"),
        )
    elif problem is not None:
        value, reason, message = "False", problem[0], problem[1]
    elif any(str(p.state) != "Online" for p in status.partitions):
        value, reason, message = (
            "False",
            "PartitionsNotOnline",
            "some partitions are electing or offline",
        )
    else:
        value, reason, message = "True", "Online", f"{len(status.partitions)} partitions online"
    changed = previous is None or previous.get("status") != value
    return {
        "type": "Ready",
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now
        if changed or previous is None
        else previous.get("lastTransitionTime", now),
    }


class StateStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _previous_ready(self, name: str) -> dict[str, Any] | None:
        path = _topic_file(self.root, name)
        try:
            conditions = json.loads(path.read_text()).get("status", {}).get("conditions", [])
        except (FileNotFoundError, ValueError, AttributeError):
            return None
        return next(
            (c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None
        )

    def load(self) -> tuple[ClusterState, dict[str, dict[str, Any]]]:
        """(cluster state, applied Topic resources by 'namespace/name')."""
        resources: dict[str, dict[str, Any]] = {}
        statuses: dict[str, TopicStatus] = {}
        for path in sorted((self.root / "topics").glob("*.json")):
            doc = json.loads(path.read_text())
            name = spec_of(doc).name
            status = doc.get("status")
            if status:
                statuses[name] = TopicStatus.from_json(status)
            doc.pop("status", None)
            resources[name] = doc
        cluster: dict[str, Any] = {}
        cluster_file = self.root / "cluster.json"
        if cluster_file.exists():
            cluster = json.loads(cluster_file.read_text())
        brokers = {int(b["id"]): BrokerInfo.from_json(b) for b in cluster.get("brokers", [])}
        state = ClusterState(int(cluster.get("generation", 0)), brokers, statuses)
        return state, resources

    def save(
        self,
        state: ClusterState,
        resources: dict[str, dict[str, Any]],
        problems: dict[str, tuple[str, str]] | None = None,
        now: str = "",
    ) -> None:
        """Write every Topic document and the cluster document.

        ``problems``: topic -> (reason, message) of the first problem the core
        reported, which makes the topic's Ready condition False.
        """
        wanted = {_topic_file(self.root, name) for name in resources}
        problems = problems or {}
        for name, resource in resources.items():
            doc = dict(resource)
            status = state.topics.get(name)
            previous = self._previous_ready(name)
            ready = _ready_condition(status, problems.get(name), previous, now)
            doc["status"] = {
                **(status.to_json() if status is not None else {}),
                "observedGeneration": state.generation,
                "conditions": [ready],
            }
            _write_atomic(_topic_file(self.root, name), doc)
        for path in (self.root / "topics").glob("*.json"):
            if path not in wanted:
                path.unlink()
        _write_atomic(
            self.root / "cluster.json",
            {
                "generation": state.generation,
                "brokers": [b.to_json() for _, b in sorted(state.brokers.items())],
            },
        )
