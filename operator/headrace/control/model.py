"""The control core's data: what the controller persists and what it is asked (pure data).

* **Status** (``ClusterState``, ``TopicStatus``, ``PartitionStatus``,
  ``CohortPlan``, and ``BrokerEndpoint`` from the protocol) holds the durable
  decisions: placement, leaders and epochs, LRS membership, cohort plans and
  the topology generation. The controller persists it, in Kubernetes CR status
  or in the local state store, with the same JSON shape.
* **Requests** (``TopicSpec``, ``UnloadRequest``) and unload progress.

What brokers report (``Heartbeat`` and its parts) is not here: it is a wire
document both planes share, in ``headrace.protocol.coordination``. Reports are
samples: the controller keeps only the latest one per broker, in memory, and
never persists them.

Every class is a frozen dataclass; the core never mutates one, it builds a new
one, so "did anything change?" is plain equality. Documents use camelCase keys
(``partitioningVersion``, ``leaderEpoch``, ``liveReplicas``) as Kubernetes status
does. Each persisted document's codec is generated (``codecs.Codec``:
``PARTITION_STATUS_JSON``, ``COHORT_PLAN_JSON``, ``TRANSITION_JSON``,
``TOPIC_STATUS_JSON``, ``CLUSTER_STATE_JSON``, ``DELETED_INCARNATION_JSON``,
``UNLOAD_PROGRESS_JSON``), with the format's quirks declared on the fields: maps kept as
lists sorted by key, which Kubernetes merges as list-maps (``codecs.ListMap``), fields
left out while unset, and what a type cannot say, such as partitions listed in order.
Reading rejects a document of the wrong shape with ``InvalidRequest`` naming the field.

The enums of states and phases (``PartitionState``, ``MovePhase``, ...) are the API's,
defined once in ``headrace.resources`` (pure too) and imported here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Final

import pydantic
from pydantic_core import PydanticCustomError

from headrace.control.codecs import CAMEL_CASE, ByHand, Codec, ListMap
from headrace.errors import InvalidTopicSpec
from headrace.protocol.coordination import PartitioningHistory, PastTransition, feeders
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.resources.operations import FinalizedBy as FinalizedBy
from headrace.resources.operations import MovePhase as MovePhase
from headrace.resources.operations import RecoverySource as RecoverySource
from headrace.resources.operations import RepartitionPhase as RepartitionPhase
from headrace.resources.operations import UnloadPhase as UnloadPhase
from headrace.resources.topics import PartitionState as PartitionState

#: the states a partition's leadership goes through (``election``); the API also names
#: ``Moving`` and ``Retiring``, which no controller sets, so a status holding one is refused
ELECTION_STATES: Final = frozenset(
    {PartitionState.ONLINE, PartitionState.ELECTING, PartitionState.OFFLINE}
)


# --------------------------------------------------------------------------- desired state


class RestoreStage(enum.StrEnum):
    """Where a Topic created from a snapshot is (the ``headrace.dev/restore`` annotation)."""

    #: not a restore: placed at once, every partition empty at offset 0
    NONE = ""
    #: the restore is being written under the Topic's creation id: not placed yet (its
    #: brokers must not open the partitions before their sealed states exist)
    PENDING = "pending"
    #: written: placed at incarnation 1 with no start offset, so every replica opens each
    #: partition from the restore's sealed state (``jobs.snapshot.restore_snapshot``)
    WRITTEN = "written"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What the user asked for (the Topic spec); the controller reads it, never writes it."""

    name: str
    partitions: int
    replicas: int = 1
    min_in_sync: int = 1
    #: segments go to the object store (``tieredStorage.enabled``); an Unload needs it
    tiered: bool = True
    #: names this incarnation of the topic (the Topic's ``metadata.uid``; the local
    #: controller assigns one when a Topic is first applied); stamped on the status at
    #: creation. "": none (a spec read without one)
    creation_id: str = ""
    #: created from a snapshot: held until the restore is written, then placed at
    #: incarnation 1 (only matters when the topic is created)
    restore: RestoreStage = RestoreStage.NONE

    def __post_init__(self) -> None:
        ns, _, short = self.name.partition("/")
        if not ns or not short or "/" in short:
            raise InvalidTopicSpec(f"topic name {self.name!r} must be 'namespace/name'")
        if self.partitions < 1:
            raise InvalidTopicSpec(f"topic {self.name!r}: partitions must be at least 1")
        if self.replicas < 1:
            raise InvalidTopicSpec(f"topic {self.name!r}: replicas must be at least 1")
        if not 1 <= self.min_in_sync <= self.replicas:
            raise InvalidTopicSpec(
                f"topic {self.name!r}: minInSync must be between 1 and replicas ({self.replicas})"
            )


# --------------------------------------------------------------------------- persisted status


def _election_state(state: PartitionState) -> PartitionState:
    if state not in ELECTION_STATES:
        raise PydanticCustomError("enum", "not a state the controller sets")
    return state


def _unset(value: object) -> bool:
    """Left out of a document: the fields of a replica move, while none runs (so documents
    without one stay as they were before moves existed)."""
    return not value


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """The durable leadership record of one partition (see ``election`` for the transitions).

    ``candidate``, ``deadline_ms`` and ``tried`` describe an election in
    progress, and are persisted so a restarted controller carries on with it:

    * ELECTING: ``candidate`` is the nominee, told to promote itself at
      ``leader_epoch``; ``deadline_ms`` is when the next one gets a turn;
      ``tried`` lists the nominees of this round so far.
    * OFFLINE: ``deadline_ms`` is when LRS members in ``tried`` that are still
      live get another chance.
    * ONLINE: ``candidate`` and ``tried`` are empty; ``deadline_ms`` is set
      only while the preferred replica, back in sync, waits out its quiet
      period before it takes the leadership back (``election``).

    ``seal``, ``moves`` and ``start_offset`` belong to unloads (see
    ``unloads``): ``seal`` tells the leader to seal the partition; ``moves``
    counts the reassignments an unload made (the partition's incarnation);
    ``start_offset`` is the first offset of incarnation ``moves``, None when
    the new owner must derive it from the object store (``moves`` > 0) or
    the partition never moved (``moves`` == 0, it starts at 0).
    """

    partition: int
    #: the replica set, preferred leader first; fixed by placement
    replicas: tuple[int, ...]
    #: None while there is none (a status document then leaves it out)
    leader: Annotated[int | None, pydantic.Field(default=None)]
    #: increases on every nomination; the leader (or the candidate) serves at this epoch
    leader_epoch: int
    #: the LRS: replicas eligible for election, as last reported by the leader
    live_replicas: tuple[int, ...]
    state: Annotated[PartitionState, pydantic.AfterValidator(_election_state)]
    candidate: int | None = None
    deadline_ms: int | None = None
    tried: tuple[int, ...] = ()
    #: the transition marker of an unload: the leader must seal the partition
    seal: bool = False
    #: the incarnation: +1 on every reassignment by an unload
    moves: int = 0
    #: first offset of incarnation ``moves``; None: derive it from the object store
    start_offset: int | None = None
    #: a replica move in flight (see ``moves``): the replica set it ends with, preferred
    #: leader first; ``replicas`` is then the old set followed by the adding replicas.
    #: Empty when no move runs.
    target: Annotated[
        tuple[int, ...], pydantic.Field(alias="targetReplicas", exclude_if=_unset)
    ] = ()
    #: the topology generation that started the move (or last retargeted it): the
    #: leader's LRS counts for the move only from a heartbeat of a leader that applied
    #: it (``moves``). 0 with no move, or a move recorded before this field existed
    target_generation: Annotated[int, pydantic.Field(exclude_if=_unset)] = 0

    @property
    def replication_factor(self) -> int:
        """How many replicas the partition has when no move runs (a move's ``replicas`` is
        the old set plus the adding ones; its target has the partition's factor)."""
        return len(self.target or self.replicas)

    @property
    def owner(self) -> int | None:
        """Whom to route to: the leader, or the candidate while one is promoting."""
        return self.leader if self.leader is not None else self.candidate


#: a partition's status as camelCase JSON (``leader``, ``candidate``, ``deadlineMs`` and
#: ``startOffset`` written as null when unset; ``targetReplicas`` and ``targetGeneration``
#: only while a move runs)
PARTITION_STATUS_JSON: Final = Codec(PartitionStatus, "partition status")


def _sorted(values: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(values))


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class CohortPlan:
    """The advisory cross-broker assignment of one cohort of one topic.

    ``generation`` is this cohort's own counter: it starts at 1 and bumps only
    when ``assignment`` changes, so re-publishing a stable plan is a no-op and
    brokers can ignore a plan older than the one they hold.
    """

    cohort: str
    generation: int
    #: member id -> the partitions it should hold, sorted; every planned member appears
    assignment: Mapping[str, Annotated[tuple[int, ...], pydantic.AfterValidator(_sorted)]] = field(
        default_factory=dict
    )


#: a cohort plan as camelCase JSON (each member's partitions read back sorted, as written)
COHORT_PLAN_JSON: Final = Codec(CohortPlan, "cohort plan")


#: the ``request`` of a transition started by an edit of ``Topic.spec.partitions``
SPEC_EDIT: Final = "Topic.spec.partitions"


def _absent(value: object) -> bool:
    """Left out of a document while None (rather than written as null)."""
    return value is None


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class Transition:
    """The transition marker of a live repartition, kept in the topic's status.

    Written together with the partitioning version bump (the cutover) and
    cleared at finalize; see ``repartitions``. ``adoption_generation`` is a
    *topology generation* (what clients ack), ``from_version``/``to_version``
    are *partitioning versions* (what publishes are fenced on): the marker is
    the bridge between the two counters, never a place where one stands in for
    the other.
    """

    #: "<namespace>/<name>" of the Repartition, or ``SPEC_EDIT``
    request: str
    from_partitions: int
    to_partitions: int
    from_version: int
    to_version: int
    #: when the cutover committed (the controller's clock)
    cutover_ms: int
    #: measured from ``drained_ms``: finalize at the latest this long after the drain
    adoption_timeout_ms: int
    #: the topology generation the cutover committed at; None until stamped (the step after)
    adoption_generation: int | None = None
    #: old partition -> the first offset its leader appended under ``to_version``
    cutover_offsets: Annotated[Mapping[int, int], ListMap("partition", "offset")] = field(
        default_factory=dict
    )
    #: cohort -> the new partitions whose post-cutover records it may be delivered
    #: (read back sorted)
    released: Annotated[
        Mapping[str, Annotated[tuple[int, ...], pydantic.AfterValidator(_sorted)]],
        ListMap("cohort", "partitions"),
    ] = field(default_factory=dict)
    #: when every tracked cohort had drained every old partition's pre-cutover backlog
    drained_ms: int | None = None
    #: the partitions the topic had at the cutover, retired ones included (None in a
    #: marker written before it was recorded: ``from_partitions``)
    existing_partitions: Annotated[int | None, pydantic.Field(exclude_if=_absent)] = None

    @property
    def measured(self) -> int:
        """The partitions ``0..measured-1`` whose cutover offsets the marker collects: every
        old partition, and every retired one a grow routes to again. The history needs the
        latter (``PastTransition``); a partition the grow places new starts empty."""
        existing = self.existing_partitions or self.from_partitions
        return max(self.from_partitions, min(self.to_partitions, existing))

    def feeders(self, partition: int) -> tuple[int, ...]:
        """The old partitions holding pre-cutover records of keys that ``partition`` now
        gets: ``crc32(key) % from == p`` and ``% to == partition`` have a solution exactly
        when ``p`` and ``partition`` agree modulo gcd(from, to)."""
        return feeders(self.from_partitions, self.to_partitions, partition)

    def past(self) -> PastTransition:
        """What the history keeps of it once it finalized."""
        return PastTransition(
            self.from_partitions,
            self.to_partitions,
            self.to_version,
            {p: o for p, o in self.cutover_offsets.items() if o > 0},
        )

    @pydantic.model_serializer(mode="wrap")
    def _with_kind(self, fields: pydantic.SerializerFunctionWrapHandler) -> dict[str, object]:
        """The document also says ``kind`` (for people: it follows from the counts)."""
        kind = "Grow" if self.to_partitions > self.from_partitions else "Shrink"
        return {"kind": kind, **fields(self)}


#: a transition marker as camelCase JSON: ``cutoverOffsets`` and ``released`` as list-maps,
#: ``adoptionGeneration`` and ``drainedMs`` null while unset, ``existingPartitions`` left out
TRANSITION_JSON: Final = Codec(Transition, "transition")


def _in_order(partitions: tuple[PartitionStatus, ...]) -> tuple[PartitionStatus, ...]:
    if [p.partition for p in partitions] != list(range(len(partitions))):
        raise PydanticCustomError("partitions_order", "partitions must be listed in order from 0")
    return partitions


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class TopicStatus:
    """Durable status of one topic (the Topic CR's status, minus conditions)."""

    name: str
    #: what publishes are fenced on; 1 at creation, bumped only by a repartition
    partitioning_version: int
    #: listed in order from 0 (a document without them has none)
    partitions: Annotated[
        tuple[PartitionStatus, ...], pydantic.AfterValidator(_in_order), pydantic.Field(default=())
    ]
    cohort_plans: Annotated[Mapping[str, CohortPlan], ListMap("cohort")] = field(
        default_factory=dict
    )
    #: the live repartition in flight, if any
    transition: Annotated[Transition | None, pydantic.Field(exclude_if=_absent)] = None
    #: the ``spec.partitions`` last acted on: an *edit* of it starts a transition (a
    #: Repartition changes the count without touching the spec); None: the partition count
    spec_partitions: Annotated[int | None, pydantic.Field(exclude_if=_absent)] = None
    #: after a shrink, the partitions ``0..active_partitions-1`` that keys are routed to;
    #: the ones above are *retired*: they take no produce but stay placed, led and
    #: readable, and a grow routes to them again, continuing their offsets. None: all
    active_partitions: Annotated[int | None, pydantic.Field(exclude_if=_absent)] = None
    #: the finished transitions whose pre-cutover records are still readable, and how far
    #: each cohort has come through them: what keeps each key in order for a cohort that
    #: was not there during a transition (``repartitions``). None: nothing to keep
    history: Annotated[
        PartitioningHistory | None,
        ByHand(PartitioningHistory.from_json, PartitioningHistory.to_json),
        pydantic.Field(exclude_if=_absent),
    ] = None
    #: the incarnation this status belongs to (``TopicSpec.creation_id`` when it was
    #: created): its objects live under it (``tiered.layout``). "": a topic created before
    #: creation ids, whose objects keep the legacy layout. Never changes
    creation_id: Annotated[str, pydantic.Field(exclude_if=_unset)] = ""

    @property
    def routing_partitions(self) -> int:
        """How many partitions keys are spread over: fewer than exist while a shrink drains,
        and after it while its retired partitions are kept readable."""
        if self.transition is not None:
            return self.transition.to_partitions
        return self.active_partitions or len(self.partitions)

    @pydantic.model_validator(mode="after")
    def _routed_within_partitions(self) -> TopicStatus:
        active = self.active_partitions
        if active is not None and not 1 <= active < len(self.partitions):
            raise PydanticCustomError(
                "active_partitions",
                "activePartitions must be between 1 and the partitions listed less one,"
                " not {active}",
                {"active": active},
            )
        return self


#: a topic's status as camelCase JSON (with its ``name``): ``cohortPlans`` as a list-map;
#: ``transition``, ``specPartitions``, ``activePartitions``, ``history`` and
#: ``creationId`` left out while unset
TOPIC_STATUS_JSON: Final = Codec(TopicStatus, "topic status")


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class DeletedIncarnation:
    """A topic deleted with its data (``deletionPolicy: Delete``) whose objects may still be
    in the store: kept in the cluster state until a broker reports them removed
    (``tier_deletions``), so neither a broker that dies mid-way nor one that was down at
    the delete leaves them behind."""

    #: "<namespace>/<name>" of the deleted topic
    topic: str
    #: its incarnation (``TopicStatus.creation_id``): its objects are under it. Never ""
    creation_id: str
    #: the partitions it had, retired ones included
    partitions: int
    #: the generation that deleted it: a broker removes its objects only once every live
    #: broker has applied it (no leader of it still uploads)
    deleted_generation: int
    #: the broker asked to remove the objects; None while none is
    broker: int | None = None


#: a deleted incarnation as camelCase JSON (``broker`` null while none is asked)
DELETED_INCARNATION_JSON: Final = Codec(DeletedIncarnation, "deleted incarnation")


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class ClusterState:
    """Everything the controller persists, and the topology generation that versions it.

    ``generation`` is bumped by exactly one on every reconcile step whose
    result differs from its input in any other field; nothing else moves it.
    """

    generation: int = 0
    #: every broker ever heard from (known brokers), by id; liveness is not stored
    brokers: Annotated[
        Mapping[
            int, Annotated[BrokerEndpoint, ByHand(BrokerEndpoint.from_json, BrokerEndpoint.to_json)]
        ],
        ListMap("id"),
    ] = field(default_factory=dict)
    topics: Annotated[Mapping[str, TopicStatus], ListMap("name")] = field(default_factory=dict)
    #: deleted incarnations whose objects are being removed, by creation id
    deleted: Annotated[
        Mapping[str, DeletedIncarnation],
        ListMap("creation_id"),
        pydantic.Field(exclude_if=_unset),
    ] = field(default_factory=dict)

    def same_content(self, other: ClusterState) -> bool:
        """Equal in everything but the generation."""
        return (
            self.brokers == other.brokers
            and self.topics == other.topics
            and self.deleted == other.deleted
        )


#: the whole persisted state as camelCase JSON: ``brokers``, ``topics`` and ``deleted`` as
#: list-maps (by id, name and creation id), ``deleted`` left out while empty; the document
#: always says its ``generation`` (0 is a generation, not a default)
CLUSTER_STATE_JSON: Final = Codec(ClusterState, "cluster state", required=("generation",))


# --------------------------------------------------------------------------- unloads


@dataclass(frozen=True, slots=True)
class DeletionRequest:
    """A topic's deletion, asked for explicitly: the one input that lets a topic leave a
    cluster's state (``reconcile``), and with it its brokers' copies.

    The operator makes one for each of a cluster's Topics whose object is being deleted
    (``metadata.deletionTimestamp``, the data finalizer holding it); the local controller
    for each name of ``topics delete``. A topic that is merely missing from the desired
    specs (its Topic now names another cluster, a watch that has not delivered it) is
    never deleted.
    """

    #: "<namespace>/<name>" of the topic
    topic: str
    #: the brokers move their copies aside instead of removing them (``deletionPolicy:
    #: Retain``)
    retain: bool


@dataclass(frozen=True, slots=True)
class UnloadRequest:
    """An Unload's spec, as the core needs it (the controller reads it, never writes it)."""

    #: "<namespace>/<name>" of the Unload
    name: str
    #: "<namespace>/<name>" of the topic
    topic: str
    #: partition indexes to move; empty moves every partition
    partitions: tuple[int, ...] = ()
    #: broker to move them to; None lets placement choose
    target: int | None = None
    #: deleted while moving: moves not started yet fail, started ones finish
    cancelled: bool = False


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class MoveProgress:
    """One partition's move: persisted with its Unload, not in the cluster state.

    ``moves`` is the incarnation the move reassigns the partition to (its
    ``moves`` when sealing started, plus one). ``deadline_ms`` is set while no
    live replica can seal the partition: when it passes, the partition is
    reopened from the object store. ``verified``, ``verification_message`` and
    ``checked_ms`` come from the sealing leader's report.
    """

    partition: int
    phase: MovePhase = MovePhase.PENDING
    from_broker: int | None = None
    to_broker: int | None = None
    #: last committed offset when sealed (-1: empty); the new incarnation starts after it
    sealed_offset: int | None = None
    moves: int | None = None
    verified: bool | None = None
    verification_message: str = ""
    checked_ms: int | None = None
    recovery_source: RecoverySource | None = None
    recovery_message: str = ""
    deadline_ms: int | None = None
    #: why the move waits or failed
    message: str = ""

    @property
    def in_flight(self) -> bool:
        """Started and not finished: the move owns the partition's seal marker."""
        return self.phase in (MovePhase.SEALING, MovePhase.SEALED)

    @property
    def finished(self) -> bool:
        return self.phase in (MovePhase.COMPLETED, MovePhase.FAILED)


@pydantic.with_config(CAMEL_CASE)
@dataclass(frozen=True, slots=True)
class UnloadProgress:
    """How an Unload is going: its status, persisted by the controller beside the spec.

    ``moves`` is empty until the request is validated, then has one entry per
    partition, in partition order.
    """

    name: str
    phase: UnloadPhase = UnloadPhase.PENDING
    moves: tuple[MoveProgress, ...] = ()
    #: when the first move started sealing
    started_ms: int | None = None
    #: when the last move finished
    completed_ms: int | None = None
    #: why it waits or failed, or what it did
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.phase in (UnloadPhase.COMPLETED, UnloadPhase.FAILED)


#: an Unload's progress as camelCase JSON, every field written (the core's own shape; an
#: Unload's status document is ``documents.unload_status``)
UNLOAD_PROGRESS_JSON: Final = Codec(UnloadProgress, "unload progress")


def normalise_lrs(replicas: Sequence[int], reported: Sequence[int], leader: int) -> tuple[int, ...]:
    """An LRS as persisted: replicas only, the leader always in, in replica order."""
    keep = set(reported) | {leader}
    return tuple(r for r in replicas if r in keep)


# --------------------------------------------------------------------------- repartitions


@dataclass(frozen=True, slots=True)
class RepartitionRequest:
    """A Repartition's spec, as the core needs it (read, never written, by the controller)."""

    #: "<namespace>/<name>" of the Repartition
    name: str
    #: "<namespace>/<name>" of the topic
    topic: str
    partitions: int
    adoption_timeout_ms: int = 30_000
    #: deleted: one not started yet fails; one in flight rolls forward to Finalized
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class RepartitionProgress:
    """How a Repartition is going: persisted with it (its status), not in the cluster state."""

    name: str
    phase: RepartitionPhase = RepartitionPhase.PENDING
    from_partitions: int | None = None
    to_partitions: int | None = None
    from_version: int | None = None
    to_version: int | None = None
    adoption_generation: int | None = None
    cutover_ms: int | None = None
    drained_ms: int | None = None
    finalized_ms: int | None = None
    finalized_by: FinalizedBy | None = None
    #: why it waits or failed, or what it did
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.phase in (RepartitionPhase.FINALIZED, RepartitionPhase.FAILED)

    @property
    def in_flight(self) -> bool:
        """Cut over and not finalized: the topic's transition marker belongs to it."""
        return self.phase in (
            RepartitionPhase.CUTTING_OVER,
            RepartitionPhase.DRAINING,
            RepartitionPhase.AWAITING_ADOPTION,
        )
