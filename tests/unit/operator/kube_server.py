"""A Kubernetes API server for handler-level tests: kmock's emulator over real HTTP.

kmock (PyPI ``kmock``, by kopf's author) serves the Kubernetes API from memory on a
local port. The operator's own adapter (``ClientApi``: the official client's dynamic
client, discovery included) talks to it over HTTP, so a handler test covers the handler,
the adapter and the requests on the wire, and asserts on what the server received
(``server["put"]``, ``server[kmock.subresource("status")]``, ...) without a control plane.

kmock's ``KubernetesEmulator`` stores objects and serves get, list, watch, create, merge
patch and delete, "very simplistically" (its docstring). ``ApiServer`` adds the few API
server rules the operator relies on, as kmock's docs suggest (inherit and implement):

* a status ``PUT`` names a ``resourceVersion``: a stale one is refused with 409
  Conflict; otherwise it replaces the status only (spec and metadata stay) and the
  object gets a new ``resourceVersion``;
* a status write is announced to watches (kopf sees its own writes come back);
* a list says its ``kind`` (``PodList``) and ``apiVersion``, and keeps to its
  ``labelSelector`` (``key=value`` and ``key`` terms);
* a server-side apply (``PATCH`` as ``application/apply-patch+yaml``) of an object that
  does not exist creates it;
* every merge or apply patch moves the ``resourceVersion`` on, and a merge patch that
  names one is refused with 409 Conflict unless it is the current one (a fenced patch);
* ``put`` (the test's own write, as another client's) gives the object a new
  ``resourceVersion`` too.

A ``DELETE`` of an object with finalizers only marks it (``deletionTimestamp``), and a
patch that removes its last finalizer lets it go: kmock's own emulation of both.

Where a test wants the server to misbehave it declares a reaction, which comes before
these defaults (they are kmock fallbacks): ``server["put", kmock.subresource("status")]
<< kmock.KubernetesError(409, "Conflict")`` conflicts every status write.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock

from headrace.operator.kube import ClientApi

GROUP_VERSION = "headrace.dev/v1alpha1"
APPLY_PATCH = "application/apply-patch+yaml"

#: what discovery says about the kinds the operator reads and writes
RESOURCES: dict[str, kmock.ResourceInfo] = (
    {
        f"{GROUP_VERSION}/{plural}": kmock.ResourceInfo(
            kind=kind,
            namespaced=True,
            subresources={"status"},
            verbs={"get", "list", "watch", "patch", "update"},
        )
        for plural, kind in (
            ("brokerclusters", "BrokerCluster"),
            ("topics", "Topic"),
            ("unloads", "Unload"),
            ("repartitions", "Repartition"),
            ("users", "User"),
            ("topicsnapshots", "TopicSnapshot"),
            ("topicrestores", "TopicRestore"),
            ("topicsnapshotschedules", "TopicSnapshotSchedule"),
        )
    }
    | {
        resource: kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs={"get", "list", "create", "patch", "delete"}
        )
        for resource, kind in (
            ("v1/events", "Event"),
            ("v1/configmaps", "ConfigMap"),
            ("v1/secrets", "Secret"),
            ("v1/persistentvolumeclaims", "PersistentVolumeClaim"),
            ("v1/services", "Service"),
            ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget"),
        )
    }
    | {
        # watched as well: the loop's watch cache of the brokers' workload (``caching``)
        resource: kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}
        )
        for resource, kind in (
            ("v1/pods", "Pod"),
            ("apps/v1/statefulsets", "StatefulSet"),
            ("batch/v1/jobs", "Job"),
        )
    }
)

#: what kopf reads cluster-wide in every mode: namespaces, and CRDs (to follow resources)
RESOURCES |= {
    resource: kmock.ResourceInfo(kind=kind, namespaced=False, verbs={"get", "list", "watch"})
    for resource, kind in (
        ("v1/namespaces", "Namespace"),
        ("storage.k8s.io/v1/storageclasses", "StorageClass"),
        ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition"),
    )
}

_PLURALS = {info.kind: resource for resource, info in RESOURCES.items()}


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with compare-and-swap status writes and creating applies."""

    _version: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for resource, info in RESOURCES.items():
            self.resources[resource] = info
        self.objects["v1/namespaces", None, "ns"] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "ns"},
        }
        self.fallback["put", kmock.subresource("status")] << self._replace_status

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def put(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``body`` as another client's write would: with a new resourceVersion."""
        doc = copy.deepcopy(dict(body))
        doc.setdefault("metadata", {})["resourceVersion"] = self._next_version()
        meta = doc["metadata"]
        self.objects[_PLURALS[doc["kind"]], meta.get("namespace"), meta["name"]] = doc
        return copy.deepcopy(doc)

    def body(self, kind: str, name: str, namespace: str = "ns") -> dict[str, Any]:
        """The object as stored now (a copy)."""
        return copy.deepcopy(dict(self.objects[_PLURALS[kind], namespace, name].raw))

    async def _replace_status(self, request: kmock.Request) -> dict[str, Any]:
        assert request.resource is not None
        try:
            stored = self.objects[request.resource, request.namespace, request.name]
        except KeyError:
            raise kmock.KubernetesObjectNotFoundError() from None
        if stored.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        current = dict(stored.raw)
        sent = (request.data.get("metadata") or {}).get("resourceVersion")
        if sent is not None and sent != current["metadata"].get("resourceVersion"):
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message="the object has been modified; please apply your changes to the latest"
                " version and try again",
            )
        replaced = copy.deepcopy(current)
        replaced["status"] = copy.deepcopy(request.data.get("status"))
        replaced["metadata"]["resourceVersion"] = self._next_version()
        stored.history.append(replaced)
        await self._buses[request.resource].put({"type": "MODIFIED", "object": replaced})
        return replaced

    async def _serve_list(self, request: kmock.Request) -> Any:
        """The emulator's list, with the ``kind`` and ``apiVersion`` a list carries (the
        official client's dynamic client needs them)."""
        listing = await super()._serve_list(request)
        assert request.resource is not None
        info = self.resources[request.resource]
        group, version = request.resource.group, request.resource.version
        listing["apiVersion"] = f"{group}/{version}" if group else str(version)
        selector = request.params.get("labelSelector")
        if selector:
            listing["items"] = [i for i in listing["items"] if _selected(i, selector)]
        listing["kind"] = f"{info.kind}List"
        return listing

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        patched = (
            request.method == kmock.method.PATCH
            and request.resource is not None
            and request.name is not None
            and request.subresource is None
        )
        if not patched:
            return await super()._handle(request)
        key = (request.resource, request.namespace, request.name)
        try:
            stored: kmock.Object | None = self.objects[key]
        except KeyError:
            stored = None
        if stored is not None and stored.deleted:
            stored = None
        if request.headers.get("Content-Type", "").startswith(APPLY_PATCH):
            if stored is None:  # server-side apply creates; the emulator would say 404
                async with self._lock:
                    self.objects[key] = {
                        "apiVersion": request.data.get("apiVersion"),
                        "kind": request.data.get("kind"),
                        "metadata": {
                            "name": request.name,
                            "namespace": request.namespace,
                            # the API server gives every object it creates a uid
                            "uid": str(uuid.uuid4()),
                        },
                    }
        elif stored is not None and isinstance(request.data, Mapping):
            # a resourceVersion in a merge patch is a precondition (kopf's JSON patches,
            # lists of operations, name none)
            sent = (request.data.get("metadata") or {}).get("resourceVersion")
            if sent is not None and sent != stored.raw["metadata"].get("resourceVersion"):
                raise kmock.KubernetesError(status=409, reason="Conflict", message="modified")
        elif stored is not None and isinstance(request.data, list):
            # a JSON patch's failed ``test`` is 422, as the API server answers (kopf then
            # tries again on the object's next event; kmock would answer 500, which kopf
            # retries with the same stale test for a minute)
            current = stored.raw["metadata"].get("resourceVersion")
            for op in request.data:
                if (
                    isinstance(op, Mapping)
                    and op.get("op") == "test"
                    and op.get("path") == "/metadata/resourceVersion"
                    and op.get("value") != current
                ):
                    raise kmock.KubernetesError(
                        status=422, reason="Invalid", message="the test operation failed"
                    )
        response = await super()._handle(request)
        if not isinstance(request.data, Mapping):
            # kopf's JSON patches test the version they saw (``test`` operations) and kmock
            # applies them as they are: left at the version they name
            return response
        # every merge or apply patch moves the version on; watches see the object at its
        # new version (after the emulator's own event, which still carries the old one)
        moved = self.objects[key]
        if moved.deleted:
            return response  # the patch removed its last finalizer: kmock let it go, as the API server does
        moved.patch({"metadata": {"resourceVersion": self._next_version()}})
        assert request.resource is not None
        await self._buses[request.resource].put({"type": "MODIFIED", "object": moved.raw})
        return response


def _selected(item: Mapping[str, Any], selector: str) -> bool:
    """Whether ``item``'s labels match a selector of ``key=value`` and ``key`` terms."""
    labels = (item.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        key, equals, value = term.partition("=")
        if key not in labels or (equals and labels[key] != value):
            return False
    return True


def kubeconfig(server: kmock.RawHandler, directory: Path) -> Path:
    """A kubeconfig that points the official client at ``server``."""
    path = directory / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{str(server.url).rstrip('/')}'}}}}]\n"
        "users: [{name: kmock, user: {token: kmock}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: kmock}}]\n"
    )
    return path


async def client_of(server: kmock.RawHandler, directory: Path) -> ClientApi:
    """The operator's ``ClientApi`` over ``server``. Made in a thread: the dynamic client
    runs discovery in its constructor, and the server answers on this event loop."""
    return await asyncio.to_thread(ClientApi, str(kubeconfig(server, directory)))
