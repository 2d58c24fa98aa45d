"""The kopf handlers of Compaction and CompactionSchedule, and the reconcilers they call
(adapter: reads and writes through ``KubeApi``; the manifests and statuses come from
the pure ``compaction_jobs``).

* A **Compaction** is reconciled when it is created (or the operator resumes) and
  whenever its Job changes (``@kopf.on.event`` of Jobs labelled
  ``headrace.dev/compaction``): find its Topic and BrokerCluster, create the Job
  unless another run of the topic is going on (then it waits, ``Pending`` with
  reason ``WaitingForRun``, and is reconciled again when that run's Job finishes),
  and write its status from the Job and its pods. A finished Compaction is not
  reconciled again: its status is final, and costs no more writes.
* A **CompactionSchedule** is applied as a CronJob on create, resume and spec
  change; its status follows the CronJob and the Jobs it creates (events of both).

Status writes are compare-and-swap on ``resourceVersion`` (a conflict is re-read
and retried) and skipped when nothing changed. A phase change is also posted as a
Kubernetes Event on the object.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf

from headrace.control.documents import condition_time
from headrace.operator import bodies, compaction_jobs
from headrace.operator.bodies import Parsed, ResourceT
from headrace.operator.handlers import GROUP, VERSION, OperatorContext
from headrace.operator.kube import KubeApi, ObjectRef, StaleResourceVersion
from headrace.resources import meta
from headrace.resources.compactions import Compaction, CompactionPhase
from headrace.resources.meta import READY, TopicReference

log = logging.getLogger(__name__)

API_VERSION: Final = meta.API_VERSION
#: the label the Job controller puts on a Job's pods (Kubernetes >= 1.27)
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
#: status writes tried before giving up until the next event
WRITE_ATTEMPTS: Final = 5


def _context(memo: Any) -> OperatorContext:
    context: OperatorContext = memo.context
    return context


async def find_target(
    api: KubeApi, namespace: str, topic_ref: TopicReference
) -> compaction_jobs.Target:
    """A run's Topic and its BrokerCluster as stored (``NotRunnable`` says what is missing)."""
    found = await api.get(ObjectRef(API_VERSION, "Topic", namespace, topic_ref.name))
    topic = None if found is None else bodies.parse_topic(found)
    cluster = None
    if topic is not None and topic.resource is not None:
        cluster_name = topic.resource.spec.cluster_ref.name
        stored = await api.get(ObjectRef(API_VERSION, "BrokerCluster", namespace, cluster_name))
        cluster = None if stored is None else bodies.parse_cluster(stored)
    return compaction_jobs.target(namespace, topic_ref, topic, cluster)


def job_done(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


async def _running_run(api: KubeApi, namespace: str, topic: str, except_job: str) -> str | None:
    """The name of an unfinished Job compacting ``topic`` (a Compaction's or a schedule's)."""
    jobs = await api.list("batch/v1", "Job", namespace, f"{compaction_jobs.TOPIC_LABEL}={topic}")
    for job in jobs:
        name = str(job["metadata"]["name"])
        if name != except_job and not job_done(job):
            return name
    return None


async def pods_of(api: KubeApi, namespace: str, job_name: str) -> list[dict[str, Any]]:
    return await api.list("v1", "Pod", namespace, f"{JOB_NAME_LABEL}={job_name}")


async def write_status(api: KubeApi, stored: Parsed[ResourceT], status: Mapping[str, Any]) -> None:
    """CAS-write ``status`` unless it is already stored."""
    if bodies.unchanged(stored, status):
        return
    await api.replace_status(stored.ref, str(stored.meta.resource_version), status)


def _post_phase(body: Mapping[str, Any], before: str | None, status: Mapping[str, Any]) -> None:
    phase = status.get("phase")
    if phase is None or phase == before:
        return
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions", []) if c["type"] == "Ready"), {}
    )
    failed = phase == str(CompactionPhase.FAILED) or "Stalled" in {
        c["type"] for c in status.get("conditions", [])
    }
    try:
        kopf.event(
            kopf.Body(dict(body)),  # type: ignore[arg-type]
            type="Warning" if failed else "Normal",
            reason=f"Compaction{phase}" if ready.get("reason") == phase else str(ready["reason"]),
            message=str(ready.get("message", "")),
        )
    except Exception:  # outside kopf's loop (tests): the status says it all the same
        log.debug("no event posted for %s", bodies.meta_of(body).name)


# ---------------------------------------------------------------------- Compaction


def _phase(compaction: Parsed[Compaction]) -> str | None:
    """The stored phase (None: none yet, or a status that cannot be read)."""
    status = bodies.stored_status(compaction)
    phase = getattr(status, "phase", None)
    return None if phase is None else str(phase)


async def reconcile_compaction(context: OperatorContext, namespace: str, name: str) -> None:
    """Bring one Compaction's Job and status up to date (see the module)."""
    api = context.api
    ref = ObjectRef(API_VERSION, "Compaction", namespace, name)
    for _ in range(WRITE_ATTEMPTS):
        body = await api.get(ref)
        if body is None:
            return
        parsed = bodies.parse_compaction(body)
        if parsed.meta.deleting or compaction_jobs.finished(_phase(parsed)):
            return
        compaction = parsed.resource
        job_ref = ObjectRef("batch/v1", "Job", namespace, name)
        job = await api.get(job_ref)
        blocked: compaction_jobs.NotRunnable | None = None
        if compaction is None:
            # one stored before the CRD's rules refused it: said in its status, never run
            blocked = compaction_jobs.NotRunnable(bodies.INVALID_SPEC, str(parsed.problem))
        elif job is None:
            try:
                run = await find_target(api, namespace, compaction.spec.topic_ref)
                other = await _running_run(api, namespace, compaction.spec.topic_ref.name, name)
                if other is not None:
                    raise compaction_jobs.NotRunnable(
                        "WaitingForRun",
                        f"Job {other} is compacting topic {compaction.spec.topic_ref.name};"
                        " this run starts when it has finished",
                    )
                await api.apply(
                    compaction_jobs.job_manifest(compaction, parsed.meta.uid, run, context.workload)
                )
                job = await api.get(job_ref)
            except compaction_jobs.NotRunnable as exc:
                blocked = exc
        state = None
        if blocked is None:
            state = compaction_jobs.run_state(job, await pods_of(api, namespace, name))
        now = condition_time(context.clock.now_ms())
        status = compaction_jobs.compaction_status(
            parsed, name if job is not None else None, state, blocked, now
        )
        try:
            await write_status(api, parsed, status)
        except StaleResourceVersion:
            continue  # changed meanwhile: read it again
        _post_phase(body, _phase(parsed), status)
        if compaction is not None and compaction_jobs.finished(status.get("phase")):
            await _start_waiting(context, namespace, compaction.spec.topic_ref.name, name)
        return
    log.warning("Compaction %s/%s: status kept conflicting; next event retries", namespace, name)


async def _start_waiting(context: OperatorContext, namespace: str, topic: str, done: str) -> None:
    """Reconcile the Compactions of ``topic`` that wait for a run (``done`` has finished)."""
    for body in await context.api.list(API_VERSION, "Compaction", namespace):
        compaction = bodies.parse_compaction(body)
        name, model = compaction.meta.name, compaction.resource
        if name == done or model is None or model.spec.topic_ref.name != topic:
            continue
        ready = None if model.status is None else model.status.condition(READY)
        if ready is not None and ready.reason == "WaitingForRun":
            await reconcile_compaction(context, namespace, name)


@kopf.on.resume(GROUP, VERSION, "compactions")
@kopf.on.create(GROUP, VERSION, "compactions")
async def compaction_created(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    await reconcile_compaction(_context(memo), namespace or "default", name)


@kopf.on.event("batch", "v1", "jobs", labels={compaction_jobs.COMPACTION_LABEL: kopf.PRESENT})
async def compaction_job_changed(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    await reconcile_compaction(
        _context(memo), namespace or "default", str(labels[compaction_jobs.COMPACTION_LABEL])
    )


# ---------------------------------------------------------------------- CompactionSchedule


def _finished_at(job: Mapping[str, Any]) -> str:
    status = job.get("status") or {}
    failed = [
        c.get("lastTransitionTime") or ""
        for c in status.get("conditions") or []
        if c.get("type") == "Failed" and c.get("status") == "True"
    ]
    return str(status.get("completionTime") or (failed[0] if failed else ""))


async def reconcile_schedule(
    context: OperatorContext, namespace: str, name: str, apply: bool
) -> None:
    """Apply the schedule's CronJob (``apply``) and write its status (see the module)."""
    api = context.api
    ref = ObjectRef(API_VERSION, "CompactionSchedule", namespace, name)
    for _ in range(WRITE_ATTEMPTS):
        body = await api.get(ref)
        if body is None:
            return
        parsed = bodies.parse_compaction_schedule(body)
        if parsed.meta.deleting:
            return
        schedule = parsed.resource
        blocked = None
        try:
            if schedule is None:
                # one stored before the CRD's rules refused it: said in its status
                raise compaction_jobs.NotRunnable(bodies.INVALID_SPEC, str(parsed.problem))
            if apply:
                run = await find_target(api, namespace, schedule.spec.topic_ref)
                await api.apply(
                    compaction_jobs.cronjob_manifest(
                        schedule, parsed.meta.uid, run, context.workload
                    )
                )
        except compaction_jobs.NotRunnable as exc:
            blocked = exc
        cronjob = await api.get(ObjectRef("batch/v1", "CronJob", namespace, name))
        jobs = await api.list(
            "batch/v1", "Job", namespace, f"{compaction_jobs.SCHEDULE_LABEL}={name}"
        )
        done = sorted((j for j in jobs if job_done(j)), key=_finished_at)
        last = None
        if done:
            job_name = str(done[-1]["metadata"]["name"])
            last = (
                job_name,
                compaction_jobs.run_state(done[-1], await pods_of(api, namespace, job_name)),
            )
        now = condition_time(context.clock.now_ms())
        status = compaction_jobs.schedule_status(parsed, cronjob, last, blocked, now)
        try:
            await write_status(api, parsed, status)
        except StaleResourceVersion:
            continue
        return
    log.warning("CompactionSchedule %s/%s: status kept conflicting", namespace, name)


@kopf.on.resume(GROUP, VERSION, "compactionschedules")
@kopf.on.create(GROUP, VERSION, "compactionschedules")
@kopf.on.update(GROUP, VERSION, "compactionschedules", field="spec")
async def schedule_changed(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    await reconcile_schedule(_context(memo), namespace or "default", name, apply=True)


@kopf.on.event("batch", "v1", "cronjobs", labels={compaction_jobs.SCHEDULE_LABEL: kopf.PRESENT})
@kopf.on.event("batch", "v1", "jobs", labels={compaction_jobs.SCHEDULE_LABEL: kopf.PRESENT})
async def schedule_run_changed(
    namespace: str | None, labels: kopf.Labels, memo: Any, **_: Any
) -> None:
    await reconcile_schedule(
        _context(memo),
        namespace or "default",
        str(labels[compaction_jobs.SCHEDULE_LABEL]),
        apply=False,
    )
