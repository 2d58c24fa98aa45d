"""One BrokerCluster's control loop in the operator: the shared ``ControlLoop`` over CR status.

``ClusterRuntime`` gives the loop (``headrace.control.looping``) its ports:
``KubeStatusStore`` (the documents as CR status, compare-and-swap),
``PodFleet`` (heartbeats and topology pushes over HTTP to the brokers' pod
IPs, the local controller's ``HttpFleet`` protocol) and the system clock. It
runs a step every ``poll_interval_ms`` (every ``transition_poll_interval_ms``
while a transition is in flight), or at once when kicked (a Topic, Unload or
Repartition changed), exactly as the local controller does.

The desired state comes from kopf's watch (its in-memory indices), passed in
as plain documents before each step (``sync``): the runtime never lists Topics
itself after it starts. A Topic or BrokerCluster annotated
``headrace.dev/paused: "true"`` is not reconciled: a paused Topic keeps the spec
the loop last had for it (it is not treated as deleted), a paused cluster
takes no steps at all; both say so in a ``Paused`` condition.

The BrokerCluster's own ``Ready`` condition (all ``spec.replicas`` brokers
live) and ``observedGeneration`` are written here too, through the store, so
they cost a write only when they change.

``Stalled`` (kstatus's ``Failed``): an object whose spec cannot be honoured as it
stands, which waiting will not fix (a refused scale down, a Topic spec the loop
refuses: ``REFUSALS``), also carries ``Stalled=True`` with the Ready reason; the
condition goes away once the spec can be honoured again. Its ``lastTransitionTime``
stays put while it holds, as Ready's does.

Each runtime also feeds the dashboard's ``Observer`` after every step (the
operator serves the same page as local mode, ``surfaces``), and counts its steps
and status writes in the ``OperatorMetrics`` when given one.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from headrace.control import moves
from headrace.control.documents import condition, condition_time, full_name, generation_of
from headrace.control.looping import BrokerFleet, Clock, ControlLoop, LoopSettings, Report
from headrace.control.reconcile import Decision, Event
from headrace.control.settings import ControlSettings
from headrace.controller.fleet import HttpFleet
from headrace.dashboard.observing import Observer
from headrace.errors import HeadraceError
from headrace.operator import (
    caching,
    eventing,
    finalizing,
    objectstores,
    repartition_owners,
    rollout_executor,
    tlssecrets,
    workloads,
    zones,
)
from headrace.operator.kube import KubeApi
from headrace.operator.metrics import STEP, OperatorMetrics
from headrace.operator.statuses import KubeStatusStore, Superseded
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.resources.clusters import BrokerCluster, ObjectStore

log = logging.getLogger(__name__)

PAUSED_ANNOTATION: Final = "headrace.dev/paused"
#: the Event when the loop starts presenting another replication token (a rotation's step 2)
TOKEN_CHANGED: Final = "ReplicationTokenChanged"

#: Ready reasons that refuse the spec as it stands (waiting cannot fix them): the object is
#: also ``Stalled``. Unavailability (PartitionsOffline, BelowMinInSync) is not: it passes;
#: nor is NotEnoughBrokers while the Topic's replicas fit the cluster's (brokers not up yet).
REFUSALS: Final = frozenset(
    {
        "ScaleDownBlocked",
        "ClusterNotFound",
        "InvalidSpec",
        "UnknownCluster",
        "NotEnoughBrokers",
        "ReplicasChange",
        "DuplicateSpec",
        "CompactionUnsupported",
        objectstores.CREDENTIALS_MISSING,
        tlssecrets.TLS_MISSING,
        tlssecrets.TLS_INVALID,
        #: the auth Secret's replication token does not parse (``handlers.cluster_loop``)
        "ReplicationTokenInvalid",
        #: the API server refused the workload for the spec as it stands (``ApplyFailure``)
        "Invalid",
        "Forbidden",
        "BadRequest",
        workloads.STORAGE_SHRINK,
        workloads.STORAGE_NOT_EXPANDABLE,
    }
)


@dataclass(frozen=True, slots=True)
class ApplyFailure:
    """An apply of the cluster's workload that failed: for which generation, and why
    (``reason``: the API server's, such as ``Invalid``, or the operator's own refusal)."""

    generation: int
    reason: str
    message: str


@dataclass
class WorkloadOutcome:
    """What the applies of one cluster's workload came to since the operator started
    (``handlers.apply_workload`` records it). The BrokerCluster's ``observedGeneration``
    is ``applied``: a generation counts as observed once its workload is applied."""

    #: the latest generation whose workload the API server took; None: none yet
    applied: int | None = None
    #: the latest apply's failure; None once an apply succeeds
    failure: ApplyFailure | None = None
    #: the StatefulSet's pod count in the latest apply that succeeded: more than
    #: ``spec.replicas`` while a scale down keeps brokers that still hold replicas
    replicas: int | None = None


def paused(body: Mapping[str, Any]) -> bool:
    annotations = body.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(PAUSED_ANNOTATION, "")).lower() == "true"


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    #: how often every broker's heartbeat is polled (as in local mode: 1 s)
    poll_interval_ms: int = 1000
    #: how often while an unload is unfinished or a partition is sealed
    transition_poll_interval_ms: int = 100
    #: a poll that takes longer than this counts as a missed heartbeat
    poll_timeout_ms: int = 800
    #: how often the replication token the loop presents is re-read from the cluster's
    #: auth Secret (one GET by name), and at once after a broker refused it: well inside
    #: the kubelet's volume sync (about a minute), so during a rotation the operator sends
    #: the new first token before the pods have all re-read theirs (docs/security.md §9)
    token_reread_interval_ms: int = 5000
    control: ControlSettings = field(default_factory=ControlSettings)


class EventSink(Protocol):
    def __call__(self, event: Event) -> None:
        """Report a decision's event (kopf posts it as a Kubernetes Event)."""
        ...


def terminating(pod: Mapping[str, Any]) -> bool:
    """The pod is being deleted (``kubectl delete pod``, an eviction, a rolling restart's
    or a scale down's delete): its ``preStop`` drain may be running."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def polled(pod: Mapping[str, Any]) -> bool:
    """Whether the control loop polls the pod's broker: it has an IP and its containers
    have not all finished. A terminating pod stays polled: its ``preStop`` hook
    (``headrace drain``) has the broker report ``draining``, and only a loop that still
    hears it hands its leadership away (``LeaderDraining``) before SIGTERM; dropped at
    the ``deletionTimestamp``, its partitions would wait out the liveness TTL
    (``LeaderLost``) instead. Once its process is gone the poll's refused connection
    counts as down at once, until the pod object goes too."""
    status = pod.get("status") or {}
    return bool(status.get("podIP")) and status.get("phase") not in ("Succeeded", "Failed")


class PodFleet:
    """A ``BrokerFleet``: the cluster's pods, found before every poll (from the watch cache
    when there is one: ``caching``), spoken to over HTTP on their pod IPs (``HttpFleet``)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        cluster_name: str,
        clock: Clock,
        timeout_ms: int,
        auth_token: str | None = None,
        reads: caching.WorkloadReads | None = None,
    ) -> None:
        """``auth_token``: presented on every poll and push (the cluster's replication
        token when its brokers run with ACLs); ``reads``: where the pods come from
        (default: listed through ``api`` every time)."""
        self.reads = reads or caching.WorkloadReads(api, namespace, cluster_name)
        self.http = HttpFleet([], clock, timeout_ms, auth_token=auth_token)
        #: the cluster's pods as last listed (their waiting reasons: ``objectstores``)
        self.listed: list[dict[str, Any]] = []

    async def start(self) -> None:
        await self.http.start()

    async def close(self) -> None:
        await self.http.close()

    async def refresh(self) -> None:
        pods = await self.reads.pods()
        self.listed = pods
        chosen: dict[int, dict[str, Any]] = {}
        for pod in pods:
            broker_id = workloads.broker_id_of(pod)
            if broker_id is None or not polled(pod):
                continue
            other = chosen.get(broker_id)
            # one pod per ordinal under a StatefulSet; should two ever be listed, the one
            # not being deleted is the broker that stays
            if other is None or (terminating(other) and not terminating(pod)):
                chosen[broker_id] = pod
        self.http.brokers = {
            broker_id: BrokerEndpoint(
                broker_id, pod["status"]["podIP"], workloads.DATA_PORT, workloads.ADMIN_PORT
            )
            for broker_id, pod in chosen.items()
        }

    async def poll(self) -> Mapping[int, Report | None]:
        await self.refresh()
        return await self.http.poll()

    async def push(self, broker_id: int, topology: Mapping[str, Any]) -> int | None:
        if broker_id not in self.http.brokers:
            return None  # its pod is gone since the poll (deleted, being replaced)
        return await self.http.push(broker_id, topology)


def stalled_condition(
    ready: Mapping[str, Any] | None, previous: Mapping[str, Any] | None, now: str
) -> dict[str, Any] | None:
    """``Stalled=True`` beside a Ready condition whose reason is a refusal; else None."""
    if ready is None or ready.get("status") != "False" or ready.get("reason") not in REFUSALS:
        return None
    return condition(
        "Stalled",
        "True",
        str(ready["reason"]),
        str(ready.get("message", "")),
        int(ready.get("observedGeneration") or 1),
        previous,
        now,
    )


def cluster_conditions(
    body: Mapping[str, Any],
    live: Iterable[int] | None,
    now: str,
    blockers: Mapping[int, list[str]] | None = None,
    store: objectstores.StoreHealth | None = None,
    reassignment: moves.Summary | None = None,
    tls: tuple[str, str] | None = None,
    workload: WorkloadOutcome | None = None,
) -> dict[str, Any]:
    """The BrokerCluster's ``conditions`` and ``observedGeneration`` (the workload's part).

    ``workload``: what the applies of its workload came to (None: not tracked, and the
    body's generation counts as observed). ``observedGeneration`` is then the generation
    last applied (as stored while none was applied since the operator started), and a
    failed apply makes Ready False with its reason: kstatus and Argo CD must not call a
    cluster current whose workload the API server refused.

    ``store``: the object store's health (``objectstores``), None when the cluster has no
    object store: a missing credentials Secret makes Ready False, an unreachable endpoint
    shows in ``ObjectStoreReachable``.

    ``live``: the live broker ids of the latest step; None while the cluster is paused.
    ``blockers``: brokers a scale down would remove that still hold replicas
    (``workloads.scale_down_blockers``). ``reassignment``: how the replica moves go
    (``control.moves``); with it, a scale down whose replicas can move is ``ScalingDown``
    (they move off first), and only one that cannot (it would lose a partition's last
    in-sync replica, or go below a replication factor) is refused as ``ScaleDownBlocked``;
    a ``Rebalancing`` condition says whether moves are in flight. ``tls``: a TLS Secret
    problem (reason, message: ``tlssecrets``), which makes Ready False.
    """
    generation = generation_of(body)
    stored = body.get("status") or {}
    previous = {c.get("type"): c for c in stored.get("conditions") or []}
    replicas = int((body.get("spec") or {}).get("replicas", 3))
    observed: int | None = generation
    failure = None
    if workload is not None:
        observed = workload.applied
        if observed is None and isinstance(stored.get("observedGeneration"), int):
            observed = stored["observedGeneration"]
        failure = workload.failure
    conditions = []
    if live is None:
        old = previous.get("Ready")
        if old is not None:
            conditions.append(old)
        conditions.append(
            condition(
                "Paused",
                "True",
                "Paused",
                f"annotation {PAUSED_ANNOTATION} is true: not reconciled",
                generation,
                previous.get("Paused"),
                now,
            )
        )
    else:
        missing = sorted(set(range(replicas)) - set(live))
        if failure is not None:
            ready = ("False", failure.reason, failure.message)
        elif tls is not None:
            ready = ("False", *tls)
        elif store is not None and store.credentials is not None:
            ready = ("False", objectstores.CREDENTIALS_MISSING, store.credentials)
        elif blockers and reassignment is not None and not reassignment.blocked:
            ready = (
                "False",
                "ScalingDown",
                f"scaling down to {replicas}: moving replicas off brokers {sorted(blockers)}"
                f" before they are removed ({reassignment.moving} partitions moving,"
                f" {reassignment.waiting} waiting)",
            )
        elif blockers:
            held = "; ".join(f"broker {b}: {', '.join(p)}" for b, p in sorted(blockers.items()))
            why = (
                "; ".join(reassignment.blocked)
                if reassignment is not None
                else "move them off with an Unload first"
            )
            ready = (
                "False",
                "ScaleDownBlocked",
                f"scaling down to {replicas} would remove brokers that still hold replicas"
                f" ({held}): {why}",
            )
        elif missing:
            ready = ("False", "BrokersNotLive", f"brokers {missing} are not live")
        else:
            ready = ("True", "AllBrokersLive", f"{replicas} brokers live")
        conditions.append(condition("Ready", *ready, generation, previous.get("Ready"), now))
        stalled = stalled_condition(conditions[-1], previous.get("Stalled"), now)
        if stalled is not None:
            conditions.append(stalled)
        kept = previous.get(objectstores.REACHABLE_CONDITION)
        if store is not None and not store.endpoint_known and store.uploads is None and kept:
            conditions.append(dict(kept))  # not checked yet (a restart): as stored
        elif store is not None:
            reachable = (
                ("False", objectstores.UNREACHABLE, store.unreachable)
                if store.unreachable is not None
                else ("False", objectstores.UPLOADS_FAILING, store.uploads)
                if store.uploads is not None
                else ("True", "EndpointAnswers", "the object store's endpoint accepts connections")
            )
            conditions.append(
                condition(
                    objectstores.REACHABLE_CONDITION,
                    *reachable,
                    generation,
                    previous.get(objectstores.REACHABLE_CONDITION),
                    now,
                )
            )
        if reassignment is not None:
            conditions.append(
                condition(
                    "Rebalancing",
                    *_rebalancing(reassignment),
                    generation,
                    previous.get("Rebalancing"),
                    now,
                )
            )
    if observed is None:
        return {"conditions": conditions}
    return {"observedGeneration": observed, "conditions": conditions}


def _rebalancing(summary: moves.Summary) -> tuple[str, str, str]:
    """The ``Rebalancing`` condition's status, reason and message."""
    if summary.rebalancing:
        return (
            "True",
            "MovingReplicas",
            f"{summary.moving} partitions moving replicas, {summary.waiting} waiting",
        )
    return ("False", "Balanced", "no replica moves in flight")


class ClusterRuntime:
    """The control loop of one BrokerCluster; see the module."""

    def __init__(
        self,
        api: KubeApi,
        cluster: Mapping[str, Any],
        topics: Iterable[Mapping[str, Any]],
        unloads: Iterable[Mapping[str, Any]],
        clock: Clock,
        settings: RuntimeSettings | None = None,
        *,
        fleet: BrokerFleet | None = None,
        events: EventSink | None = None,
        reapply: Callable[[list[dict[str, Any]]], Awaitable[object]] | None = None,
        metrics: OperatorMetrics | None = None,
        repartitions: Iterable[Mapping[str, Any]] = (),
        auth_token: str | None = None,
        read_tokens: Callable[[], Awaitable[tuple[str, ...] | None]] | None = None,
        workload: Callable[[], WorkloadOutcome | None] | None = None,
        watched: Callable[[], caching.Watched] | None = None,
    ) -> None:
        """``auth_token``: the credentials the operator presents to the brokers (polls,
        pushes, drains); ``read_tokens``: the replication tokens listed now (None: auth
        is off), re-read every ``token_reread_interval_ms`` to present the first
        (``refresh_token``); ``reapply``: apply the cluster's workload again, given the Topic statuses (a refused
        scale down is carried out once the brokers it would remove hold no replica);
        ``repartitions``: the watched Repartitions (those of this cluster's Topics count);
        ``workload``: what the applies of the cluster's workload came to (``cluster_conditions``;
        None: not tracked); ``watched``: the cluster's pods and StatefulSet as the watches
        deliver them (``caching``; None: read through ``api`` every step). An ``events``
        sink that is an ``eventing.EventPoster`` is flushed after every step: one Event
        per object and kind."""
        self.workload = workload
        self._refused_generation: int | None = None
        self.settings = settings or RuntimeSettings()
        self.clock = clock
        self.cluster = dict(cluster)
        meta = cluster["metadata"]
        self.namespace = str(meta.get("namespace", "default"))
        self.name = str(meta["name"])
        mine = [t for t in topics if self.owns(t)]
        names = {full_name(t) for t in mine}
        self.store = KubeStatusStore(
            api,
            cluster,
            mine,
            [u for u in unloads if self.owns(u, names)],
            # a deleted Unload stays until its moves in flight finish (the loop releases it)
            finalizer=finalizing.UNLOAD_FINALIZER,
            repartitions=repartition_owners.owned(repartitions, names),
        )
        #: the pods and StatefulSet each step acts on
        self.reads = caching.WorkloadReads(api, self.namespace, self.name, watched)
        #: the zone of each broker's node (its rack)
        self.zones = zones.NodeZones(api)
        self.pods: PodFleet | None = None
        if fleet is None:
            self.pods = PodFleet(
                api,
                self.namespace,
                self.name,
                clock,
                self.settings.poll_timeout_ms,
                auth_token=auth_token,
                reads=self.reads,
            )
            fleet = self.pods
        self.loop = ControlLoop(
            self.store,
            fleet,
            clock,
            LoopSettings(cluster_id=self.name, control=self.settings.control),
        )
        self.events = events
        self.reapply = reapply
        #: deleted Topics the finalizer holds until the brokers let their data go
        self.finalizer = finalizing.TopicFinalizer(api, events)
        #: the rolling restart of the pods (a changed pod template: brokerConfig, image)
        self.rollout = rollout_executor.Rollout(
            api, self.namespace, self.name, events, reads=self.reads
        )
        if auth_token:
            self.rollout.auth_headers = {"Authorization": f"Bearer {auth_token}"}
        self.api = api
        #: the paused Topics, with the generation they are at
        self._paused: dict[str, int] = {}
        #: the brokers a refused scale down keeps, as of the last step
        self.blockers: dict[int, list[str]] = {}
        self.kicked = asyncio.Event()
        self.metrics = metrics
        #: the object store's credentials and endpoint, checked now and then
        self.store_checks = objectstores.StoreChecks()
        #: the TLS Secrets and the admin CA the polls verify with, checked now and then
        self.tls_checks = tlssecrets.TlsChecks()
        #: the dashboard's memory of this cluster (rates, last heartbeats), fed every step
        self.dashboard = Observer(self.name)
        #: when the last step finished (event-loop time, s; ``surfaces`` checks it)
        self.last_step_s = time.monotonic()
        self._counted = (0, 0)  # store writes and conflicts already in the metrics
        self.auth_token = auth_token
        self.read_tokens = read_tokens
        #: when the tokens were last read (clock ms), and the refusals seen by then
        self._tokens_read_ms: int | None = None
        self._refusals_seen = 0

    def set_auth_token(self, auth_token: str | None) -> None:
        """The credentials for the brokers' admin ports from now on (the cluster's
        ``spec.auth`` changed while this loop ran, or its replication token rotated)."""
        self.auth_token = auth_token
        if self.pods is not None:
            self.pods.http.set_auth_token(auth_token)
        self.rollout.auth_headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}

    async def refresh_token(self) -> bool:
        """Re-read the replication tokens when due (every ``token_reread_interval_ms``, or
        at once after a broker refused a poll or push) and present the first from now on;
        whether it changed. A Secret that is gone or does not parse keeps the token in
        force (the brokers keep theirs too), and says why in the log."""
        if self.read_tokens is None:
            return False
        now = self.clock.now_ms()
        refusals = self.pods.http.refusals if self.pods is not None else 0
        due = (
            self._tokens_read_ms is None
            or now - self._tokens_read_ms >= self.settings.token_reread_interval_ms
            or refusals != self._refusals_seen
        )
        if not due:
            return False
        self._tokens_read_ms, self._refusals_seen = now, refusals
        try:
            tokens = await self.read_tokens()
        except Exception as exc:  # an API error too: the step must still run
            level = (
                logging.ERROR if isinstance(exc, LookupError | HeadraceError) else logging.WARNING
            )
            log.log(
                level,
                "cluster %s/%s: replication token not re-read, the one in force stays: %s: %s",
                self.namespace, self.name, type(exc).__name__, exc,
            )  # fmt: skip
            return False
        token = tokens[0] if tokens else None
        if token == self.auth_token:
            return False
        self.set_auth_token(token)
        if token is not None:
            # a fingerprint, never the token: enough to tell which line is in use
            fingerprint = hashlib.sha256(token.encode()).hexdigest()[:8]
            message = (
                f"presenting the first of {len(tokens or ())} replication tokens"
                f" (sha256 {fingerprint}...)"
            )
            log.info("cluster %s/%s: %s", self.namespace, self.name, message)
            if self.events is not None:
                self.events(Event(TOKEN_CHANGED, f"{self.namespace}/{self.name}", message))
        return True

    def owns(self, body: Mapping[str, Any], topics: Iterable[str] = ()) -> bool:
        """Whether a Topic (by its ``clusterRef``) or an Unload (by its topic, one of
        ``topics``) is this cluster's."""
        if body.get("metadata", {}).get("namespace", "default") != self.namespace:
            return False
        spec = body.get("spec") or {}
        if body.get("kind") == "Unload":
            topic = (spec.get("topicRef") or {}).get("name")
            return f"{self.namespace}/{topic}" in set(topics)
        return (spec.get("clusterRef") or {}).get("name") == self.name

    def kick(self) -> None:
        self.kicked.set()

    # ------------------------------------------------------------------ desired state

    def sync(
        self,
        cluster: Mapping[str, Any],
        topics: Iterable[Mapping[str, Any]],
        unloads: Iterable[Mapping[str, Any]] = (),
        repartitions: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """Take the watched objects as the desired state (see the module). A cluster spec
        the model refuses is not taken: the loop goes on with the last one it accepted
        (partitions keep failing over), and the cluster's Ready says why (the workload's
        apply fails on it, ``WorkloadOutcome``)."""
        self.cluster = self._accepted(cluster)
        self.store.remember(cluster)
        wanted: dict[str, dict[str, Any]] = {}
        topics = list(topics)
        self.finalizer.sync([t for t in topics if self.owns(t)])
        # the only deletions the loop may carry out: this cluster's Topics being deleted
        # (a Topic that left the index, or names another cluster now, is not one of them)
        self.loop.deletions = finalizing.deletions([t for t in topics if self.owns(t)])
        for body in topics:
            if not self.owns(body) or finalizing.deleting(body):
                continue  # a deleted Topic leaves the state (its finalizer waits for that)
            name = full_name(body)
            self.store.remember(body)
            held = self.loop.topics.get(name)
            if paused(body) and held is not None:
                wanted[name] = held
                continue
            resource = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
            resource.setdefault("metadata", {})["generation"] = generation_of(body)
            wanted[name] = resource
        self.loop.topics = wanted
        self._paused = {
            full_name(b): generation_of(b) for b in topics if self.owns(b) and paused(b)
        }
        seen = set()
        for body in unloads:
            if not self.owns(body, wanted):
                continue
            name = full_name(body)
            seen.add(name)
            self.store.remember(body)
            if name not in self.loop.unloads:
                resource = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
                self.loop.unloads[name] = resource
            deleted = body.get("metadata", {}).get("deletionTimestamp")
            if deleted is not None:
                self.loop.unloads[name]["metadata"]["deletionTimestamp"] = deleted
        for name in set(self.loop.unloads) - seen:
            self.loop.forget_unload(name)
        repartition_owners.sync(self.loop, self.store, repartitions, wanted)

    def _accepted(self, cluster: Mapping[str, Any]) -> dict[str, Any]:
        """``cluster``, with the spec last accepted if the model refuses its own."""
        try:
            BrokerCluster.from_manifest({k: v for k, v in cluster.items() if k != "status"})
        except ValueError:
            if self._refused_generation != generation_of(cluster):
                self._refused_generation = generation_of(cluster)
                log.warning(
                    "cluster %s/%s: generation %d has a spec the model refuses; the loop"
                    " goes on with the last one it accepted", self.namespace, self.name,
                    self._refused_generation,
                )  # fmt: skip
            return {**cluster, "spec": copy.deepcopy(self.cluster.get("spec"))}
        return dict(cluster)

    # ------------------------------------------------------------------ the loop

    async def step(self) -> Decision | None:
        """One round: a loop step and the cluster's conditions; None while paused."""
        if self.metrics is None:
            try:
                return await self._step()
            finally:
                await self._post_events()
        started = time.perf_counter()
        self.metrics.reconciles.labels(STEP).inc()
        try:
            return await self._step()
        except Exception:
            self.metrics.errors.labels(STEP).inc()
            raise
        finally:
            await self._post_events()
            self.metrics.durations.labels(STEP).observe(time.perf_counter() - started)
            writes, conflicts = self.store.writes, self.store.conflicts
            self.metrics.status_writes.inc(writes - self._counted[0])
            self.metrics.status_conflicts.inc(conflicts - self._counted[1])
            self._counted = (writes, conflicts)

    async def _post_events(self) -> None:
        """The step's Events, one per object and kind (``eventing``); none while the loop
        is being cancelled (its stop must not wait on API calls)."""
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            return
        if isinstance(self.events, eventing.EventPoster):
            await self.events.flush()

    def view(self) -> dict[str, Any]:
        """The dashboard's view model of this cluster now (``dashboard.views``)."""
        decision = self.loop.last_decision
        return self.dashboard.view(
            self.loop.state_document(),
            self.loop.heartbeats,
            decision.liveness if decision is not None else None,
            self.clock.now_ms(),
        )

    async def _step(self) -> Decision | None:
        now = condition_time(self.clock.now_ms())
        if paused(self.cluster):
            outcome = self.workload() if self.workload is not None else None
            await self.store.write_workload_status(
                cluster_conditions(self.cluster, None, now, workload=outcome)
            )
            return None
        for name in self.loop.topics:
            await self.store.set_topic_conditions(name, self._topic_conditions(name, now))
        tls = await self._check_tls()
        # the brokers are the StatefulSet's ordinals: replicas move off higher ones (a scale
        # down) and onto new ones (a scale up) before the StatefulSet shrinks (``moves``)
        spec_replicas = int((self.cluster.get("spec") or {}).get("replicas", 3))
        self.loop.members = frozenset(range(spec_replicas))
        if self.pods is not None:
            # the zone of each broker's node: placement spreads replicas over zones
            pods = await self.reads.pods()
            self.loop.racks = await self.zones.racks(pods, self.clock.now_ms())
        decision = await self.loop.step()
        self.dashboard.observe(self.clock.now_ms(), self.loop.heartbeats)
        for event in decision.events:
            if self.events is not None:
                self.events(event)
        live = decision.liveness.live
        replicas = int((self.cluster.get("spec") or {}).get("replicas", 3))
        statuses = [
            {
                "name": name,
                "partitions": [
                    {"partition": p.partition, "replicas": list(p.replicas)} for p in t.partitions
                ],
            }
            for name, t in decision.state.topics.items()
        ]
        await self.finalizer.release_finished(
            decision.state.topics,
            decision.state.generation,
            decision.state.brokers,
            live,
            self.loop.heartbeats,
            self.loop.broker_generations,
            members=self.loop.members,
        )
        blockers = workloads.scale_down_blockers(replicas, statuses)
        # Apply again when the brokers to keep change, and when the StatefulSet as last
        # applied keeps other brokers than these: an apply by another process of this
        # operator (its resume, before a restart) may have kept brokers this loop never
        # saw hold anything, and no later change of ``blockers`` would ever let them go.
        outcome = self.workload() if self.workload is not None else None
        kept_pods = max([replicas, *(b + 1 for b in blockers)])
        stale = outcome is not None and outcome.replicas not in (None, kept_pods)
        if (stale or set(blockers) != set(self.blockers)) and self.reapply is not None:
            await self.reapply(statuses)  # other brokers to keep: resize the StatefulSet
        self.blockers = blockers
        store = self._object_store()
        pods = self.pods.listed if self.pods is not None else await self.reads.pods()
        health = await self.store_checks.check(store, pods, self.loop.heartbeats)
        workload = cluster_conditions(
            self.cluster,
            live,
            now,
            blockers,
            store=None if store is None else health,
            reassignment=decision.reassignment,
            tls=tls,
            workload=self.workload() if self.workload is not None else None,
        )
        await self.rollout.step(decision, pods, replicas, self.clock.now_ms())
        previous = {c.get("type"): c for c in self.store.workload_conditions()}
        restarting_condition = self.rollout.condition(
            previous.get(rollout_executor.RESTARTING), generation_of(self.cluster), now
        )
        if restarting_condition is not None:
            workload["conditions"].append(restarting_condition)
        await self.store.write_workload_status(workload)
        return decision

    async def _check_tls(self) -> tuple[str, str] | None:
        """The TLS Secrets' problem (None: fine, or no TLS); before the polls, so that they
        speak HTTPS with the admin CA as soon as the spec turns TLS on."""
        spec = self.cluster.get("spec") or {}
        if not (spec.get("tls") or {}).get("enabled") and self.tls_checks.admin_context is None:
            return None
        try:
            cluster = BrokerCluster.from_manifest(
                {k: v for k, v in self.cluster.items() if k != "status"}
            )
        except ValueError:
            return None  # the workload handler reports the spec
        health = await self.tls_checks.check(self.api, cluster)
        context = self.tls_checks.admin_context
        if self.pods is not None:
            self.pods.http.set_ssl_context(context)
        self.rollout.ssl_context = context
        return health.problem

    def _object_store(self) -> ObjectStore | None:
        doc = (self.cluster.get("spec") or {}).get("objectStore")
        return None if doc is None else ObjectStore.model_validate(doc)

    def _topic_conditions(self, name: str, now: str) -> list[dict[str, Any]]:
        """A paused Topic's ``Paused`` condition; ``Stalled`` beside a refusing Ready."""
        status = self.store.topic_status(name) or {}
        previous = {c.get("type"): c for c in status.get("conditions") or []}
        ready = previous.get("Ready")
        if ready is not None and ready.get("reason") == "NotEnoughBrokers":
            # the same reason says "fewer brokers than replicas are up now" (a start, a
            # restart: waiting fixes it) and "the cluster has fewer brokers at all"
            spec = (self.loop.topics.get(name) or {}).get("spec") or {}
            brokers = int((self.cluster.get("spec") or {}).get("replicas", 3))
            if int(spec.get("replicas", 0)) <= brokers:
                ready = None
        stalled = stalled_condition(ready, previous.get("Stalled"), now)
        own = [stalled] if stalled is not None else []
        if name not in self._paused:
            return own
        return [
            *own,
            condition(
                "Paused",
                "True",
                "Paused",
                f"annotation {PAUSED_ANNOTATION} is true: spec changes wait",
                self._paused[name],
                previous.get("Paused"),
                now,
            ),
        ]

    async def run(
        self, desired: Callable[[], tuple[Mapping[str, Any], list[Any], list[Any], list[Any]]]
    ) -> None:
        """Step until cancelled; ``desired()`` gives the watched (cluster, topics, unloads,
        repartitions)."""
        if self.pods is not None:
            await self.pods.start()
        try:
            while True:
                self.kicked.clear()
                try:
                    await self.refresh_token()
                    self.sync(*desired())
                    await self.step()
                except (asyncio.CancelledError, Superseded):
                    # Superseded: another controller wrote what this one was about to;
                    # kopf starts this loop again, and it loads what is stored
                    raise
                except Exception:
                    log.exception("cluster %s/%s: step failed", self.namespace, self.name)
                self.last_step_s = time.monotonic()
                interval = (
                    self.settings.transition_poll_interval_ms
                    if self.loop.transitioning
                    else self.settings.poll_interval_ms
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.kicked.wait(), interval / 1000)
        finally:
            if self.pods is not None:
                await self.pods.close()
