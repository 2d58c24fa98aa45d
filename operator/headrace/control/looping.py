"""The control loop both controllers share: poll, reconcile, persist, push (orchestration).

``ControlLoop.step`` is one round of the controller: ask every broker for its
heartbeat, run one pure ``reconcile`` step, persist what changed, push the
topology to every live broker whose last heartbeat shows an older generation.
Pushes are idempotent and brokers fence them by generation, so repeating one
is harmless. Running the steps (every poll interval, or at once after an
apply) is the caller's business.

The loop does no I/O of its own: it reaches the world through three ports,
which the local controller (``headrace.controller``) implements with files
and HTTP, the kopf operator with custom resource status, and tests with
fakes:

``StatusStore``  the durable documents: loaded once, then one status
                 document written at a time (a file, or a status patch)
``BrokerFleet``  heartbeats in, topology pushes out
``Clock``        wall-clock milliseconds

What a step reconciles towards (the Topics, Unloads, members, racks and deletions)
comes in whole, as a frozen ``DesiredState`` that ``step`` takes before it decides:
the kopf operator builds one per step from its watches, the local controller from
what was applied to it. The loop's own copy (``topics``, ``unloads``, ``members``,
``racks``, ``deletions``) is read-only from outside: only a step changes it, so
nothing changes the loop's wishes while it decides.

Persistence order
-----------------
Persist first, push after: a decision that is not persisted must never be
pushed (a restart from the older documents could hand the same epoch to
another leader). Within a commit the Topic statuses go first, each stamped
with the generation it is written for, and the cluster document last (the
commit record); see ``documents`` for how a restart finds a commit that
stopped part-way, and why it then commits again above every persisted
generation before it pushes. A commit that fails in this process is treated
the same way: the next one goes above the generation it tried. Every commit
also goes above every generation a broker reports holding
(``_next_generation``): a generation numbers one topology only, whatever was
lost of the documents (unless a broker hosts a topic the controller does not
know: then its fence keeps the brokers' data from the controller's state). And
one document: it is built once per generation (``topology_document``, whose
``lrs`` go by the brokers live then), a change of its ``retained`` names is a
new generation, and a restarted controller commits again above the generation
it restored before pushing it to a broker behind (what was pushed under that
number is not persisted).

A Topic's status says which spec it reflects: ``observedGeneration`` (in
the status and in its Ready condition) is the ``metadata.generation`` the
reconcile step ran with, so a step that ran with a spec whose generation no
status has observed yet persists even when nothing else changed. A Topic
whose stored spec does not parse is reported on that Topic (``InvalidSpec``)
and never stops the step for the others (``desired``).

Unloads: the progress is persisted after the cluster state and before the
push, so a broker never acts on a decision that is not persisted, and the
core recognises the one crash window left (state written, progress not).
While an unload is unfinished or a partition is sealed, ``transitioning`` is
True and the caller should poll faster. An Unload deleted while its moves
are in flight carries ``metadata.deletionTimestamp`` and is released
(``StatusStore.release_unload``, a finalizer's removal) once they finish.

A restarted controller loads the persisted state, waits out the warm-up the
core prescribes, and changes nothing unless the cluster did (or its last
commit was torn): no generation bump, no leader change.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

from headrace.control import documents, moves, repartitions, setting_aside, topology
from headrace.control.liveness import Liveness
from headrace.control.model import (
    CLUSTER_STATE_JSON,
    TRANSITION_JSON,
    ClusterState,
    DeletionRequest,
    RepartitionProgress,
    RepartitionRequest,
    TopicSpec,
    TopicStatus,
    UnloadProgress,
    UnloadRequest,
)
from headrace.control.reconcile import Decision, Problem, StepInputs
from headrace.control.settings import ControlSettings
from headrace.control.steady import SteadySteps
from headrace.errors import InvalidTopicSpec
from headrace.protocol.coordination import Heartbeat

#: how long a cohort may have no member on a partition's leader before it is logged as a
#: warning: longer than a member's rejoin after a leader change (a topology push, then a
#: join; a refused join is retried with backoff up to 2 s) and than a session timeout
UNCOVERED_WARN_MS = 15_000

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- ports


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (heartbeat receipt, deadlines, times)."""
        ...


@dataclass(frozen=True, slots=True)
class Report:
    """What one broker answered a heartbeat poll with."""

    heartbeat: Heartbeat
    #: the topology generation the broker holds
    generation: int


class BrokerFleet(Protocol):
    async def poll(self) -> Mapping[int, Report | None]:
        """Ask every broker for its heartbeat, concurrently, by broker id.

        A broker that answered maps to its report (``received_ms`` stamped with
        the controller's clock); one known to be gone (nothing listens on its
        admin port: proof, not silence) maps to None; a silent one is left out.
        """
        ...

    async def push(self, broker_id: int, topology: Mapping[str, Any]) -> int | None:
        """Send the topology document to one broker: the generation it now holds, or None.

        Promptly: the step pushes to one broker after another. A broker that has not
        answered soon gets None (the adapter may let the push finish in the background;
        its next heartbeat shows the generation it holds)."""
        ...


@dataclass(frozen=True, slots=True)
class Stored:
    """The persisted documents, as ``StatusStore.load`` finds them."""

    #: the cluster document (``documents.cluster_status``), None if never written
    cluster: Mapping[str, Any] | None = None
    #: Topic resources (metadata, spec and status, if any) by 'namespace/name'
    topics: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Unload resources (metadata, spec and status, if any) by 'namespace/name'
    unloads: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Repartition resources (metadata, spec and status, if any) by 'namespace/name'
    repartitions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class StatusStore(Protocol):
    """The controller's durable documents; every write replaces one document, atomically.

    No write is atomic with another: the loop orders them (see the module).
    Writing the status of a resource that is gone does nothing.
    """

    def load(self) -> Stored:
        """Every document, once, when the loop starts (the operator: from its watch cache)."""
        ...

    async def write_topic_status(self, name: str, status: Mapping[str, Any]) -> None: ...

    async def write_cluster_status(self, status: Mapping[str, Any]) -> None: ...

    async def write_unload_status(self, name: str, status: Mapping[str, Any]) -> None: ...

    async def release_unload(self, name: str) -> None:
        """A deleted Unload's moves have finished: let it go (remove its finalizer)."""
        ...

    async def write_repartition_status(self, name: str, status: Mapping[str, Any]) -> None: ...


# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True, slots=True)
class LoopSettings:
    cluster_id: str = "local"
    control: ControlSettings = field(default_factory=ControlSettings)


@dataclass(frozen=True, slots=True)
class DesiredState:
    """What one step reconciles towards, as the adapter read it just before the step: a
    value the loop takes whole at the start of ``step``, so that nothing changes the
    loop's wishes from outside while it decides. Never changed once built."""

    #: the applied Topic resources (no status), by 'namespace/name'
    topics: Mapping[str, Mapping[str, Any]]
    #: the applied Unload resources (no status), by 'namespace/name'; one the loop holds
    #: that is not here is gone (``forget_unload``)
    unloads: Mapping[str, Mapping[str, Any]]
    #: the Repartition resources, by 'namespace/name', each with the status it was read
    #: with: one the loop does not hold yet is adopted with that status (its progress), one
    #: it holds keeps the loop's own record, and one it holds that is not here is gone
    #: (``forget_repartition``)
    repartitions: Mapping[str, Mapping[str, Any]]
    #: the brokers the cluster should have (``ControlLoop.members``); None: no moves planned
    members: frozenset[int] | None
    #: the rack of each broker as the adapter knows it (``ControlLoop.racks``)
    racks: Mapping[int, str]
    #: the deletions asked for (``ControlLoop.deletions``)
    deletions: frozenset[DeletionRequest]


class ControlLoop:
    """The controller's state and its step; see the module."""

    def __init__(
        self,
        store: StatusStore,
        fleet: BrokerFleet,
        clock: Clock,
        settings: LoopSettings | None = None,
    ) -> None:
        self.store = store
        self.fleet = fleet
        self.clock = clock
        self.settings = settings or LoopSettings()
        stored = store.load()
        #: the applied Topic resources (no status), by 'namespace/name' (``topics``)
        self._topics: dict[str, Mapping[str, Any]] = {}
        #: the Topic statuses as last written (to rewrite only what changed)
        self._topic_status: dict[str, dict[str, Any]] = {}
        for name, doc in stored.topics.items():
            resource = copy.deepcopy(dict(doc))
            status = resource.pop("status", None)
            resource.setdefault("metadata", {})["generation"] = documents.generation_of(resource)
            self._topics[name] = resource
            if status:
                self._topic_status[name] = status
        restored = documents.restore(stored.cluster, self._topic_status)
        self.state: ClusterState = restored.state
        #: topics whose copies the brokers keep aside though no deletion was requested: the
        #: restore found no placement for them (``documents.Restored.set_aside``)
        self.set_aside: frozenset[str] = restored.set_aside
        if self.set_aside - set(self.state.topics):
            log.warning(
                "topics %s are committed but their placement is gone (their Topic names"
                " another cluster, or is gone without its finalizer): the brokers keep their"
                " copies aside",
                sorted(self.set_aside - set(self.state.topics)),
            )
        #: topics a Retain deletion took out of the state whose copies some broker may still
        #: hold, by name: retained until every holder moved its copy aside (``setting_aside``)
        self._setting_aside: dict[str, setting_aside.SettingAside] = {}
        self._cluster_status = dict(stored.cluster) if stored.cluster is not None else None
        #: the generation the next commit must reach: set when the persisted state may hold
        #: content that no generation was pushed with (a torn commit), or a commit failed
        self._floor: int | None = None
        if restored.torn:
            self._floor = restored.highest + 1
            log.warning(
                "the last commit stopped part-way (cluster document at generation %d, documents"
                " up to %d): committing again at %d before pushing",
                self.state.generation,
                restored.highest,
                self._floor,
            )
        #: applied Unload resources (no status; ``unloads``) and their progress, by
        #: 'namespace/name'
        self._unloads: dict[str, Mapping[str, Any]] = {}
        self.progress: dict[str, UnloadProgress] = {}
        self._unload_status: dict[str, dict[str, Any]] = {}
        for name, doc in stored.unloads.items():
            resource = copy.deepcopy(dict(doc))
            status = resource.pop("status", None)
            self._unloads[name] = resource
            if status:
                self._unload_status[name] = status
                self.progress[name] = documents.progress_of(name, status)
        #: applied Repartition resources (no status) and their progress, by 'namespace/name'
        self._repartitions: dict[str, dict[str, Any]] = {}
        self.repartition_progress: dict[str, RepartitionProgress] = {}
        self._repartition_status: dict[str, dict[str, Any]] = {}
        for name, doc in stored.repartitions.items():
            resource = copy.deepcopy(dict(doc))
            status = resource.pop("status", None)
            self._repartitions[name] = resource
            if status:
                self._repartition_status[name] = status
                self.repartition_progress[name] = documents.repartition_progress_of(name, status)
        self.heartbeats: dict[int, Heartbeat] = {}
        #: ``members`` and ``racks`` (the adapter's, taken at each step)
        self._members: frozenset[int] | None = None
        self._racks: dict[int, str] = {}
        #: the topology generation each broker last reported
        self.broker_generations: dict[int, int] = {}
        #: topics the brokers host that this controller does not know, last logged
        self._unknown_hosted: list[str] = []
        self.observing_since_ms = clock.now_ms()
        self.last_decision: Decision | None = None
        #: the membership (``members``) the last decision was made with: what its moves
        #: go towards
        self.decided_members: frozenset[int] | None = None
        self.steps = 0
        #: "<topic>:<cohort>" -> when (ms) the cohort was first seen with partitions whose
        #: leader none of its members is connected to (``Decision.uncovered``)
        self._uncovered_since: dict[str, int] = {}
        #: of those, the ones already logged as a warning, with what was logged
        self._uncovered_warned: dict[str, Mapping[int, Sequence[int]]] = {}
        #: reconcile, skipped while nothing changes (``steady``: idle cost that does not grow
        #: with the partition count)
        self._reconciler = SteadySteps()
        self.generation_bumps = 0
        self.pushes = 0
        #: ``deletions`` (the adapter's, taken at each step)
        self._deletions: frozenset[DeletionRequest] = frozenset()
        #: the last spec of each Topic that parsed (one that stops parsing keeps it; an
        #: unclaimed topic too, so that it is served as it was)
        self._parsed: dict[str, TopicSpec] = {}
        #: the last broker settings of each Topic (an unclaimed topic keeps its retention)
        self._configs: dict[str, dict[str, Any]] = {}
        #: the problems behind the Ready conditions last written (rewrite only on change)
        self._saved_problems: dict[str, tuple[str, str]] | None = None
        #: the ``retained`` the state's generation was pushed with (None: not known yet,
        #: the first step takes the one it finds, as a restart changes nothing by itself)
        self._committed_retained: frozenset[str] | None = None
        #: the topology document of the state's generation, once built: a generation
        #: numbers one document, whatever the liveness when it is pushed again
        self._topology: dict[str, Any] | None = None
        #: the last generation this process committed (None: none yet)
        self._numbered_here: int | None = None

    # ------------------------------------------------------------------ views

    # The desired state as the loop last took it (``take``): read-only, so that only a
    # step's ``DesiredState`` changes it.

    @property
    def topics(self) -> Mapping[str, Mapping[str, Any]]:
        """The applied Topic resources (no status), by 'namespace/name'."""
        return MappingProxyType(self._topics)

    @property
    def unloads(self) -> Mapping[str, Mapping[str, Any]]:
        """The applied Unload resources (no status), by 'namespace/name'; a released one
        leaves (``forget_unload``)."""
        return MappingProxyType(self._unloads)

    @property
    def repartitions(self) -> Mapping[str, Mapping[str, Any]]:
        """The Repartition resources the loop serves (no status), by 'namespace/name'."""
        return MappingProxyType(self._repartitions)

    @property
    def members(self) -> frozenset[int] | None:
        """The brokers the cluster should have (replicas move off the others and onto new
        ones, ``control.moves``); None: no moves are planned."""
        return self._members

    @property
    def racks(self) -> Mapping[int, str]:
        """The rack of each broker as the adapter knows it (the operator: the zone of the
        node each broker pod runs on); it wins over the rack a heartbeat reports."""
        return MappingProxyType(self._racks)

    @property
    def deletions(self) -> frozenset[DeletionRequest]:
        """The topics whose deletion was asked for explicitly: the only way a topic leaves
        the state (``reconcile``). The operator asks from the Topics being deleted, the
        local controller from ``topics delete``; a name with ``retain`` stays here until
        every broker has moved its copy aside (and under ``retained`` until then even if it
        leaves here: ``setting_aside``)."""
        return self._deletions

    @property
    def specs(self) -> list[TopicSpec]:
        """The specs the step reconciles (see ``desired``)."""
        return self.desired()[0]

    def desired(self) -> tuple[list[TopicSpec], dict[str, tuple[str, str]]]:
        """The specs to reconcile, and the Topics left out of them (reason, message): those
        whose spec does not parse, and those waiting for an older topic's setting aside.

        A Topic whose stored spec does not parse (written by hand, or by an older
        version of the models) is that Topic's problem alone (``InvalidSpec``): the
        other topics reconcile as usual. It is not deleted for it: a placed topic keeps
        reconciling under the last spec of it that parsed in this process, or else
        under ``documents.holding_spec``; one not placed yet is not created.

        A new Topic whose name's previous topic is still being set aside (``setting_aside``)
        waits for it (``PreviousTopicRetained``): placed now, a broker holding the old copy
        would drop it as a superseded incarnation instead of moving it aside.
        """
        specs: list[TopicSpec] = []
        invalid: dict[str, tuple[str, str]] = {}
        for name, resource in self._topics.items():
            waiting = self._awaiting_set_aside(name)
            if waiting and name not in self.state.topics:
                invalid[name] = (
                    "PreviousTopicRetained",
                    f"the topic of this name deleted with deletionPolicy Retain is still on"
                    f" brokers {sorted(waiting)}, which have not moved it aside yet: this"
                    " Topic is placed once they have",
                )
                continue
            try:
                spec = documents.spec_of(resource)
            except InvalidTopicSpec as exc:
                invalid[name] = ("InvalidSpec", exc.message)
                held = self._parsed.get(name)
                if held is None and name in self.state.topics:
                    held = documents.holding_spec(name, self.state.topics[name])
                if held is not None:
                    specs.append(held)
                continue
            self._parsed[name] = spec
            self._configs[name] = documents.topic_config(resource)
            specs.append(spec)
        for name in set(self._parsed) - set(self._topics) - set(self.state.topics):
            del self._parsed[name]
        for name in set(self._configs) - set(self._topics) - set(self.state.topics):
            del self._configs[name]
        return specs, invalid

    def broker_racks(self) -> dict[int, str]:
        """Where each broker runs (``placement.Racks``): the rack its heartbeat reports
        (``--rack``), unless the adapter knows better (``racks``)."""
        reported = {b: hb.rack for b, hb in self.heartbeats.items() if hb.rack}
        return dict(sorted({**reported, **self._racks}.items()))

    @property
    def retained(self) -> frozenset[str]:
        """The topics not in the state whose copies the brokers keep: deleted ones with
        ``deletionPolicy: Retain`` (the Topic being deleted, or gone while a broker that
        holds a copy has not moved it aside yet: ``setting_aside``), and those set aside
        (the push's ``retained``)."""
        asked = frozenset(d.topic for d in self._deletions if d.retain)
        return asked | frozenset(self._setting_aside) | self.set_aside

    def _awaiting_set_aside(self, name: str) -> frozenset[int]:
        """The brokers still to move aside the copy of the topic ``name`` that a Retain
        deletion took out of the state (empty: none, or it is not being set aside)."""
        aside = self._setting_aside.get(name)
        if aside is None:
            return frozenset()
        return aside.waiting_for(self.broker_generations, self.heartbeats)

    def unload_requests(self) -> list[UnloadRequest]:
        """The Unloads, oldest first (a partition's moves are served in this order)."""

        def age(name: str) -> tuple[str, str]:
            return (str(self._unloads[name]["metadata"].get("creationTimestamp", "")), name)

        return [documents.unload_request(self._unloads[n]) for n in sorted(self._unloads, key=age)]

    def repartition_requests(self) -> list[RepartitionRequest]:
        """The Repartitions, oldest first (one topic's are served in this order)."""

        def age(name: str) -> tuple[str, str]:
            meta = self._repartitions[name]["metadata"]
            return (str(meta.get("creationTimestamp", "")), name)

        return [
            documents.repartition_request(self._repartitions[n])
            for n in sorted(self._repartitions, key=age)
        ]

    @property
    def transitioning(self) -> bool:
        """An unload or a repartition is unfinished, or a partition sealed, or a cohort with
        members is held by a topic's history: poll fast (a repartition holds moved keys
        back until the controller releases them)."""
        return (
            any(
                name not in self.progress or not self.progress[name].finished
                for name in self._unloads
            )
            or any(p.seal for t in self.state.topics.values() for p in t.partitions)
            or any(t.transition is not None for t in self.state.topics.values())
            or any(_held_by_history(t) for t in self.state.topics.values())
            or any(
                name not in self.repartition_progress
                or not self.repartition_progress[name].finished
                for name in self._repartitions
            )
        )

    def unobserved(self) -> list[str]:
        """The Topics whose status does not yet say it observed their ``metadata.generation``."""
        return [
            name
            for name, resource in sorted(self._topics.items())
            if self._topic_status.get(name, {}).get("observedGeneration")
            != documents.generation_of(resource)
        ]

    def moving(self, name: str) -> bool:
        """Whether the Unload has moves in flight (deleting it must wait for them)."""
        progress = self.progress.get(name)
        return progress is not None and any(m.in_flight for m in progress.moves)

    def unload_documents(self) -> list[dict[str, Any]]:
        """The Unload documents, with their status as last written."""
        docs = []
        for name in sorted(self._unloads):
            doc = dict(self._unloads[name])
            if name in self._unload_status:
                doc["status"] = self._unload_status[name]
            docs.append(doc)
        return docs

    # ------------------------------------------------------------------ the step

    def take(self, desired: DesiredState) -> None:
        """Reconcile towards ``desired`` from now on (``step`` takes it when given one)."""
        for name in set(self._unloads) - set(desired.unloads):
            self.forget_unload(name)
        for name in set(self._repartitions) - set(desired.repartitions):
            self.forget_repartition(name)
        for name, doc in desired.repartitions.items():
            if name not in self._repartitions:
                self._adopt_repartition(name, doc)
        self._topics = dict(desired.topics)
        self._unloads = dict(desired.unloads)
        self._members = desired.members
        self._racks = dict(desired.racks)
        self._deletions = desired.deletions

    async def step(self, desired: DesiredState | None = None) -> Decision:
        """One round; ``desired``: what it reconciles towards (None: what it last took, or
        what it loaded at the start)."""
        if desired is not None:
            self.take(desired)
        for broker_id, report in (await self.fleet.poll()).items():
            if report is None:
                if broker_id in self.heartbeats:
                    log.warning(
                        "broker %s refused the heartbeat poll: treating it as down", broker_id
                    )
                    del self.heartbeats[broker_id]
                continue
            self.heartbeats[broker_id] = report.heartbeat
            self.broker_generations[broker_id] = report.generation
        generation = self.state.generation
        if self._numbered_here != generation and any(
            g < generation for g in self.broker_generations.values()
        ):
            # A broker is behind a generation committed before this process (a restart):
            # what was pushed under it (its ``lrs`` went by the brokers then live) is not
            # persisted, so commit again above it rather than push a rebuilt document.
            self._floor = max(self._floor or 0, generation + 1)
        next_generation = self._next_generation()
        now = self.clock.now_ms()
        # The specs this step reconciles, by the generation each was applied at: what the
        # statuses written for it have observed (an apply may land while a write awaits).
        observed = {n: documents.generation_of(r) for n, r in self._topics.items()}
        specs, invalid = self.desired()
        decision = self._reconciler.reconcile(
            StepInputs(
                self.state,
                specs,
                self.heartbeats,
                now,
                self.settings.control,
                observing_since_ms=self.observing_since_ms,
                unload_requests=self.unload_requests(),
                unload_progress=self.progress,
                repartition_requests=self.repartition_requests(),
                repartition_progress=self.repartition_progress,
                members=self._members,
                # a move started now records the generation it is pushed at
                commit_generation=next_generation,
                deletions=self._deletions,
                racks=self.broker_racks(),
            )
        )
        if self._committed_retained is None:
            self._committed_retained = self.retained
        # a deletion that does not retain ends the setting aside of its name
        self.set_aside -= {d.topic for d in self._deletions if not d.retain}
        # a Retain deletion's setting aside ends once every broker that held it confirmed
        for name in setting_aside.confirmed(
            self._setting_aside, self.broker_generations, self.heartbeats
        ):
            del self._setting_aside[name]
        self.steps += 1
        for event in decision.events:
            log.info("%s %s: %s", event.kind, event.subject, event.message)
        # The push names the retained topics: a topology that keeps other names aside (or
        # none, so that a broker deletes its copies) is another topology, another number.
        retained_changed = self.retained != self._committed_retained
        if (self._floor is not None and decision.state.generation < self._floor) or (
            retained_changed and decision.state.generation == self.state.generation
        ):
            decision = replace(
                decision, state=replace(decision.state, generation=next_generation), changed=True
            )
        if invalid:  # first, so that it is the reason a Topic's Ready condition gives
            unreadable = tuple(Problem(n, *invalid[n]) for n in sorted(invalid))
            decision = replace(decision, problems=(*unreadable, *decision.problems))
        self.last_decision = decision
        self.decided_members = self._members
        self._note_uncovered(decision.uncovered, now)
        problems = {p.topic: (p.reason, p.message) for p in reversed(decision.problems)}
        if decision.changed:
            # recorded before the commit that persists it: the Topic may go at any moment
            self._setting_aside.update(
                setting_aside.started(self.state, decision.state, self._deletions)
            )
        if decision.changed or problems != self._saved_problems or self.unobserved():
            await self._commit(decision.state, decision.liveness, problems, observed, now)
            self._saved_problems = problems
            if decision.changed:
                self.generation_bumps += 1
                self.state = decision.state
                self._committed_retained = self.retained
                self._numbered_here = self.state.generation
        elif self._cluster_status is not None:
            # No commit: the record stays as written, its brokers' liveness follows the step.
            cluster = documents.with_liveness(self._cluster_status, decision.liveness)
            if cluster != self._cluster_status:
                await self.store.write_cluster_status(cluster)
                self._cluster_status = cluster
        if decision.unloads_changed or set(decision.unloads) != set(self.progress):
            # After the state (the core recognises a reassignment whose progress was lost,
            # not the other way round), before the push.
            self.progress = dict(decision.unloads)
            await self.save_unloads(now)
        if decision.repartitions_changed or set(decision.repartitions) != set(
            self.repartition_progress
        ):
            self.repartition_progress = dict(decision.repartitions)
            await self.save_repartitions(now)
        await self._release_finished_deletions()
        await self._push(decision)
        return decision

    def _note_uncovered(
        self, uncovered: Mapping[str, Mapping[int, Sequence[int]]], now: int
    ) -> None:
        """Log the cohorts that have members but none on some partition's leader: nothing
        delivers those partitions to the cohort. A warning once it lasts (a leader change
        causes it for a moment), naming the partitions and their leaders; again if the set
        changes; and a note when it is over."""
        for key in [k for k in self._uncovered_since if k not in uncovered]:
            del self._uncovered_since[key]
            if self._uncovered_warned.pop(key, None) is not None:
                log.info("cohort %s has a member on every partition's leader again", key)
        for key, missing in uncovered.items():
            since = self._uncovered_since.setdefault(key, now)
            if now - since < UNCOVERED_WARN_MS or self._uncovered_warned.get(key) == missing:
                continue
            self._uncovered_warned[key] = missing
            where = "; ".join(
                f"partitions {', '.join(map(str, ps))} (leader broker {b})"
                for b, ps in sorted(missing.items())
            )
            log.warning(
                "cohort %s has no member on the leader of %s for %.0f s: nothing is delivered"
                " to it from there until a member joins that broker",
                key,
                where,
                (now - since) / 1000,
            )

    def _next_generation(self) -> int:
        """The generation the next commit is numbered: above the state's, the floor of a
        torn or failed commit, and every generation a broker holds.

        A broker holding a generation above the state's means this controller's numbering
        fell behind the cluster's: its commit record was lost (the Topic statuses it is
        restored from carry no stamp of a commit that changed no Topic, a deletion say),
        or replaced by an older copy. Numbering a commit at or below it would give two
        topologies one generation: the brokers would ignore the push as not newer, their
        clients the snapshots, and the controller would count the brokers' old topology
        as its own applied (its promotions and moves go by the generation a broker
        reports applied).

        Not while a broker hosts a topic this controller does not know (its state lost
        or older than the cluster's): a push deletes every hosted topic it does not
        name, and the brokers' fence on generations is what keeps their data from a
        controller that knows less than they do."""
        own = max(self.state.generation + 1, self._floor or 0)
        held = max(self.broker_generations.values(), default=0)
        if held < own:
            return own
        known = set(self.state.topics) | self.retained | {d.topic for d in self._deletions}
        unknown = sorted(
            {p.topic for hb in self.heartbeats.values() for p in hb.partitions} - known
        )
        if unknown:
            if unknown != self._unknown_hosted:
                log.error(
                    "brokers hold topology generation %d, above this controller's %d, and"
                    " host topics it does not know (%s): its state is lost or older than"
                    " the cluster's; numbering its commits below theirs, which they ignore",
                    held,
                    self.state.generation,
                    ", ".join(unknown[:5]),
                )
            self._unknown_hosted = unknown
            return own
        self._unknown_hosted = []
        return held + 1

    async def _commit(
        self,
        state: ClusterState,
        liveness: Liveness,
        problems: Mapping[str, tuple[str, str]],
        observed: Mapping[str, int],
        now_ms: int,
    ) -> None:
        """Topic statuses first (stamped), the cluster document last; see ``documents``.

        ``observed``: the ``metadata.generation`` of each Topic the step reconciled.
        """
        try:
            now = documents.condition_time(now_ms)
            for name in sorted(self._topics):
                if name not in observed:
                    continue  # applied after the step reconciled: the next step writes it
                previous = self._topic_status.get(name)
                ready = documents.previous_ready(previous)
                status = documents.topic_status(
                    state, name, problems.get(name), ready, now, observed[name]
                )
                # An unchanged status keeps its older stamp: a stamp at or below the
                # cluster document's generation is consistent with it.
                if previous is None or _unstamped(status) != _unstamped(previous):
                    await self.store.write_topic_status(name, status)
                    self._topic_status[name] = status
            for name in set(self._topic_status) - set(self._topics):
                del self._topic_status[name]  # its resource is gone, and the status with it
            # the topics being set aside too: a restarted loop keeps them aside
            kept_aside = self.set_aside | frozenset(self._setting_aside)
            cluster = documents.cluster_status(state, liveness, kept_aside)
            if cluster != self._cluster_status:
                await self.store.write_cluster_status(cluster)
                self._cluster_status = cluster
        except BaseException:
            # Documents may now be stamped with this generation: never commit other content
            # under it (or below it).
            self._floor = max(self._floor or 0, state.generation + 1)
            raise
        self._floor = None

    async def save_unloads(self, now_ms: int) -> None:
        """Write the status of every Unload whose progress changed."""
        now = documents.condition_time(now_ms)
        for name in sorted(self._unloads):
            progress = self.progress.get(name)
            if progress is None:
                continue
            previous = self._unload_status.get(name)
            observed = documents.generation_of(self._unloads[name])
            ready = documents.previous_ready(previous)
            status = documents.unload_status(progress, observed, ready, now)
            if status != previous:
                await self.store.write_unload_status(name, status)
                self._unload_status[name] = status

    async def save_repartitions(self, now_ms: int) -> None:
        """Write the status of every Repartition whose progress changed."""
        now = documents.condition_time(now_ms)
        for name in sorted(self._repartitions):
            progress = self.repartition_progress.get(name)
            if progress is None:
                continue
            previous = self._repartition_status.get(name)
            observed = documents.generation_of(self._repartitions[name])
            ready = documents.previous_ready(previous)
            status = documents.repartition_status(progress, observed, ready, now)
            if status != previous:
                await self.store.write_repartition_status(name, status)
                self._repartition_status[name] = status

    def _adopt_repartition(self, name: str, doc: Mapping[str, Any]) -> None:
        """Take a Repartition that appeared after the loop started (metadata, spec, status if
        any) as applied. A status it already carries is its progress, as at ``load``: one
        refused before this loop served it (the operator fails a Repartition of a missing
        topic itself) stays refused, never starts later."""
        resource = copy.deepcopy(dict(doc))
        status = resource.pop("status", None)
        self._repartitions[name] = resource
        if status and status.get("phase"):
            self._repartition_status[name] = status
            self.repartition_progress[name] = documents.repartition_progress_of(name, status)

    def forget_repartition(self, name: str) -> None:
        """The Repartition is gone. One in flight rolls forward: its marker carries it."""
        self._repartitions.pop(name, None)
        self.repartition_progress.pop(name, None)
        self._repartition_status.pop(name, None)

    def repartition_documents(self) -> list[dict[str, Any]]:
        """The Repartition documents, with their status as last written."""
        docs = []
        for name in sorted(self._repartitions):
            doc = dict(self._repartitions[name])
            if name in self._repartition_status:
                doc["status"] = self._repartition_status[name]
            docs.append(doc)
        return docs

    def transitions(self) -> list[dict[str, Any]]:
        """Every topic's transition marker in flight, with its phase (for status pages)."""
        return [
            {
                "topic": name,
                "phase": repartitions.phase_of(t.transition).value,
                **TRANSITION_JSON.dump(t.transition),
            }
            for name, t in sorted(self.state.topics.items())
            if t.transition is not None
        ]

    async def _release_finished_deletions(self) -> None:
        """Let deleted Unloads go once their moves are no longer in flight."""
        done = [
            n
            for n, doc in self._unloads.items()
            if doc["metadata"].get("deletionTimestamp") is not None and not self.moving(n)
        ]
        for name in done:
            await self.store.release_unload(name)
            self.forget_unload(name)
            log.info("unload %s deleted: its moves have finished", name)

    def forget_unload(self, name: str) -> None:
        """The Unload is gone (released, or deleted with no moves in flight)."""
        self._unloads.pop(name, None)
        self.progress.pop(name, None)
        self._unload_status.pop(name, None)

    async def _push(self, decision: Decision) -> None:
        generation = self.state.generation
        if generation == 0:
            return
        behind = [
            b
            for b in sorted(decision.liveness.live)
            if self.broker_generations.get(b, 0) < generation
        ]
        if not behind:
            return
        doc = self.topology_document()
        for broker_id in behind:
            held = await self.fleet.push(broker_id, doc)
            if held is not None:
                self.pushes += 1
                self.broker_generations[broker_id] = held

    # ------------------------------------------------------------------ documents

    def topology_document(self) -> dict[str, Any]:
        """The document brokers apply: ``ClusterTopology`` (``protocol.coordination``),
        built by ``control.topology.cluster_topology``: once per generation, at its first
        push (or request) after a step."""
        if self._topology is not None and self._topology["generation"] == self.state.generation:
            return self._topology
        decision = self.last_decision
        doc = topology.cluster_topology(
            self.state,
            self.settings.cluster_id,
            live=decision.liveness.live if decision is not None else None,
            # an unclaimed topic keeps the settings of its last spec (its retention above all)
            min_in_sync={
                **{name: spec.min_in_sync for name, spec in self._parsed.items()},
                **{spec.name: spec.min_in_sync for spec in self.specs},
            },
            # the settings of the spec last parsed (``desired``); of a spec not parsed in
            # this process, what of it reads
            configs={
                name: self._configs[name]
                if name in self._configs
                else documents.topic_config(self._topics[name])
                for name in self.state.topics
                if name in self._topics or name in self._configs
            },
            retained=self.retained,
        ).to_json()
        if decision is not None:
            self._topology = doc
        return doc

    def replica_log_ends(self, topic: str | None = None) -> dict[str, Any]:
        """Each partition's replica log end offsets as the latest heartbeats of the live
        brokers report them: what an election ranks its candidates by (``election``,
        least lag first). ``topic``: that topic only. Built on request, not every step."""
        decision = self.last_decision
        live = decision.liveness.live if decision is not None else frozenset()
        ends: dict[str, dict[int, dict[str, int]]] = {}
        for broker_id in sorted(live):
            heartbeat = self.heartbeats.get(broker_id)
            if heartbeat is None:
                continue
            for report in heartbeat.partitions:
                if topic is None or report.topic == topic:
                    by_broker = ends.setdefault(report.topic, {}).setdefault(report.partition, {})
                    by_broker[str(broker_id)] = report.log_end_offset
        return {
            "topics": {
                name: [{"partition": p, "logEndOffsets": ends[name][p]} for p in sorted(ends[name])]
                for name in sorted(ends)
            }
        }

    def state_document(self) -> dict[str, Any]:
        decision = self.last_decision
        return {
            "cluster": CLUSTER_STATE_JSON.dump(self.state),
            "live": sorted(decision.liveness.live) if decision else [],
            "adoptionFloor": decision.adoption_floor if decision else None,
            "problems": [
                {"topic": p.topic, "reason": p.reason, "message": p.message}
                for p in decision.problems
            ]
            if decision
            else [],
            # brokers of an older release than the controller's topology format (upgrade
            # brokers first): they keep their last topology until upgraded
            "brokersBehind": [
                {
                    "broker": broker_id,
                    "refusedTopologyFormat": heartbeat.refused_topology_format,
                    "readsTopologyFormat": heartbeat.topology_format,
                }
                for broker_id, heartbeat in sorted(self.heartbeats.items())
                if heartbeat.refused_topology_format is not None
            ],
            "unloads": self.unload_documents(),
            "repartitions": self.repartition_documents(),
            "transitions": self.transitions(),
            "members": None if self._members is None else sorted(self._members),
            "racks": {str(b): rack for b, rack in self.broker_racks().items()},
            "reassignment": (decision.reassignment if decision else moves.Summary()).to_json(),
            "steps": self.steps,
            "stepsSkipped": self._reconciler.skipped,
            "generationBumps": self.generation_bumps,
            "pushes": self.pushes,
        }


def _unstamped(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != "topologyGeneration"}


def _held_by_history(topic: TopicStatus) -> bool:
    """A cohort with members may still be held back by the topic's partitioning history."""
    history = topic.history
    return history is not None and any(
        plan.assignment and history.holds(cohort) for cohort, plan in topic.cohort_plans.items()
    )
