"""TopicSnapshot and TopicRestore -> batch/v1 Jobs, and their statuses (pure: manifests and
status documents from parsed objects, no I/O; ``snapshot_handlers`` is the adapter).

The operator never holds the object store's credentials (its Role has no Secrets to
read), so everything that touches the store runs in a Job's pod, as a Compaction does:
one container running ``headrace tier ...`` (``cli.snapshots``, the commands local mode
runs in-process) with the cluster's store URL and the credentials as ``secretKeyRef``
environment variables, exactly as the brokers get them. The pod writes a short JSON
summary to ``/dev/termination-log`` (``cli.snapshots.snapshot_summary``), which the
operator reads from the pod's terminated state into the status.

* **snapshot** ``<name>``: ``tier snapshot TOPIC NAME --cuts ...``. The operator picks the
  cuts when it creates the Job, from the brokers' latest heartbeats (one round:
  ``tiered.snapshots.cuts_at``), as local mode does from one round of requests; the pod
  waits until the uploaders have stored that far and writes the immutable document. A
  rerun of the pod after the document exists reports that document (never a second).
* **restore** ``<name>``: ``tier restore SOURCE SNAPSHOT --to NEW --into-creation-id UID``
  copies the snapshot into the incarnation of the Topic the operator created, held
  ``pending``, and verifies the copy with the Spark verify job (``--master local[*]`` in
  the pod, as a Compaction's); its verdict and the report's key, in the summary whether
  it passed or not, become the status's ``verification``. A retried pod finishes what an
  earlier one wrote. The operator then marks it ``written`` and the control loop places it
  (``control.reconcile``).
* **delete-snapshot** ``<name>``: on the TopicSnapshot's deletion (a finalizer), deletes the
  document, so its objects are no longer pinned.

Every Job is named after its resource with a prefix and owned by it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from headrace.control.documents import (
    TOPIC_RESTORE_LABEL,
    condition,
    condition_time,
    epoch_ms,
    rfc3339,
)
from headrace.operator import compaction_jobs, workloads
from headrace.operator.bodies import Parsed, ResourceT, stored_condition
from headrace.operator.compaction_jobs import RESULT_PATH, NotRunnable, Target
from headrace.protocol.coordination import Heartbeat
from headrace.resources.clusters import BrokerCluster
from headrace.resources.meta import READY
from headrace.resources.snapshots import (
    RestoreVerification,
    SnapshotPhase,
    TopicRestore,
    TopicSnapshot,
)
from headrace.tiered.snapshots import cuts_at

SNAPSHOT_LABEL: Final = "headrace.dev/topic-snapshot"
RESTORE_LABEL: Final = TOPIC_RESTORE_LABEL
#: a Job's name becomes a label value of its pods: at most 63 characters
NAME_LIMIT: Final = 63
#: the restore's ``--dir`` in its pod, on the scratch volume: its Spark verification's log
RESTORE_DIR: Final = f"{workloads.SCRATCH_DIR}/headrace-restore"
#: attempts of a Job's pod (the commands are idempotent: a retry redoes or reports)
BACKOFF_LIMIT: Final = 2


class Step:
    """The Jobs of a snapshot's life, by the prefix of their names."""

    SNAPSHOT: Final = "snapshot"
    RESTORE: Final = "restore"
    DELETE: Final = "unsnapshot"


def job_name(step: str, name: str) -> str:
    """``<step>-<name>``, shortened with a hash of the name where it would be too long."""
    full = f"{step}-{name}"
    if len(full) <= NAME_LIMIT:
        return full
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{full[: NAME_LIMIT - 11].rstrip('-.')}-{digest}"


def cuts_from(heartbeats: Mapping[int, Heartbeat], topic: str, partitions: int) -> dict[int, int]:
    """Every partition's cut from the brokers' latest heartbeats (``NotRunnable``
    ``WaitingForBrokers`` while some partition of the ``partitions`` has no report)."""
    cuts = cuts_at(
        (p.partition, p.high_watermark)
        for heartbeat in heartbeats.values()
        for p in heartbeat.partitions
        if p.topic == topic
    )
    missing = sorted(set(range(partitions)) - set(cuts))
    if missing:
        raise NotRunnable(
            "WaitingForBrokers", f"no broker reports partitions {missing} of {topic} yet"
        )
    return {p: c for p, c in cuts.items() if p < partitions}


def _store_args(cluster: BrokerCluster) -> list[str]:
    store = cluster.spec.object_store
    assert store is not None  # compaction_jobs.target checked it
    return ["--store", workloads.object_store_url(store), "--cluster", cluster.metadata.name]


def snapshot_args(run: Target, name: str, cuts: Mapping[int, int]) -> list[str]:
    return [
        "tier",
        "snapshot",
        run.topic,
        name,
        *_store_args(run.cluster),
        "--creation-id",
        run.creation_id,
        "--cuts",
        ",".join(f"{p}={c}" for p, c in sorted(cuts.items())),
        "--result-file",
        RESULT_PATH,
    ]


def restore_args(
    cluster: BrokerCluster,
    source: str,
    source_creation_id: str,
    snapshot: str,
    target: str,
    target_creation_id: str,
) -> list[str]:
    return [
        "tier",
        "restore",
        source,
        snapshot,
        "--to",
        target,
        "--creation-id",
        source_creation_id,
        "--into-creation-id",
        target_creation_id,
        *_store_args(cluster),
        # the Spark verification's log: the scratch volume (the root filesystem is read-only)
        "--dir",
        RESTORE_DIR,
        "--result-file",
        RESULT_PATH,
    ]


def delete_args(cluster: BrokerCluster, topic: str, creation_id: str, name: str) -> list[str]:
    return [
        "tier",
        "delete-snapshot",
        topic,
        name,
        *_store_args(cluster),
        "--creation-id",
        creation_id,
        "--result-file",
        RESULT_PATH,
    ]


def job_manifest(
    *,
    name: str,
    namespace: str,
    owner: Parsed[ResourceT],
    cluster: BrokerCluster,
    args: list[str],
    labels: Mapping[str, str],
    workload: workloads.WorkloadSettings,
    spark: bool = False,
) -> dict[str, Any]:
    """A Job running ``headrace <args>`` once (retried up to ``BACKOFF_LIMIT``), owned by
    ``owner`` (the resource), with the store's credentials as the brokers get them.
    ``spark``: the work runs a Spark job (a restore's verification), so the Job runs the
    Spark image (Java, pyspark), which the brokers' image does not carry."""
    scratch, scratch_mount = workloads.scratch_volume()
    all_labels = {
        "app.kubernetes.io/name": "headrace",
        "app.kubernetes.io/component": "snapshot",
        "app.kubernetes.io/managed-by": "headrace-operator",
        workloads.CLUSTER_LABEL: cluster.metadata.name,
        **labels,
    }
    image: dict[str, str] = (
        {"image": workload.spark_image, "imagePullPolicy": workload.spark_image_pull_policy}
        if spark
        else {"image": cluster.spec.image or workload.default_image}
    )
    container = {
        "name": "tier",
        **image,
        "command": list(workload.broker_command),
        "args": args,
        "env": [
            *workloads.store_env(cluster.spec.object_store),
            *({"name": k, "value": v} for k, v in sorted(workload.env.items())),
        ],
        "terminationMessagePath": RESULT_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": workloads.container_security_context(),
        "volumeMounts": [scratch_mount],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": all_labels,
            "ownerReferences": [
                {
                    "apiVersion": owner.ref.api_version,
                    "kind": owner.kind,
                    "name": owner.meta.name,
                    "uid": owner.meta.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "template": {
                "metadata": {"labels": all_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": workloads.pod_security_context(),
                    "containers": [container],
                    "volumes": [scratch],
                },
            },
        },
    }


# ---------------------------------------------------------------------- Job outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    """A Job as its status and its pods' summaries show it."""

    #: True: Complete with an ``ok`` summary; False: Failed (or Complete without one);
    #: None: not finished
    succeeded: bool | None
    #: the last finished pod's summary (``cli.snapshots``), if it wrote one
    summary: Mapping[str, Any] | None
    message: str


def outcome(job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> Outcome:
    if job is None:
        return Outcome(None, None, "the Job is being created")
    summary, raw = compaction_jobs.last_summary(pods)
    why = str(summary.get("error", "")) if summary is not None else raw
    if compaction_jobs.job_condition(job, "Complete") is not None:
        if summary is not None and summary.get("ok") is True:
            return Outcome(True, summary, "done")
        return Outcome(False, summary, f"the Job completed without a summary: {raw[:2000]}")
    failed = compaction_jobs.job_condition(job, "Failed")
    if failed is not None:
        message = f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
        return Outcome(False, summary, (f"{message}; last attempt: {why}" if why else message))
    name = job["metadata"]["name"]
    return Outcome(
        None, None, f"Job {name} is running" + (f" (last attempt: {why})" if why else "")
    )


# ---------------------------------------------------------------------- statuses


def _status(
    stored: Parsed[ResourceT],
    phase: SnapshotPhase,
    message: str,
    now: str,
    blocked: NotRunnable | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """``phase`` as the status and its Ready condition; a ``blocked`` one says why (its
    reason) and is ``Stalled`` unless it only waits."""
    generation = stored.meta.generation
    ready = (
        "True" if phase is SnapshotPhase.READY else "False",
        blocked.reason if blocked is not None else str(phase),
        (blocked.message if blocked is not None else message)[:4096],
    )
    conditions = [condition("Ready", *ready, generation, stored_condition(stored, READY), now)]
    conditions.extend(compaction_jobs.stalled_condition(stored, blocked, generation, now))
    status: dict[str, Any] = {"observedGeneration": generation, "phase": str(phase)}
    status.update({k: v for k, v in fields.items() if v is not None})
    status["conditions"] = conditions
    return status


def snapshot_status(
    body: Parsed[TopicSnapshot], result: Outcome | None, blocked: NotRunnable | None, now: str
) -> dict[str, Any]:
    """A TopicSnapshot's status from its Job's ``result``, or why it has no Job (``blocked``)."""
    if blocked is not None or result is None:
        return _status(body, SnapshotPhase.PENDING, "", now, blocked)
    if result.succeeded is None:
        return _status(body, SnapshotPhase.PENDING, result.message, now)
    if not result.succeeded:
        return _status(body, SnapshotPhase.FAILED, result.message, now)
    summary = result.summary or {}
    partitions = [
        {"partition": p, "start": start, "cut": cut, "objects": objects}
        for p, start, cut, objects in summary.get("partitions") or []
    ]
    message = f"{summary.get('objects', 0)} objects, {summary.get('bytes', 0)} bytes pinned"
    return _status(
        body,
        SnapshotPhase.READY,
        message,
        now,
        creationId=str(summary.get("creationId") or ""),
        key=summary.get("key"),
        partitions=partitions or None,
        objects=int(summary.get("objects") or 0),
        bytes=int(summary.get("bytes") or 0),
        takenAt=rfc3339(int(summary["timeMs"])) if "timeMs" in summary else None,
    )


def restore_status(
    body: Parsed[TopicRestore],
    phase: SnapshotPhase,
    message: str,
    now: str,
    *,
    blocked: NotRunnable | None = None,
    creation_id: str | None = None,
    result: Outcome | None = None,
    completed_at: str | None = None,
) -> dict[str, Any]:
    """A TopicRestore's status: where it is, the new Topic's creation id once it exists, and
    what the copy came to once its Job is done."""
    old = None if body.resource is None else body.resource.status
    summary = (result.summary if result is not None else None) or {}
    kept = set() if old is None else old.model_fields_set
    completed = None if old is None or old.completed_at is None else old.completed_at
    verification = verification_in(summary) or (None if old is None else old.verification)
    return _status(
        body,
        phase,
        message,
        now,
        blocked,
        creationId=creation_id or (None if old is None else old.creation_id),
        objects=int(summary["objects"])
        if "objects" in summary
        else (old.objects if old is not None and "objects" in kept else None),
        bytes=int(summary["bytes"])
        if "bytes" in summary
        else (old.bytes if old is not None and "bytes" in kept else None),
        verification=None
        if verification is None
        else verification.model_dump(mode="json", by_alias=True, exclude_none=True),
        completedAt=completed_at
        or (None if completed is None else condition_time(epoch_ms(completed.isoformat()))),
    )


def verification_in(summary: Mapping[str, Any]) -> RestoreVerification | None:
    """The verify job's verdict a restore Job's summary carries (``cli.snapshots``
    ``verification_summary``); None if it has none (the restore failed before verifying)
    or one this operator cannot read (a pod of another version)."""
    raw = summary.get("verification")
    if raw is None:
        return None
    try:
        return RestoreVerification.model_validate(raw)
    except ValidationError:
        return None


def final(stored: Parsed[TopicSnapshot] | Parsed[TopicRestore]) -> bool:
    """Ready or Failed: a snapshot or restore that is done is not reconciled again."""
    status = None if stored.resource is None else stored.resource.status
    phase = None if status is None else status.phase
    return phase in (SnapshotPhase.READY, SnapshotPhase.FAILED)
