"""A cluster's pods and StatefulSet from the watch cache, never older than acted on.

Every step of a cluster's loop needs its broker pods (their IPs, readiness, revision)
and its StatefulSet (the update revision, the replica count). Listing and reading them
on every step cost two API calls per step, about 20 per second per cluster during a
transition's fast polling. kopf's watches already deliver every change of them to two
indices (``handlers.pods_index``, ``handlers.statefulsets_index``); ``WorkloadReads``
serves a step from those (``Watched``), so an idle or transitioning loop makes no list
and no get of its own.

A watch cache lags, and may even go back in time (a relist from an API server
that is behind another). What must never happen is a step acting on a state of an
object older than one it has already acted on or seen: deleting a pod again that it
deleted a moment ago, or taking a StatefulSet's old ``updateRevision`` for the
current one and restarting pods that run the new one. ``resourceVersion`` is
opaque (compared for equality, never ordered), so ``Versions`` (pure) keeps, per
object (its ``uid``):

* the states known to be past: those the cache showed before another (a watch
  delivers one object's changes in order), those an API read superseded, and
  those the operator acted on (deleting a pod makes a new state of it, or none);
* after an API read, the state the cache must show before its view of the
  object is trusted again (a state the operator never saw may be older);

and two orders that do not need ``resourceVersion``: a pod the operator deleted
never shows again without its ``deletionTimestamp``, and a StatefulSet's
``metadata.generation`` and ``status.observedGeneration`` never go down. A cached
view that breaks any of these is stale, and the step reads the API server instead
(one list or get: a quorum read, as fresh as it gets), which also tells
``Versions`` what is current.

Without a watch (``watched`` None: tests, or a runtime started outside kopf) every
read goes to the API server, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.operator import workloads
from headrace.operator.kube import KubeApi, ObjectRef

#: how many past states of one object are remembered (pods and StatefulSets change a
#: handful of times per restart; a longer history only ever catches older relists)
PAST_STATES: Final = 32
#: how many acted-on objects are remembered past their absence (pods deleted by rolling
#: restarts; a stale view of one older than this many restarts ago is not caught)
ACTED_OBJECTS: Final = 256


@dataclass(frozen=True, slots=True)
class Watched:
    """A cluster's workload as the watches last delivered it."""

    pods: tuple[Mapping[str, Any], ...] = ()
    #: None: no StatefulSet delivered (not created yet, or deleted)
    statefulset: Mapping[str, Any] | None = None


def _generations(body: Mapping[str, Any]) -> tuple[int, int]:
    """(metadata.generation, status.observedGeneration): both only ever go up."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    return int(meta.get("generation") or 0), int(status.get("observedGeneration") or 0)


def _went_back(now: tuple[int, int], highest: tuple[int, int]) -> bool:
    return now[0] < highest[0] or now[1] < highest[1]


def _identity(body: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = body.get("metadata") or {}
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if not uid or not version:
        return None
    return str(uid), str(version)


@dataclass
class Versions:
    """The states of each object (by uid) known to be past (pure; see the module)."""

    #: uid -> the resourceVersion last taken as current
    current: dict[str, str] = field(default_factory=dict)
    #: uid -> resourceVersions that are past (oldest first)
    past: dict[str, list[str]] = field(default_factory=dict)
    #: uids whose past must outlive their absence (the operator acted on them: a stale
    #: view may still show them after they are gone); such a pod was deleted
    acted: set[str] = field(default_factory=set)
    #: uid -> the state an API read found, until the cache shows it too
    floors: dict[str, str] = field(default_factory=dict)
    #: uids an API read found gone: a view still showing one is stale
    gone: set[str] = field(default_factory=set)
    #: uid -> the highest (generation, observedGeneration) seen (StatefulSets)
    generations: dict[str, tuple[int, int]] = field(default_factory=dict)
    _acted_order: list[str] = field(default_factory=list)

    def stale(self, bodies: Iterable[Mapping[str, Any]]) -> bool:
        """Whether any of ``bodies`` is a state known to be past (see the module)."""
        for body in bodies:
            ident = _identity(body)
            if ident is None:
                continue
            uid, version = ident
            floor = self.floors.get(uid)
            if (
                version in self.past.get(uid, ())
                or (floor is not None and version != floor)
                or uid in self.gone
                or (uid in self.acted and not (body.get("metadata") or {}).get("deletionTimestamp"))
                or _went_back(_generations(body), self.generations.get(uid, (0, 0)))
            ):
                return True
        return False

    def take(self, bodies: Iterable[Mapping[str, Any]], *, read: bool = False) -> None:
        """``bodies`` are the current states, every object of their kind the view covers
        (one absent is gone). ``read``: they come from the API server, not the cache: the
        cache must show these states before it is trusted again, and what it showed of an
        object now absent is past for good."""
        seen = set()
        for body in bodies:
            ident = _identity(body)
            if ident is None:
                continue
            uid, version = ident
            seen.add(uid)
            before = self.current.get(uid)
            if before is not None and before != version:
                self._pass(uid, before)
            self.current[uid] = version
            highest = self.generations.get(uid, (0, 0))
            now = _generations(body)
            self.generations[uid] = (max(highest[0], now[0]), max(highest[1], now[1]))
            if read:
                self.floors[uid] = version
            elif self.floors.get(uid) == version:
                del self.floors[uid]
        if read:
            self.gone |= set(self.current) - seen
            self.gone -= seen
            for uid in set(self.floors) - seen:
                del self.floors[uid]
        if not read:
            # a view is taken only when it shows no object found gone: it agrees
            self.gone.clear()
        for uid in set(self.current) - seen:
            del self.current[uid]
            if not read and uid not in self.acted:
                self.past.pop(uid, None)
                self.generations.pop(uid, None)

    def acted_on(self, body: Mapping[str, Any]) -> None:
        """The operator changed (or deleted) the object from this state: it is past."""
        ident = _identity(body)
        if ident is not None:
            self._pass(*ident)
            self.acted.add(ident[0])
            self._acted_order.append(ident[0])
            while len(self._acted_order) > ACTED_OBJECTS:
                oldest = self._acted_order.pop(0)
                if oldest not in self._acted_order:
                    self.acted.discard(oldest)
                    if oldest not in self.current:
                        self.past.pop(oldest, None)

    def _pass(self, uid: str, version: str) -> None:
        history = self.past.setdefault(uid, [])
        if version not in history:
            history.append(version)
            del history[:-PAST_STATES]


class WorkloadReads:
    """The pods and the StatefulSet a step of one cluster acts on (see the module).

    ``watched``: the watch cache's view now (None: read the API server every time)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        cluster_name: str,
        watched: Callable[[], Watched] | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.cluster_name = cluster_name
        self.watched = watched
        self.selector = f"{workloads.CLUSTER_LABEL}={cluster_name}"
        self.pod_versions = Versions()
        self.statefulset_versions = Versions()
        #: reads that went to the API server: pod lists, StatefulSet gets, and those of
        #: them made because the cache was stale
        self.lists = 0
        self.gets = 0
        self.stale_reads = 0

    async def pods(self) -> list[dict[str, Any]]:
        """The cluster's pods: cached unless the cache shows a past state."""
        if self.watched is not None:
            cached = [dict(p) for p in self.watched().pods]
            if not self.pod_versions.stale(cached):
                self.pod_versions.take(cached)
                return cached
            self.stale_reads += 1
        self.lists += 1
        listed = await self.api.list("v1", "Pod", self.namespace, self.selector)
        self.pod_versions.take(listed, read=self.watched is not None)
        return listed

    async def statefulset(self) -> dict[str, Any] | None:
        """The cluster's StatefulSet: cached unless the cache shows a past state."""
        if self.watched is not None:
            cached = self.watched().statefulset
            if cached is not None and not self.statefulset_versions.stale([cached]):
                self.statefulset_versions.take([cached])
                return dict(cached)
            if cached is not None:
                self.stale_reads += 1
            # none cached: not created yet, or deleted (being replaced for a larger volume):
            # the API server says which
        self.gets += 1
        name = workloads.names(self.cluster_name)["statefulset"]
        found = await self.api.get(ObjectRef("apps/v1", "StatefulSet", self.namespace, name))
        self.statefulset_versions.take(
            [found] if found is not None else [], read=self.watched is not None
        )
        return found

    def acted_on_pod(self, pod: Mapping[str, Any]) -> None:
        """The step deleted ``pod`` (from this state)."""
        self.pod_versions.acted_on(pod)
