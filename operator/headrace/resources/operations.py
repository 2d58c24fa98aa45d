"""Repartition and Unload: one-shot operations on a topic, their progress in status.

Pure data. Each is a request (spec, immutable once created) and a record of
how it went (status), so ``kubectl get repartitions`` is the history of a
topic's partition changes. The state machines that move the phases live in the
control core; the phases are listed here, and only here, because they are the API (the
core imports them).
"""

from __future__ import annotations

import enum
from typing import ClassVar, Literal

from pydantic import AwareDatetime, ConfigDict, Field

from headrace.resources.meta import (
    IMMUTABLE_SPEC,
    MAX_PARTITIONS,
    READY_COLUMNS,
    KindNames,
    Model,
    ObjectMeta,
    PartitionSet,
    PrinterColumn,
    Resource,
    Status,
    TopicReference,
    list_map,
)

_TOPIC_COLUMN = PrinterColumn("Topic", "string", ".spec.topicRef.name", "Target topic")

# --- Repartition ---


class RepartitionSpec(Model):
    """The requested change."""

    model_config = ConfigDict(json_schema_extra=IMMUTABLE_SPEC)

    topic_ref: TopicReference
    """The topic to repartition."""
    partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    """The partition count to grow or shrink to."""
    adoption_timeout_seconds: int = Field(default=30, ge=1, le=3600)
    """After the backlog drains, finalize at the latest this long after, even if some
    clients have not yet acknowledged the new routing (version fences keep that safe)."""


class RepartitionPhase(enum.StrEnum):
    """Where a repartition is: see ``RepartitionStatus.phase`` (the control core's
    ``repartitions`` moves it)."""

    PENDING = "Pending"
    CUTTING_OVER = "CuttingOver"
    DRAINING = "Draining"
    AWAITING_ADOPTION = "AwaitingAdoption"
    FINALIZED = "Finalized"
    FAILED = "Failed"


class FinalizedBy(enum.StrEnum):
    """Why a repartition finalized: every live broker's clients acked, or the timeout."""

    ADOPTED = "Adopted"
    ADOPTION_TIMED_OUT = "AdoptionTimedOut"


class RepartitionStatus(Status):
    """Progress of the repartition; ``phase`` is also the Ready condition's reason."""

    phase: RepartitionPhase | None = None
    """Where the repartition is: ``Pending`` (accepted, waiting for the topic to be free of
    other transitions), ``CuttingOver`` (the transition marker is written and the
    partitioning version is being bumped), ``Draining`` (moved keys are held until the
    pre-cutover backlog of their old partitions drains), ``AwaitingAdoption`` (drained;
    waiting for clients to adopt the new routing or for the adoption timeout),
    ``Finalized`` (the marker is cleared and shrunk-away partitions are retired) or
    ``Failed`` (the Ready condition's message says why)."""
    from_partitions: int | None = Field(default=None, ge=1, le=MAX_PARTITIONS)
    """Partition count before."""
    to_partitions: int | None = Field(default=None, ge=1, le=MAX_PARTITIONS)
    """Partition count after."""
    from_version: int | None = Field(default=None, ge=0)
    """Partitioning version before the cutover."""
    to_version: int | None = Field(default=None, ge=0)
    """Partitioning version after the cutover."""
    adoption_generation: int | None = Field(default=None, ge=0)
    """Topology generation clients must acknowledge for the new routing to count as adopted
    (a topology generation, never a partitioning version)."""
    cutover_at: AwareDatetime | None = None
    """When the transition marker was written and the partitioning version bumped."""
    drained_at: AwareDatetime | None = None
    """When the pre-cutover backlog finished draining."""
    finalized_at: AwareDatetime | None = None
    """When the repartition finished."""
    finalized_by: FinalizedBy | None = None
    """Why it finalized: ``Adopted`` (every live broker's clients acknowledged the adoption
    generation) or ``AdoptionTimedOut`` (the adoption timeout elapsed first)."""


class Repartition(Resource):
    """A one-shot change of a topic's partition count."""

    KIND: ClassVar[str] = "Repartition"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="repartitions",
        singular="repartition",
        short_names=("hrrp",),
        # TOPIC FROM TO PHASE READY REASON AGE: a topic's history of partition changes
        columns=(
            _TOPIC_COLUMN,
            PrinterColumn("From", "integer", ".status.fromPartitions", "Partitions before"),
            PrinterColumn("To", "integer", ".spec.partitions", "Target partitions"),
            PrinterColumn("Phase", "string", ".status.phase", "Where the transition is"),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["Repartition"] = "Repartition"
    metadata: ObjectMeta
    spec: RepartitionSpec
    status: RepartitionStatus | None = None


# --- Unload ---


class UnloadSpec(Model):
    """The requested move."""

    model_config = ConfigDict(json_schema_extra=IMMUTABLE_SPEC)

    topic_ref: TopicReference
    """The topic whose partitions move."""
    partitions: PartitionSet = Field(default_factory=list)
    """Partition indexes to move; empty moves every partition."""
    target_broker: int | None = Field(default=None, ge=0)
    """Broker id to move them to; unset lets placement choose."""


class MovePhase(enum.StrEnum):
    """Where one partition's move is: see ``PartitionMove.phase`` (the control core's
    ``unloads`` moves it)."""

    PENDING = "Pending"
    SEALING = "Sealing"
    SEALED = "Sealed"
    COMPLETED = "Completed"
    FAILED = "Failed"


class VerificationResult(enum.StrEnum):
    PASSED = "Passed"
    FAILED = "Failed"


class MoveVerification(Model):
    """The check that the moved partition's stored segments end at the sealed offset."""

    result: VerificationResult
    """``Passed`` (the stored segments and the sealed state agree) or ``Failed`` (they
    disagree; ``message`` says how)."""
    checked_at: AwareDatetime | None = None
    """When it was checked."""
    message: str = Field(default="", max_length=4096)
    """What disagreed, when it failed."""


class RecoverySource(enum.StrEnum):
    """Who finished a seal its owner could not: another replica, or nobody (the object
    store); see ``MoveRecovery.source``."""

    REPLICAS = "Replicas"
    OBJECT_STORE = "ObjectStore"


class MoveRecovery(Model):
    """How a move finished when the old owner could not seal the partition itself."""

    source: RecoverySource
    """``Replicas`` (the old owner stopped leading mid-seal and another in-sync replica took
    over and sealed: nothing acknowledged with ``acks=all`` is lost) or ``ObjectStore`` (no
    live replica could seal it within the recovery timeout: the new owner starts after the
    last offset durable in the object store, and records acknowledged but not yet uploaded
    are lost, at most one upload interval of them for a topic with one replica)."""
    message: str = Field(default="", max_length=4096)
    """What happened, and what may have been lost."""


class PartitionMove(Model):
    """One partition's move from one broker to another."""

    partition: int = Field(ge=0)
    """Partition index."""
    from_broker: int | None = Field(default=None, ge=0)
    """Broker id of the old owner, once the move has started."""
    to_broker: int | None = Field(default=None, ge=0)
    """Broker id of the new owner, once chosen."""
    sealed_offset: int | None = Field(default=None, ge=-1)
    """Last committed offset when the partition was sealed (-1: it was empty); the new owner
    continues at the next one."""
    phase: MovePhase = MovePhase.PENDING
    """Where this move is: ``Pending`` (not started), ``Sealing`` (the old owner stops
    appends, uploads every remaining record and writes the sealed state), ``Sealed`` (the
    sealed state is recorded and the partition reassigned; every new replica drops its old
    local copy and opens it at ``sealedOffset + 1``), ``Completed`` (the new owner leads at
    ``sealedOffset + 1``) or ``Failed``."""
    verification: MoveVerification | None = None
    """Result of verifying the sealed partition, once checked."""
    recovery: MoveRecovery | None = None
    """Set when the old owner could not finish the seal itself."""
    moves: int | None = Field(default=None, ge=1)
    """The partition's incarnation after this move (``moves`` in the Topic status: how many
    moves it has had), once the move has started."""
    recovery_deadline: AwareDatetime | None = None
    """While no live replica can seal the partition: when the controller stops waiting for
    one and reopens it from the object store."""
    message: str | None = Field(default=None, max_length=4096)
    """What the move is waiting for, or why it failed."""


class UnloadPhase(enum.StrEnum):
    """Where an unload is as a whole: see ``UnloadStatus.phase`` (the control core's
    ``unloads`` moves it)."""

    PENDING = "Pending"
    MOVING = "Moving"
    COMPLETED = "Completed"
    FAILED = "Failed"


class UnloadStatus(Status):
    """Progress of the unload; ``phase`` is also the Ready condition's reason."""

    phase: UnloadPhase | None = None
    """``Pending``, ``Moving``, ``Completed`` or ``Failed``."""
    moves: list[PartitionMove] = Field(
        default_factory=list, json_schema_extra=list_map("partition")
    )
    """One entry per partition being moved."""
    started_at: AwareDatetime | None = None
    """When the first move began."""
    completed_at: AwareDatetime | None = None
    """When the last move completed."""


class Unload(Resource):
    """A one-shot move of a topic's partitions to other brokers (e.g. before draining one)."""

    KIND: ClassVar[str] = "Unload"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="unloads",
        singular="unload",
        short_names=("hrul",),
        columns=(
            _TOPIC_COLUMN,
            PrinterColumn("Target", "integer", ".spec.targetBroker", "Target broker"),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["Unload"] = "Unload"
    metadata: ObjectMeta
    spec: UnloadSpec
    status: UnloadStatus | None = None
