"""The one small Kubernetes API wrapper the operator writes through (an adapter).

Everything the operator reads or writes outside kopf's own watches goes
through ``KubeApi``: fetch an object, replace a status subresource under a
``resourceVersion`` precondition, server-side apply a workload manifest,
list pods, patch metadata. Handlers and the status store depend on the
``KubeApi`` protocol, so unit tests give them a fake (``tests/unit/operator``)
and never speak HTTP.

``ClientApi`` implements it with the official ``kubernetes`` client's dynamic
client. That client is synchronous, so each call runs in a worker thread
(``asyncio.to_thread``); the operator makes a handful of calls per second at
most, so the threads are not a bottleneck. Its exceptions are translated
here, at the edge: ``StaleResourceVersion`` for a 409, None for a 404.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

#: the field manager of every server-side apply, so `kubectl apply --server-side` by a
#: person never fights the operator over the fields it owns
FIELD_MANAGER = "headrace-operator"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Which object: enough to address it in the API."""

    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ObjectRef:
        meta = body["metadata"]
        return cls(body["apiVersion"], body["kind"], meta.get("namespace", "default"), meta["name"])


class KubeApiError(Exception):
    """The API server refused a request (other than the two outcomes callers expect).

    ``code``, ``reason`` and ``detail`` are the HTTP status and the API server's
    ``Status.reason`` (``Invalid``, ``Forbidden``) and ``Status.message``, when it said."""

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.detail = detail

    @classmethod
    def of(cls, what: str, exc: Any) -> KubeApiError:
        """``what`` refused, from the official client's ``ApiException`` ``exc``."""
        code = getattr(exc, "status", None)
        reason, detail = None, None
        try:
            status = json.loads(getattr(exc, "body", None) or "")
        except (TypeError, ValueError):
            status = None
        if isinstance(status, Mapping):
            reason = status.get("reason") if isinstance(status.get("reason"), str) else None
            detail = status.get("message") if isinstance(status.get("message"), str) else None
        summary = detail or getattr(exc, "reason", None) or "refused"
        return cls(f"{what}: {code} {reason or ''}: {summary}", code=code, reason=reason,
                   detail=detail)  # fmt: skip


class StaleResourceVersion(KubeApiError):
    """409 Conflict: the object changed since the ``resourceVersion`` the write named."""


class NotLeading(KubeApiError):
    """This replica does not hold the Lease (or has not renewed it within its deadline):
    it must not write."""


#: seconds: the longest one API call may take. A hung connection must not hold a step (or
#: the handler that waits for it) forever; the next step tries again
REQUEST_TIMEOUT_S = 30.0


class KubeApi(Protocol):
    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        ...

    async def replace_status(
        self, ref: ObjectRef, resource_version: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """PUT the status subresource if the object is still at ``resource_version``.

        Returns the object as stored (with its new ``resourceVersion``), None if it is
        gone; raises ``StaleResourceVersion`` if it changed meanwhile. The spec is never
        written: the status subresource ignores it.
        """
        ...

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        """Server-side apply ``manifest`` as ``FIELD_MANAGER`` (create or update)."""
        ...

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create ``manifest``'s object if none of its name exists: True if this call made
        it, False if one was there already, which is left exactly as it is (no field of
        it becomes the operator's, unlike an ``apply``)."""
        ...

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str = ""
    ) -> list[dict[str, Any]]: ...

    async def patch_metadata(self, ref: ObjectRef, patch: Mapping[str, Any]) -> None:
        """JSON merge patch of ``metadata`` (finalizers, annotations); a gone object is fine."""
        ...

    async def delete(self, ref: ObjectRef, *, orphan: bool = False) -> None:
        """Delete the object (a pod of a rolling restart); a gone object is fine.
        ``orphan``: its dependents stay (a StatefulSet's pods, while it is replaced)."""
        ...


def api_client(kubeconfig: str | None = None) -> Any:
    """An official-client ``ApiClient``: from ``kubeconfig`` (or KUBECONFIG / ~/.kube) or,
    in a pod with neither, the in-cluster service account. Every client of the operator
    comes from here, so a pod never needs a kubeconfig file."""
    import kubernetes

    # the official client is only partly typed: handle it as untyped
    k8s: Any = kubernetes
    if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
        k8s.config.load_incluster_config()
        return k8s.client.ApiClient()
    return k8s.config.new_client_from_config(config_file=kubeconfig)


class ClientApi:
    """``KubeApi`` over the official client's dynamic client (configured from KUBECONFIG or
    the in-cluster service account)."""

    def __init__(
        self, kubeconfig: str | None = None, request_timeout_s: float = REQUEST_TIMEOUT_S
    ) -> None:
        import kubernetes

        k8s: Any = kubernetes
        self._dynamic: Any = k8s.dynamic.DynamicClient(api_client(kubeconfig))
        self._timeout = request_timeout_s

    def _resource(self, api_version: str, kind: str) -> Any:
        return self._dynamic.resources.get(api_version=api_version, kind=kind)

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        from kubernetes.dynamic import exceptions

        def call() -> dict[str, Any] | None:
            try:
                found = self._resource(ref.api_version, ref.kind).get(
                    name=ref.name, namespace=ref.namespace, _request_timeout=self._timeout
                )
            except exceptions.NotFoundError:
                return None
            except exceptions.DynamicApiError as exc:  # a 403 above all: translated here
                raise KubeApiError.of(f"get {ref.kind} {ref.namespace}/{ref.name}", exc) from exc
            return found.to_dict()  # type: ignore[no-any-return]

        return await asyncio.to_thread(call)

    async def replace_status(
        self, ref: ObjectRef, resource_version: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        from kubernetes.dynamic import exceptions

        body = {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "metadata": {
                "name": ref.name,
                "namespace": ref.namespace,
                "resourceVersion": resource_version,
            },
            "status": dict(status),
        }

        def call() -> dict[str, Any] | None:
            resource = self._resource(ref.api_version, ref.kind)
            try:
                stored = resource.status.replace(
                    body=body, namespace=ref.namespace, _request_timeout=self._timeout
                )
            except exceptions.NotFoundError:
                return None
            except exceptions.ConflictError as exc:
                raise StaleResourceVersion(f"{ref.kind} {ref.namespace}/{ref.name}") from exc
            except exceptions.DynamicApiError as exc:
                raise KubeApiError(
                    f"status of {ref.kind} {ref.namespace}/{ref.name}: {exc}"
                ) from exc
            return stored.to_dict()  # type: ignore[no-any-return]

        return await asyncio.to_thread(call)

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        from kubernetes.dynamic import exceptions

        def call() -> None:
            resource = self._resource(manifest["apiVersion"], manifest["kind"])
            meta = manifest["metadata"]
            try:
                self._dynamic.server_side_apply(
                    resource,
                    body=dict(manifest),
                    name=meta["name"],
                    namespace=meta.get("namespace"),
                    field_manager=FIELD_MANAGER,
                    force_conflicts=True,
                    _request_timeout=self._timeout,
                )
            except exceptions.DynamicApiError as exc:
                raise KubeApiError.of(f"apply {manifest['kind']} {meta['name']}", exc) from exc

        await asyncio.to_thread(call)

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        from kubernetes.dynamic import exceptions

        def call() -> bool:
            resource = self._resource(manifest["apiVersion"], manifest["kind"])
            meta = manifest["metadata"]
            try:
                resource.create(
                    body=dict(manifest),
                    namespace=meta.get("namespace"),
                    field_manager=FIELD_MANAGER,
                    _request_timeout=self._timeout,
                )
            except exceptions.ConflictError:  # AlreadyExists
                return False
            except exceptions.DynamicApiError as exc:
                raise KubeApiError.of(f"create {manifest['kind']} {meta['name']}", exc) from exc
            return True

        return await asyncio.to_thread(call)

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        def call() -> list[dict[str, Any]]:
            found = self._resource(api_version, kind).get(
                namespace=namespace,
                label_selector=label_selector or None,
                _request_timeout=self._timeout,
            )
            return [item.to_dict() for item in found.items]

        return await asyncio.to_thread(call)

    async def patch_metadata(self, ref: ObjectRef, patch: Mapping[str, Any]) -> None:
        from kubernetes.dynamic import exceptions

        def call() -> None:
            try:
                self._resource(ref.api_version, ref.kind).patch(
                    body={"metadata": dict(patch)},
                    name=ref.name,
                    namespace=ref.namespace,
                    content_type="application/merge-patch+json",
                    _request_timeout=self._timeout,
                )
            except exceptions.NotFoundError:
                return
            except exceptions.ConflictError as exc:  # a resourceVersion in the patch: fenced
                raise StaleResourceVersion(f"{ref.kind} {ref.namespace}/{ref.name}") from exc
            except exceptions.DynamicApiError as exc:
                raise KubeApiError(
                    f"metadata of {ref.kind} {ref.namespace}/{ref.name}: {exc}"
                ) from exc

        await asyncio.to_thread(call)

    async def delete(self, ref: ObjectRef, *, orphan: bool = False) -> None:
        from kubernetes.dynamic import exceptions

        def call() -> None:
            try:
                self._resource(ref.api_version, ref.kind).delete(
                    name=ref.name,
                    namespace=ref.namespace,
                    body={"propagationPolicy": "Orphan"} if orphan else None,
                    _request_timeout=self._timeout,
                )
            except exceptions.NotFoundError:
                return
            except exceptions.DynamicApiError as exc:
                raise KubeApiError(f"delete {ref.kind} {ref.namespace}/{ref.name}: {exc}") from exc

        await asyncio.to_thread(call)


class FencedApi:
    """A ``KubeApi`` that writes only while ``leading()`` says this replica leads.

    Reads pass through. Every write first asks ``leading`` (the Lease elector's: a
    renewal within its deadline, by this process's monotonic clock) and raises
    ``NotLeading`` instead of writing when it does not. A replica paused past its
    deadline (SIGSTOP, a frozen VM) thus writes nothing when it wakes, even before its
    renewal thread has found the Lease taken."""

    def __init__(self, inner: KubeApi, leading: Callable[[], bool]) -> None:
        self.inner = inner
        self._leading = leading

    def _check(self, what: str) -> None:
        if not self._leading():
            raise NotLeading(f"{what}: this replica does not hold the Lease")

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        return await self.inner.get(ref)

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        return await self.inner.list(api_version, kind, namespace, label_selector)

    async def replace_status(
        self, ref: ObjectRef, resource_version: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        self._check(f"status of {ref.kind} {ref.namespace}/{ref.name}")
        return await self.inner.replace_status(ref, resource_version, status)

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        self._check(f"apply {manifest['kind']} {manifest['metadata']['name']}")
        await self.inner.apply(manifest)

    async def create(self, manifest: Mapping[str, Any]) -> bool:
        self._check(f"create {manifest['kind']} {manifest['metadata']['name']}")
        return await self.inner.create(manifest)

    async def patch_metadata(self, ref: ObjectRef, patch: Mapping[str, Any]) -> None:
        self._check(f"metadata of {ref.kind} {ref.namespace}/{ref.name}")
        await self.inner.patch_metadata(ref, patch)

    async def delete(self, ref: ObjectRef, *, orphan: bool = False) -> None:
        self._check(f"delete {ref.kind} {ref.namespace}/{ref.name}")
        await self.inner.delete(ref, orphan=orphan)
