"""Compaction -> a batch/v1 Job, CompactionSchedule -> a batch/v1 CronJob, and their statuses
(pure: manifests and status documents from parsed objects, no I/O; ``compaction_handlers`` is
the adapter that reads and writes them).

**The run.** One pod of the operator's Spark image (``WorkloadSettings.spark_image``: Java
and headrace's ``jobs`` extra, which the brokers' image has not) runs ``headrace compact
NAMESPACE/TOPIC`` (``cli/jobs.py``): the
driver starts pyspark's bundled ``spark-submit`` with ``--master local[*]`` inside the
pod, so the executors are threads of the pod's JVM. The pod gets the cluster's
object-store URL (``workloads.object_store_url``) and the credentials as
``secretKeyRef`` environment variables, exactly as the brokers do: the operator never
reads or copies them. ``--verify`` verifies each partition after compacting.

**Executors as pods** (``spec.spark.master: kubernetes``): the driver still runs in the
Job's pod (client deploy mode), with ``--master k8s://https://$(KUBERNETES_SERVICE_HOST):
$(KUBERNETES_SERVICE_PORT)``, and asks the API server for ``spec.spark.executors``
executor pods of the operator's Spark image (the Job's own image: drivers and executors run
one Spark version). The pod runs as the Spark service account
(the chart's Role: pods, services and configmaps in its namespace), authenticates with
its mounted token and CA, names itself (``spark.kubernetes.driver.pod.name``, so the
executors are owned by it and garbage-collected with it) and its IP
(``spark.driver.host``, which the executors dial). The executors get the store's
credentials as ``secretKeyRef`` variables too
(``spark.kubernetes.executor.secretKeyRef.*``): still no copy of a secret.

**The result.** The job writes a short JSON summary (``cli.jobs.result_summary``:
segments before and after, bytes reclaimed, verified, mismatches, the report's key, or
why it failed) to ``/dev/termination-log``; the kubelet puts it in the pod's
terminated state, where the operator reads it. With ``FallbackToLogsOnError`` a job
that died before writing it leaves its log's tail there instead. So the operator needs
neither the store's credentials nor pod logs to fill in the status.

**Phases** follow the Job: ``Pending`` (no pod has run yet, or it waits for another
run on the same topic: two runs of one topic are never started at once), ``Running``
(a pod is active), ``Succeeded`` (the Job's ``Complete`` condition), ``Failed`` (its
``Failed`` condition: ``backoffLimit`` retries used up). The job itself also takes a
per-partition lock in the store (docs/spark.md), so even a schedule's run and a
Compaction of the same topic cannot both compact a partition.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from headrace.control.documents import condition
from headrace.operator import workloads
from headrace.operator.bodies import Parsed, stored_condition
from headrace.resources.clusters import BrokerCluster
from headrace.resources.compactions import (
    Compaction,
    CompactionPhase,
    CompactionSchedule,
    CompactionSettings,
    SparkMaster,
)
from headrace.resources.meta import TopicReference
from headrace.resources.topics import CleanupPolicy, Topic

COMPACTION_LABEL: Final = "headrace.dev/compaction"
SCHEDULE_LABEL: Final = "headrace.dev/compaction-schedule"
TOPIC_LABEL: Final = "headrace.dev/topic"
#: where the job writes its summary (the kubelet's default terminationMessagePath)
RESULT_PATH: Final = "/dev/termination-log"
#: the job's scratch directory (Spark's log, ``--dir``): an emptyDir
WORK_DIR: Final = "/var/run/headrace-job"
#: Spark in the pod: the driver and its executor threads in one JVM
DEFAULT_MASTER: Final = "local[*]"
#: Spark's executors as pods: the API server as the pod sees it (the kubelet expands
#: the service variables every container gets)
KUBERNETES_MASTER: Final = "k8s://https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"
#: where Kubernetes mounts a pod's service-account token and CA
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
#: the driver pod's own name and IP, from the downward API, for Spark's settings
POD_NAME_ENV: Final = "HEADRACE_POD_NAME"
POD_IP_ENV: Final = "HEADRACE_POD_IP"
#: the executor container's name in ``executor_pod_template``
EXECUTOR_CONTAINER: Final = "executor"


@dataclass(frozen=True, slots=True)
class Target:
    """What a run needs to know about its topic and the topic's cluster."""

    cluster: BrokerCluster
    topic: str  # "namespace/name", as brokers and the object store name it
    segment_bytes: int
    key_compacted: bool
    #: the topic's ``status.creationId``: its objects' prefix ("" for a topic created
    #: before creation ids, whose objects keep the legacy layout)
    creation_id: str = ""
    #: the topic's partition count (its spec)
    partitions: int = 0


class NotRunnable(Exception):
    """Why a run cannot start as its spec stands; ``reason`` is the Ready reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def waits(self) -> bool:
        """Only waiting for another resource (``Waiting...``): not stalled."""
        return self.reason.startswith("Waiting")


def stalled_condition(
    stored: Parsed[Any], blocked: NotRunnable | None, generation: int, now: str
) -> list[dict[str, Any]]:
    """The ``Stalled`` condition of a one-shot resource that cannot run for ``blocked``'s
    reason, or none while it only waits (or runs)."""
    if blocked is None or blocked.waits:
        return []
    stalled = stored_condition(stored, "Stalled")
    return [condition("Stalled", "True", blocked.reason, blocked.message, generation, stalled, now)]


def target(
    namespace: str,
    topic_ref: TopicReference,
    stored_topic: Parsed[Topic] | None,
    stored_cluster: Parsed[BrokerCluster] | None,
) -> Target:
    """The run's target from the stored Topic and BrokerCluster; ``NotRunnable`` says why not."""
    name = topic_ref.name
    if stored_topic is None:
        raise NotRunnable("TopicNotFound", f"Topic {name!r} does not exist in {namespace}")
    topic = stored_topic.resource
    if topic is None:
        raise NotRunnable("InvalidTopic", f"Topic {name!r} does not parse: {stored_topic.problem}")
    cluster_name = topic.spec.cluster_ref.name
    if stored_cluster is None:
        raise NotRunnable(
            "ClusterNotFound", f"BrokerCluster {cluster_name!r} of Topic {name!r} does not exist"
        )
    cluster = stored_cluster.resource
    if cluster is None:
        raise NotRunnable(
            "InvalidCluster", f"BrokerCluster does not parse: {stored_cluster.problem}"
        )
    if cluster.spec.object_store is None:
        raise NotRunnable(
            "NoObjectStore", f"BrokerCluster {cluster_name!r} has no objectStore to compact"
        )
    if not topic.spec.tiered_storage.enabled:
        raise NotRunnable("NotTiered", f"Topic {name!r} does not have tieredStorage enabled")
    segment_bytes = topic.spec.segments.bytes or cluster.spec.broker_config.segment_bytes
    return Target(
        cluster,
        f"{namespace}/{name}",
        segment_bytes,
        topic.spec.cleanup_policy == CleanupPolicy.COMPACT,
        (topic.status.creation_id if topic.status is not None else None) or "",
        topic.spec.partitions,
    )


def _owner(kind: str, api_version: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def executor_pod_template() -> dict[str, Any]:
    """The pod template Spark's driver builds each executor pod on
    (``spark.kubernetes.executor.podTemplateFile``): Pod Security "restricted", as the
    Spark image's user, with a read-only root and emptyDirs for what an executor writes
    outside the local directories Spark mounts itself (``/tmp``; the fetched application
    files in the image's working directory). Spark fills in the rest of the container."""
    scratch, scratch_mount = workloads.scratch_volume()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "securityContext": workloads.pod_security_context(workloads.SPARK_IMAGE_UID),
            "containers": [
                {
                    "name": EXECUTOR_CONTAINER,
                    "securityContext": workloads.container_security_context(),
                    "volumeMounts": [
                        scratch_mount,
                        {"name": "work-dir", "mountPath": workloads.SPARK_WORK_DIR},
                    ],
                }
            ],
            "volumes": [scratch, {"name": "work-dir", "emptyDir": {}}],
        },
    }


def kubernetes_conf(
    settings: CompactionSettings, run: Target, workload: workloads.WorkloadSettings
) -> list[tuple[str, str]]:
    """The Spark properties of a driver in the Job's pod with executors as pods (client
    mode; see the module). ``$(VAR)`` words are the pod's own, expanded by the kubelet."""
    spark = settings.spark
    conf = [
        ("spark.submit.deployMode", "client"),
        ("spark.kubernetes.namespace", run.topic.partition("/")[0]),
        ("spark.kubernetes.driver.pod.name", f"$({POD_NAME_ENV})"),
        ("spark.driver.host", f"$({POD_IP_ENV})"),
        ("spark.driver.bindAddress", f"$({POD_IP_ENV})"),
        ("spark.kubernetes.container.image", workload.spark_image),
        ("spark.kubernetes.container.image.pullPolicy", workload.spark_image_pull_policy),
        ("spark.kubernetes.authenticate.driver.serviceAccountName", workload.spark_service_account),
        # executors need no API access: the namespace's default account, not the driver's
        ("spark.kubernetes.authenticate.executor.serviceAccountName", "default"),
        ("spark.kubernetes.authenticate.caCertFile", f"{SERVICE_ACCOUNT_DIR}/ca.crt"),
        ("spark.kubernetes.authenticate.oauthTokenFile", f"{SERVICE_ACCOUNT_DIR}/token"),
        ("spark.executor.instances", str(spark.executors)),
        ("spark.executor.cores", str(spark.executor_cores)),
        ("spark.executor.memory", spark.executor_memory),
        # executors get no PersistentVolumeClaims: the driver neither reuses nor deletes
        # any (so its Role needs no rights on them)
        ("spark.kubernetes.driver.ownPersistentVolumeClaim", "false"),
        ("spark.kubernetes.driver.reusePersistentVolumeClaim", "false"),
        # the executor's container in the template (``headrace compact`` writes the file)
        ("spark.kubernetes.executor.podTemplateContainerName", EXECUTOR_CONTAINER),
    ]
    for env in workloads.store_env(run.cluster.spec.object_store):
        ref = env["valueFrom"]["secretKeyRef"]
        conf.append(
            (f"spark.kubernetes.executor.secretKeyRef.{env['name']}", f"{ref['name']}:{ref['key']}")
        )
    return conf


def job_args(
    settings: CompactionSettings,
    run: Target,
    workload: workloads.WorkloadSettings | None = None,
) -> list[str]:
    """``headrace compact`` arguments of one run (``workload``: the operator's Spark image
    and service account, needed with ``spark.master: kubernetes``)."""
    store = run.cluster.spec.object_store
    assert store is not None  # target() checked it
    conf: list[tuple[str, str]] = []
    if settings.spark.master == SparkMaster.KUBERNETES:
        master = KUBERNETES_MASTER
        conf = kubernetes_conf(settings, run, workload or workloads.WorkloadSettings())
    else:
        master = settings.spark_conf.get("spark.master", DEFAULT_MASTER)
    # the user's sparkConf comes last: spark-submit keeps the last value of a key
    conf += [(k, v) for k, v in sorted(settings.spark_conf.items()) if k != "spark.master"]
    args = [
        "compact",
        run.topic,
        "--store",
        workloads.object_store_url(store),
        "--cluster",
        run.cluster.metadata.name,
        *(["--creation-id", run.creation_id] if run.creation_id else []),
        "--master",
        master,
        "--dir",
        WORK_DIR,
        "--target-bytes",
        str(settings.target_segment_bytes or run.segment_bytes),
        "--grace-seconds",
        str(settings.grace_seconds),
        "--verify" if settings.verify else "--no-verify",
        "--result-file",
        RESULT_PATH,
    ]
    if settings.partitions:
        args += ["--partitions", ",".join(str(p) for p in sorted(settings.partitions))]
    if run.key_compacted:
        args.append("--keep-last-per-key")
    if settings.spark.master == SparkMaster.KUBERNETES:
        args += [
            "--executor-pod-template",
            json.dumps(executor_pod_template(), sort_keys=True, separators=(",", ":")),
        ]
    for key, value in conf:
        args += ["--conf", f"{key}={value}"]
    return args


def job_spec(
    settings: CompactionSettings,
    run: Target,
    workload: workloads.WorkloadSettings,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """A Job's ``spec`` (also a CronJob's ``jobTemplate.spec``)."""
    scratch, scratch_mount = workloads.scratch_volume()
    container: dict[str, Any] = {
        "name": "compact",
        # the driver needs Java and pyspark, which the brokers' image has not; and its
        # Spark must be the executors' (the same image)
        "image": workload.spark_image,
        "imagePullPolicy": workload.spark_image_pull_policy,
        "command": list(workload.broker_command),
        "args": job_args(settings, run, workload),
        "env": [
            *workloads.store_env(run.cluster.spec.object_store),
            *({"name": k, "value": v} for k, v in sorted(workload.env.items())),
        ],
        "terminationMessagePath": RESULT_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # the driver's JVM writes its scratch (spark.local.dir, java.io.tmpdir) to /tmp
        "securityContext": workloads.container_security_context(),
        "volumeMounts": [{"name": "work", "mountPath": WORK_DIR}, scratch_mount],
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": workloads.pod_security_context(),
        "containers": [container],
        "volumes": [{"name": "work", "emptyDir": {}}, scratch],
    }
    if settings.spark.master == SparkMaster.KUBERNETES:
        # the driver talks to the API server as the Spark service account, and tells
        # Spark its own name (the executors' owner) and address (theirs to dial)
        pod["serviceAccountName"] = workload.spark_service_account
        pod["automountServiceAccountToken"] = True
        container["env"][:0] = [
            {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ]
    spec: dict[str, Any] = {
        "backoffLimit": settings.backoff_limit,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
    }
    if settings.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    return spec


def _labels(run: Target, extra: Mapping[str, str]) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "headrace",
        "app.kubernetes.io/component": "compaction",
        "app.kubernetes.io/managed-by": "headrace-operator",
        workloads.CLUSTER_LABEL: run.cluster.metadata.name,
        TOPIC_LABEL: run.topic.partition("/")[2],
        **extra,
    }


def job_manifest(
    compaction: Compaction, uid: str, run: Target, workload: workloads.WorkloadSettings
) -> dict[str, Any]:
    """The Job of a Compaction: named as it, owned by it."""
    name = compaction.metadata.name
    labels = _labels(run, {COMPACTION_LABEL: name})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": run.topic.partition("/")[0],
            "labels": labels,
            "ownerReferences": [_owner(compaction.kind, compaction.api_version, name, uid)],
        },
        "spec": job_spec(compaction.spec, run, workload, labels),
    }


def cronjob_manifest(
    schedule: CompactionSchedule, uid: str, run: Target, workload: workloads.WorkloadSettings
) -> dict[str, Any]:
    """The CronJob of a CompactionSchedule: named as it, owned by it (no ``timeZone``: the
    controller-manager's, UTC in practice, as the schedule's docs say)."""
    name = schedule.metadata.name
    spec = schedule.spec
    labels = _labels(run, {SCHEDULE_LABEL: name})
    cron: dict[str, Any] = {
        "schedule": spec.schedule,
        "suspend": spec.suspend,
        "concurrencyPolicy": str(spec.concurrency_policy),
        "successfulJobsHistoryLimit": spec.successful_jobs_history_limit,
        "failedJobsHistoryLimit": spec.failed_jobs_history_limit,
        "jobTemplate": {
            "metadata": {"labels": labels},
            "spec": job_spec(spec, run, workload, labels),
        },
    }
    if spec.starting_deadline_seconds is not None:
        cron["startingDeadlineSeconds"] = spec.starting_deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": name,
            "namespace": run.topic.partition("/")[0],
            "labels": labels,
            "ownerReferences": [_owner(schedule.kind, schedule.api_version, name, uid)],
        },
        "spec": cron,
    }


# ---------------------------------------------------------------------- statuses


@dataclass(frozen=True, slots=True)
class RunState:
    """A Job as its status and pods show it."""

    phase: CompactionPhase
    attempts: int
    start_time: str | None
    completion_time: str | None
    #: ``CompactionResult`` fields (camelCase), from the last finished pod's summary
    result: dict[str, Any] | None
    message: str


def job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def last_summary(pods: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """(the parsed summary, the raw message) of the most recently finished pod."""
    finished = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            done = (status.get("state") or {}).get("terminated")
            if done is not None:
                finished.append((str(done.get("finishedAt") or ""), str(done.get("message") or "")))
    if not finished:
        return None, ""
    message = max(finished)[1]
    try:
        summary = json.loads(message)
    except ValueError:
        return None, message
    return (summary, message) if isinstance(summary, dict) else (None, message)


def result_of(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The ``CompactionResult`` (camelCase) of a job's summary."""
    return {
        "segmentsBefore": max(0, int(summary.get("segmentsBefore", 0))),
        "segmentsAfter": max(0, int(summary.get("segmentsAfter", 0))),
        "bytesReclaimed": int(summary.get("bytesReclaimed", 0)),
        "verified": bool(summary.get("verified", False)),
        "mismatches": max(0, int(summary.get("mismatches", 0))),
        **({"report": summary["reportKey"]} if summary.get("reportKey") else {}),
    }


def run_state(job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> RunState:
    """Where a run is, from its Job (None: not created yet) and the Job's pods."""
    if job is None:
        return RunState(CompactionPhase.PENDING, 0, None, None, None, "the Job is being created")
    status = job.get("status") or {}
    attempts = sum(int(status.get(k) or 0) for k in ("active", "succeeded", "failed"))
    summary, raw = last_summary(pods)
    result = result_of(summary) if summary is not None else None
    why = str(summary.get("error", "")) if summary is not None else raw
    start = status.get("startTime")
    if job_condition(job, "Complete") is not None:
        message = "compacted"
        if result is not None:
            message = (
                f"{result['segmentsBefore']} -> {result['segmentsAfter']} segments,"
                f" {result['bytesReclaimed']} bytes reclaimed"
                + (", verified" if result["verified"] else "")
            )
        return RunState(
            CompactionPhase.SUCCEEDED,
            attempts,
            start,
            status.get("completionTime"),
            result,
            message,
        )
    failed = job_condition(job, "Failed")
    if failed is not None:
        message = f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
        if why:
            message = f"{message}; last attempt: {why}"
        return RunState(
            CompactionPhase.FAILED,
            attempts,
            start,
            failed.get("lastTransitionTime"),
            result,
            message[:4096],
        )
    if int(status.get("active") or 0) > 0:
        message = "running" + (f" (attempt {attempts}; the last failed: {why})" if why else "")
        return RunState(CompactionPhase.RUNNING, attempts, start, None, None, message[:4096])
    return RunState(CompactionPhase.PENDING, attempts, start, None, None, "waiting for a pod")


def compaction_status(
    compaction: Parsed[Compaction],
    job_name: str | None,
    state: RunState | None,
    blocked: NotRunnable | None,
    now: str,
) -> dict[str, Any]:
    """A Compaction's status: from its run (``state``), or why it does not run (``blocked``:
    its target is missing, or another run of the topic goes on)."""
    old = compaction
    generation = compaction.meta.generation
    status: dict[str, Any] = {"observedGeneration": generation}
    conditions = []
    if blocked is not None:
        status["phase"] = str(CompactionPhase.PENDING)
        conditions.append(
            condition(
                "Ready",
                "False",
                blocked.reason,
                blocked.message,
                generation,
                stored_condition(old, "Ready"),
                now,
            )
        )
        conditions.extend(stalled_condition(old, blocked, generation, now))
    else:
        assert state is not None
        status["phase"] = str(state.phase)
        status["attempts"] = state.attempts
        done = state.phase == CompactionPhase.SUCCEEDED
        conditions.append(
            condition(
                "Ready",
                "True" if done else "False",
                str(state.phase),
                state.message,
                generation,
                stored_condition(old, "Ready"),
                now,
            )
        )
        for key, value in (
            ("startTime", state.start_time),
            ("completionTime", state.completion_time),
            ("result", state.result),
        ):
            if value is not None:
                status[key] = value
    if job_name is not None:
        status["jobName"] = job_name
    status["conditions"] = conditions
    return status


def finished(phase: str | None) -> bool:
    """Whether a Compaction in ``phase`` is done for good (its status is final)."""
    return phase in (str(CompactionPhase.SUCCEEDED), str(CompactionPhase.FAILED))


def schedule_status(
    schedule: Parsed[CompactionSchedule],
    cronjob: Mapping[str, Any] | None,
    last_job: tuple[str, RunState] | None,
    blocked: NotRunnable | None,
    now: str,
) -> dict[str, Any]:
    """A CompactionSchedule's status: its CronJob's times and active runs, and the most
    recently finished run (``last_job``: its name and state)."""
    old = schedule
    generation = schedule.meta.generation
    status: dict[str, Any] = {"observedGeneration": generation}
    cron = (cronjob or {}).get("status") or {}
    for key in ("lastScheduleTime", "lastSuccessfulTime"):
        if cron.get(key):
            status[key] = cron[key]
    status["active"] = [{"name": ref["name"]} for ref in cron.get("active") or [] if "name" in ref]
    if last_job is not None:
        name, state = last_job
        status["lastJob"] = {"name": name}
        if state.result is not None:
            status["lastResult"] = state.result
        if state.phase == CompactionPhase.FAILED:
            status["lastFailure"] = state.message
    if blocked is not None:
        ready = ("False", blocked.reason, blocked.message)
    elif cronjob is None:
        ready = ("False", "Pending", "the CronJob is being created")
    elif last_job is not None and last_job[1].phase == CompactionPhase.FAILED:
        ready = ("False", "LastRunFailed", f"{last_job[0]}: {last_job[1].message}")
    else:
        suspended = bool(((cronjob or {}).get("spec") or {}).get("suspend"))
        ready = (
            "True",
            "Suspended" if suspended else "Scheduled",
            f"CronJob {schedule.meta.name}",
        )
    conditions = [condition("Ready", *ready, generation, stored_condition(old, "Ready"), now)]
    if blocked is not None:
        conditions.append(
            condition(
                "Stalled",
                "True",
                blocked.reason,
                blocked.message,
                generation,
                stored_condition(old, "Stalled"),
                now,
            )
        )
    status["conditions"] = conditions
    return status
