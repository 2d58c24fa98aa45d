"""One BrokerCluster's control loop in the operator: the shared ``ControlLoop`` over CR status.

``ClusterRuntime`` gives the loop (``headrace.control.looping``) its ports:
``KubeStatusStore`` (the documents as CR status, compare-and-swap),
``PodFleet`` (``pods``: heartbeats and topology pushes over HTTP to the brokers'
pod IPs) and the system clock. It runs a step every ``poll_interval_ms`` (every
``transition_poll_interval_ms`` while a transition is in flight), or at once when
kicked (a Topic, Unload or Repartition changed), exactly as the local controller does.

The desired state comes from kopf's watch (its in-memory indices), passed in
as plain documents before each step (``sync``), which makes of them the frozen
``DesiredState`` the loop takes at the start of its step (with the members and
racks that step found): nothing changes the loop's fields from outside. The
runtime never lists Topics itself after it starts. A Topic or BrokerCluster annotated
``headrace.dev/paused: "true"`` is not reconciled: a paused Topic keeps the spec
the loop last had for it (it is not treated as deleted), a paused cluster
takes no steps at all; both say so in a ``Paused`` condition (``conditions``).

One step is a pipeline of named steps (``STEPS``), as Strimzi's KafkaReconciler
runs one reconcile: each is a small function of the runtime and the ``Round`` the
steps before it filled in, and can be run alone in a test. In order: the Topics'
own conditions, the TLS Secrets, the membership (the StatefulSet's ordinals), the
racks, the loop's step, its Events, the Topic finalizer, the workload's size, the
object store, the cluster's conditions, the rolling restart, and the status write.
A paused cluster runs ``PAUSED_STEPS`` instead: its ``Paused`` condition only.

The BrokerCluster's own ``Ready`` condition (all ``spec.replicas`` brokers
live) and ``observedGeneration`` are written here too, through the store, so
they cost a write only when they change; ``conditions`` judges them.

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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from headrace.control.documents import condition, condition_time, generation_of
from headrace.control.looping import BrokerFleet, Clock, ControlLoop, DesiredState, LoopSettings
from headrace.control.reconcile import Decision, Event
from headrace.control.settings import ControlSettings
from headrace.dashboard.observing import Observer, observed_of
from headrace.errors import HeadraceError
from headrace.operator import (
    bodies,
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
from headrace.operator.conditions import (
    EXTERNAL_ADDRESSES_CONDITION,
    PAUSED_ANNOTATION,
    WorkloadOutcome,
    cluster_conditions,
    external_addresses_condition,
    paused,
    stalled_condition,
)
from headrace.operator.kube import KubeApi
from headrace.operator.metrics import STEP, OperatorMetrics
from headrace.operator.pods import PodFleet
from headrace.operator.statuses import KubeStatusStore, Superseded
from headrace.protocol.endpoints import ListenerAddress
from headrace.resources.clusters import BrokerCluster, ExternalListenerType
from headrace.resources.topics import Topic

log = logging.getLogger(__name__)

#: the Event when the loop starts presenting another replication token (a rotation's step 2)
TOKEN_CHANGED: Final = "ReplicationTokenChanged"


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
    #: how often the brokers' LoadBalancer Services are listed for the addresses their
    #: load balancers got (one LIST by label): a step may come every 100 ms
    external_reread_interval_ms: int = 2000
    control: ControlSettings = field(default_factory=ControlSettings)


class EventSink(Protocol):
    def __call__(self, event: Event) -> None:
        """Report a decision's event (kopf posts it as a Kubernetes Event)."""
        ...


@dataclass(frozen=True, slots=True)
class DesiredObjects:
    """The watched objects a cluster's loop reconciles towards, as kopf's indexes last
    delivered them: the BrokerCluster, and the Topics, Unloads and Repartitions that may
    be its own (``ClusterRuntime.owns`` picks them)."""

    cluster: Mapping[str, Any]
    topics: Sequence[Mapping[str, Any]] = ()
    unloads: Sequence[Mapping[str, Any]] = ()
    repartitions: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True, slots=True)
class ClusterPorts:
    """Where a cluster's loop does its I/O and reports what it did."""

    api: KubeApi
    clock: Clock
    #: the brokers; None: the cluster's pods over HTTP (``pods.PodFleet``)
    fleet: BrokerFleet | None = None
    #: where the decisions' events go (kopf posts them as Kubernetes Events); an
    #: ``eventing.EventPoster`` is flushed after every step: one Event per object and kind
    events: EventSink | None = None
    #: counts the steps and status writes (None: not counted)
    metrics: OperatorMetrics | None = None


@dataclass(frozen=True, slots=True)
class WorkloadLink:
    """The cluster's workload as the kopf handlers apply it (``handlers.apply_workload``)."""

    #: apply it again, given the Topic statuses (a refused scale down is carried out once
    #: the brokers it would remove hold no replica)
    reapply: Callable[[list[dict[str, Any]]], Awaitable[object]] | None = None
    #: what its applies came to (``cluster_conditions``); None: not tracked
    outcome: Callable[[], WorkloadOutcome | None] | None = None
    #: the cluster's pods and StatefulSet as the watches deliver them (``caching``); None:
    #: read through the API every step
    watched: Callable[[], caching.Watched] | None = None


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the operator presents to the brokers' admin ports (polls, pushes, drains)."""

    #: the replication token in force at the start (None: auth is off)
    token: str | None = None
    #: the replication tokens listed now (None: auth is off), re-read every
    #: ``token_reread_interval_ms`` to present the first (``ClusterRuntime.refresh_token``)
    read_tokens: Callable[[], Awaitable[tuple[str, ...] | None]] | None = None


@dataclass
class Round:
    """What one step has found so far: each named step reads what the ones before it
    filled in, and adds its own."""

    #: the step's time, as conditions carry it
    now: str
    #: the TLS Secrets' problem (reason, message); None: fine, or no TLS
    tls: tuple[str, str] | None = None
    #: the brokers the cluster should have (None: not judged yet)
    members: frozenset[int] | None = None
    #: the zone of each broker's node (None: not read, the loop keeps the racks it has)
    racks: dict[int, str] | None = None
    #: the control loop's decision
    decision: Decision | None = None
    #: the Topics' partitions and replicas, as the decision placed them
    statuses: list[dict[str, Any]] = field(default_factory=list)
    #: the cluster's pods as last read
    pods: list[dict[str, Any]] = field(default_factory=list)
    #: the object store's health (None: the cluster has none)
    store: objectstores.StoreHealth | None = None
    #: the brokers whose load balancer has no address yet (empty: none, or no
    #: LoadBalancer listener: ``external`` tells which)
    pending_external: list[int] = field(default_factory=list)
    #: whether the cluster has a LoadBalancer external listener
    external: bool = False
    #: the BrokerCluster's status to write
    status: dict[str, Any] = field(default_factory=dict)


def spec_replicas(runtime: ClusterRuntime) -> int:
    """The brokers the cluster's spec (as last accepted) asks for."""
    return 3 if runtime.model is None else runtime.model.spec.replicas


async def write_paused_status(runtime: ClusterRuntime, found: Round) -> None:
    """A paused cluster: its ``Paused`` condition, and nothing else happens."""
    outcome = runtime.workload() if runtime.workload is not None else None
    await runtime.store.write_workload_status(
        cluster_conditions(runtime.parsed_cluster, None, found.now, workload=outcome)
    )


async def mark_topics(runtime: ClusterRuntime, found: Round) -> None:
    """Each Topic's own conditions: ``Paused``, ``Stalled`` beside a refusing Ready."""
    for name in runtime.wanted_topics:
        await runtime.store.set_topic_conditions(name, runtime.topic_conditions(name, found.now))


async def check_tls(runtime: ClusterRuntime, found: Round) -> None:
    """The TLS Secrets' problem; before the polls, so that they speak HTTPS with the admin
    CA as soon as the spec turns TLS on."""
    cluster = runtime.model
    if cluster is None:
        return  # the workload handler reports the spec
    if not cluster.spec.tls.enabled and runtime.tls_checks.admin_context is None:
        return
    health = await runtime.tls_checks.check(runtime.api, cluster)
    context = runtime.tls_checks.admin_context
    if runtime.pods is not None:
        runtime.pods.http.set_ssl_context(context)
    runtime.rollout.ssl_context = context
    found.tls = health.problem


async def set_membership(runtime: ClusterRuntime, found: Round) -> None:
    """The brokers are the StatefulSet's ordinals: replicas move off higher ones (a scale
    down) and onto new ones (a scale up) before the StatefulSet shrinks (``moves``)."""
    found.members = frozenset(range(spec_replicas(runtime)))


async def place_racks(runtime: ClusterRuntime, found: Round) -> None:
    """The zone of each broker's node: placement spreads replicas over zones."""
    if runtime.pods is not None:
        pods = await runtime.reads.pods()
        found.racks = await runtime.zones.racks(pods, runtime.clock.now_ms())


async def step_loop(runtime: ClusterRuntime, found: Round) -> None:
    """The control loop's step towards the desired state as last synced, with the members
    and racks this step found; and the dashboard's memory of it."""
    loop = runtime.loop
    synced = runtime.desired_state or DesiredState(
        loop.topics, loop.unloads, loop.repartitions, loop.members, loop.racks, loop.deletions
    )
    desired = replace(
        synced,
        members=synced.members if found.members is None else found.members,
        racks=synced.racks if found.racks is None else found.racks,
    )
    found.decision = decision = await loop.step(desired)
    runtime.dashboard.observe(runtime.clock.now_ms(), runtime.loop.heartbeats)
    found.statuses = [
        {
            "name": name,
            "partitions": [
                {"partition": p.partition, "replicas": list(p.replicas)} for p in t.partitions
            ],
        }
        for name, t in decision.state.topics.items()
    ]


async def report_events(runtime: ClusterRuntime, found: Round) -> None:
    """The decision's events, to the sink (posted after the step: ``_post_events``)."""
    assert found.decision is not None
    for event in found.decision.events:
        if runtime.events is not None:
            runtime.events(event)


async def release_finalizers(runtime: ClusterRuntime, found: Round) -> None:
    """Deleted Topics whose data the brokers let go lose their finalizer."""
    decision = found.decision
    assert decision is not None
    await runtime.finalizer.release_finished(
        decision.state.topics,
        decision.state.generation,
        decision.state.brokers,
        decision.liveness.live,
        runtime.loop.heartbeats,
        runtime.loop.broker_generations,
        members=runtime.loop.members,
    )


async def resize_workload(runtime: ClusterRuntime, found: Round) -> None:
    """The brokers a scale down must keep (they still hold replicas), and the workload
    applied again when they change."""
    replicas = spec_replicas(runtime)
    blockers = workloads.scale_down_blockers(replicas, found.statuses)
    # Apply again when the brokers to keep change, and when the StatefulSet as last
    # applied keeps other brokers than these: an apply by another process of this
    # operator (its resume, before a restart) may have kept brokers this loop never
    # saw hold anything, and no later change of ``blockers`` would ever let them go.
    outcome = runtime.workload() if runtime.workload is not None else None
    kept_pods = max([replicas, *(b + 1 for b in blockers)])
    stale = outcome is not None and outcome.replicas not in (None, kept_pods)
    if (stale or set(blockers) != set(runtime.blockers)) and runtime.reapply is not None:
        await runtime.reapply(found.statuses)  # other brokers to keep: resize the StatefulSet
    runtime.blockers = blockers


async def check_object_store(runtime: ClusterRuntime, found: Round) -> None:
    """The object store's credentials and reachability (``objectstores``)."""
    store = None if runtime.model is None else runtime.model.spec.object_store
    pods = runtime.pods.listed if runtime.pods is not None else await runtime.reads.pods()
    found.pods = pods
    health = await runtime.store_checks.check(store, pods, runtime.loop.heartbeats)
    found.store = None if store is None else health


async def read_external_addresses(runtime: ClusterRuntime, found: Round) -> None:
    """Each broker's load-balancer address, from its Service's status, handed to the
    polls (which put it in the brokers' heartbeats, so in the topology the loop pushes):
    a broker cannot learn it itself, as a load-balancer controller writes it into the
    Service's status, after the pod started or later again."""
    model = runtime.model
    external = None if model is None else model.spec.listeners.external
    if model is None or external is None or external.type is not ExternalListenerType.LOAD_BALANCER:
        runtime.external_addresses, runtime.external_read_ms = None, None
        if runtime.pods is not None:
            runtime.pods.external = None
        return
    now_ms = runtime.clock.now_ms()
    last = runtime.external_read_ms
    addresses = runtime.external_addresses
    if (
        addresses is None
        or last is None
        or now_ms - last >= runtime.settings.external_reread_interval_ms
    ):
        selector = f"{workloads.CLUSTER_LABEL}={runtime.name},{workloads.EXTERNAL_SERVICE_LABEL}"
        services = await runtime.api.list("v1", "Service", runtime.namespace, selector)
        addresses = workloads.load_balancer_addresses(model, services) or {}
        runtime.external_addresses, runtime.external_read_ms = addresses, now_ms
    if runtime.pods is not None:
        runtime.pods.external = addresses
    found.external = True
    found.pending_external = workloads.pending_external_brokers(
        model, addresses, model.spec.replicas
    )


async def judge_conditions(runtime: ClusterRuntime, found: Round) -> None:
    """The BrokerCluster's conditions and ``observedGeneration`` (``conditions``)."""
    decision = found.decision
    assert decision is not None
    found.status = cluster_conditions(
        runtime.parsed_cluster,
        decision.liveness.live,
        found.now,
        runtime.blockers,
        store=found.store,
        reassignment=decision.reassignment,
        tls=found.tls,
        workload=runtime.workload() if runtime.workload is not None else None,
    )
    if found.external:
        previous = {c.get("type"): c for c in runtime.store.workload_conditions()}
        found.status["conditions"].append(
            external_addresses_condition(
                found.pending_external,
                generation_of(runtime.cluster),
                previous.get(EXTERNAL_ADDRESSES_CONDITION),
                found.now,
            )
        )


async def roll_pods(runtime: ClusterRuntime, found: Round) -> None:
    """The rolling restart's next move (``rollout_executor``), and its ``Restarting``
    condition."""
    assert found.decision is not None
    replicas = spec_replicas(runtime)
    await runtime.rollout.step(found.decision, found.pods, replicas, runtime.clock.now_ms())
    previous = {c.get("type"): c for c in runtime.store.workload_conditions()}
    restarting = runtime.rollout.condition(
        previous.get(rollout_executor.RESTARTING), generation_of(runtime.cluster), found.now
    )
    if restarting is not None:
        found.status["conditions"].append(restarting)


async def write_status(runtime: ClusterRuntime, found: Round) -> None:
    """The BrokerCluster's status, through the store (a write only when it changed)."""
    await runtime.store.write_workload_status(found.status)


#: one named step of a cluster's loop
ClusterStep = Callable[["ClusterRuntime", Round], Awaitable[None]]

#: a step of a paused cluster
PAUSED_STEPS: Final[tuple[ClusterStep, ...]] = (write_paused_status,)
#: a step of a running cluster, in order
STEPS: Final[tuple[ClusterStep, ...]] = (
    mark_topics,
    check_tls,
    set_membership,
    place_racks,
    read_external_addresses,
    step_loop,
    report_events,
    release_finalizers,
    resize_workload,
    check_object_store,
    judge_conditions,
    roll_pods,
    write_status,
)


class ClusterRuntime:
    """The control loop of one BrokerCluster; see the module."""

    def __init__(
        self,
        desired: DesiredObjects,
        ports: ClusterPorts,
        settings: RuntimeSettings | None = None,
        *,
        workload: WorkloadLink | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """``desired``: the watched objects at the start (the loop loads what is stored for
        those that are its own); ``ports``: its I/O; ``workload``: the cluster's workload
        as the handlers apply it (None: not tracked, never applied again);
        ``credentials``: what it presents to the brokers (None: auth is off)."""
        workload = workload or WorkloadLink()
        credentials = credentials or Credentials()
        api, clock, fleet, events = ports.api, ports.clock, ports.fleet, ports.events
        cluster = desired.cluster
        self.workload = workload.outcome
        self._refused_generation: int | None = None
        self.settings = settings or RuntimeSettings()
        self.clock = clock
        self.cluster = dict(cluster)
        meta = bodies.meta_of(cluster)
        self.namespace, self.name = meta.namespace, meta.name
        #: each watched Topic and Unload parsed once per version (``bodies``)
        self._clusters = bodies.ParseCache(bodies.parse_cluster)
        self._accepted_clusters = bodies.ParseCache(bodies.parse_cluster)
        self._topics = bodies.ParseCache(bodies.parse_topic)
        self._unloads = bodies.ParseCache(bodies.parse_unload)
        #: the BrokerCluster's model as last accepted (``sync``)
        self.model: BrokerCluster | None = bodies.parse_cluster(cluster).resource
        mine = [t for t in desired.topics if self.owns(t)]
        names = {bodies.meta_of(t).full_name for t in mine}
        self.store = KubeStatusStore(
            api,
            cluster,
            mine,
            [u for u in desired.unloads if self.owns(u, names)],
            # a deleted Unload stays until its moves in flight finish (the loop releases it)
            finalizer=finalizing.UNLOAD_FINALIZER,
            repartitions=[b for _, b in repartition_owners.owned(desired.repartitions, names)],
        )
        #: the pods and StatefulSet each step acts on
        self.reads = caching.WorkloadReads(api, self.namespace, self.name, workload.watched)
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
                auth_token=credentials.token,
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
        self.reapply = workload.reapply
        #: deleted Topics the finalizer holds until the brokers let their data go
        self.finalizer = finalizing.TopicFinalizer(api, events)
        #: the rolling restart of the pods (a changed pod template: brokerConfig, image)
        self.rollout = rollout_executor.Rollout(
            api, self.namespace, self.name, events, reads=self.reads
        )
        if credentials.token:
            self.rollout.auth_headers = {"Authorization": f"Bearer {credentials.token}"}
        self.api = api
        #: the paused Topics, with the generation they are at
        self._paused: dict[str, int] = {}
        #: the model of each Topic in ``wanted_topics`` (None: the model refuses its spec)
        self._wanted_models: dict[str, Topic | None] = {}
        #: the brokers a refused scale down keeps, as of the last step
        self.blockers: dict[int, list[str]] = {}
        self.kicked = asyncio.Event()
        #: what the loop reconciles towards at its next step, as last synced (None: not
        #: synced yet, the loop goes on with what it loaded)
        self.desired_state: DesiredState | None = None
        self.metrics = ports.metrics
        #: the object store's credentials and endpoint, checked now and then
        self.store_checks = objectstores.StoreChecks()
        #: the TLS Secrets and the admin CA the polls verify with, checked now and then
        self.tls_checks = tlssecrets.TlsChecks()
        #: the dashboard's memory of this cluster (rates, last heartbeats), fed every step
        self.dashboard = Observer(self.name)
        #: when the last step finished (event-loop time, s; ``surfaces`` checks it)
        self.last_step_s = time.monotonic()
        self._counted = (0, 0)  # store writes and conflicts already in the metrics
        self.auth_token = credentials.token
        self.read_tokens = credentials.read_tokens
        #: each broker's load-balancer address as last listed, and when (clock ms); None:
        #: not read (no LoadBalancer listener)
        self.external_addresses: dict[int, ListenerAddress] | None = None
        self.external_read_ms: int | None = None
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
        if body.get("kind") == "Unload":
            unload = self._unloads(body)
            if unload.meta.namespace != self.namespace or unload.resource is None:
                return False
            return f"{self.namespace}/{unload.resource.spec.topic_ref.name}" in set(topics)
        topic = self._topics(body)
        if topic.meta.namespace != self.namespace:
            return False
        if topic.resource is None:  # its loop tells it why in its status
            return bodies.topic_cluster(body) == self.name
        return topic.resource.spec.cluster_ref.name == self.name

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
        wanted: dict[str, Mapping[str, Any]] = {}
        models: dict[str, Topic | None] = {}
        mine = [(self._topics(t), t) for t in topics if self.owns(t)]
        self._topics.keep({t.meta.full_name for t, _ in mine})
        self.finalizer.sync([t for t, _ in mine])
        # the only deletions the loop may carry out: this cluster's Topics being deleted
        # (a Topic that left the index, or names another cluster now, is not one of them)
        deletions = finalizing.deletions([t for t, _ in mine])
        for topic, body in mine:
            if topic.meta.deleting:
                continue  # a deleted Topic leaves the state (its finalizer waits for that)
            name = topic.meta.full_name
            self.store.remember(body)
            held = self.wanted_topics.get(name)
            if paused(topic.meta) and held is not None:
                wanted[name] = held
                models[name] = self._wanted_models.get(name)
                continue
            # the control core reconciles the Topic's document (it tells a spec it refuses)
            resource = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
            resource.setdefault("metadata", {})["generation"] = topic.meta.generation
            wanted[name] = resource
            models[name] = topic.resource
        self._wanted_models = models
        self._paused = {t.meta.full_name: t.meta.generation for t, _ in mine if paused(t.meta)}
        # the loop's own record of an Unload wins over the body (it is not older); one it
        # no longer holds (a deleted one it released) is taken from the body again
        held_unloads: dict[str, Mapping[str, Any]] = {}
        unloads = list(unloads)
        self._unloads.keep({bodies.meta_of(u).full_name for u in unloads})
        for body in unloads:
            if not self.owns(body, wanted):
                continue
            unload = self._unloads(body)
            name = unload.meta.full_name
            self.store.remember(body)
            known = self.loop.unloads.get(name)
            record: Mapping[str, Any] = (
                known
                if known is not None
                else {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
            )
            deleted = unload.meta.deletion_timestamp
            if deleted is not None:
                record = {
                    **record,
                    "metadata": {**record["metadata"], "deletionTimestamp": deleted},
                }
            held_unloads[name] = record
        self.desired_state = DesiredState(
            topics=wanted,
            unloads=held_unloads,
            repartitions=repartition_owners.held(self.store, repartitions, wanted),
            members=self.loop.members,
            racks=self.loop.racks,
            deletions=deletions,
        )

    @property
    def wanted_topics(self) -> Mapping[str, Mapping[str, Any]]:
        """The Topics (no status) the loop reconciles towards, as last synced."""
        if self.desired_state is None:
            return self.loop.topics
        return self.desired_state.topics

    @property
    def parsed_cluster(self) -> bodies.Parsed[BrokerCluster]:
        """The BrokerCluster as last synced (its spec as last accepted), parsed."""
        return self._accepted_clusters(self.cluster)

    def _wanted_model(self, name: str) -> Topic | None:
        """The model of the Topic ``name`` the loop reconciles towards (None: the model
        refuses its spec, or there is none)."""
        if name in self._wanted_models:
            return self._wanted_models[name]
        wanted = self.wanted_topics.get(name)  # before the first sync: the loop's own
        return None if wanted is None else bodies.parse_topic(wanted).resource

    def _accepted(self, cluster: Mapping[str, Any]) -> dict[str, Any]:
        """``cluster``, with the spec last accepted if the model refuses its own (``model``:
        the accepted one's)."""
        parsed = self._clusters(cluster)
        if parsed.resource is None:
            if self._refused_generation != parsed.meta.generation:
                self._refused_generation = parsed.meta.generation
                log.warning(
                    "cluster %s/%s: generation %d has a spec the model refuses; the loop"
                    " goes on with the last one it accepted", self.namespace, self.name,
                    self._refused_generation,
                )  # fmt: skip
            return {**cluster, "spec": copy.deepcopy(self.cluster.get("spec"))}
        self.model = parsed.resource
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
        return self.dashboard.view(observed_of(self.loop, self.clock.now_ms()))

    async def _step(self) -> Decision | None:
        found = Round(now=condition_time(self.clock.now_ms()))
        for step in PAUSED_STEPS if paused(bodies.meta_of(self.cluster)) else STEPS:
            await step(self, found)
        return found.decision

    def topic_conditions(self, name: str, now: str) -> list[dict[str, Any]]:
        """A paused Topic's ``Paused`` condition; ``Stalled`` beside a refusing Ready."""
        status = self.store.topic_status(name) or {}
        previous = {c.get("type"): c for c in status.get("conditions") or []}
        ready = previous.get("Ready")
        if ready is not None and ready.get("reason") == "NotEnoughBrokers":
            # the same reason says "fewer brokers than replicas are up now" (a start, a
            # restart: waiting fixes it) and "the cluster has fewer brokers at all"
            topic = self._wanted_model(name)
            replicas = 0 if topic is None else topic.spec.replicas
            if replicas <= spec_replicas(self):
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

    async def run(self, desired: Callable[[], DesiredObjects]) -> None:
        """Step until cancelled; ``desired()`` gives the watched objects now."""
        if self.pods is not None:
            await self.pods.start()
        try:
            while True:
                self.kicked.clear()
                try:
                    await self.refresh_token()
                    objects = desired()
                    self.sync(
                        objects.cluster, objects.topics, objects.unloads, objects.repartitions
                    )
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
