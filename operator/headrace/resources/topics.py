"""Topic: the desired partitions and settings of one topic, and where they live.

Pure data. The status holds the operator's durable decisions about the topic
(``docs/architecture.md`` section 3, invariants 8 and 9): the partitioning
version publishes are fenced on, each partition's assignment and leader epoch,
the transition markers of a repartition or an unload in progress, elections in
flight and cohort plans.
Every field the control core persists is declared here, so the API server's
structural pruning keeps all of it (``docs/decisions.md``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from headrace.resources.meta import (
    MAX_PARTITIONS,
    READY_COLUMNS,
    CelRule,
    ClusterReference,
    KindNames,
    Model,
    ObjectMeta,
    PrinterColumn,
    Resource,
    Status,
    immutable,
    list_map,
)

#: the most replicas a partition may have; each one costs its leader a follower fetch
MAX_REPLICAS = 7


class Retention(Model):
    """How long records are kept, on broker disks and, for a tiered topic, in the object
    store too (the whole log). Unset fields take the cluster's ``brokerConfig``."""

    ms: int | None = Field(default=None, ge=-1)
    """Delete segments (on a tiered topic, stored objects too) whose newest record is older
    than this many milliseconds; -1 keeps them forever."""
    bytes: int | None = Field(default=None, ge=-1)
    """Delete the oldest segments while a partition is larger than this (on a tiered topic,
    its stored objects and local segments together); -1 is unlimited."""


class Segments(Model):
    """When a partition's active segment is rolled. Unset fields take the cluster's
    ``brokerConfig``."""

    bytes: int | None = Field(default=None, ge=1)
    """Roll past this size, in bytes."""
    ms: int | None = Field(default=None, ge=1)
    """Roll a segment this old even if small, in milliseconds (lets age retention delete it)."""


class CleanupPolicy(enum.StrEnum):
    DELETE = "delete"
    COMPACT = "compact"


class TieredStorage(Model):
    """Upload of sealed segments to the cluster's object store."""

    enabled: bool = True
    """Upload segments; needs an object store on the cluster (local mode has a built-in one).
    Unload and Compaction work only on tiered topics."""
    upload_interval_seconds: int = Field(default=30, ge=1, le=86_400)
    """How often each partition's leader uploads the segments sealed since the last upload."""
    local_retention_ms: int | None = Field(default=None, ge=-1)
    """Keep uploaded segments on broker disks this long; unset follows ``retention.ms``."""
    local_retention_bytes: int | None = Field(default=None, ge=-1)
    """Keep at most this many bytes of uploaded segments per partition on broker disks;
    unset follows ``retention.bytes``."""


class Delivery(Model):
    """How records reach cohort (consumer group) members."""

    cohort_grace_ms: int | None = Field(default=None, ge=0, le=3_600_000)
    """How long a member losing a partition in a rebalance may finish in-flight records
    before the partition's delivery gate moves, in milliseconds; unset takes the cluster's
    ``brokerConfig.cohortGraceMs``."""


class DeletionPolicy(enum.StrEnum):
    """What happens to a Topic's data when the Topic is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


#: the API server's refusal of a ``clusterRef`` edit (the CRD's CEL rule)
CLUSTER_REF_IMMUTABLE: Final = (
    "clusterRef is immutable: a Topic cannot move to another BrokerCluster"
    " (its data stays on this one); apply a Topic for the other cluster instead"
)
#: the API server's refusal of a ``replicas`` edit (the CRD's CEL rule)
REPLICAS_IMMUTABLE: Final = (
    "replicas is immutable: changing a topic's replication factor is not supported"
)


def _default_min_in_sync(data: dict[str, object]) -> int:
    replicas = data.get("replicas", 3)
    return min(2, replicas) if isinstance(replicas, int) else 2


class TopicSpec(Model):
    """The desired topic."""

    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {
        # replicas always has a value (its default); minInSync's is computed
        "_within_replicas": CelRule(
            "!has(self.minInSync) || self.minInSync <= self.replicas",
            "minInSync must not exceed replicas",
            ".minInSync",
        )
    }

    cluster_ref: ClusterReference = Field(json_schema_extra=immutable(CLUSTER_REF_IMMUTABLE))
    """The BrokerCluster that hosts the topic. Immutable: a topic's data lives on its
    cluster's brokers, so a Topic cannot move to another cluster (apply a Topic there)."""
    partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    """The desired partition count; a change is carried out as a repartition."""
    replicas: int = Field(
        default=3, ge=1, le=MAX_REPLICAS, json_schema_extra=immutable(REPLICAS_IMMUTABLE)
    )
    """Copies of each partition, on distinct brokers. Immutable: changing a topic's
    replication factor is not supported."""
    min_in_sync: int = Field(default_factory=_default_min_in_sync, ge=1, le=MAX_REPLICAS)
    """Live replicas an ``acks=all`` produce needs; with fewer it fails fast instead of
    acknowledging. At most ``replicas``; default ``min(2, replicas)``."""
    retention: Retention = Field(default_factory=Retention)
    """How long records are kept."""
    segments: Segments = Field(default_factory=Segments)
    """When segments roll."""
    max_batch_bytes: int | None = Field(default=None, ge=1)
    """Largest record batch a producer may send; unset takes ``brokerConfig.maxBatchBytes``."""
    cleanup_policy: CleanupPolicy = CleanupPolicy.DELETE
    """``delete`` (retention removes old segments) or ``compact`` (compaction keeps the
    last record per key)."""
    tiered_storage: TieredStorage = Field(default_factory=TieredStorage)
    """Upload to object storage."""
    delivery: Delivery = Field(default_factory=Delivery)
    """Cohort delivery settings."""
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    """What deleting the Topic does to its data. ``Retain`` (the default: data is not lost
    by a stray ``kubectl delete``): every broker closes its copies and moves them aside, to
    ``retained/`` in its data directory, and the topic leaves the routing table. ``Delete``:
    the brokers remove their copies, and a broker the topic's objects in the object store
    (all but what snapshots pin; the BrokerCluster's ``status.deletedTopics`` lists it until
    they are gone). Either way the operator's finalizer (``headrace.dev/topic-data``) keeps
    the Topic until the brokers have dealt with their copies."""

    @field_validator("min_in_sync")
    @classmethod
    def _within_replicas(cls, value: int, info: ValidationInfo) -> int:
        replicas = info.data.get("replicas")
        if isinstance(replicas, int) and value > replicas:
            raise PydanticCustomError(
                "min_in_sync_above_replicas",
                "minInSync ({value}) must not exceed replicas ({replicas})",
                {"value": value, "replicas": replicas},
            )
        return value


class PartitionState(enum.StrEnum):
    """Where a partition is in its leadership life cycle: see ``PartitionAssignment.state``.

    The control core's ``election`` moves a partition between the first three; no
    controller sets ``Moving`` or ``Retiring`` (``control.model.ELECTION_STATES``)."""

    ONLINE = "Online"
    ELECTING = "Electing"
    OFFLINE = "Offline"
    MOVING = "Moving"
    RETIRING = "Retiring"


class PartitionAssignment(Model):
    """Where one partition lives: the controller's durable decision."""

    partition: int = Field(ge=0)
    """Partition index."""
    leader: int | None = Field(default=None, ge=0)
    """Broker id of the leader; unset while there is none."""
    replicas: list[int] = Field(default_factory=list)
    """Broker ids holding a copy, the preferred leader first."""
    live_replicas: list[int] = Field(default_factory=list)
    """The live replica set (LRS): replicas caught up with the leader. The high watermark
    advances over these."""
    leader_epoch: int = Field(default=0, ge=0)
    """Bumped on every leader change; requests with an older epoch are rejected."""
    state: PartitionState = PartitionState.ONLINE
    """``Online`` (a leader serves it), ``Electing`` (its leader is gone and a successor is
    being promoted), ``Offline`` (no live replica can lead it), ``Moving`` (being unloaded
    to another broker) or ``Retiring`` (shrunk away by a repartition, draining its backlog
    before it is retired; a retired partition stays readable, see ``activePartitions``)."""
    candidate: int | None = Field(default=None, ge=0)
    """While ``Electing``: the broker nominated to lead at ``leaderEpoch``. It promotes itself
    and says so in its heartbeat; until then clients are routed to it."""
    deadline_ms: int | None = Field(default=None, ge=0)
    """While ``Electing``: when the next nominee gets a turn; while ``Offline``: when the
    replicas in ``tried`` that stayed live get another chance; while ``Online``: when the
    preferred replica, back in sync, takes the leadership back (the end of its quiet
    period; unset when the leader is the preferred replica). Milliseconds since the Unix
    epoch on the controller's clock (the core's own unit, so a restarted controller carries
    on with the election exactly)."""
    tried: list[int] = Field(default_factory=list)
    """The nominees of the current election round, in the order they were nominated."""
    seal: bool = False
    """An unload's transition marker: the leader must seal the partition (stop appends,
    upload every record, write the sealed state to the object store) before it moves."""
    moves: int = Field(default=0, ge=0)
    """The partition's incarnation: bumped each time an unload reassigns it. A replica
    holding an older incarnation drops its copy."""
    start_offset: int | None = Field(default=None, ge=0)
    """The first offset of incarnation ``moves``. Unset before the first move (it starts at
    0) and after a move recovered from the object store (the new owner starts after the last
    offset stored there)."""
    target_replicas: list[int] = Field(default_factory=list)
    """While a replica move runs (a scale up or down of the cluster): the replica set the
    partition ends with, preferred leader first. ``replicas`` is then the old set followed by
    the adding replicas, which catch up as followers; once every target member is in the
    LRS (and leads, if the leader is leaving) ``replicas`` becomes the target. Empty when no
    move runs."""
    target_generation: int | None = Field(default=None, ge=1)
    """While a replica move runs: the topology generation that started it (or last changed
    its target). The leader's live replica set counts for the move only once the leader
    reports having applied this generation, so a leader that missed a push cannot complete
    the move on a stale LRS. Unset when no move runs (and on moves started by an operator
    that did not record it)."""


class CohortPlan(Model):
    """The advisory assignment of one cohort's partitions to its members.

    Delivery gates are authoritative; a broker ignores a plan older than the one it holds.
    """

    cohort: str
    """Cohort (consumer group) name."""
    generation: int = Field(ge=1)
    """The cohort's own counter: 1 for its first plan, bumped only when ``assignment``
    changes, so a controller restart causes no rebalance."""
    assignment: dict[str, list[Annotated[int, Field(ge=0)]]] = Field(default_factory=dict)
    """Member id to the partitions it should hold, sorted; every planned member appears."""


class TransitionKind(enum.StrEnum):
    GROW = "Grow"
    SHRINK = "Shrink"


class CutoverOffset(Model):
    """Where one old partition's post-cutover records begin."""

    partition: int = Field(ge=0)
    """Old partition index."""
    offset: int = Field(ge=0)
    """The first offset its leader appended under the new partitioning version."""


class ReleasedPartitions(Model):
    """The new partitions one cohort may be delivered post-cutover records of."""

    cohort: str = Field(max_length=253)
    """Cohort name."""
    partitions: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    """New partitions whose feeding old partitions this cohort has drained."""


class TransitionMarker(Model):
    """A repartition in progress, from its cutover until it is finalized."""

    kind: TransitionKind
    """``Grow`` or ``Shrink``."""
    request: str = Field(max_length=512)
    """The Repartition (``namespace/name``) that started it, or ``Topic.spec.partitions``
    for an edit of the spec."""
    from_version: int = Field(ge=0)
    """Partitioning version before the cutover."""
    to_version: int = Field(ge=0)
    """Partitioning version after the cutover."""
    from_partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    """Partition count before the cutover."""
    to_partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    """Partition count after the cutover."""
    cutover_ms: int = Field(ge=0)
    """When the marker was written and the version bumped (ms since the epoch)."""
    adoption_timeout_ms: int = Field(ge=1)
    """Finalize at the latest this long after the drain, adopted or not."""
    adoption_generation: int | None = Field(default=None, ge=0)
    """The topology generation that reflects the new partitioning, stamped right after the
    version bump commits; the transition is adopted once every live broker's clients have
    acknowledged it."""
    cutover_offsets: list[CutoverOffset] = Field(
        default_factory=list, json_schema_extra=list_map("partition")
    )
    """Per old partition, where its post-cutover records begin (reported by its leader)."""
    released: list[ReleasedPartitions] = Field(
        default_factory=list, json_schema_extra=list_map("cohort")
    )
    """Per cohort, the new partitions it is no longer held on."""
    drained_ms: int | None = Field(default=None, ge=0)
    """When the pre-cutover backlog of the old partitions finished draining."""
    existing_partitions: int | None = Field(default=None, ge=1, le=MAX_PARTITIONS)
    """The partitions the topic had at the cutover, retired ones included: a grow collects
    the cutover offsets of the retired ones it routes to again too."""


class PastTransition(Model):
    """A finished repartition kept in the topic's history."""

    from_partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    """Partition count before its cutover."""
    to_partitions: int = Field(ge=1, le=MAX_PARTITIONS)
    """Partition count after its cutover."""
    to_version: int = Field(ge=0)
    """The partitioning version its cutover moved to."""
    cutover_offsets: list[CutoverOffset] = Field(
        default_factory=list, json_schema_extra=list_map("partition")
    )
    """Per partition it measured (each old partition, and each retired partition a grow
    routed to again), where its post-cutover records begin; a partition left out starts at
    0."""


class CohortPosition(Model):
    """How far one cohort has come through the topic's history."""

    cohort: str = Field(max_length=253)
    """Cohort name."""
    version: int = Field(ge=0)
    """The ``toVersion`` of the oldest kept transition that may still hold it back (one
    above the newest's: past the whole history)."""
    released: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    """The partitions that transition no longer holds it on."""


class PartitioningHistory(Model):
    """The finished repartitions whose pre-cutover records are still readable: a cohort
    created after one (or idle during it) is held by them as by a live one, so it gets each
    key in order across the topic's history."""

    transitions: list[PastTransition] = Field(default_factory=list)
    """Oldest first. One is forgotten once retention removed every record below its
    cutover offsets."""
    cohorts: list[CohortPosition] = Field(
        default_factory=list, json_schema_extra=list_map("cohort")
    )
    """Per cohort, how far it has come; a cohort not listed starts at the oldest
    transition."""


class TopicStatus(Status):
    """What the operator decided for the topic."""

    partitioning_version: int | None = Field(default=None, ge=0)
    """The version keyed publishes are routed and fenced under; bumped at a repartition's
    cutover."""
    partitions: list[PartitionAssignment] = Field(
        default_factory=list, json_schema_extra=list_map("partition")
    )
    """Assignment of every partition."""
    transition: TransitionMarker | None = None
    """The repartition in progress, if any."""
    cohort_plans: list[CohortPlan] = Field(
        default_factory=list, json_schema_extra=list_map("cohort")
    )
    """The advisory plan of every cohort with connected members."""
    spec_partitions: int | None = Field(default=None, ge=1, le=MAX_PARTITIONS)
    """The ``spec.partitions`` the controller last acted on: an edit of the spec starts a
    repartition, while a Repartition changes the count and leaves the spec as it was."""
    partition_count: int | None = Field(default=None, ge=1, le=MAX_PARTITIONS)
    """How many partitions keys are routed over now, which after a Repartition may differ
    from ``spec.partitions`` (retired partitions, ``activePartitions``, not counted)."""
    active_partitions: int | None = Field(default=None, ge=1, le=MAX_PARTITIONS)
    """After a shrink: the partitions keys are routed to (``0`` to ``activePartitions - 1``).
    The partitions above it are retired: they take no produce, but stay placed, led and
    readable until the topic is deleted, and a grow routes to them again, continuing their
    offsets. Unset: every partition is routed to."""
    history: PartitioningHistory | None = None
    """The topic's partitioning history, while a finished repartition's pre-cutover records
    are readable."""
    topology_generation: int | None = Field(default=None, ge=0)
    """The topology generation this status was written for. The controller writes every
    Topic's status before the BrokerCluster's, so a status stamped above the cluster's
    ``topologyGeneration`` is from a commit that stopped part-way."""
    creation_id: str | None = Field(default=None, min_length=1, max_length=128)
    """Which incarnation of the topic this is: the Topic's ``metadata.uid`` when it was
    first placed (in local mode, an id the controller gave it). Its objects in the object
    store are kept under it, so a Topic deleted and created again under the same name
    never meets the objects of the old one. Unset for a topic placed before creation ids
    existed: its objects keep the legacy layout. It never changes."""


class Topic(Resource):
    """A partitioned, replicated topic on a BrokerCluster."""

    KIND: ClassVar[str] = "Topic"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="topics",
        singular="topic",
        short_names=("hrt",),
        columns=(
            PrinterColumn(
                "Partitions", "integer", ".status.partitionCount", "Partitions the topic has now"
            ),
            PrinterColumn("Replicas", "integer", ".spec.replicas", "Copies of each partition"),
            PrinterColumn(
                "Version", "integer", ".status.partitioningVersion", "Partitioning version"
            ),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["Topic"] = "Topic"
    metadata: ObjectMeta
    spec: TopicSpec
    status: TopicStatus | None = None
