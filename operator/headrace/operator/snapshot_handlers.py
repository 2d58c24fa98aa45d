"""The kopf handlers of TopicSnapshot, TopicRestore and TopicSnapshotSchedule, and the
reconcilers they call
(adapter: reads and writes through ``KubeApi``; Jobs and statuses from the pure
``snapshot_jobs``). The same commands as ``headrace apply -f`` in local mode run in the
Jobs (``cli.snapshots``), so both modes take and restore the same snapshot.

* **TopicSnapshot**, on create and resume and on its Job's events: find the Topic and its
  BrokerCluster, take the cuts from that cluster's latest heartbeats and create the
  snapshot Job once; its status follows the Job (``Pending``, then ``Ready`` with the
  document's summary, or ``Failed``). Everything the snapshot depends on is stored: the
  Job (named after it) and the document in the store, so a restarted operator finds the
  Job and never starts a second one, and a retried pod reports the document it wrote.
* **Deleting a TopicSnapshot** deletes its document (a finalizer: kopf's, through the
  delete handler): a Job of ``tier delete-snapshot``, after the snapshot's own Job has
  finished. Until then its objects stay pinned.
* **TopicRestore**, on create and resume, its Job's events and its Topic's events: once
  its TopicSnapshot is Ready, create the new Topic held ``pending`` (labelled with the
  restore, so a restarted operator knows it as its own, annotated with the snapshot's
  key, and the creation id recorded in the status first), then the restore Job; when the
  Job succeeds, mark the Topic ``written``, and report ``Ready`` when the control loop
  has placed it (the Topic is Ready). A Topic of that name that the restore did not
  create fails it; one still pending for a restore of another snapshot is named so, with
  both snapshots.

* **TopicSnapshotSchedule**, on a kopf timer (every ``SCHEDULE_TICK_S``): create
  the TopicSnapshot that is due (named after its time: a restart creates none twice),
  delete the ones beyond what the schedule keeps, write its status, as
  ``control.snapshot_schedules.tick`` decides (local mode's controller runs the same).

Waiting (for brokers' heartbeats, for the snapshot) is retried by kopf: the create and
resume handlers raise ``TemporaryError`` until an event will drive the rest. Status writes
are compare-and-swap and skipped when nothing changed; phase changes are posted as Events.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf

from headrace.control import snapshot_schedules
from headrace.control.documents import (
    RESTORE_ANNOTATION,
    condition,
    condition_time,
    epoch_ms,
    restore_held_for,
    restored_topic,
)
from headrace.control.model import RestoreStage
from headrace.operator import (
    bodies,
    compaction_handlers,
    compaction_jobs,
    snapshot_jobs,
)
from headrace.operator.bodies import Parsed, ResourceT
from headrace.operator.compaction_jobs import NotRunnable
from headrace.operator.handlers import GROUP, VERSION, OperatorContext
from headrace.operator.kube import ObjectRef, StaleResourceVersion
from headrace.operator.snapshot_jobs import Step
from headrace.protocol.coordination import Heartbeat
from headrace.resources import meta
from headrace.resources.clusters import BrokerCluster
from headrace.resources.meta import READY, ConditionStatus
from headrace.resources.snapshots import (
    SnapshotPhase,
    TopicRestore,
    TopicSnapshot,
    TopicSnapshotStatus,
)
from headrace.resources.topics import Topic
from headrace.tiered.snapshots import (
    InvalidSnapshot,
    RestoreOfAnotherSnapshot,
    refuse_another_snapshot,
    where_stored,
)

log = logging.getLogger(__name__)

API_VERSION: Final = meta.API_VERSION
#: seconds between kopf's retries of a snapshot or restore that waits
RETRY_S: Final = 5
#: status writes tried before giving up until the next event
WRITE_ATTEMPTS: Final = 5
#: seconds between two looks at a schedule (a snapshot is taken at most this late)
SCHEDULE_TICK_S: Final = 10.0


class Waiting(Exception):
    """The reconcile cannot go on until something changes that no watched event announces."""


def _context(memo: Any) -> OperatorContext:
    context: OperatorContext = memo.context
    return context


def _invalid_status(stored: Parsed[ResourceT], now: str) -> dict[str, Any]:
    """The status of an object whose spec the model refuses: ``Ready=False`` and
    ``Stalled``, with the fields and rules refused."""
    generation, why = stored.meta.generation, str(stored.problem)
    return {
        "observedGeneration": generation,
        "conditions": [
            condition(
                kind,
                value,
                bodies.INVALID_SPEC,
                why,
                generation,
                bodies.stored_condition(stored, kind),
                now,
            )
            for kind, value in ((READY, "False"), ("Stalled", "True"))
        ],
    }


def _invalid(stored: Parsed[ResourceT]) -> NotRunnable:
    """Why an object stored before the CRD's rules refused its spec never runs: said in its
    status, as ``Stalled``."""
    return NotRunnable(bodies.INVALID_SPEC, str(stored.problem))


def _heartbeats(context: OperatorContext, namespace: str, cluster: str) -> Mapping[int, Heartbeat]:
    runtime = context.loops.get((namespace, cluster))
    return runtime.loop.heartbeats if runtime is not None else {}


def _post(
    context: OperatorContext,
    stored: Parsed[TopicSnapshot] | Parsed[TopicRestore],
    body: Mapping[str, Any],
    kind: str,
    status: Mapping[str, Any],
) -> None:
    """An Event for a phase change (none when the phase stays)."""
    phase = status.get("phase")
    old = None if stored.resource is None else stored.resource.status
    before = None if old is None or old.phase is None else str(old.phase)
    if phase == before or phase == str(SnapshotPhase.PENDING):
        return
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    failed = phase == str(SnapshotPhase.FAILED)
    try:
        context.post_event(
            body, "Warning" if failed else "Normal", f"{kind}{phase}", str(ready["message"])
        )
    except Exception:  # outside kopf's loop (tests): the status says it all the same
        log.debug("no event posted for %s", stored.meta.name)


async def _job_outcome(
    context: OperatorContext, namespace: str, name: str
) -> tuple[dict[str, Any] | None, snapshot_jobs.Outcome]:
    job = await context.api.get(ObjectRef("batch/v1", "Job", namespace, name))
    pods = [] if job is None else await compaction_handlers.pods_of(context.api, namespace, name)
    return job, snapshot_jobs.outcome(job, pods)


async def _cluster(context: OperatorContext, namespace: str, name: str) -> BrokerCluster:
    body = await context.api.get(ObjectRef(API_VERSION, "BrokerCluster", namespace, name))
    if body is None:
        raise NotRunnable("ClusterNotFound", f"BrokerCluster {name!r} does not exist")
    parsed = bodies.parse_cluster(body)
    cluster = parsed.resource
    if cluster is None:
        raise NotRunnable("InvalidCluster", f"BrokerCluster does not parse: {parsed.problem}")
    if cluster.spec.object_store is None:
        raise NotRunnable("NoObjectStore", f"BrokerCluster {name!r} has no objectStore")
    return cluster


# ---------------------------------------------------------------------- TopicSnapshot


async def reconcile_snapshot(context: OperatorContext, namespace: str, name: str) -> None:
    """Create the snapshot's Job once and write its status (see the module); ``Waiting``
    while the cut cannot be taken yet."""
    api = context.api
    ref = ObjectRef(API_VERSION, "TopicSnapshot", namespace, name)
    job_name = snapshot_jobs.job_name(Step.SNAPSHOT, name)
    for _ in range(WRITE_ATTEMPTS):
        body = await api.get(ref)
        if body is None:
            return
        stored = bodies.parse_snapshot(body)
        if stored.meta.deleting or snapshot_jobs.final(stored):
            return
        snapshot = stored.resource
        job, result = await _job_outcome(context, namespace, job_name)
        blocked = None
        if snapshot is None:
            blocked = _invalid(stored)
        elif job is None:
            try:
                run = await compaction_handlers.find_target(api, namespace, snapshot.spec.topic_ref)
                heartbeats = _heartbeats(context, namespace, run.cluster.metadata.name)
                cuts = snapshot_jobs.cuts_from(heartbeats, run.topic, run.partitions)
                await api.apply(
                    snapshot_jobs.job_manifest(
                        name=job_name,
                        namespace=namespace,
                        owner=stored,
                        cluster=run.cluster,
                        args=snapshot_jobs.snapshot_args(run, name, cuts),
                        labels={
                            snapshot_jobs.SNAPSHOT_LABEL: name,
                            compaction_jobs.TOPIC_LABEL: snapshot.spec.topic_ref.name,
                        },
                        workload=context.workload,
                    )
                )
                job, result = await _job_outcome(context, namespace, job_name)
            except NotRunnable as exc:
                blocked = exc
        now = condition_time(context.clock.now_ms())
        status = snapshot_jobs.snapshot_status(stored, result, blocked, now)
        try:
            await compaction_handlers.write_status(api, stored, status)
        except StaleResourceVersion:
            continue
        _post(context, stored, body, "Snapshot", status)
        if blocked is not None:
            raise Waiting(blocked.message)
        return
    log.warning("TopicSnapshot %s/%s: status kept conflicting; next event retries", namespace, name)


@kopf.on.resume(GROUP, VERSION, "topicsnapshots")
@kopf.on.create(GROUP, VERSION, "topicsnapshots")
async def snapshot_created(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    try:
        await reconcile_snapshot(_context(memo), namespace or "default", name)
    except Waiting as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from None


@kopf.on.event("batch", "v1", "jobs", labels={snapshot_jobs.SNAPSHOT_LABEL: kopf.PRESENT})
async def snapshot_job_changed(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    try:
        await reconcile_snapshot(
            _context(memo), namespace or "default", str(labels[snapshot_jobs.SNAPSHOT_LABEL])
        )
    except Waiting:
        pass  # the create handler retries


async def remove_snapshot(context: OperatorContext, body: Mapping[str, Any]) -> None:
    """Delete the snapshot's document before its TopicSnapshot goes (see the module);
    ``Waiting`` until that is done."""
    stored = bodies.parse_snapshot(body)
    namespace, name = stored.meta.namespace, stored.meta.name
    job, taken = await _job_outcome(context, namespace, snapshot_jobs.job_name(Step.SNAPSHOT, name))
    if job is not None and taken.succeeded is None:
        raise Waiting(f"the snapshot's Job is running: {taken.message}")
    status = None if stored.resource is None else stored.resource.status
    key = (None if status is None else status.key) or (taken.summary or {}).get("key")
    if not key:
        return  # never written (or written and deleted again by the failed Job itself)
    try:
        cluster_id, topic, creation_id, _ = where_stored(str(key))
        cluster = await _cluster(context, namespace, cluster_id)
    except (InvalidSnapshot, NotRunnable) as exc:
        # no store to reach: the document and its pins stay (data kept, never lost)
        context.post_event(
            body, "Warning", "SnapshotKept", f"{key} stays in the object store: {exc}"
        )
        return
    delete_name = snapshot_jobs.job_name(Step.DELETE, name)
    job, deleted = await _job_outcome(context, namespace, delete_name)
    if job is None:
        await context.api.apply(
            snapshot_jobs.job_manifest(
                name=delete_name,
                namespace=namespace,
                owner=stored,
                cluster=cluster,
                args=snapshot_jobs.delete_args(cluster, topic, creation_id, name),
                labels={snapshot_jobs.SNAPSHOT_LABEL: name},
                workload=context.workload,
            )
        )
        raise Waiting(f"deleting {key}")
    if deleted.succeeded is None:
        raise Waiting(f"deleting {key}: {deleted.message}")
    if not deleted.succeeded:
        raise Waiting(
            f"deleting {key} failed ({deleted.message}); delete Job {delete_name} to try again"
        )
    context.post_event(body, "Normal", "SnapshotDeleted", f"{key} deleted")


@kopf.on.delete(GROUP, VERSION, "topicsnapshots")
async def snapshot_deleted(body: kopf.Body, memo: Any, **_: Any) -> None:
    try:
        await remove_snapshot(_context(memo), body)
    except Waiting as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from None


# ---------------------------------------------------------------------- TopicRestore


async def reconcile_restore(context: OperatorContext, namespace: str, name: str) -> None:
    """Take one TopicRestore a step on (see the module); ``Waiting`` while its snapshot is
    not Ready."""
    api = context.api
    ref = ObjectRef(API_VERSION, "TopicRestore", namespace, name)
    job_name = snapshot_jobs.job_name(Step.RESTORE, name)
    for _ in range(WRITE_ATTEMPTS):
        body = await api.get(ref)
        if body is None:
            return
        stored = bodies.parse_restore(body)
        if stored.meta.deleting or snapshot_jobs.final(stored):
            return
        now = condition_time(context.clock.now_ms())
        again = False
        try:
            if stored.resource is None:
                raise _invalid(stored)
            status, again = await _restore_step(
                context, namespace, stored, stored.resource, job_name, now
            )
        except NotRunnable as exc:
            phase = SnapshotPhase.FAILED if exc.reason == "TopicExists" else SnapshotPhase.PENDING
            status = snapshot_jobs.restore_status(stored, phase, exc.message, now, blocked=exc)
        try:
            await compaction_handlers.write_status(api, stored, status)
        except StaleResourceVersion:
            continue
        _post(context, stored, body, "Restore", status)
        if again:
            continue  # the creation id is stored: on to the Job
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        if ready["reason"] in ("WaitingForSnapshot", "SnapshotNotFound"):
            raise Waiting(str(ready["message"]))
        return
    log.warning("TopicRestore %s/%s: status kept conflicting; next event retries", namespace, name)


async def _restore_step(
    context: OperatorContext,
    namespace: str,
    body: Parsed[TopicRestore],
    restore: TopicRestore,
    job_name: str,
    now: str,
) -> tuple[dict[str, Any], bool]:
    """The restore's next step, and its status after it (and whether to go on at once)."""
    api = context.api
    name = body.meta.name
    snapshot_name = restore.spec.snapshot_ref.name
    found = await api.get(ObjectRef(API_VERSION, "TopicSnapshot", namespace, snapshot_name))
    if found is None:
        raise NotRunnable("SnapshotNotFound", f"TopicSnapshot {snapshot_name!r} does not exist")
    snapshot = bodies.parse_snapshot(found).resource
    taken = None if snapshot is None else snapshot.status
    if taken is None or taken.phase != SnapshotPhase.READY or not taken.key:
        raise NotRunnable("WaitingForSnapshot", f"TopicSnapshot {snapshot_name!r} is not Ready yet")
    assert snapshot is not None  # it has a status
    cluster_id, source, source_creation_id, _ = where_stored(taken.key)
    cluster = await _cluster(context, namespace, cluster_id)
    topic_ref = ObjectRef(API_VERSION, "Topic", namespace, restore.spec.topic)
    found_topic = await api.get(topic_ref)
    recorded = None if restore.status is None else restore.status.creation_id
    if found_topic is None:
        if recorded:
            return snapshot_jobs.restore_status(
                body,
                SnapshotPhase.FAILED,
                f"Topic {restore.spec.topic!r} was deleted during the restore",
                now,
            ), False
        found_topic = await _create_topic(
            context, namespace, name, restore, snapshot, taken.key, cluster_id
        )
    topic = bodies.parse_topic(found_topic)
    if topic.meta.labels.get(snapshot_jobs.RESTORE_LABEL) != name or (
        recorded and recorded != topic.meta.uid
    ):
        raise NotRunnable("TopicExists", _not_ours(restore, topic, taken.key))
    uid = topic.meta.uid
    if not recorded:  # first: a restarted operator must know the Topic as this restore's
        held = snapshot_jobs.restore_status(
            body, SnapshotPhase.PENDING, "Topic created, held", now, creation_id=uid
        )
        return held, True
    job, result = await _job_outcome(context, namespace, job_name)
    if job is None:
        await api.apply(
            snapshot_jobs.job_manifest(
                name=job_name,
                namespace=namespace,
                owner=body,
                cluster=cluster,
                args=snapshot_jobs.restore_args(
                    cluster,
                    source,
                    source_creation_id,
                    snapshot_name,
                    f"{namespace}/{restore.spec.topic}",
                    uid,
                ),
                labels={snapshot_jobs.RESTORE_LABEL: name},
                workload=context.workload,
                spark=True,
            )
        )
        job, result = await _job_outcome(context, namespace, job_name)
    if result.succeeded is None:
        return snapshot_jobs.restore_status(body, SnapshotPhase.PENDING, result.message, now), False
    if not result.succeeded:
        return snapshot_jobs.restore_status(
            body,
            SnapshotPhase.FAILED,
            f"{result.message}; Topic {restore.spec.topic!r} stays unplaced (delete it)",
            now,
            result=result,
        ), False
    if topic.meta.annotations.get(RESTORE_ANNOTATION) != str(RestoreStage.WRITTEN):
        await api.patch_metadata(
            topic_ref, {"annotations": {RESTORE_ANNOTATION: str(RestoreStage.WRITTEN)}}
        )
        return snapshot_jobs.restore_status(
            body, SnapshotPhase.PENDING, "written and verified; placing", now, result=result
        ), False
    topic_status = bodies.stored_status(topic)
    ready = None if topic_status is None else topic_status.condition(READY)
    if ready is None or ready.status != ConditionStatus.TRUE:
        why = "" if ready is None else ready.message
        return snapshot_jobs.restore_status(
            body,
            SnapshotPhase.PENDING,
            f"placing Topic {restore.spec.topic!r}: {why}".rstrip(": "),
            now,
            result=result,
        ), False
    return snapshot_jobs.restore_status(
        body,
        SnapshotPhase.READY,
        f"Topic {restore.spec.topic!r} restored and placed",
        now,
        result=result,
        completed_at=now,
    ), False


def _not_ours(restore: TopicRestore, topic: Parsed[Topic], snapshot_key: str) -> str:
    """Why the Topic of the restore's name is not its to write: a Topic still pending for
    a restore of another snapshot is named with both snapshots (writing this one would
    mix them), any other as a Topic that exists."""
    held_for = restore_held_for(topic.meta.annotations)
    other = topic.meta.labels.get(snapshot_jobs.RESTORE_LABEL)
    if held_for is not None:
        try:
            refuse_another_snapshot(f"Topic {restore.spec.topic!r}", held_for, snapshot_key)
        except RestoreOfAnotherSnapshot as exc:
            by = f" (TopicRestore {other!r})" if other else ""
            return f"{exc.message}{by}"
    return (
        f"Topic {restore.spec.topic!r} exists and is not this restore's: restore into a new topic"
    )


async def _create_topic(
    context: OperatorContext,
    namespace: str,
    name: str,
    restore: TopicRestore,
    snapshot: TopicSnapshot,
    snapshot_key: str,
    cluster_id: str,
) -> dict[str, Any]:
    """The new Topic, held ``pending`` for the snapshot whose document is ``snapshot_key``:
    the source Topic's spec if it still exists (else its cluster's defaults), the
    snapshot's partition count."""
    source_name = snapshot.spec.topic_ref.name
    found = await context.api.get(ObjectRef(API_VERSION, "Topic", namespace, source_name))
    source = None if found is None else bodies.parse_topic(found).resource
    source_spec = (
        {"clusterRef": {"name": cluster_id}}
        if source is None
        else source.spec.model_dump(mode="json", exclude_unset=True)
    )
    cuts = [] if snapshot.status is None else snapshot.status.partitions
    partitions = (
        max(p.partition for p in cuts) + 1
        if cuts
        else (1 if source is None else source.spec.partitions)
    )
    await context.api.apply(
        restored_topic(
            namespace,
            restore.spec.topic,
            source_spec,
            partitions,
            RestoreStage.PENDING,
            snapshot_key=snapshot_key,
            restore=name,
        )
    )
    created = await context.api.get(ObjectRef(API_VERSION, "Topic", namespace, restore.spec.topic))
    assert created is not None, "a Topic just applied"
    return created


@kopf.on.resume(GROUP, VERSION, "topicrestores")
@kopf.on.create(GROUP, VERSION, "topicrestores")
async def restore_created(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    try:
        await reconcile_restore(_context(memo), namespace or "default", name)
    except Waiting as exc:
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from None


@kopf.on.event("batch", "v1", "jobs", labels={snapshot_jobs.RESTORE_LABEL: kopf.PRESENT})
@kopf.on.event(GROUP, VERSION, "topics", labels={snapshot_jobs.RESTORE_LABEL: kopf.PRESENT})
async def restore_progressed(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    restore = str(labels[snapshot_jobs.RESTORE_LABEL])
    try:
        await reconcile_restore(_context(memo), namespace or "default", restore)
    except Waiting:
        pass  # the create handler retries


# ---------------------------------------------------------------------- TopicSnapshotSchedule


async def reconcile_schedule(context: OperatorContext, namespace: str, name: str) -> None:
    """One tick of a schedule (``control.snapshot_schedules.tick``): create the TopicSnapshot
    that is due, delete the ones beyond what it keeps, write its status."""
    api = context.api
    ref = ObjectRef(API_VERSION, "TopicSnapshotSchedule", namespace, name)
    for _ in range(WRITE_ATTEMPTS):
        body = await api.get(ref)
        if body is None:
            return
        stored = bodies.parse_snapshot_schedule(body)
        if stored.meta.deleting:
            return
        now_ms = context.clock.now_ms()
        if stored.resource is None:
            # one stored before the CRD's rules refused it: said in its status, never run
            status = _invalid_status(stored, condition_time(now_ms))
            try:
                await compaction_handlers.write_status(api, stored, status)
            except StaleResourceVersion:
                continue
            return
        selector = f"{snapshot_schedules.SCHEDULE_LABEL}={name}"
        listed = await api.list(API_VERSION, "TopicSnapshot", namespace, selector)
        created = stored.meta.creation_timestamp
        decided = snapshot_schedules.tick(
            stored.resource,
            stored.meta.generation,
            bodies.stored_condition(stored, READY),
            [scheduled(bodies.parse_snapshot(b)) for b in listed],
            epoch_ms(created) if created else now_ms,
            now_ms,
        )
        if decided.create is not None:
            await api.apply(decided.create)
        for old in decided.delete:
            await api.delete(ObjectRef(API_VERSION, "TopicSnapshot", namespace, old))
        try:
            await compaction_handlers.write_status(api, stored, decided.status)
        except StaleResourceVersion:
            continue
        if decided.fire_ms is not None:
            taken = snapshot_schedules.snapshot_name(name, decided.fire_ms)
            if decided.skipped_for is None:
                context.post_event(
                    body, "Normal", "SnapshotScheduled", f"TopicSnapshot {taken} created"
                )
            else:
                context.post_event(
                    body,
                    "Warning",
                    "SnapshotSkipped",
                    f"{taken} skipped: {decided.skipped_for} is not done",
                )
        return
    log.warning("TopicSnapshotSchedule %s/%s: status kept conflicting", namespace, name)


def scheduled(snapshot: Parsed[TopicSnapshot]) -> snapshot_schedules.ScheduledSnapshot:
    """A schedule's TopicSnapshot as the schedule's decision reads it."""
    status = bodies.stored_status(snapshot)
    phase = status.phase if isinstance(status, TopicSnapshotStatus) else None
    ready = None if status is None else status.condition(READY)
    return snapshot_schedules.ScheduledSnapshot(
        snapshot.meta.name,
        phase,
        deleting=snapshot.meta.deleting,
        why="" if ready is None else ready.message,
    )


@kopf.timer(GROUP, VERSION, "topicsnapshotschedules", interval=SCHEDULE_TICK_S)
async def schedule_ticked(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    await reconcile_schedule(_context(memo), namespace or "default", name)
