"""The local state store: the controller's durable decisions, as documents.

Local mode keeps in a directory what Kubernetes keeps in custom resources:

    <dir>/topics/<namespace>.<name>.json   a Topic resource: apiVersion, kind,
                                           metadata, spec (as applied) and status
                                           (the control core's TopicStatus document)
    <dir>/cluster.json                     the cluster status: generation, brokers
    <dir>/unloads/<namespace>.<name>.json  an Unload resource: apiVersion, kind, metadata,
                                           spec (as applied) and status (the control core's
                                           UnloadProgress, in the UnloadStatus shape)

Only durable decisions are written (assignments, epochs, LRS, plans, the
generation, unload progress), never heartbeat samples. Writes are atomic (temp
file, fsync, rename), so a controller killed mid-write leaves the previous
document. An Unload document is the CR Kubernetes would hold: it validates as
``headrace.resources.operations.Unload``, times are RFC 3339 (to the
millisecond, so the core's millisecond deadlines survive a round trip), and
an Unload deleted while moving carries ``metadata.deletionTimestamp`` until
its moves finish, as a finalizer would keep it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from headrace import files
from headrace.control.model import (
    ClusterState,
    MovePhase,
    MoveProgress,
    RecoverySource,
    TopicSpec,
    TopicStatus,
    UnloadPhase,
    UnloadProgress,
    UnloadRequest,
)
from headrace.errors import InvalidRequest
from headrace.protocol.endpoints import BrokerEndpoint

API_VERSION: Final = "headrace.dev/v1alpha1"
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS: Final = dt.timedelta(milliseconds=1)


def rfc3339(ms: int) -> str:
    """Milliseconds since the epoch as RFC 3339 UTC, to the millisecond."""
    text = (_EPOCH + ms * _MS).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def epoch_ms(text: str) -> int:
    """The inverse of ``rfc3339`` (any RFC 3339 time with an offset)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidRequest(f"{text!r} is not an RFC 3339 time") from exc
    if when.tzinfo is None:
        raise InvalidRequest(f"{text!r} has no UTC offset")
    return (when - _EPOCH) // _MS


def _write_atomic(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json_atomic(path, doc, indent=2, sort_keys=True)


def _topic_file(root: Path, name: str) -> Path:
    return root / "topics" / (name.replace("/", ".") + ".json")


def _unload_file(root: Path, name: str) -> Path:
    return root / "unloads" / (name.replace("/", ".") + ".json")


def full_name(resource: Mapping[str, Any]) -> str:
    """'<namespace>/<name>' of a resource document."""
    meta = resource["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def spec_of(resource: dict[str, Any]) -> TopicSpec:
    spec = resource["spec"]
    replicas = int(spec.get("replicas", 1))
    tiered = spec.get("tieredStorage") or {}
    return TopicSpec(
        full_name(resource),
        int(spec["partitions"]),
        replicas,
        int(spec.get("minInSync", min(2, replicas))),
        bool(tiered.get("enabled", True)),
    )


def topic_config(resource: Mapping[str, Any]) -> dict[str, Any]:
    """The topology document's per-topic ``config``: the Topic spec's settings that are set.

    Keys are the broker's (``retention_ms``, ``segment_bytes``, ``tiered``, ...); a
    setting left unset is left out, so the broker's own default applies.
    """
    spec = resource.get("spec", {})
    retention = spec.get("retention") or {}
    segments = spec.get("segments") or {}
    tiered = spec.get("tieredStorage") or {}
    interval = tiered.get("uploadIntervalSeconds")
    values: dict[str, Any] = {
        "retention_ms": retention.get("ms"),
        "retention_bytes": retention.get("bytes"),
        "segment_bytes": segments.get("bytes"),
        "segment_ms": segments.get("ms"),
        "max_batch_bytes": spec.get("maxBatchBytes"),
        "tiered": tiered.get("enabled"),
        "upload_interval_ms": None if interval is None else int(interval) * 1000,
        "local_retention_ms": tiered.get("localRetentionMs"),
        "local_retention_bytes": tiered.get("localRetentionBytes"),
    }
    return {k: v for k, v in values.items() if v is not None}


def unload_request(resource: Mapping[str, Any]) -> UnloadRequest:
    """The core's view of an Unload document (``deletionTimestamp`` cancels what has not begun)."""
    meta = resource["metadata"]
    spec = resource["spec"]
    namespace = meta.get("namespace", "default")
    target = spec.get("targetBroker")
    return UnloadRequest(
        full_name(resource),
        f"{namespace}/{spec['topicRef']['name']}",
        tuple(int(p) for p in spec.get("partitions") or ()),
        None if target is None else int(target),
        cancelled=meta.get("deletionTimestamp") is not None,
    )


def _optional_time(ms: int | None) -> str | None:
    return None if ms is None else rfc3339(ms)


def _move_status(move: MoveProgress) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "partition": move.partition,
        "fromBroker": move.from_broker,
        "toBroker": move.to_broker,
        "sealedOffset": move.sealed_offset,
        "phase": move.phase.value,
        "moves": move.moves,
        "recoveryDeadline": _optional_time(move.deadline_ms),
        "message": move.message or None,
    }
    if move.verified is not None:
        doc["verification"] = {
            "result": "Passed" if move.verified else "Failed",
            "checkedAt": _optional_time(move.checked_ms),
            "message": move.verification_message,
        }
    if move.recovery_source is not None:
        doc["recovery"] = {
            "source": move.recovery_source.value,
            "message": move.recovery_message,
        }
    return _without_none(doc)


def _without_none(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        k: _without_none(v) if isinstance(v, dict) else v for k, v in doc.items() if v is not None
    }


def _move_of(doc: Mapping[str, Any]) -> MoveProgress:
    verification = doc.get("verification") or {}
    recovery = doc.get("recovery") or {}
    checked = verification.get("checkedAt")
    deadline = doc.get("recoveryDeadline")
    return MoveProgress(
        partition=int(doc["partition"]),
        phase=MovePhase(doc.get("phase", "Pending")),
        from_broker=doc.get("fromBroker"),
        to_broker=doc.get("toBroker"),
        sealed_offset=doc.get("sealedOffset"),
        moves=doc.get("moves"),
        verified=None if not verification else verification["result"] == "Passed",
        verification_message=str(verification.get("message", "")),
        checked_ms=None if checked is None else epoch_ms(checked),
        recovery_source=None if not recovery else RecoverySource(recovery["source"]),
        recovery_message=str(recovery.get("message", "")),
        deadline_ms=None if deadline is None else epoch_ms(deadline),
        message=str(doc.get("message") or ""),
    )


def unload_status(
    progress: UnloadProgress,
    observed_generation: int,
    previous_ready: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The Unload's status document (UnloadStatus shape) for the core's progress.

    Its Ready condition is True once Completed; its reason is the phase and its
    message the progress message (which is how the message survives a restart).
    """
    value = "True" if progress.phase is UnloadPhase.COMPLETED else "False"
    changed = previous_ready is None or previous_ready.get("status") != value
    ready = {
        "type": "Ready",
        "status": value,
        "observedGeneration": observed_generation,
        "reason": progress.phase.value,
        "message": progress.message,
        "lastTransitionTime": now
        if changed or previous_ready is None
        else previous_ready.get("lastTransitionTime", now),
    }
    status = {
        "observedGeneration": observed_generation,
        "conditions": [ready],
        "phase": progress.phase.value,
        "moves": [_move_status(m) for m in progress.moves],
        "startedAt": _optional_time(progress.started_ms),
        "completedAt": _optional_time(progress.completed_ms),
    }
    return {k: v for k, v in status.items() if v is not None}


def progress_of(name: str, status: Mapping[str, Any]) -> UnloadProgress:
    """The core's progress from an Unload's status document (the inverse of ``unload_status``)."""
    ready = next(
        (
            c
            for c in status.get("conditions", [])
            if isinstance(c, dict) and c.get("type") == "Ready"
        ),
        {},
    )
    started = status.get("startedAt")
    completed = status.get("completedAt")
    try:
        return UnloadProgress(
            name,
            UnloadPhase(status.get("phase", "Pending")),
            tuple(_move_of(m) for m in status.get("moves", [])),
            None if started is None else epoch_ms(started),
            None if completed is None else epoch_ms(completed),
            str(ready.get("message", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"unload {name}: unreadable status: {exc}") from exc


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
        #: the Unload documents as last written, by name (rewrite only what changed)
        self._unload_docs: dict[str, dict[str, Any]] = {}

    def load_unloads(self) -> tuple[dict[str, dict[str, Any]], dict[str, UnloadProgress]]:
        """(applied Unload resources without status, their progress), by 'namespace/name'."""
        resources: dict[str, dict[str, Any]] = {}
        progress: dict[str, UnloadProgress] = {}
        for path in sorted((self.root / "unloads").glob("*.json")):
            doc = json.loads(path.read_text())
            name = full_name(doc)
            self._unload_docs[name] = json.loads(json.dumps(doc))
            status = doc.pop("status", None)
            if status:
                progress[name] = progress_of(name, status)
            resources[name] = doc
        return resources, progress

    def save_unloads(
        self,
        resources: Mapping[str, Mapping[str, Any]],
        progress: Mapping[str, UnloadProgress],
        now: str,
    ) -> None:
        """Write every Unload document whose content changed; remove the ones not given."""
        for name, resource in resources.items():
            doc: dict[str, Any] = json.loads(json.dumps(resource))
            doc.pop("status", None)
            previous = self._unload_docs.get(name)
            state = progress.get(name)
            if state is not None:
                old_status = (previous or {}).get("status") or {}
                old_ready = next(
                    (c for c in old_status.get("conditions", []) if c.get("type") == "Ready"),
                    None,
                )
                observed = int(doc.get("metadata", {}).get("generation") or 1)
                doc["status"] = unload_status(state, observed, old_ready, now)
            if doc != previous:
                _write_atomic(_unload_file(self.root, name), doc)
                self._unload_docs[name] = doc
        for name in list(self._unload_docs):
            if name not in resources:
                _unload_file(self.root, name).unlink(missing_ok=True)
                del self._unload_docs[name]

    def unload_documents(self) -> list[dict[str, Any]]:
        """The Unload documents as last written (for ``/v1/state``)."""
        return [self._unload_docs[n] for n in sorted(self._unload_docs)]

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
        brokers = {int(b["id"]): BrokerEndpoint.from_json(b) for b in cluster.get("brokers", [])}
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
