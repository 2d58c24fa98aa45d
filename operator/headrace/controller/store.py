"""The local state store: the controller's documents as files (a ``StatusStore``).

Local mode keeps in a directory what Kubernetes keeps in custom resources:

    <dir>/topics/<namespace>.<name>.json   a Topic resource: apiVersion, kind,
                                           metadata, spec (as applied) and status
                                           (``documents.topic_status``)
    <dir>/cluster.json                     the cluster document, the commit record:
                                           a BrokerCluster status (topologyGeneration,
                                           topics, brokers; ``documents.cluster_status``)
    <dir>/repartitions/<ns>.<name>.json    a Repartition resource: spec as applied, status
                                           (the core's RepartitionProgress, RepartitionStatus
                                           shape)
    <dir>/unloads/<namespace>.<name>.json  an Unload resource: apiVersion, kind, metadata,
                                           spec (as applied) and status (the control core's
                                           UnloadProgress, in the UnloadStatus shape)
    <dir>/topicsnapshots/<ns>.<name>.json  a TopicSnapshot, TopicRestore or
    <dir>/topicrestores/...                TopicSnapshotSchedule: metadata, spec as applied
    <dir>/topicsnapshotschedules/...       and status in the operator's status models
                                           (``resources.snapshots``); ``apply -f`` writes
                                           the first two as it runs them, the controller's
                                           schedules (``controller.schedules``) the third

The directory plays both parts Kubernetes splits: the API server's (``put_*``
and ``remove_*``: what ``apply`` and ``delete`` change, spec and metadata) and
the status subresource's (``write_*``: what the control loop decides). Each
write replaces one file atomically (``headrace.files``: temp file, fsync, rename), so a
controller killed mid-write leaves the previous document; the loop orders
the writes so that a kill between two of them is recovered (see
``headrace.control.documents``). An Unload document is the CR Kubernetes
would hold: it validates as ``headrace.resources.operations.Unload``, and an
Unload deleted while moving carries ``metadata.deletionTimestamp`` until its
moves finish, as a finalizer would keep it. A Topic document is likewise the
CR Kubernetes would hold, whole (see ``documents``), and ``admitted`` keeps
its ``metadata.generation`` as the API server keeps it (1 at creation, bumped
on every spec change), so that ``status.observedGeneration`` says which spec
the controller has acted on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headrace import files
from headrace.control.documents import full_name, generation_of
from headrace.control.looping import Stored


def _write_atomic(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json_atomic(path, doc, indent=2, sort_keys=True)


def admitted(
    resource: Mapping[str, Any], previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any]:
    """``resource`` as the API server would store it over ``previous`` (None: a new object).

    ``metadata.generation`` is 1 at creation and bumped by one when the spec changes;
    ``creationTimestamp`` is set at creation and kept; ``uid`` (a new one for every
    object, so a Topic deleted and applied again is another incarnation: the prefix of
    its objects, ``tiered.layout``) is given at creation and kept. Whatever the caller put
    in these is ignored, as the API server ignores it. The status is not the caller's
    to set.
    """
    doc: dict[str, Any] = json.loads(json.dumps(resource))
    doc.pop("status", None)
    meta = doc.setdefault("metadata", {})
    meta.setdefault("namespace", "default")
    kept_uid = (previous or {}).get("metadata", {}).get("uid")
    meta["uid"] = str(kept_uid) if kept_uid else str(uuid.uuid4())
    if previous is None:
        meta["generation"] = 1
        meta["creationTimestamp"] = now
        return doc
    generation = generation_of(previous)
    meta["generation"] = generation if doc.get("spec") == previous.get("spec") else generation + 1
    meta["creationTimestamp"] = previous.get("metadata", {}).get("creationTimestamp", now)
    return doc


#: the snapshot kinds' folders (their plural names)
SNAPSHOTS = "topicsnapshots"
RESTORES = "topicrestores"
SCHEDULES = "topicsnapshotschedules"


def _file(root: Path, kind: str, name: str) -> Path:
    return root / kind / (name.replace("/", ".") + ".json")


class FileStore:
    """The documents of one local cluster, one file each; a ``StatusStore``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def load(self) -> Stored:
        docs: dict[str, dict[str, dict[str, Any]]] = {
            "topics": {},
            "unloads": {},
            "repartitions": {},
        }
        for kind, found in docs.items():
            for path in sorted((self.root / kind).glob("*.json")):
                doc = json.loads(path.read_text())
                found[full_name(doc)] = doc
        cluster_file = self.root / "cluster.json"
        cluster = json.loads(cluster_file.read_text()) if cluster_file.exists() else None
        return Stored(cluster, docs["topics"], docs["unloads"], docs["repartitions"])

    # ------------------------------------------------------------------ spec and metadata

    def put(self, kind: str, resource: Mapping[str, Any]) -> None:
        """Create or replace a resource's spec and metadata; its status is kept."""
        name = full_name(resource)
        doc: dict[str, Any] = json.loads(json.dumps(resource))
        doc.pop("status", None)
        try:
            status = json.loads(_file(self.root, kind, name).read_text()).get("status")
        except FileNotFoundError:
            status = None
        if status is not None:
            doc["status"] = status
        self._write(kind, name, doc)

    def remove(self, kind: str, name: str) -> None:
        """Delete a resource (and its status with it)."""
        _file(self.root, kind, name).unlink(missing_ok=True)

    def document(self, kind: str, name: str) -> dict[str, Any] | None:
        """The resource ``name`` ('namespace/name') of ``kind`` (a folder), None if absent."""
        try:
            doc: dict[str, Any] = json.loads(_file(self.root, kind, name).read_text())
        except FileNotFoundError:
            return None
        return doc

    def documents(self, kind: str) -> list[dict[str, Any]]:
        """Every resource of ``kind``, by name."""
        found = []
        for path in sorted((self.root / kind).glob("*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except FileNotFoundError:
                continue  # deleted between the listing and the read
        return found

    def write_status(self, kind: str, name: str, status: Mapping[str, Any]) -> None:
        """Replace a resource's status (none is written for one deleted meanwhile)."""
        self._write_status(kind, name, status)

    # ------------------------------------------------------------------ status (StatusStore)

    async def write_topic_status(self, name: str, status: Mapping[str, Any]) -> None:
        self._write_status("topics", name, status)

    async def write_unload_status(self, name: str, status: Mapping[str, Any]) -> None:
        self._write_status("unloads", name, status)

    async def write_cluster_status(self, status: Mapping[str, Any]) -> None:
        _write_atomic(self.root / "cluster.json", status)

    async def release_unload(self, name: str) -> None:
        self.remove("unloads", name)

    async def write_repartition_status(self, name: str, status: Mapping[str, Any]) -> None:
        self._write_status("repartitions", name, status)

    def _write_status(self, kind: str, name: str, status: Mapping[str, Any]) -> None:
        # The file is the resource as last applied (by this process or another): patch it.
        try:
            resource = json.loads(_file(self.root, kind, name).read_text())
        except FileNotFoundError:
            return  # deleted meanwhile: its status went with it
        self._write(kind, name, {**resource, "status": json.loads(json.dumps(status))})

    def _write(self, kind: str, name: str, doc: dict[str, Any]) -> None:
        _write_atomic(_file(self.root, kind, name), doc)
