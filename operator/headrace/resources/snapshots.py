"""TopicSnapshot and TopicRestore: a topic's consistent snapshot in the object store, and
a new topic created from one; TopicSnapshotSchedule: TopicSnapshots on a cron schedule.

Pure data. A TopicSnapshot is a request (spec, immutable) and the snapshot document's
summary (status); a TopicRestore names a snapshot and the topic to create from it. What
they do is in ``headrace.jobs.snapshot`` and docs/tiered-storage.md, *Snapshots*; the
operator reconciles them in ``headrace.operator.snapshot_handlers``.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Literal

from pydantic import AwareDatetime, ConfigDict, Field

from headrace.resources.cron import CronSchedule
from headrace.resources.meta import (
    IMMUTABLE_SPEC,
    READY_COLUMNS,
    JobMeta,
    KindNames,
    Model,
    ObjectMeta,
    PrinterColumn,
    Resource,
    ResourceName,
    Status,
    TopicReference,
    list_map,
)


class SnapshotPhase(enum.StrEnum):
    """See ``TopicSnapshotStatus.phase`` and ``TopicRestoreStatus.phase``."""

    PENDING = "Pending"
    READY = "Ready"
    FAILED = "Failed"


class SnapshotPartition(Model):
    """One partition of the snapshot."""

    partition: int = Field(ge=0)
    """Partition index."""
    start: int = Field(ge=0)
    """The lowest offset kept."""
    cut: int = Field(ge=-1)
    """The last offset kept (``start - 1``: none)."""
    objects: int = Field(ge=0)
    """Segment objects it lists."""


class TopicSnapshotSpec(Model):
    """The requested snapshot."""

    model_config = ConfigDict(json_schema_extra=IMMUTABLE_SPEC)

    topic_ref: TopicReference
    """The topic to snapshot: every partition up to its high watermark at one moment,
    and the cohorts' cursors."""


class TopicSnapshotStatus(Status):
    """The snapshot as written; ``phase`` is also the Ready condition's reason, unless it
    waits for something the condition names (``WaitingForBrokers``, ``TopicNotFound``)."""

    phase: SnapshotPhase | None = None
    """``Pending``, ``Ready`` or ``Failed``."""
    creation_id: str | None = None
    """The topic's incarnation the snapshot belongs to (its objects' prefix)."""
    key: str | None = None
    """Object-store key of the snapshot document."""
    partitions: list[SnapshotPartition] = Field(
        default_factory=list, json_schema_extra=list_map("partition")
    )
    """Each partition's cut."""
    objects: int = Field(default=0, ge=0)
    """Segment objects the snapshot pins."""
    bytes: int = Field(default=0, ge=0)
    """Their bytes."""
    taken_at: AwareDatetime | None = None
    """When the cut was taken."""


class TopicSnapshot(Resource):
    """A consistent snapshot of a topic in the object store; its objects are kept against
    retention, compaction, the orphan sweep and the topic's deletion until it is deleted."""

    KIND: ClassVar[str] = "TopicSnapshot"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="topicsnapshots",
        singular="topicsnapshot",
        short_names=("hrsnap",),
        columns=(
            PrinterColumn("Topic", "string", ".spec.topicRef.name", "Snapshotted topic"),
            PrinterColumn("Phase", "string", ".status.phase", "Pending, Ready or Failed"),
            PrinterColumn("Objects", "integer", ".status.objects", "Objects pinned"),
            PrinterColumn("Bytes", "integer", ".status.bytes", "Bytes pinned"),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["TopicSnapshot"] = "TopicSnapshot"
    metadata: ObjectMeta
    spec: TopicSnapshotSpec
    status: TopicSnapshotStatus | None = None


class SnapshotReference(Model):
    """A TopicSnapshot in the same namespace."""

    name: ResourceName
    """Name of the TopicSnapshot."""


class TopicRestoreSpec(Model):
    """The requested restore."""

    model_config = ConfigDict(json_schema_extra=IMMUTABLE_SPEC)

    snapshot_ref: SnapshotReference
    """The snapshot to restore."""
    topic: ResourceName
    """Name of the new topic (in this namespace; it must not exist): the snapshot's
    offsets, records and cohort cursors, the source Topic's spec."""


class VerificationOutcome(enum.StrEnum):
    """See ``RestoreVerification.outcome``."""

    VERIFIED = "Verified"
    FAILED = "Failed"


class RestoreVerification(Model):
    """The Spark verify job's verdict on the restored copy, checked before the new topic
    is released (every object at its size, every header and CRC, no offset gap or
    overlap, the sealed states covered)."""

    outcome: VerificationOutcome
    """``Verified``, or ``Failed`` (the new topic stays pending: see ``reason``)."""
    report_key: str | None = None
    """Object-store key of the verify job's report, under the new incarnation's
    ``reports/`` (none: the job could not run and wrote none)."""
    reason: str | None = Field(default=None, max_length=4096)
    """Why it failed: the first problems the report names, or why the job could not run."""


class TopicRestoreStatus(Status):
    """How the restore went; ``phase`` is also the Ready condition's reason, unless it
    waits for something the condition names (``WaitingForSnapshot``, ``TopicExists``)."""

    phase: SnapshotPhase | None = None
    """``Pending``, ``Ready`` (the new topic is placed) or ``Failed``."""
    creation_id: str | None = None
    """The new topic's creation id."""
    objects: int = Field(default=0, ge=0)
    """Segment objects copied."""
    bytes: int = Field(default=0, ge=0)
    """Bytes copied."""
    verification: RestoreVerification | None = None
    """The Spark verify job's verdict and where its report is, once it has run."""
    completed_at: AwareDatetime | None = None
    """When the new topic was placed."""


class TopicRestore(Resource):
    """A new topic created from a TopicSnapshot, with the same offsets and cursors."""

    KIND: ClassVar[str] = "TopicRestore"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="topicrestores",
        singular="topicrestore",
        short_names=("hrrs",),
        columns=(
            PrinterColumn("Snapshot", "string", ".spec.snapshotRef.name", "Source snapshot"),
            PrinterColumn("Topic", "string", ".spec.topic", "New topic"),
            PrinterColumn("Phase", "string", ".status.phase", "Pending, Ready or Failed"),
            PrinterColumn(
                "Verified", "string", ".status.verification.outcome", "Spark verify job's verdict"
            ),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["TopicRestore"] = "TopicRestore"
    metadata: ObjectMeta
    spec: TopicRestoreSpec
    status: TopicRestoreStatus | None = None


class TopicSnapshotScheduleSpec(Model):
    """What to snapshot, when, and how many snapshots to keep."""

    topic_ref: TopicReference
    """The topic to snapshot."""
    schedule: CronSchedule
    """Cron schedule, five fields (``minute hour day-of-month month day-of-week``) or a macro
    such as ``@daily``; times are UTC. When the operator was not running at a time, it
    takes the latest one missed, once."""
    suspend: bool = False
    """Take no new snapshots while true; the kept ones stay."""
    keep: int = Field(default=7, ge=1, le=1000)
    """Ready snapshots of this schedule to keep: when a newer one is Ready, the oldest beyond
    this count are deleted (their objects are then no longer pinned). Of the failed ones
    only the most recent is kept."""


class TopicSnapshotScheduleStatus(Status):
    """What the schedule last did."""

    last_schedule_time: AwareDatetime | None = None
    """The scheduled time of the latest snapshot it created."""
    last_snapshot: SnapshotReference | None = None
    """The latest TopicSnapshot it created."""
    kept: list[SnapshotReference] = Field(default_factory=list)
    """Its Ready snapshots, oldest first."""
    last_failure: str | None = Field(default=None, max_length=4096)
    """Why its most recent finished snapshot failed, when it did."""


class TopicSnapshotSchedule(Resource):
    """TopicSnapshots of a topic on a cron schedule, the newest ``keep`` kept."""

    KIND: ClassVar[str] = "TopicSnapshotSchedule"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="topicsnapshotschedules",
        singular="topicsnapshotschedule",
        short_names=("hrss",),
        columns=(
            PrinterColumn("Topic", "string", ".spec.topicRef.name", "Snapshotted topic"),
            PrinterColumn("Schedule", "string", ".spec.schedule", "Cron schedule"),
            PrinterColumn("Keep", "integer", ".spec.keep", "Ready snapshots kept"),
            PrinterColumn(
                "Last Schedule", "date", ".status.lastScheduleTime", "Latest snapshot's time"
            ),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["TopicSnapshotSchedule"] = "TopicSnapshotSchedule"
    metadata: JobMeta
    spec: TopicSnapshotScheduleSpec
    status: TopicSnapshotScheduleStatus | None = None
