"""Compaction (one run) and CompactionSchedule (runs on a cron schedule).

Pure data. A run is a Spark job that merges a topic's small segments (and, for
``cleanupPolicy: compact`` topics, keeps the last record per key), preserving
offsets, then optionally verifies every partition. The operator launches a
Compaction as a Kubernetes Job and a CompactionSchedule as a CronJob; the
schedule fields mean what they mean on a CronJob.
"""

from __future__ import annotations

import enum
from typing import Annotated, ClassVar, Final, Literal

from pydantic import AwareDatetime, ConfigDict, Field

from headrace.resources.cron import CronSchedule
from headrace.resources.meta import (
    IMMUTABLE_SPEC,
    READY_COLUMNS,
    JobMeta,
    KindNames,
    Model,
    PartitionSet,
    PrinterColumn,
    Resource,
    ResourceName,
    Status,
    TopicReference,
)

# --- the run ---


class SparkMaster(enum.StrEnum):
    LOCAL = "local"
    KUBERNETES = "kubernetes"


#: Spark's size strings (``spark.executor.memory``): a number of bytes or ``k``/``m``/``g``/``t``
SPARK_SIZE_PATTERN: Final = r"^[0-9]+([kKmMgGtT][bB]?)?$"


class SparkSettings(Model):
    """Where the job's Spark executors run."""

    master: SparkMaster = SparkMaster.LOCAL
    """``local``: the driver and its executor threads in the Job's one pod
    (``local[*]``). ``kubernetes``: the driver stays in the Job's pod and starts
    ``executors`` executor pods through the API server (``k8s://``, client mode); the
    driver runs as the chart's Spark service account, the executors as the namespace's
    ``default`` one; they are owned by the driver's pod and deleted when the job ends."""
    executors: int = Field(default=2, ge=1, le=64)
    """Executor pods (``spark.executor.instances``), with ``master: kubernetes``."""
    executor_cores: int = Field(default=1, ge=1, le=64)
    """Task slots of each executor pod (``spark.executor.cores``; also its CPU request
    unless ``sparkConf`` sets ``spark.kubernetes.executor.request.cores``)."""
    executor_memory: Annotated[str, Field(pattern=SPARK_SIZE_PATTERN, max_length=32)] = "1g"
    """Heap of each executor pod (``spark.executor.memory``, such as ``1g`` or ``512m``);
    the pod's memory request adds Spark's overhead (10%, at least 384 MiB)."""


class CompactionSettings(Model):
    """What a compaction run does; shared by Compaction and CompactionSchedule."""

    topic_ref: TopicReference
    """The topic to compact; it must have tiered storage enabled."""
    partitions: PartitionSet = Field(default_factory=list)
    """Partition indexes to compact; empty compacts every partition."""
    verify: bool = True
    """Verify every partition after compacting: offsets contiguous, no overlap, CRCs valid,
    manifest and sealed state in agreement."""
    target_segment_bytes: int | None = Field(default=None, ge=1)
    """Merge small segments into segments of about this size; unset takes the topic's
    segment size."""
    grace_seconds: int = Field(default=30, ge=0, le=86_400)
    """How long the replaced objects stay after the manifest swap, so that readers holding
    the old manifest finish, in seconds."""
    backoff_limit: int = Field(default=2, ge=0, le=10)
    """Retries of a failed job before the run counts as failed."""
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """Stop a run still going after this many seconds and count it as failed (the Job's
    ``activeDeadlineSeconds``: reason ``DeadlineExceeded``); unset, a run may take as long
    as it takes. Bounds a run whose executor pods never start (an image the nodes cannot
    pull, pods that cannot be scheduled), which Spark would wait for forever."""
    spark_conf: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=128
    )
    """Extra Spark properties (``spark.sql.shuffle.partitions: "4"``) for the job."""
    spark: SparkSettings = Field(default_factory=SparkSettings)
    """Where Spark's executors run: threads in the Job's pod (default) or pods of their own."""


class CompactionPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class CompactionResult(Model):
    """The summary of the job's report."""

    segments_before: int = Field(ge=0)
    """Segments before compaction."""
    segments_after: int = Field(ge=0)
    """Segments after compaction."""
    bytes_reclaimed: int
    """Bytes of object storage freed (negative if the new segments are larger)."""
    verified: bool
    """Whether verification ran and passed."""
    mismatches: int = Field(default=0, ge=0)
    """Problems verification found; the report lists them."""
    report: str | None = None
    """Object-store key of the full report."""


class CompactionSpec(CompactionSettings):
    """The requested run."""

    model_config = ConfigDict(json_schema_extra=IMMUTABLE_SPEC)


class CompactionStatus(Status):
    """Progress and result of the run; ``phase`` is also the Ready condition's reason."""

    phase: CompactionPhase | None = None
    """``Pending``, ``Running``, ``Succeeded`` or ``Failed``."""
    job_name: ResourceName | None = None
    """Name of the Kubernetes Job running it."""
    attempts: int = Field(default=0, ge=0)
    """Job pods started so far."""
    start_time: AwareDatetime | None = None
    """When the job started."""
    completion_time: AwareDatetime | None = None
    """When the job finished."""
    result: CompactionResult | None = None
    """What the job did, once finished."""


class Compaction(Resource):
    """One compaction (and verification) run over a topic's stored segments."""

    KIND: ClassVar[str] = "Compaction"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="compactions",
        singular="compaction",
        short_names=("hrcp",),
        columns=(
            PrinterColumn("Topic", "string", ".spec.topicRef.name", "Target topic"),
            PrinterColumn("Job", "string", ".status.jobName", "Kubernetes Job"),
            PrinterColumn("Verified", "boolean", ".status.result.verified", "Verification passed"),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["Compaction"] = "Compaction"
    metadata: JobMeta
    spec: CompactionSpec
    status: CompactionStatus | None = None


# --- the schedule ---


class ConcurrencyPolicy(enum.StrEnum):
    ALLOW = "Allow"
    FORBID = "Forbid"
    REPLACE = "Replace"


class CompactionScheduleSpec(CompactionSettings):
    """What to run and when."""

    schedule: CronSchedule
    """Cron schedule, five fields (``minute hour day-of-month month day-of-week``) or a macro
    such as ``@daily``; times are UTC."""
    suspend: bool = False
    """Start no new runs while true; running ones continue."""
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.FORBID
    """What to do when a run is due while the previous one is still going: ``Allow`` (run
    both), ``Forbid`` (skip the new one) or ``Replace`` (stop the old one). ``Forbid`` by
    default, unlike a CronJob: two compactions of one topic would race on its manifests."""
    starting_deadline_seconds: int | None = Field(default=None, ge=0)
    """Skip a run that could not start within this many seconds of its time."""
    successful_jobs_history_limit: int = Field(default=3, ge=0, le=100)
    """Finished successful runs to keep."""
    failed_jobs_history_limit: int = Field(default=1, ge=0, le=100)
    """Finished failed runs to keep."""


class JobReference(Model):
    """A Job started by the schedule."""

    name: ResourceName
    """Name of the Job."""


class CompactionScheduleStatus(Status):
    """What the schedule last did."""

    last_schedule_time: AwareDatetime | None = None
    """When a run was last started."""
    last_successful_time: AwareDatetime | None = None
    """When a run last succeeded."""
    active: list[JobReference] = Field(default_factory=list)
    """Runs going on now."""
    last_job: JobReference | None = None
    """The most recent run that finished."""
    last_result: CompactionResult | None = None
    """What the most recent finished run did (``lastJob``)."""
    last_failure: str | None = Field(default=None, max_length=4096)
    """Why ``lastJob`` failed, when it did."""


class CompactionSchedule(Resource):
    """Compaction runs on a cron schedule."""

    KIND: ClassVar[str] = "CompactionSchedule"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="compactionschedules",
        singular="compactionschedule",
        short_names=("hrcs",),
        columns=(
            PrinterColumn("Topic", "string", ".spec.topicRef.name", "Target topic"),
            PrinterColumn("Schedule", "string", ".spec.schedule", "Cron schedule"),
            PrinterColumn("Suspend", "boolean", ".spec.suspend", "Whether runs are suspended"),
            PrinterColumn(
                "Last Schedule", "date", ".status.lastScheduleTime", "When a run last started"
            ),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["CompactionSchedule"] = "CompactionSchedule"
    metadata: JobMeta
    spec: CompactionScheduleSpec
    status: CompactionScheduleStatus | None = None
