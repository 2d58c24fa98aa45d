"""The control loop's documents as custom resource status (a ``StatusStore``).

The local controller keeps its documents in files (``headrace.controller.store``);
the operator keeps the same documents in the status subresource of the
custom resources: each Topic's status, the BrokerCluster's status (the
cluster document, the commit record) and each Unload's and Repartition's status. The spec is
never written: every write is a PUT of ``/status``.

Compare-and-swap
----------------
kopf's peering (or a Lease) decides which replica is active, but neither is a
fence: a replica that lost its lease can still have a write in flight. So
every status write names the ``resourceVersion`` the store last saw for that
object, and the API server refuses it (409) if the object changed since. On
a conflict the store re-reads the object and tries again with the fresh
version, unless what it read is a *newer* commit than the one being written
(a higher ``topologyGeneration``): then another controller is ahead, and the
write fails with ``Superseded`` instead of rolling the cluster back. The same
holds for a BrokerCluster commit (the cluster document, which carries the
generation) at the *same* generation that differs from the one this store last
wrote or loaded: another controller committed it, and overwriting it would let
two controllers take turns. ``Superseded`` ends the control loop's run;
kopf starts it again, and the new run loads what is stored.

A watch event can deliver an object older than the store's own last write
(the index lags). ``remember`` ignores a version it has already seen, so the
store never moves back to it and pays a 409 for nothing.

No-op writes
------------
The store remembers the status it last wrote (or loaded) for each object and
makes no API call at all when asked to write the same document again, so an
idle cluster costs no writes (the loop itself already skips most; this is the
second line, and the one unit tests pin down).

The BrokerCluster status has two writers in one process: the control loop
(the cluster document) and the workload reconciler (its ``conditions`` and
``observedGeneration``, see ``handlers``). The store owns the merge: each
writes its part and the object gets both.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from headrace.control.documents import full_name
from headrace.control.looping import Stored
from headrace.operator.kube import KubeApi, KubeApiError, ObjectRef, StaleResourceVersion
from headrace.resources import API_VERSION

log = logging.getLogger(__name__)

#: conflicts in a row after which a write gives up (the next step tries again)
MAX_CONFLICTS: Final = 5
#: versions remembered per object to recognise a stale watch event (see the module)
SEEN_VERSIONS: Final = 64

#: the BrokerCluster status fields the workload reconciler owns, not the control loop
WORKLOAD_FIELDS: Final = ("conditions", "observedGeneration")
#: Topic condition types the operator adds beside the loop's Ready (``set_topic_conditions``)
OPERATOR_CONDITIONS: Final = frozenset({"Paused", "Stalled"})


class Superseded(KubeApiError):
    """The stored status is from a newer commit than the one being written: another
    controller is active. The loop must not overwrite it."""


@dataclass(frozen=True, slots=True)
class Known:
    """An object's status as this store last wrote or read it, and at which version."""

    resource_version: str
    status: Mapping[str, Any]


def _generation(status: Mapping[str, Any] | None) -> int:
    value = (status or {}).get("topologyGeneration")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _commit(status: Mapping[str, Any]) -> dict[str, Any]:
    """The control loop's commit in a BrokerCluster status: all but the workload fields."""
    return {k: v for k, v in status.items() if k not in WORKLOAD_FIELDS}


class KubeStatusStore:
    """The documents of one BrokerCluster and its Topics and Unloads; a ``StatusStore``."""

    def __init__(
        self,
        api: KubeApi,
        cluster: Mapping[str, Any],
        topics: Iterable[Mapping[str, Any]] = (),
        unloads: Iterable[Mapping[str, Any]] = (),
        *,
        finalizer: str | None = None,
        repartitions: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """``cluster``, ``topics``, ``unloads``, ``repartitions``: the objects as the watch
        last delivered them (metadata, spec, status); ``finalizer``: the one
        ``release_unload`` removes."""
        self.api = api
        self.finalizer = finalizer
        self.cluster_ref = ObjectRef.of(cluster)
        self._known: dict[ObjectRef, Known] = {}
        #: the versions of each object seen so far, newest last (``remember``)
        self._seen: dict[ObjectRef, deque[str]] = {}
        #: the status of each object as this store loaded or last wrote it
        self._ours: dict[ObjectRef, dict[str, Any]] = {}
        self._topics = {full_name(t): dict(t) for t in topics}
        self._unloads = {full_name(u): dict(u) for u in unloads}
        self._repartitions = {full_name(r): dict(r) for r in repartitions}
        for body in (
            cluster,
            *self._topics.values(),
            *self._unloads.values(),
            *self._repartitions.values(),
        ):
            self.remember(body)
        self._ours = {ref: dict(known.status) for ref, known in self._known.items()}
        status = dict(cluster.get("status") or {})
        self._workload = {k: status.pop(k) for k in WORKLOAD_FIELDS if k in status}
        self._cluster_doc: dict[str, Any] | None = status or None
        #: the operator's own conditions of each Topic (``OPERATOR_CONDITIONS``)
        self._topic_conditions: dict[str, list[dict[str, Any]]] = {}
        #: API calls that wrote (for tests, the idle-writes figure and /metrics)
        self.writes = 0
        #: status writes refused with 409 (for /metrics)
        self.conflicts = 0

    def remember(self, body: Mapping[str, Any]) -> None:
        """Take ``body``'s version and status as the latest known (a watch event, a read)."""
        version = body.get("metadata", {}).get("resourceVersion")
        if version is None:
            return
        ref = ObjectRef.of(body)
        if not self._saw(ref, str(version)):
            return  # a version seen before: older than what the store knows now
        self._known[ref] = Known(str(version), dict(body.get("status") or {}))

    def _saw(self, ref: ObjectRef, version: str) -> bool:
        """Note ``version`` of ``ref``; False if it was seen before (resourceVersions are
        opaque, so "seen" is the only order the store relies on)."""
        seen = self._seen.setdefault(ref, deque(maxlen=SEEN_VERSIONS))
        if version in seen:
            return False
        seen.append(version)
        return True

    # ------------------------------------------------------------------ StatusStore

    def load(self) -> Stored:
        return Stored(self._cluster_doc, self._topics, self._unloads, self._repartitions)

    async def write_topic_status(self, name: str, status: Mapping[str, Any]) -> None:
        await self._write(self._ref("Topic", name), self._with_conditions(name, status))

    def topic_status(self, name: str) -> Mapping[str, Any] | None:
        """The Topic's status as last written or read."""
        known = self._known.get(self._ref("Topic", name))
        return known.status if known is not None else None

    async def set_topic_conditions(self, name: str, conditions: list[dict[str, Any]]) -> None:
        """The operator's own conditions of a Topic (e.g. ``Paused``), kept beside the loop's
        in every status written from now on, and written now if they changed."""
        if self._topic_conditions.get(name, []) == conditions:
            return
        self._topic_conditions[name] = conditions
        known = self.topic_status(name)
        if known is not None:
            await self._write(self._ref("Topic", name), self._with_conditions(name, known))

    def _with_conditions(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        own = self._topic_conditions.get(name, [])
        if not own and "conditions" not in status:
            return dict(status)
        kept = [
            c for c in status.get("conditions") or [] if c.get("type") not in OPERATOR_CONDITIONS
        ]
        return {**status, "conditions": [*kept, *own]}

    async def write_unload_status(self, name: str, status: Mapping[str, Any]) -> None:
        await self._write(self._ref("Unload", name), status)

    async def write_repartition_status(self, name: str, status: Mapping[str, Any]) -> None:
        await self._write(self._ref("Repartition", name), status)

    async def write_cluster_status(self, status: Mapping[str, Any]) -> None:
        self._cluster_doc = dict(status)
        await self._write(self.cluster_ref, {**status, **self._workload})

    async def write_workload_status(self, fields: Mapping[str, Any]) -> None:
        """The workload reconciler's part of the BrokerCluster status (``WORKLOAD_FIELDS``)."""
        self._workload = {k: fields[k] for k in WORKLOAD_FIELDS if k in fields}
        await self._write(self.cluster_ref, {**(self._cluster_doc or {}), **self._workload})

    def workload_conditions(self) -> list[dict[str, Any]]:
        """The BrokerCluster's conditions as last written or loaded."""
        return list(self._workload.get("conditions") or [])

    async def release_unload(self, name: str) -> None:
        ref = self._ref("Unload", name)
        body = await self.api.get(ref)
        finalizers = list((body or {}).get("metadata", {}).get("finalizers") or [])
        if body is not None and self.finalizer in finalizers:
            finalizers.remove(self.finalizer)
            await self.api.patch_metadata(ref, {"finalizers": finalizers})
            self.writes += 1
        self._known.pop(ref, None)

    # ------------------------------------------------------------------ compare-and-swap

    @staticmethod
    def _ref(kind: str, name: str) -> ObjectRef:
        namespace, _, short = name.partition("/")
        return ObjectRef(API_VERSION, kind, namespace, short)

    def _refuse_if_superseded(
        self, ref: ObjectRef, stored: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
        """Raise ``Superseded`` if ``stored`` (the object's status as last seen) is a newer
        commit than ``status``, or one at the same generation that this store did not
        write: another controller is active."""
        if _generation(stored) > _generation(status):
            raise Superseded(
                f"{ref.kind} {ref.namespace}/{ref.name} holds topology generation"
                f" {_generation(stored)}, newer than {_generation(status)}"
            )
        ours = self._ours.get(ref)
        if (
            ref == self.cluster_ref
            and ours is not None
            and _generation(stored) == _generation(status)
            and _commit(stored) != _commit(ours)
        ):
            raise Superseded(
                f"{ref.kind} {ref.namespace}/{ref.name}: another controller committed topology"
                f" generation {_generation(status)}"
            )

    async def _write(self, ref: ObjectRef, status: Mapping[str, Any]) -> None:
        """Replace ``ref``'s status with ``status`` unless it already is; see the module."""
        status = dict(status)
        known = self._known.get(ref)
        if known is not None and known.status == status:
            return  # no-op: no API call
        for _ in range(MAX_CONFLICTS):
            if known is None:
                body = await self.api.get(ref)
                if body is None:
                    return  # deleted meanwhile: its status went with it
                # read just now, so the newest there is, even if a watch event showed it first
                version = str(body.get("metadata", {}).get("resourceVersion"))
                self._saw(ref, version)
                known = self._known[ref] = Known(version, dict(body.get("status") or {}))
                if known.status == status:
                    return
            self._refuse_if_superseded(ref, known.status, status)
            try:
                stored = await self.api.replace_status(ref, known.resource_version, status)
            except StaleResourceVersion:
                self.conflicts += 1
                log.info(
                    "%s %s/%s changed meanwhile: re-reading", ref.kind, ref.namespace, ref.name
                )
                self._known.pop(ref, None)
                known = None
                continue
            self.writes += 1
            if stored is None:
                self._known.pop(ref, None)
                return
            version = str(stored.get("metadata", {}).get("resourceVersion"))
            self._saw(ref, version)
            self._known[ref] = Known(version, status)
            self._ours[ref] = status
            return
        raise KubeApiError(
            f"{ref.kind} {ref.namespace}/{ref.name}: {MAX_CONFLICTS} conflicts in a row"
        )
