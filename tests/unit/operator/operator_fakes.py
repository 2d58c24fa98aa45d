"""A fake ``KubeApi``: objects in a dict, resourceVersions that move, every write recorded.

The runtime and surfaces tests use it: they step the control loop many times under a
manual clock and check its decisions, not the API on the wire. The handler and status
store tests speak HTTP to kmock's emulator instead (``kube_server``).

It behaves as the API server does where the operator depends on it: a status
PUT names a ``resourceVersion`` and gets a conflict if the object moved on; it
replaces the status and leaves the spec alone; every write bumps the version.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from headrace.operator import handlers
from headrace.operator.kube import KubeApi, ObjectRef, StaleResourceVersion
from tests.unit.controller.controller_fakes import ManualClock

CLUSTER = {
    "apiVersion": "headrace.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "demo", "namespace": "ns", "uid": "uid-1", "generation": 1},
    "spec": {"replicas": 3},
}


def topic(
    name: str = "orders", partitions: int = 2, generation: int = 1, replicas: int = 3
) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name, "namespace": "ns", "generation": generation},
        "spec": {"clusterRef": {"name": "demo"}, "partitions": partitions, "replicas": replicas},
    }


def _merge_patch(value: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(value)
    for key, change in patch.items():
        if change is None:
            merged.pop(key, None)
        elif isinstance(change, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge_patch(merged[key], change)
        else:
            merged[key] = copy.deepcopy(change)
    return merged


class FakeApi:
    def __init__(self, *objects: Mapping[str, Any]) -> None:
        self.objects: dict[ObjectRef, dict[str, Any]] = {}
        self.version = 0
        #: (verb, kind, name) of every request that writes, conflicts included
        self.writes: list[tuple[str, str, str]] = []
        self.reads = 0
        self.applied: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []
        for obj in objects:
            self.put(obj)

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as a client's write would (a new resourceVersion)."""
        self.version += 1
        doc = copy.deepcopy(dict(obj))
        doc.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[ObjectRef.of(doc)] = doc
        return copy.deepcopy(doc)

    def body(self, kind: str, name: str, namespace: str = "ns") -> dict[str, Any]:
        return copy.deepcopy(
            self.objects[ObjectRef("headrace.dev/v1alpha1", kind, namespace, name)]
        )

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        self.reads += 1
        found = self.objects.get(ref)
        return copy.deepcopy(found) if found is not None else None

    async def replace_status(
        self, ref: ObjectRef, resource_version: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        self.writes.append(("PUT status", ref.kind, ref.name))
        found = self.objects.get(ref)
        if found is None:
            return None
        if found["metadata"]["resourceVersion"] != resource_version:
            raise StaleResourceVersion(f"{ref.kind} {ref.name}")
        return self.put({**found, "status": copy.deepcopy(dict(status))})

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        self.writes.append(("APPLY", manifest["kind"], manifest["metadata"]["name"]))
        self.applied.append(copy.deepcopy(dict(manifest)))

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        self.writes.append(("CREATE", manifest["kind"], manifest["metadata"]["name"]))
        if ObjectRef.of(manifest) in self.objects:
            return False
        self.put(manifest)
        return True

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        self.reads += 1
        return copy.deepcopy(self.pods) if kind == "Pod" else []

    async def patch_metadata(self, ref: ObjectRef, patch: Mapping[str, Any]) -> None:
        self.writes.append(("PATCH metadata", ref.kind, ref.name))
        found = self.objects.get(ref)
        if found is not None:  # a JSON merge patch (RFC 7386): None removes a key
            self.put({**found, "metadata": _merge_patch(found["metadata"], patch)})

    async def delete(self, ref: ObjectRef, *, orphan: bool = False) -> None:
        self.writes.append(("DELETE", ref.kind, ref.name))
        self.objects.pop(ref, None)
        self.pods = [p for p in self.pods if p["metadata"]["name"] != ref.name]


@dataclass(frozen=True, slots=True)
class PostedEvent:
    """An Event a handler posted: on which object (kind, name), of which type and reason."""

    kind: str
    name: str
    type: str
    reason: str
    message: str


def memo_over(api: KubeApi) -> Any:
    """kopf's ``memo`` for a handler called directly: an ``OperatorContext`` over ``api``;
    the Events its handlers post land in ``memo.events``."""
    events: list[PostedEvent] = []

    def post(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        events.append(PostedEvent(body["kind"], body["metadata"]["name"], kind, reason, message))

    context = handlers.OperatorContext(api=api, clock=ManualClock(), post_event=post)
    return SimpleNamespace(context=context, events=events)
