"""The documents a broker and its controller exchange over admin HTTP (pure).

Both planes import them from here, so the data plane never imports the
control plane and the two sides cannot drift apart:

* ``Heartbeat`` (with ``PartitionReport``, ``SealReport`` and ``CohortReport``;
  the broker's addresses are a ``protocol.endpoints.BrokerEndpoint``): what a
  broker's ``GET /v1/heartbeat`` returns and the controller polls. The broker
  fills it in; the controller parses it.
* ``ClusterTopology`` (with ``TopicPlacement`` and ``PartitionPlacement``):
  what the controller pushes with ``POST /v1/topology``. The controller fills
  it in; the broker parses it and applies it, fenced by ``generation``.
  ``TopologyReply`` is the broker's answer. ``ClusterTopology.client_snapshot``
  is the routing view a broker gives its clients (``TopologySnapshot``).

One key style on the wire: camelCase (``leaderEpoch``, ``partitioningVersion``,
``adminPort``), as the controller's persisted status has. A topic's ``config``
holds broker setting names (``retention_ms`` in Python, in ``topic.json`` and
in the broker's own admin API); the topology carries them in camelCase too
(``retentionMs``) and ``from_json`` gives the broker's names back.

``from_json`` refuses a document of the wrong shape with ``InvalidRequest``
naming the field. Fields a broker or controller from before a field existed
would leave out have the defaults noted on them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from headrace.errors import InvalidRequest, UnsupportedDocument
from headrace.protocol.endpoints import DEFAULT_LISTENER, BrokerEndpoint
from headrace.protocol.jsonfields import ints, mapping, objects, optional, required
from headrace.protocol.messages import TopicRouting, TopologySnapshot

Role = Literal["leader", "follower"]

#: a partition's owner in the client snapshot while it is Offline
NO_OWNER = -1

#: the format of the pushed topology this build writes, and the newest it reads. Fields are
#: added without a new format (a reader ignores keys it does not know, and a field it
#: misses takes its default); the format moves only when an older reader would apply a
#: document wrongly. A broker refuses a newer format (``UnsupportedDocument``) and says so
#: in its heartbeat (``refusedTopologyFormat``) instead of applying what it cannot read.
TOPOLOGY_FORMAT = 1


# --------------------------------------------------------------------------- broker → controller


@dataclass(frozen=True, slots=True)
class SealReport:
    """A leader's word that it has sealed its partition (see ``control.unloads``).

    Appends are stopped, every record through ``last_committed_offset`` is in
    the object store and the sealed state is written there. ``epoch`` and
    ``moves`` say which leadership and which incarnation sealed, so a report
    from an earlier one is recognised as stale.
    """

    #: -1 for an empty partition
    last_committed_offset: int
    epoch: int
    moves: int
    #: the stored segments and the sealed state agree
    verified: bool
    #: what disagreed, when not verified
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "lastCommittedOffset": self.last_committed_offset,
            "epoch": self.epoch,
            "moves": self.moves,
            "verified": self.verified,
            "message": self.message,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SealReport:
        w = "seal report"
        return cls(
            required(doc, "lastCommittedOffset", int, w),
            required(doc, "epoch", int, w),
            required(doc, "moves", int, w),
            required(doc, "verified", bool, w),
            optional(doc, "message", str, w) or "",
        )


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """One partition replica as its broker sees it."""

    topic: str
    partition: int
    role: Role
    leader_epoch: int
    log_end_offset: int
    high_watermark: int
    #: the leader's live replica set (broker ids, itself included); empty from a follower
    live_replicas: tuple[int, ...] = ()
    #: the incarnation of the partition this copy belongs to (``PartitionStatus.moves``)
    moves: int = 0
    #: where this copy of incarnation ``moves`` started (0 for incarnation 0)
    start_offset: int = 0
    #: present once this broker, leading at ``sealed.epoch``, has sealed the partition
    sealed: SealReport | None = None
    #: the first offset this copy still holds on local disk (retention moves it up)
    log_start_offset: int = 0
    #: the last offset in the object store; None when the topic is not tiered, -1 before
    #: the first upload (for the dashboard: informational, never used for decisions)
    stored_through: int | None = None
    #: cohort -> its cursor (the next offset to deliver) on this copy; for lag and the
    #: consume rate on the dashboard (informational)
    cursors: Mapping[str, int] = field(default_factory=dict)
    #: (partitioning version, offset): the first offset this leader appended under that
    #: version, recorded when it applied the version (or took the lead under it); a
    #: repartition's cutover offset (``control.repartitions``)
    cutover: tuple[int, int] | None = None
    #: why this leader's uploads to the object store keep failing (several rounds in a
    #: row), None while they succeed; on the wire only when set (the operator's
    #: ``ObjectStoreReachable`` condition)
    upload_error: str | None = None
    #: the first offset a reader can still get, the object store included, when that is
    #: below ``log_start_offset``; None: ``log_start_offset`` (on the wire only when set)
    stored_from: int | None = None

    @property
    def readable_from(self) -> int:
        """The first offset any reader can still get (retention removed what is below)."""
        return self.log_start_offset if self.stored_from is None else self.stored_from

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "topic": self.topic,
            "partition": self.partition,
            "role": self.role,
            "leaderEpoch": self.leader_epoch,
            "logEndOffset": self.log_end_offset,
            "highWatermark": self.high_watermark,
            "liveReplicas": list(self.live_replicas),
            "moves": self.moves,
            "startOffset": self.start_offset,
            "sealed": None if self.sealed is None else self.sealed.to_json(),
            "logStartOffset": self.log_start_offset,
            "storedThrough": self.stored_through,
            "cursors": {c: self.cursors[c] for c in sorted(self.cursors)},
        }
        if self.cutover is not None:
            doc["cutover"] = {"version": self.cutover[0], "offset": self.cutover[1]}
        if self.upload_error is not None:
            doc["uploadError"] = self.upload_error
        if self.stored_from is not None:
            doc["storedFrom"] = self.stored_from
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PartitionReport:
        w = "partition report"
        role = required(doc, "role", str, w)
        if role == "leader":
            checked: Role = "leader"
        elif role == "follower":
            checked = "follower"
        else:
            raise InvalidRequest(f"{w}: role must be 'leader' or 'follower', not {role!r}")
        sealed = optional(doc, "sealed", dict, w)
        cursors = optional(doc, "cursors", dict, w) or {}
        if not all(
            isinstance(c, str) and isinstance(o, int) and not isinstance(o, bool)
            for c, o in cursors.items()
        ):
            raise InvalidRequest(f"{w}: cursors must map cohort names to offsets")
        return cls(
            required(doc, "topic", str, w),
            required(doc, "partition", int, w),
            checked,
            required(doc, "leaderEpoch", int, w),
            required(doc, "logEndOffset", int, w),
            required(doc, "highWatermark", int, w),
            ints(doc, "liveReplicas", w, default=True),
            optional(doc, "moves", int, w) or 0,
            optional(doc, "startOffset", int, w) or 0,
            None if sealed is None else SealReport.from_json(sealed),
            optional(doc, "logStartOffset", int, w) or 0,
            optional(doc, "storedThrough", int, w),
            dict(cursors),
            _cutover(optional(doc, "cutover", dict, w), w),
            optional(doc, "uploadError", str, w),
            optional(doc, "storedFrom", int, w),
        )


def _cutover(doc: Mapping[str, Any] | None, where: str) -> tuple[int, int] | None:
    if doc is None:
        return None
    return (required(doc, "version", int, where), required(doc, "offset", int, where))


@dataclass(frozen=True, slots=True)
class CohortReport:
    """The members of one cohort connected to the reporting broker."""

    topic: str
    cohort: str
    members: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "cohort": self.cohort, "members": list(self.members)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CohortReport:
        w = "cohort report"
        members = required(doc, "members", list, w)
        if not all(isinstance(m, str) for m in members):
            raise InvalidRequest(f"{w}: members must be strings")
        return cls(required(doc, "topic", str, w), required(doc, "cohort", str, w), tuple(members))


PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ReportJournal:
    """Where a heartbeat stands in its broker's journal of partition reports.

    A broker numbers each change of a partition report (``seq``); a poller that
    passes the ``instance`` and ``seq`` it holds (``GET /v1/heartbeat?since=
    instance:seq``) gets only the reports changed since then, and the keys of
    partitions no longer hosted (``Heartbeat.removed``): a delta. ``since`` is
    None on a full report, which the broker sends when it cannot answer with a
    delta (another process since, or no ``since`` given). An idle broker's
    delta is a few hundred bytes however many partitions it holds.
    """

    #: the broker process (a restart starts another journal)
    instance: str
    #: the journal position this heartbeat brings its poller to
    seq: int
    #: the position it starts from; None: a full report
    since: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"instance": self.instance, "seq": self.seq, "since": self.since}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ReportJournal:
        w = "report journal"
        return cls(
            required(doc, "instance", str, w),
            required(doc, "seq", int, w),
            optional(doc, "since", int, w),
        )

    @property
    def full(self) -> bool:
        return self.since is None


def parse_since(text: str | None) -> tuple[str, int] | None:
    """``instance:seq`` from a poll's ``since`` parameter; None when absent or malformed
    (a full report then, which is always correct)."""
    if not text:
        return None
    instance, _, seq = text.rpartition(":")
    if not instance or not seq.isdigit():
        return None
    return instance, int(seq)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The latest sample from one broker (``GET /v1/heartbeat``).

    ``received_ms`` is stamped by the controller with its own clock when the
    sample arrives (never taken from the broker), so liveness needs no clock
    agreement between machines. It is not part of the JSON: ``from_json``
    takes it as an argument, and a broker building its own sample leaves it 0.

    With a ``journal`` that is not full, ``partitions`` holds only the reports
    changed since ``journal.since`` and ``removed`` the partitions dropped since;
    ``merged_into`` makes the full heartbeat of it.
    """

    broker: BrokerEndpoint
    received_ms: int = 0
    #: lowest topology generation acked by the broker's client connections; None if none acked
    adoption: int | None = None
    #: the broker is shutting down: move leadership away, place nothing new on it
    draining: bool = False
    partitions: tuple[PartitionReport, ...] = ()
    cohorts: tuple[CohortReport, ...] = ()
    #: the cluster topology generation the broker has applied; 0 before the first push
    generation: int = 0
    #: open client connections (informational)
    connections: int = 0
    #: where this report stands in the broker's journal; None from a broker without one
    journal: ReportJournal | None = None
    #: a delta only: the partitions this broker stopped hosting since ``journal.since``
    removed: tuple[PartitionKey, ...] = ()
    #: the newest topology format this broker reads (1 from a broker before formats)
    topology_format: int = 1
    #: the format of the last push it refused as too new; None: none refused
    refused_topology_format: int | None = None
    #: the rack (zone) the broker runs in (``--rack``); placement spreads a partition's
    #: replicas over racks. None: not told (a rack of its own)
    rack: str | None = None
    #: the broker has an object store (it can remove a deleted topic's objects); None from
    #: a broker before this field, which is never asked to
    object_store: bool | None = None
    #: the creation ids of the deleted incarnations the topology asks this broker to remove
    #: (``ClusterTopology.removals``) whose objects it has removed: the store holds only
    #: what snapshots pin of them
    removed_incarnations: tuple[str, ...] = ()

    @property
    def broker_id(self) -> int:
        return self.broker.id

    def to_json(self) -> dict[str, Any]:
        doc = {
            "broker": self.broker.to_json(),
            "generation": self.generation,
            "adoption": self.adoption,
            "draining": self.draining,
            "partitions": [p.to_json() for p in self.partitions],
            "cohorts": [c.to_json() for c in self.cohorts],
            "connections": self.connections,
            "topologyFormat": self.topology_format,
            "refusedTopologyFormat": self.refused_topology_format,
        }
        if self.rack is not None:
            doc["rack"] = self.rack
        if self.object_store is not None:
            doc["objectStore"] = self.object_store
        if self.removed_incarnations:
            doc["removedIncarnations"] = list(self.removed_incarnations)
        if self.journal is not None:
            doc["journal"] = self.journal.to_json()
            doc["removed"] = [{"topic": t, "partition": i} for t, i in self.removed]
        return doc

    def merged_into(
        self, reports: dict[PartitionKey, PartitionReport] | None
    ) -> tuple[Heartbeat, dict[PartitionKey, PartitionReport]] | None:
        """The full heartbeat this one makes of ``reports`` (the poller's copy of the
        previous ones, updated in place and returned); None when a delta does not
        apply to them (no copy), so the poller must ask for a full report."""
        if self.journal is None or self.journal.full:
            current = {(p.topic, p.partition): p for p in self.partitions}
        elif reports is None:
            return None
        else:
            current = reports
            for key in self.removed:
                current.pop(key, None)
            for p in self.partitions:
                current[(p.topic, p.partition)] = p
        full = replace(self, partitions=tuple(current.values()), removed=())
        return full, current

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, received_ms: int) -> Heartbeat:
        w = "heartbeat"
        draining = mapping(doc, w).get("draining", False)
        if not isinstance(draining, bool):
            raise InvalidRequest(f"{w}: field 'draining' must be a boolean")
        journal = optional(doc, "journal", dict, w)
        removed = optional(doc, "removedIncarnations", list, w) or []
        if not all(isinstance(r, str) for r in removed):
            raise InvalidRequest(f"{w}: field 'removedIncarnations' must be a list of strings")
        return cls(
            BrokerEndpoint.from_json(required(doc, "broker", dict, w)),
            received_ms,
            optional(doc, "adoption", int, w),
            draining,
            tuple(PartitionReport.from_json(p) for p in objects(doc, "partitions", w)),
            tuple(CohortReport.from_json(c) for c in objects(doc, "cohorts", w)),
            optional(doc, "generation", int, w) or 0,
            optional(doc, "connections", int, w) or 0,
            None if journal is None else ReportJournal.from_json(journal),
            tuple(
                (required(r, "topic", str, w), required(r, "partition", int, w))
                for r in objects(doc, "removed", w)
            ),
            optional(doc, "topologyFormat", int, w) or 1,
            optional(doc, "refusedTopologyFormat", int, w),
            optional(doc, "rack", str, w) or None,
            optional(doc, "objectStore", bool, w),
            tuple(removed),
        )


# --------------------------------------------------------------------------- controller → broker


@dataclass(frozen=True, slots=True)
class PartitionPlacement:
    """One partition's replicas and leadership, as the controller decided them."""

    partition: int
    replicas: list[int]
    #: who leads (or the candidate told to promote itself); None while Offline
    leader: int | None
    #: the leader epoch to serve at
    epoch: int
    #: the live replica set a new leader starts from (default: ``replicas``)
    lrs: list[int]
    #: an Unload is in progress: the leader seals the partition
    seal: bool = False
    #: the partition's incarnation: how many unloads moved it
    moves: int = 0
    #: where incarnation ``moves`` starts; None after a move: derive it from the object store
    start_offset: int | None = 0
    #: the topology generation that started the replica move in flight (``control.moves``);
    #: 0: none. A leader seeing a new one makes followers outside ``lrs`` fetch again to
    #: count as in sync (``replication.leader``)
    move_generation: int = 0

    def to_json(self) -> dict[str, Any]:
        doc = {
            "partition": self.partition,
            "replicas": list(self.replicas),
            "leader": self.leader,
            "epoch": self.epoch,
            "lrs": list(self.lrs),
            "seal": self.seal,
            "moves": self.moves,
            "startOffset": self.start_offset,
        }
        if self.move_generation:  # only while a move runs
            doc["moveGeneration"] = self.move_generation
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PartitionPlacement:
        w = "partition placement"
        replicas = list(ints(doc, "replicas", w))
        lrs = list(ints(doc, "lrs", w)) if mapping(doc, w).get("lrs") is not None else replicas
        # absent: incarnation 0 starts at 0; null: derive the start from the object store
        start = optional(doc, "startOffset", int, w) if "startOffset" in doc else 0
        return cls(
            required(doc, "partition", int, w),
            replicas,
            optional(doc, "leader", int, w),
            required(doc, "epoch", int, w),
            lrs,
            optional(doc, "seal", bool, w) or False,
            optional(doc, "moves", int, w) or 0,
            start,
            optional(doc, "moveGeneration", int, w) or 0,
        )


@dataclass(frozen=True, slots=True)
class TopicPlacement:
    """One topic of the pushed topology."""

    name: str
    partitions: int
    partitioning_version: int
    #: default 1
    min_in_sync: int
    #: broker setting name (``retention_ms``, ``upload_interval_ms``, ...) -> value; unset
    #: settings are left out so the broker's own default applies
    config: dict[str, Any]
    assignments: list[PartitionPlacement]
    #: cohort -> member -> partitions: the controller's advisory plans
    cohort_plans: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    #: a repartition in flight (``control.repartitions``); None: none
    transition: TransitionPlacement | None = None
    #: after a shrink, the partitions keys are routed to (``0..active_partitions-1``); the
    #: ones above are retired: readable, led and replicated, but they take no produce.
    #: 0: all of them
    active_partitions: int = 0
    #: the finished transitions whose pre-cutover records are still readable, and the
    #: holds they keep on cohorts (``PartitioningHistory``); None: none
    history: PartitioningHistory | None = None
    #: which incarnation of the topic this is (``TopicStatus.creation_id``): its objects'
    #: prefix (``tiered.layout``). "" (left out): a topic from before creation ids, whose
    #: objects keep the legacy layout
    creation_id: str = ""

    @property
    def routing_partitions(self) -> int:
        """What keys are spread over: fewer than ``partitions`` while a shrink drains, and
        after it while its retired partitions stay readable."""
        if self.transition is not None:
            return self.transition.to_partitions
        return self.active_partitions or self.partitions

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partitions": self.partitions,
            "partitioningVersion": self.partitioning_version,
            "minInSync": self.min_in_sync,
            "config": {camel_case(k): v for k, v in self.config.items()},
            "assignments": [a.to_json() for a in self.assignments],
            "cohortPlans": {
                c: {m: list(ps) for m, ps in plan.items()} for c, plan in self.cohort_plans.items()
            },
            **({} if self.transition is None else {"transition": self.transition.to_json()}),
            **({"activePartitions": self.active_partitions} if self.active_partitions else {}),
            **({} if self.history is None else {"history": self.history.to_json()}),
            **({"creationId": self.creation_id} if self.creation_id else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TopicPlacement:
        w = "topic placement"
        config = optional(doc, "config", dict, w) or {}
        transition = optional(doc, "transition", dict, w)
        history = optional(doc, "history", dict, w)
        plans: dict[str, dict[str, list[int]]] = {}
        for cohort, plan in (optional(doc, "cohortPlans", dict, w) or {}).items():
            where = f"{w}: cohort plan {cohort!r}"
            plans[str(cohort)] = {str(m): list(ints(mapping(plan, where), m, where)) for m in plan}
        return cls(
            required(doc, "name", str, w),
            required(doc, "partitions", int, w),
            required(doc, "partitioningVersion", int, w),
            optional(doc, "minInSync", int, w) or 1,
            {snake_case(str(k)): v for k, v in config.items()},
            [PartitionPlacement.from_json(a) for a in required_objects(doc, "assignments", w)],
            plans,
            None if transition is None else TransitionPlacement.from_json(transition),
            optional(doc, "activePartitions", int, w) or 0,
            None if history is None else PartitioningHistory.from_json(history),
            optional(doc, "creationId", str, w) or "",
        )


@dataclass(frozen=True, slots=True)
class TransitionPlacement:
    """What a broker needs of a repartition in flight: the routing count, and the holds.

    A cohort is held on new partition ``q`` from ``q``'s cutover offset (0 for a
    partition the grow added; a retired partition a grow routes to again is held at
    its own log end) until ``released`` names ``q`` for it; see
    ``control.repartitions`` for why that keeps each key in order.
    """

    from_partitions: int
    to_partitions: int
    to_version: int
    #: old partition -> its cutover offset, once its leader reported it
    cutover_offsets: dict[int, int] = field(default_factory=dict)
    #: cohort -> the new partitions it is released on
    released: dict[str, list[int]] = field(default_factory=dict)

    def hold(self, cohort: str, partition: int, local_cutover: int | None) -> int | None:
        """The first offset of ``partition`` that ``cohort`` may not be delivered yet;
        None: no hold. ``local_cutover``: the leader's own record, used until the
        controller has one (0 when neither knows: hold everything)."""
        if partition >= self.to_partitions or partition in self.released.get(cohort, ()):
            return None
        # A partition the grow added has cutover 0; a retired one routed to again has its
        # log end (held from 0, a new cohort could never read its older records: the
        # history's holds on the partitions they feed would wait for them for ever).
        known = self.cutover_offsets.get(partition)
        if known is not None:
            return known
        return local_cutover if local_cutover is not None else 0

    def routed_anew_from(self, partition: int, local_cutover: int | None) -> int | None:
        """For a partition the grow routes keys to anew (added, or retired and routed to
        again): where its post-cutover records begin; None for any other partition."""
        if not self.from_partitions <= partition < self.to_partitions:
            return None
        known = self.cutover_offsets.get(partition)
        if known is not None:
            return known
        return local_cutover if local_cutover is not None else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "fromPartitions": self.from_partitions,
            "toPartitions": self.to_partitions,
            "toVersion": self.to_version,
            "cutoverOffsets": {str(p): o for p, o in sorted(self.cutover_offsets.items())},
            "released": {c: sorted(ps) for c, ps in sorted(self.released.items())},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TransitionPlacement:
        w = "transition placement"
        offsets = optional(doc, "cutoverOffsets", dict, w) or {}
        released = optional(doc, "released", dict, w) or {}
        try:
            cut = {int(p): int(o) for p, o in offsets.items()}
            rel = {str(c): [int(q) for q in qs] for c, qs in released.items()}
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"{w}: {exc}") from None
        return cls(
            required(doc, "fromPartitions", int, w),
            required(doc, "toPartitions", int, w),
            required(doc, "toVersion", int, w),
            cut,
            rel,
        )


def feeders(from_partitions: int, to_partitions: int, partition: int) -> tuple[int, ...]:
    """The old partitions holding pre-cutover records of keys that new ``partition`` gets:
    ``crc32(key) % from == p`` and ``% to == partition`` have a solution exactly when ``p``
    and ``partition`` agree modulo gcd(from, to)."""
    g = math.gcd(from_partitions, to_partitions)
    return tuple(p for p in range(from_partitions) if p % g == partition % g)


@dataclass(frozen=True, slots=True)
class PastTransition:
    """A finalized repartition, kept as part of its topic's partitioning history.

    ``cutover_offsets`` holds, for every partition the transition measured (each old
    partition, and each retired partition a grow routed to again), its log end when it
    cut over; a partition the grow placed new is absent (it started empty: 0).
    """

    from_partitions: int
    to_partitions: int
    to_version: int
    cutover_offsets: Mapping[int, int] = field(default_factory=dict)

    def feeders(self, partition: int) -> tuple[int, ...]:
        return feeders(self.from_partitions, self.to_partitions, partition)

    def held_from(self, partition: int) -> int | None:
        """Where this transition's post-cutover records of ``partition`` begin; None: it
        routes nothing to ``partition`` (retired by it, or not there yet)."""
        if partition >= self.to_partitions:
            return None
        return self.cutover_offsets.get(partition, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "fromPartitions": self.from_partitions,
            "toPartitions": self.to_partitions,
            "toVersion": self.to_version,
            "cutoverOffsets": [
                {"partition": p, "offset": self.cutover_offsets[p]}
                for p in sorted(self.cutover_offsets)
            ],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PastTransition:
        w = "past transition"
        return cls(
            required(doc, "fromPartitions", int, w),
            required(doc, "toPartitions", int, w),
            required(doc, "toVersion", int, w),
            {
                required(o, "partition", int, w): required(o, "offset", int, w)
                for o in objects(doc, "cutoverOffsets", w)
            },
        )


@dataclass(frozen=True, slots=True)
class CohortPosition:
    """How far one cohort has come through a topic's partitioning history."""

    #: the ``to_version`` of the oldest kept transition that may still hold the cohort
    #: back (one above the newest's: past the whole history)
    version: int
    #: the partitions that transition no longer holds the cohort on
    released: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitioningHistory:
    """A topic's finished transitions whose pre-cutover records are still readable, and
    how far each cohort has come through them (``control.repartitions``).

    A cohort is held by every kept transition from its position on, as a live
    transition holds it: new partition ``q`` from ``q``'s own cutover offset until the
    controller released ``q`` for it. A cohort the history does not name (one created
    after, or idle during, a transition) starts at the oldest kept transition with
    nothing released; one past the whole history is held by nothing.
    """

    #: oldest first, by ``to_version``
    transitions: tuple[PastTransition, ...]
    cohorts: Mapping[str, CohortPosition] = field(default_factory=dict)

    @property
    def past(self) -> int:
        """The position of a cohort past every kept transition."""
        return self.transitions[-1].to_version + 1 if self.transitions else 0

    def position(self, cohort: str) -> CohortPosition:
        found = self.cohorts.get(cohort)
        if found is not None:
            return found
        return CohortPosition(self.transitions[0].to_version if self.transitions else 0)

    def holds(self, cohort: str) -> bool:
        """Some kept transition may still hold ``cohort`` back."""
        return self.position(cohort).version < self.past

    def hold(self, cohort: str, partition: int) -> int | None:
        """The first offset of ``partition`` that ``cohort`` may not be delivered yet;
        None: no hold. The oldest transition holding it decides: a later one's cutover
        offset of the same partition is never below it."""
        at = self.position(cohort)
        for t in self.transitions:
            if t.to_version < at.version:
                continue
            if t.to_version == at.version and partition in at.released:
                continue
            held = t.held_from(partition)
            if held is not None:
                return held
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "transitions": [t.to_json() for t in self.transitions],
            "cohorts": [
                {"cohort": c, "version": p.version, "released": list(p.released)}
                for c, p in sorted(self.cohorts.items())
            ],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PartitioningHistory:
        w = "partitioning history"
        transitions = tuple(
            sorted(
                (PastTransition.from_json(t) for t in objects(doc, "transitions", w)),
                key=lambda t: t.to_version,
            )
        )
        cohorts = {
            required(c, "cohort", str, w): CohortPosition(
                required(c, "version", int, w), tuple(sorted(ints(c, "released", w, default=True)))
            )
            for c in objects(doc, "cohorts", w)
        }
        return cls(transitions, cohorts)


@dataclass(frozen=True, slots=True)
class IncarnationRemoval:
    """A deleted topic incarnation whose objects one broker is asked to remove: everything
    under ``<cluster>/<namespace>/<topic>/<creation id>/`` that no snapshot pins (the
    snapshot documents stay). The broker reports it done in its heartbeat
    (``Heartbeat.removed_incarnations``); the controller asks until it is."""

    topic: str
    #: never "": a topic of the legacy layout shares its prefix with a later one of its name
    creation_id: str
    #: the partitions it had (retired ones included)
    partitions: int
    #: the broker asked to remove them
    broker: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "creationId": self.creation_id,
            "partitions": self.partitions,
            "broker": self.broker,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> IncarnationRemoval:
        w = "incarnation removal"
        creation_id = required(doc, "creationId", str, w)
        if not creation_id:
            raise InvalidRequest(f"{w}: creationId must not be empty")
        return cls(
            required(doc, "topic", str, w),
            creation_id,
            required(doc, "partitions", int, w),
            required(doc, "broker", int, w),
        )


@dataclass(frozen=True, slots=True)
class ClusterTopology:
    """The whole topology a controller pushes; brokers ignore one not newer than theirs."""

    generation: int
    #: default "local"
    cluster_id: str
    brokers: list[BrokerEndpoint]
    topics: list[TopicPlacement] = field(default_factory=list)
    #: deleted topics whose copies brokers keep on disk (a Topic with ``deletionPolicy:
    #: Retain`` being deleted): a broker hosting one closes it and moves its files aside
    #: instead of removing them. Absent: every topic the document does not name is deleted.
    retained: list[str] = field(default_factory=list)
    #: the document's format (``TOPOLOGY_FORMAT``); absent in a push from before formats: 1
    format: int = TOPOLOGY_FORMAT
    #: deleted incarnations whose objects a broker is asked to remove (``removals`` on the
    #: wire, left out when empty). A broker from before it ignores the key; a document
    #: without it asks nothing
    removals: list[IncarnationRemoval] = field(default_factory=list)

    def broker(self, broker_id: int) -> BrokerEndpoint | None:
        return next((b for b in self.brokers if b.id == broker_id), None)

    def client_snapshot(self, listener: str = DEFAULT_LISTENER) -> TopologySnapshot:
        """What clients of ``listener`` route by: each partition's owner is the leader the
        push names (the candidate while one promotes), ``NO_OWNER`` when Offline; each
        broker's address on that listener (``BrokerEndpoint.on``; a broker whose address
        there is pending is left out, as one not registered yet); the client wire carries
        no admin port."""
        routing = []
        for t in sorted(self.topics, key=lambda t: t.name):
            ordered = sorted(t.assignments, key=lambda a: a.partition)
            routing.append(
                TopicRouting(
                    t.name,
                    t.partitions,
                    t.partitioning_version,
                    [NO_OWNER if a.leader is None else a.leader for a in ordered],
                    [a.epoch for a in ordered],
                    t.routing_partitions,
                    t.creation_id,
                )
            )
        brokers = [e for e in (b.on(listener) for b in self.brokers) if e is not None]
        return TopologySnapshot(self.generation, self.cluster_id, brokers, routing)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "generation": self.generation,
            "clusterId": self.cluster_id,
            "brokers": [b.to_json() for b in self.brokers],
            "topics": [t.to_json() for t in self.topics],
            **({"retained": list(self.retained)} if self.retained else {}),
            **({"removals": [r.to_json() for r in self.removals]} if self.removals else {}),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ClusterTopology:
        """Raises ``UnsupportedDocument`` for a format newer than ``TOPOLOGY_FORMAT``,
        before anything else is read: such a document may mean something else."""
        w = "cluster topology"
        fmt = optional(doc, "format", int, w) or 1
        if fmt > TOPOLOGY_FORMAT:
            raise UnsupportedDocument(
                f"topology format {fmt}; this broker reads formats up to {TOPOLOGY_FORMAT}:"
                " upgrade it (brokers first, then the controller)"
            )
        return cls(
            required(doc, "generation", int, w),
            optional(doc, "clusterId", str, w) or "local",
            [BrokerEndpoint.from_json(b) for b in required_objects(doc, "brokers", w)],
            [TopicPlacement.from_json(t) for t in objects(doc, "topics", w)],
            [str(n) for n in optional(doc, "retained", list, w) or []],
            fmt,
            [IncarnationRemoval.from_json(r) for r in objects(doc, "removals", w)],
        )


@dataclass(frozen=True, slots=True)
class TopologyReply:
    """A broker's answer to a push: whether it applied it, and the generation it now holds."""

    applied: bool
    #: None: a cluster broker that has no topology yet
    generation: int | None

    def to_json(self) -> dict[str, Any]:
        return {"applied": self.applied, "generation": self.generation}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TopologyReply:
        w = "topology reply"
        return cls(required(doc, "applied", bool, w), optional(doc, "generation", int, w))


# --------------------------------------------------------------------------- helpers


def required_objects(doc: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    """A list of objects that must be present (it may be empty)."""
    required(doc, key, list, where)
    return objects(doc, key, where)


_WORD_START = re.compile(r"_([a-z0-9])")
_UPPER = re.compile(r"([A-Z])")


def camel_case(name: str) -> str:
    """``upload_interval_ms`` -> ``uploadIntervalMs``."""
    return _WORD_START.sub(lambda m: m.group(1).upper(), name)


def snake_case(name: str) -> str:
    """``uploadIntervalMs`` -> ``upload_interval_ms``."""
    return _UPPER.sub(lambda m: "_" + m.group(1).lower(), name)
