"""The kopf handlers: thin glue between kopf's watches and the operator's parts.

* **indices** (``@kopf.index``): every BrokerCluster, Topic, Unload and Repartition as the
  watch last delivered it. kopf fills them before any handler or daemon runs,
  so a cluster's control loop starts from the complete stored state (its
  ``StatusStore.load`` is the watch cache, as ``looping`` says).
* **the workload** (``@kopf.on.create/update/resume`` of a BrokerCluster):
  parse the spec into the pydantic model, build the manifests
  (``workloads``), server-side apply them through ``KubeApi``; create the Kafka
  offsets Topic where one is missing (after a restart too: ``resume``).
* **the control loop** (``@kopf.daemon`` per BrokerCluster): a
  ``ClusterRuntime`` stepping the shared ``ControlLoop``; it writes status,
  never spec.
* **kicks** (``@kopf.on.event`` of Topics, Unloads and Repartitions): run the
  owning cluster's step now instead of at its next poll. A Repartition of a
  Topic that does not exist is failed there (``repartition_owners``). Topics and
  Unloads get their finalizers there (``finalizing``); a held one that no
  cluster's loop will serve again is let go there.
* **the cluster's deletion** (``@kopf.on.delete`` of a BrokerCluster): kopf stops
  its loop as the deletion starts, so the Topics and Unloads it held are let go
  (their data stays where it is, ``finalizing.left_behind``).

What the handlers need (the API wrapper, the clock, settings, the running
loops) is the ``OperatorContext`` in kopf's ``memo``, set by ``main``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf
import pydantic

from headrace.control.documents import condition, condition_time, full_name
from headrace.control.looping import Clock
from headrace.control.reconcile import Event
from headrace.errors import InvalidRequest
from headrace.operator import (
    auth,
    bodies,
    caching,
    eventing,
    finalizing,
    repartition_owners,
    workloads,
)
from headrace.operator.bodies import Parsed
from headrace.operator.conditions import ApplyFailure, WorkloadOutcome, paused, stalled_condition
from headrace.operator.kube import KubeApi, KubeApiError, ObjectRef, StaleResourceVersion
from headrace.operator.metrics import WORKLOAD, OperatorMetrics
from headrace.operator.running import (
    ClusterPorts,
    ClusterRuntime,
    Credentials,
    DesiredObjects,
    RuntimeSettings,
    WorkloadLink,
)
from headrace.operator.surfaces import LoopHealth, Surfaces
from headrace.resources import BrokerCluster, Topic, TopicStatus, Unload

log = logging.getLogger(__name__)

GROUP: Final = "headrace.dev"
VERSION: Final = "v1alpha1"
#: kopf's own bookkeeping annotations (handler progress, last handled spec) go under this
#: prefix; never into status, whose schema would prune them
ANNOTATION_PREFIX: Final = "operator.headrace.dev"


def post_kopf_event(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    """Post an Event on the object ``body`` through kopf's poster (``kind``: Normal or
    Warning)."""
    raw: Any = dict(body)
    kopf.event(kopf.Body(raw), type=kind, reason=reason, message=message)


@dataclass
class OperatorContext:
    """What every handler reaches through ``memo.context``."""

    api: KubeApi
    clock: Clock
    workload: workloads.WorkloadSettings = field(default_factory=workloads.WorkloadSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: the running control loops, by (namespace, cluster name)
    loops: dict[tuple[str, str], ClusterRuntime] = field(default_factory=dict)
    #: what the applies of each cluster's workload came to (its ``observedGeneration``)
    workloads: dict[tuple[str, str], WorkloadOutcome] = field(default_factory=dict)
    #: control loops whose task ended with an error (until kopf restarts them), and why
    died: dict[tuple[str, str], str] = field(default_factory=dict)
    #: control loops that cannot start until their cluster is fixed (a replication token
    #: that does not parse), and why: on /healthz, not unhealthy
    blocked: dict[tuple[str, str], str] = field(default_factory=dict)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    #: /healthz, /metrics and the dashboard, when served (``main``)
    surfaces: Surfaces | None = None
    #: posts an Event on an object: (body, Normal | Warning, reason, message)
    post_event: Callable[[Mapping[str, Any], str, str, str], None] = post_kopf_event

    def health(self) -> dict[tuple[str, str], LoopHealth]:
        """What ``/healthz`` decides on (call on kopf's event loop)."""
        health = {}
        for key, runtime in self.loops.items():
            failure = self.workloads[key].failure if key in self.workloads else None
            unapplied = None if failure is None else f"{failure.reason}: {failure.message}"
            health[key] = LoopHealth(runtime.last_step_s, unapplied=unapplied)
        for key, why in self.blocked.items():
            health[key] = LoopHealth(time.monotonic(), blocked=why)
        for key, why in self.died.items():
            health[key] = LoopHealth(time.monotonic(), died=why)
        return health


#: seconds: how often a paused BrokerCluster's workload handler looks again
PAUSED_RETRY_S: Final = 10

#: seconds: the API server ends each watch after this long, and kopf opens it again
WATCH_SERVER_TIMEOUT_S: Final = 600
#: seconds: a connection to the API server that takes longer is given up and retried
CONNECT_TIMEOUT_S: Final = 30
#: seconds: one request of kopf's (a patch, a list), as the operator's own (``kube``)
REQUEST_TIMEOUT_S: Final = 60


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings that keep the operator's writes to what it decides."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    # kopf's "Handler ... succeeded" Events are noise; ours (elections, moves) are posted
    settings.posting.level = logging.WARNING
    # Every watch ends and is opened again within WATCH_SERVER_TIMEOUT_S, and a connection
    # that hangs is given up: a watch that silently stops delivering (a dropped connection
    # the client never hears of) would otherwise leave the indices, and so the loops'
    # desired state, frozen while everything looks healthy
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_SERVER_TIMEOUT_S + 60
    settings.watching.connect_timeout = CONNECT_TIMEOUT_S
    settings.networking.connect_timeout = CONNECT_TIMEOUT_S
    settings.networking.request_timeout = REQUEST_TIMEOUT_S


def _snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


def _context(memo: Any) -> OperatorContext:
    context: OperatorContext = memo.context
    return context


# ---------------------------------------------------------------------- surfaces


@kopf.on.startup()
async def serve_surfaces(memo: Any, **_: Any) -> None:
    """The surfaces (started by ``main`` before the Lease) serve the cluster loops from now."""
    context = _context(memo)
    if context.surfaces is not None:
        context.surfaces.attach(asyncio.get_running_loop(), lambda: context.loops, context.health)


# ---------------------------------------------------------------------- indices


@kopf.index(GROUP, VERSION, "brokerclusters")
def clusters_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, name): _snapshot(body)}


@kopf.index(GROUP, VERSION, "topics")
def topics_index(namespace: str | None, spec: kopf.Spec, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, bodies.topic_cluster(body)): _snapshot(body)}


@kopf.index(GROUP, VERSION, "unloads")
def unloads_index(namespace: str | None, body: kopf.Body, **_: Any) -> Any:
    return {namespace: _snapshot(body)}


@kopf.index(GROUP, VERSION, "repartitions")
def repartitions_index(namespace: str | None, body: kopf.Body, **_: Any) -> Any:
    return {namespace: _snapshot(body)}


# The workload each loop step reads (``caching``): the watches keep them, so a step lists
# no pods and gets no StatefulSet of its own.
@kopf.index("v1", "pods", labels={workloads.CLUSTER_LABEL: kopf.PRESENT})
def pods_index(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> Any:
    return {(namespace, labels[workloads.CLUSTER_LABEL]): _snapshot(body)}


@kopf.index("apps", "v1", "statefulsets", labels={workloads.CLUSTER_LABEL: kopf.PRESENT})
def statefulsets_index(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> Any:
    return {(namespace, labels[workloads.CLUSTER_LABEL]): _snapshot(body)}


# ---------------------------------------------------------------------- the workload


def cluster_model(cluster: Parsed[BrokerCluster]) -> BrokerCluster:
    """The BrokerCluster's model; a spec that does not parse is a permanent error
    (retrying the same spec cannot help): the cluster's loop reports it in status.

    The CRD's CEL twins of the model's rules make the API server refuse such a spec; one
    stored before (an older CRD) still reaches the operator, which must say so."""
    if cluster.resource is None:
        raise kopf.PermanentError(f"invalid BrokerCluster: {cluster.problem}")
    return cluster.resource


def topic_statuses(topics: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The statuses of Topic bodies, each with its 'namespace/name' as ``name``."""
    return [{**(t.get("status") or {}), "name": full_name(t)} for t in topics if t.get("status")]


async def apply_workload(
    body: Mapping[str, Any],
    context: OperatorContext,
    statuses: Iterable[Mapping[str, Any]] = (),
) -> list[str]:
    """Apply the cluster's StatefulSet, Services, PDB and ConfigMap, and create its Kafka
    offsets Topic if it has none (``workloads.offsets_topic``); their kinds/names.

    A scale down that would remove brokers still holding replicas in ``statuses`` (Topic
    statuses, see ``topic_statuses``) keeps those brokers (the cluster's loop reports it
    as ``ScaleDownBlocked``, and applies again once they are free).
    """
    cluster = bodies.parse_cluster(body)
    key = cluster.meta.key
    generation = cluster.meta.generation
    outcome = context.workloads.setdefault(key, WorkloadOutcome())
    running = context.loops.get(key)
    try:
        applied, replicas = await _apply_workload(cluster, context, statuses)
    except kopf.TemporaryError:
        raise  # a step of a change under way (the StatefulSet being replaced)
    except Exception as exc:
        outcome.failure = _failure(generation, exc)
        if running is not None:
            running.kick()  # its status says so now, not at its next poll
        refused = isinstance(exc, KubeApiError) and exc.code in PERMANENT_CODES
        if refused or isinstance(exc, workloads.StorageRefused):
            # the same spec is refused the same way: kopf waits for the next spec change
            raise kopf.PermanentError(str(exc)) from exc
        raise
    outcome.applied, outcome.failure, outcome.replicas = generation, None, replicas
    if running is not None:
        running.kick()
    return applied


#: HTTP codes of an apply the API server refuses for what it says (retrying cannot help)
PERMANENT_CODES: Final = frozenset({400, 403, 404, 422})


def _failure(generation: int, exc: Exception) -> ApplyFailure:
    """What the BrokerCluster's Ready says of a failed apply of ``generation``'s workload."""
    if isinstance(exc, workloads.StorageRefused):
        return ApplyFailure(generation, exc.reason, str(exc))
    if isinstance(exc, kopf.PermanentError):  # the spec does not parse
        return ApplyFailure(generation, INVALID_SPEC, str(exc))
    if isinstance(exc, KubeApiError) and exc.reason and REASON.fullmatch(exc.reason):
        return ApplyFailure(generation, exc.reason, f"the API server refused {exc}")
    return ApplyFailure(generation, "ApplyFailed", f"{type(exc).__name__}: {exc}")


#: a condition reason (metav1.Condition's rule)
REASON: Final = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")


async def _apply_workload(
    parsed: Parsed[BrokerCluster],
    context: OperatorContext,
    statuses: Iterable[Mapping[str, Any]],
) -> tuple[list[str], int]:
    """The kinds/names applied, and the StatefulSet's pod count."""
    cluster = cluster_model(parsed)
    meta = parsed.meta
    await _resize_storage(context, cluster, meta.namespace)
    blockers = workloads.scale_down_blockers(cluster.spec.replicas, statuses)
    replicas = max([cluster.spec.replicas, *(b + 1 for b in blockers)])
    if blockers:
        log.warning(
            "%s/%s: keeping %d brokers, not %d: brokers %s still hold replicas",
            meta.namespace,
            meta.name,
            replicas,
            cluster.spec.replicas,
            sorted(blockers),
        )
    applied = []
    metrics = context.metrics
    metrics.reconciles.labels(WORKLOAD).inc()
    started = time.perf_counter()
    try:
        token = None
        keep_token = False
        if cluster.spec.auth.enabled:
            # before the pods: they mount both (a missing one keeps them ContainerCreating)
            try:
                token = await auth.replication_token(context.api, parsed)
            except InvalidRequest as exc:
                # a bad edit of the Secret's token lines: the brokers keep the tokens they
                # hold, and so does the loop; the workload itself is still applied
                log.error("%s/%s: %s; the token in force stays", meta.namespace, meta.name, exc)
                keep_token = True
            await auth.sync_acl(context.api, parsed, context.clock.now_ms())
            applied += [
                f"Secret/{auth.auth_secret_name(meta.name)}",
                f"ConfigMap/{auth.acl_config_name(meta.name)}",
            ]
        for manifest in workloads.manifests(
            cluster, meta.uid, meta.namespace, context.workload, replicas
        ):
            await context.api.apply(manifest)
            applied.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
        await _delete_stale_external_services(context, cluster, meta.namespace, replicas)
        offsets = workloads.offsets_topic(cluster, meta.uid, meta.namespace)
        if offsets is not None and await context.api.create(offsets):
            applied.append(f"Topic/{offsets['metadata']['name']}")
        running = context.loops.get(meta.key)
        if running is not None and not keep_token:
            # auth turned on (or off) while the loop runs: its polls and pushes follow
            running.set_auth_token(token)
    except Exception:
        metrics.errors.labels(WORKLOAD).inc()
        raise
    finally:
        metrics.durations.labels(WORKLOAD).observe(time.perf_counter() - started)
    return applied, replicas


async def _delete_stale_external_services(
    context: OperatorContext, cluster: BrokerCluster, namespace: str, replicas: int
) -> None:
    """Delete the external Services of brokers a scale down removed (or all of them, once
    the external listener is): left, they would hold their node ports."""
    selector = (
        f"{workloads.CLUSTER_LABEL}={cluster.metadata.name},{workloads.EXTERNAL_SERVICE_LABEL}"
    )
    existing = await context.api.list("v1", "Service", namespace, selector)
    metas = [bodies.meta_of(service) for service in existing]
    for name in workloads.stale_external_services(cluster, replicas, metas):
        await context.api.delete(ObjectRef("v1", "Service", namespace, name))


async def _resize_storage(context: OperatorContext, cluster: BrokerCluster, namespace: str) -> None:
    """Carry out a change of ``storage.size`` before the StatefulSet is applied, whose
    ``volumeClaimTemplates`` the API server refuses to change (422).

    Growth, where the claims' StorageClass allows expansion: every broker's claim is
    grown in place (the volume expands under the running broker), then the StatefulSet
    is deleted without its pods (``propagationPolicy: Orphan``) and applied again with
    the new template, which adopts them (as Elastic's ECK does): nothing restarts. The
    apply is retried (``kopf.TemporaryError``) until the old StatefulSet is gone.
    A shrink, or growth whose class does not allow expansion: ``StorageRefused``."""
    name = cluster.metadata.name
    sts_ref = ObjectRef("apps/v1", "StatefulSet", namespace, name)
    statefulset = await context.api.get(sts_ref)
    if statefulset is None:
        return
    if (statefulset.get("metadata") or {}).get("deletionTimestamp"):
        raise kopf.TemporaryError("the StatefulSet is being replaced", delay=1)
    stored, wanted = workloads.claim_size(statefulset), cluster.spec.storage.size
    change = workloads.storage_change(stored, wanted)
    if change == 0:
        return
    if change < 0:
        raise workloads.StorageRefused(
            workloads.STORAGE_SHRINK,
            f"storage.size {wanted} is smaller than the brokers' volumes ({stored}):"
            f" a volume cannot shrink; set it back to at least {stored}",
        )
    class_name = cluster.spec.storage.storage_class_name or await _default_class(context)
    storage_class = (
        None
        if class_name is None
        else await context.api.get(ObjectRef("storage.k8s.io/v1", "StorageClass", "", class_name))
    )
    if not workloads.expandable(storage_class):
        raise workloads.StorageRefused(
            workloads.STORAGE_NOT_EXPANDABLE,
            f"storage.size {wanted} needs the brokers' volumes ({stored}) expanded, and"
            f" StorageClass {class_name!r} does not allow it (allowVolumeExpansion);"
            f" set it back to {stored}",
        )
    claims = await context.api.list(
        "v1", "PersistentVolumeClaim", namespace, f"{workloads.CLUSTER_LABEL}={name}"
    )
    for claim in claims:
        if not claim["metadata"]["name"].startswith(f"data-{name}-"):
            continue
        patch = workloads.claim_patch(claim, wanted)
        if patch is not None:
            await context.api.apply(patch)
            log.info("%s/%s: claim %s grows to %s", namespace, name, claim["metadata"]["name"],
                     wanted)  # fmt: skip
    await context.api.delete(sts_ref, orphan=True)
    raise kopf.TemporaryError(f"replacing the StatefulSet for volumes of {wanted}", delay=1)


async def _default_class(context: OperatorContext) -> str | None:
    """The name of the cluster's default StorageClass, if it has one."""
    classes = await context.api.list("storage.k8s.io/v1", "StorageClass", "")
    for storage_class in classes:
        annotations = storage_class.get("metadata", {}).get("annotations") or {}
        if annotations.get(workloads.DEFAULT_CLASS_ANNOTATION) == "true":
            return str(storage_class["metadata"]["name"])
    return None


@kopf.on.resume(GROUP, VERSION, "brokerclusters")
@kopf.on.create(GROUP, VERSION, "brokerclusters")
@kopf.on.update(GROUP, VERSION, "brokerclusters", field="spec")
async def cluster_workload(
    body: kopf.Body, namespace: str | None, name: str, memo: Any, **kwargs: Any
) -> None:
    if paused(bodies.meta_of(body)):
        # A paused cluster is left as it is, its workload too; retried until the pause is
        # lifted, when the spec it has then is applied (a change made meanwhile included)
        raise kopf.TemporaryError(
            f"BrokerCluster {namespace}/{name} is paused: its workload waits", delay=PAUSED_RETRY_S
        )
    topics: kopf.Index[Any, Any] | None = kwargs.get("topics_index")
    mine = list(topics.get((namespace or "default", name), [])) if topics is not None else []
    applied = await apply_workload(body, _context(memo), topic_statuses(mine))
    log.info("applied %s", ", ".join(applied))


# ---------------------------------------------------------------------- the control loop


def _only(store: Any) -> dict[str, Any] | None:
    return next(iter(store), None) if store is not None else None


def event_sink(
    context: OperatorContext,
    cluster_key: tuple[str, str],
    topics: Mapping[Any, Any],
    clusters: Mapping[Any, Any],
) -> eventing.EventPoster:
    """Post a step's decisions as Events on the Topic each names, else on the
    BrokerCluster: one Event per object and kind, counted again when it repeats
    (``eventing``)."""

    def target_of(event: Event) -> Mapping[str, Any] | None:
        namespace, _, rest = event.subject.partition("/")
        topic_name = rest.split("/")[0].split(":")[0]
        for body in topics.get(cluster_key, []):
            meta = bodies.meta_of(body)
            if (meta.namespace, meta.name) == (namespace, topic_name):
                return dict(body)
        return _only(clusters.get(cluster_key))

    return eventing.EventPoster(context.api, target_of, context.clock.now_ms)


def watched_workload(
    cluster_key: tuple[str, str], pods: Mapping[Any, Any], statefulsets: Mapping[Any, Any]
) -> Callable[[], caching.Watched]:
    """The cluster's pods and StatefulSet as the watches last delivered them."""

    def view() -> caching.Watched:
        return caching.Watched(
            tuple(pods.get(cluster_key, [])), _only(statefulsets.get(cluster_key))
        )

    return view


@kopf.daemon(GROUP, VERSION, "brokerclusters", cancellation_timeout=10.0)
async def cluster_loop(namespace: str | None, name: str, memo: Any, **kwargs: Any) -> None:
    """Run the cluster's control loop until kopf stops the daemon (the object is deleted,
    or the operator exits). The indices come in ``kwargs`` under their functions' names."""
    context = _context(memo)
    namespace = namespace or "default"
    key = (namespace, name)
    clusters_index: kopf.Index[Any, Any] = kwargs["clusters_index"]
    topics_index: kopf.Index[Any, Any] = kwargs["topics_index"]
    unloads_index: kopf.Index[Any, Any] = kwargs["unloads_index"]
    # (an empty kopf Index is falsy: never ``or`` it away, the daemon keeps this object)
    repartitions_index: Mapping[Any, Any] = kwargs.get("repartitions_index", {})

    def desired() -> DesiredObjects:
        cluster = _only(clusters_index.get(key))
        if cluster is None:
            raise LookupError(f"BrokerCluster {namespace}/{name} left the index")
        return DesiredObjects(
            cluster,
            list(topics_index.get(key, [])),
            list(unloads_index.get(namespace, [])),
            list(repartitions_index.get(namespace, [])),
        )

    async def reapply(statuses: list[dict[str, Any]]) -> None:
        await apply_workload(desired().cluster, context, statuses)

    async def read_tokens() -> tuple[str, ...] | None:
        """The replication tokens the auth Secret lists now; None while auth is off."""
        cluster = bodies.parse_cluster(desired().cluster)
        if not cluster_model(cluster).spec.auth.enabled:
            return None
        return await auth.read_replication_tokens(context.api, cluster)

    try:
        runtime = await _start_runtime(context, key, desired, reapply, read_tokens, kwargs)
    except kopf.TemporaryError:
        raise  # blocked until its cluster is fixed: said on /healthz and in its status
    except Exception as exc:
        # a loop that cannot start is not running either: /healthz says so until kopf
        # starts the daemon again
        context.died[key] = f"{type(exc).__name__}: {exc}"
        raise
    context.loops[key] = runtime
    context.died.pop(key, None)
    context.blocked.pop(key, None)
    log.info("control loop of %s/%s started", namespace, name)
    try:
        await runtime.run(desired)
    except Exception as exc:
        # kopf restarts the daemon after a backoff; until then /healthz says so
        context.died[key] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        context.loops.pop(key, None)


async def _start_runtime(
    context: OperatorContext,
    key: tuple[str, str],
    desired: Callable[[], DesiredObjects],
    reapply: Callable[[list[dict[str, Any]]], Awaitable[None]],
    read_tokens: Callable[[], Awaitable[tuple[str, ...] | None]],
    indices: Mapping[str, Any],
) -> ClusterRuntime:
    """The cluster's runtime, ready to run; ``kopf.TemporaryError`` while its cluster
    blocks it (a spec the model refuses, a replication token that does not parse): said on
    /healthz and in the BrokerCluster's status, and kopf starts the daemon again soon,
    which looks again: fixing the spec or the Secret is all it takes. Not a death (the
    operator's liveness stays): restarting the operator would fix neither, and would
    interrupt every other cluster's loop."""
    objects = desired()
    cluster = objects.cluster
    parsed = bodies.parse_cluster(cluster)
    delay = context.runtime.token_reread_interval_ms / 1000
    if parsed.resource is None:
        problem = str(parsed.problem)
        why = f"invalid spec: {problem}"
        context.blocked[key] = why
        await _report_cannot_start(context, parsed, INVALID_SPEC, problem)
        raise kopf.TemporaryError(why, delay=delay)
    # the replication token for the brokers' admin ports, now and as it rotates (the loop
    # re-reads the Secret: ``ClusterRuntime.refresh_token``)
    try:
        token = (
            await auth.replication_token(context.api, parsed)
            if parsed.resource.spec.auth.enabled
            else None
        )
    except (InvalidRequest, LookupError) as exc:
        # no token to poll the brokers with, so no loop (the message names lines, never a
        # value)
        why = f"{type(exc).__name__}: {exc}"
        context.blocked[key] = why
        await _report_cannot_start(context, parsed, TOKEN_UNREADABLE, str(exc))
        raise kopf.TemporaryError(why, delay=delay) from exc
    ports = ClusterPorts(
        context.api,
        context.clock,
        events=event_sink(context, key, indices["topics_index"], indices["clusters_index"]),
        metrics=context.metrics,
    )
    workload = WorkloadLink(
        reapply=reapply,
        outcome=lambda: context.workloads.get(key),
        # (no index: handlers called outside kopf read the API every step)
        watched=watched_workload(key, indices["pods_index"], indices["statefulsets_index"])
        if "pods_index" in indices and "statefulsets_index" in indices
        else None,
    )
    return ClusterRuntime(
        objects,
        ports,
        context.runtime,
        workload=workload,
        credentials=Credentials(token, read_tokens),
    )


#: the BrokerCluster's Ready reason while its auth Secret's replication token does not parse
TOKEN_UNREADABLE: Final = "ReplicationTokenInvalid"
#: the BrokerCluster's Ready reason while the model refuses its spec
INVALID_SPEC: Final = bodies.INVALID_SPEC


def cannot_start_status(
    cluster: Parsed[BrokerCluster], reason: str, why: str, now: str
) -> dict[str, Any] | None:
    """The BrokerCluster's status with ``Ready=False`` (and ``Stalled``: waiting does not
    fix a bad edit) because its control loop cannot start, for ``reason`` (``why``: for a
    token, which line, never a value). None if it already says so, or if its stored status
    cannot be read (it is not written over). The loop's first status write, once it
    starts, replaces both conditions."""
    if cluster.status_problem is not None:
        return None
    stored = cluster.status
    generation = cluster.meta.generation
    message = f"the control loop cannot start: {why}"
    previous = bodies.stored_condition(cluster, "Ready")
    ready = condition("Ready", "False", reason, message, generation, previous, now)
    stalled = stalled_condition(ready, bodies.stored_condition(cluster, "Stalled"), now)
    others = [
        c.model_dump(mode="json", exclude_unset=True)
        for c in (stored.conditions if stored is not None else [])
        if c.type not in {"Ready", "Stalled"}
    ]
    wanted = {
        **_status_document(stored),
        "conditions": [ready, *([stalled] if stalled else []), *others],
    }
    return None if bodies.unchanged(cluster, wanted) else wanted


async def _report_cannot_start(
    context: OperatorContext, cluster: Parsed[BrokerCluster], reason: str, why: str
) -> None:
    log.error("control loop of %s cannot start: %s", cluster.meta.full_name, why)
    ref = cluster.ref
    try:
        body = await context.api.get(ref)
        if body is None:
            return
        stored = bodies.parse_cluster(body)
        now = condition_time(context.clock.now_ms())
        status = cannot_start_status(stored, reason, why, now)
        if status is not None:
            await context.api.replace_status(ref, str(stored.meta.resource_version), status)
    except StaleResourceVersion:
        pass  # changed meanwhile: the daemon's next start writes it again
    except Exception:  # the report is best effort; /healthz says it anyway
        log.exception("cannot write the Ready condition of %s/%s", ref.namespace, ref.name)


# ---------------------------------------------------------------------- kicks


def orphan_status(topic: Parsed[Topic], now: str) -> dict[str, Any] | None:
    """The status of a Topic whose BrokerCluster does not exist, or None if it already has it.

    Only a Topic never placed is given one: a placed Topic keeps its assignments (the
    cluster may be coming back; nothing stored is lost), and its Ready condition says
    so once the cluster's loop runs again. Nor is one whose spec or status does not parse
    (what it says cannot be known, so nothing is written over it).
    """
    model = topic.resource
    if model is None or topic.status_problem is not None:
        return None
    stored = model.status or TopicStatus()
    if stored.partitions:
        return None
    status = _status_document(model.status)
    cluster = model.spec.cluster_ref.name
    generation = topic.meta.generation
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    previous = conditions.get("Ready")
    ready = {
        "type": "Ready",
        "status": "False",
        "observedGeneration": generation,
        "reason": "ClusterNotFound",
        "message": f"BrokerCluster {cluster!r} does not exist in this namespace",
        "lastTransitionTime": now
        if previous is None or previous.get("status") != "False"
        else previous.get("lastTransitionTime", now),
    }
    # waiting does not fix it: kstatus's Failed until the cluster exists (its loop then
    # writes the Topic's conditions, without this one)
    stalled = stalled_condition(ready, conditions.get("Stalled"), now)
    wanted = {
        **status,
        "observedGeneration": generation,
        "conditions": [ready, *([stalled] if stalled else [])],
    }
    return None if wanted == status else wanted


def _status_document(status: pydantic.BaseModel | None) -> dict[str, Any]:
    """A stored status as the document it was read from (the fields it had)."""
    if status is None:
        return {}
    return status.model_dump(mode="json", by_alias=True, exclude_unset=True)


async def release_left_behind(
    context: OperatorContext,
    topic: Parsed[Topic],
    body: Mapping[str, Any],
    cluster_name: str,
    cluster: Parsed[BrokerCluster] | None,
) -> None:
    """Let a held Topic whose BrokerCluster is gone or going go, its data where it is, and
    say where on the Topic (``finalizing.left_behind``; ``body``: the Topic the Event is
    posted on)."""
    verdict = finalizing.left_behind(topic, cluster_name, cluster)
    await finalizing.release(context.api, topic.ref, topic.meta)
    log.warning("topic %s: %s", topic.meta.full_name, verdict.message)
    kind = "Normal" if verdict.reason == "TopicDataRetained" else "Warning"
    context.post_event(body, kind, verdict.reason, verdict.message)


@kopf.on.event(GROUP, VERSION, "topics")
async def topic_changed(body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """Kick the owning cluster's loop; a Topic whose cluster does not exist is told so.

    A Topic gets the data finalizer (``finalizing``) the first time it is seen. A deleted
    one whose cluster does not exist, or is being deleted (its loop stopped), is let go
    at once: its data stays where it is, and an Event says where.
    """
    context = _context(memo)
    topic = bodies.parse_topic(body)
    # kopf's index key (``topics_index``), which a spec the model refuses has too
    key = (topic.meta.namespace, str(bodies.topic_cluster(body)))
    gone = kwargs.get("type") == "DELETED"
    if not gone and finalizing.needs_finalizer(topic.meta):
        try:
            await finalizing.attach(context.api, topic.ref, topic.meta)
        except StaleResourceVersion:
            pass
        return  # either way the Topic changed: its next event brings this handler back
    clusters: kopf.Index[Any, Any] | None = kwargs.get("clusters_index")
    cluster_body = _only(clusters.get(key)) if clusters is not None and key in clusters else None
    cluster = None if cluster_body is None else bodies.parse_cluster(cluster_body)
    loop_gone = clusters is not None and finalizing.gone_or_going(
        None if cluster is None else cluster.meta
    )
    if not gone and loop_gone and finalizing.held(topic.meta):
        await release_left_behind(context, topic, body, key[1], cluster)
        return
    runtime = context.loops.get(key)
    if runtime is not None:
        runtime.kick()
        return
    if clusters is None or key in clusters or gone:
        return
    status = orphan_status(topic, condition_time(context.clock.now_ms()))
    if status is None:
        return  # already says so (or cannot be read): no write
    try:
        await context.api.replace_status(topic.ref, str(topic.meta.resource_version), status)
    except StaleResourceVersion:
        pass  # it changed: its next event brings this handler back


def unload_topic(unload: Parsed[Unload]) -> str | None:
    """The 'namespace/name' of the Topic an Unload moves partitions of (None: its spec
    does not parse, so it names none)."""
    if unload.resource is None:
        return None
    return f"{unload.meta.namespace}/{unload.resource.spec.topic_ref.name}"


def unserved(
    unload: Parsed[Unload],
    topics: Mapping[Any, Iterable[Mapping[str, Any]]],
    clusters: Mapping[Any, Iterable[Mapping[str, Any]]],
) -> str | None:
    """Why no cluster's loop will ever serve the Unload (so nothing would release it), or
    None when one does or will: its Topic's cluster exists and is not being deleted (a
    loop not running yet loads it when it starts)."""
    wanted = unload_topic(unload)
    if wanted is None:
        return f"its spec does not parse ({unload.problem})"
    namespace = wanted.partition("/")[0]
    owner, topic = next(
        (
            (key, meta)
            for key, indexed in topics.items()
            if key[0] == namespace
            for meta in map(bodies.meta_of, indexed)
            if meta.full_name == wanted
        ),
        (None, None),
    )
    if owner is None or topic is None:
        return f"its topic {wanted} does not exist"
    if topic.deleting:
        return f"its topic {wanted} is being deleted"
    cluster = _only(clusters.get(owner)) if owner in clusters else None
    if finalizing.gone_or_going(None if cluster is None else bodies.meta_of(cluster)):
        going = "does not exist" if cluster is None else "is being deleted"
        return f"BrokerCluster {owner[1]} of its topic {wanted} {going}"
    return None


async def release_unserved(
    context: OperatorContext, unload: Parsed[Unload], body: Mapping[str, Any], why: str
) -> None:
    message = f"released at once: {why}, so no cluster's loop moves its partitions any more"
    await finalizing.release(context.api, unload.ref, unload.meta, finalizing.UNLOAD_FINALIZER)
    log.info("unload %s: %s", unload.meta.full_name, message)
    context.post_event(body, "Normal", "UnloadReleased", message)


@kopf.on.event(GROUP, VERSION, "unloads")
async def unload_changed(namespace: str | None, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """Kick the namespace's loops. An Unload gets the move finalizer (``finalizing``) the
    first time it is seen: deleted mid-move, it stays until its cluster's loop has
    finished the moves in flight (it never leaves a partition sealed), and the loop
    releases it. A deleted one that no loop will serve (``unserved``) is let go at once."""
    context = _context(memo)
    unload = bodies.parse_unload(body)
    gone = kwargs.get("type") == "DELETED"
    if not gone and finalizing.needs_finalizer(unload.meta, finalizing.UNLOAD_FINALIZER):
        try:
            await finalizing.attach(
                context.api, unload.ref, unload.meta, finalizing.UNLOAD_FINALIZER
            )
        except StaleResourceVersion:
            pass
        return  # either way the Unload changed: its next event brings this handler back
    for (loop_namespace, _name), runtime in context.loops.items():
        if loop_namespace == namespace:
            runtime.kick()
    topics: kopf.Index[Any, Any] | None = kwargs.get("topics_index")
    clusters: kopf.Index[Any, Any] | None = kwargs.get("clusters_index")
    if gone or topics is None or clusters is None:
        return
    if finalizing.held(unload.meta, finalizing.UNLOAD_FINALIZER):
        why = unserved(unload, topics, clusters)
        if why is not None:
            await release_unserved(context, unload, body, why)


# ---------------------------------------------------------------------- a cluster's deletion


@kopf.on.delete(GROUP, VERSION, "brokerclusters")
async def cluster_deleted(
    namespace: str | None, name: str, body: kopf.Body, memo: Any, **kwargs: Any
) -> None:
    """Let go of the Topics and Unloads the deleted cluster holds: kopf stopped its loop
    as the deletion started, and no later event of theirs need come (a namespace delete
    marks them all at once). A Topic or Unload deleted later finds the cluster gone or
    going in its own event (``topic_changed``, ``unload_changed``). Objects of deleted
    topics its loop was still removing stay: a Warning on the cluster says where
    (``finalizing.removals_left``)."""
    context = _context(memo)
    key = (namespace or "default", name)
    topics_index: kopf.Index[Any, Any] | None = kwargs.get("topics_index")
    unloads_index: kopf.Index[Any, Any] | None = kwargs.get("unloads_index")
    cluster = bodies.parse_cluster(body)
    left = finalizing.removals_left(cluster)
    if left is not None:
        log.warning("cluster %s/%s: %s", key[0], name, left)
        context.post_event(body, "Warning", "TopicObjectsNotDeleted", left)
    topics = list(topics_index.get(key, [])) if topics_index is not None else []
    names = set()
    for topic_body in topics:
        topic = bodies.parse_topic(topic_body)
        names.add(topic.meta.full_name)
        if finalizing.held(topic.meta):
            await release_left_behind(context, topic, topic_body, name, cluster)
    unloads = list(unloads_index.get(key[0], [])) if unloads_index is not None else []
    for unload_body in unloads:
        unload = bodies.parse_unload(unload_body)
        if finalizing.held(unload.meta, finalizing.UNLOAD_FINALIZER) and (
            unload_topic(unload) in names
        ):
            why = f"BrokerCluster {name} is being deleted"
            await release_unserved(context, unload, unload_body, why)


@kopf.on.event(GROUP, VERSION, "repartitions")
async def repartition_changed(
    namespace: str | None, body: kopf.Body, memo: Any, **kwargs: Any
) -> None:
    """Kick the loop of the cluster whose Topic it names; fail it if that Topic does not
    exist (read from the API server: the index may not have a Topic applied with it yet);
    tell it it waits if the Topic's BrokerCluster does not exist."""
    context = _context(memo)
    namespace = namespace or "default"
    for (loop_namespace, _name), runtime in context.loops.items():
        if loop_namespace == namespace:
            runtime.kick()
    topics: kopf.Index[Any, Any] | None = kwargs.get("topics_index")
    if kwargs.get("type") == "DELETED" or topics is None:
        return
    repartition = bodies.parse_repartition(body)
    wanted = repartition_owners.topic_of(repartition)
    if wanted is None:
        # the CRD's rules keep such a spec out; one stored before names no topic to serve
        log.warning("repartition %s: %s", repartition.meta.full_name, repartition.problem)
        return
    owner = next(
        (
            key
            for key, indexed in topics.items()
            if key[0] == namespace and any(bodies.meta_of(t).full_name == wanted for t in indexed)
        ),
        None,
    )
    if owner is not None:
        clusters: kopf.Index[Any, Any] | None = kwargs.get("clusters_index")
        if clusters is None or owner in clusters:
            return  # its cluster's loop serves it (kicked above, or about to start)
        now_ms = context.clock.now_ms()
        status = repartition_owners.missing_cluster_status(repartition, owner[1], now_ms)
    else:
        status = repartition_owners.missing_topic_status(repartition, context.clock.now_ms())
    if status is None:
        return  # served or told before (its topic may have gone since): it keeps its record
    topic = ObjectRef(repartition.ref.api_version, "Topic", namespace, wanted.partition("/")[2])
    if owner is None and await context.api.get(topic) is not None:
        return  # the index has not caught up with it yet: its loop serves this one
    try:
        await context.api.replace_status(
            repartition.ref, str(repartition.meta.resource_version), status
        )
    except StaleResourceVersion:
        pass  # it changed: its next event brings this handler back
