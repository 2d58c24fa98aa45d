"""The local-mode controller: the shared control loop over files and HTTP.

``ControlLoop`` (``headrace.control.looping``) does the work: poll, reconcile,
persist, push. This process gives it its ports (``FileStore``: the state
directory; ``HttpFleet``: the brokers' admin ports; the system clock), runs
a step every ``poll_interval_ms`` (every ``transition_poll_interval_ms``
while an unload is unfinished or a partition is sealed, so that a move's
unavailability is the brokers' work, not the poll interval) or at once after
an apply, and plays the API server's part for the documents: ``apply`` and
``delete`` write spec and metadata, as kubectl would.

The controller keeps the desired state itself (the applied Topics and Unloads, the
membership, the deletions asked for) and hands the loop a frozen snapshot of it at
each step (``desired``), as the kopf operator does from its watches: an apply that
lands while a step awaits its brokers reaches the loop at the next step, never in
the middle of one.

An Unload is one-shot: applying the same spec again is a no-op, a different
one is refused; deleting one whose moves are in flight marks it
(``deletionTimestamp``) and the loop removes it once they finish, cancelling
the moves that have not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from headrace import files
from headrace.aio import cancel_and_wait
from headrace.control import admission, documents, moves
from headrace.control.documents import full_name, rfc3339, spec_of
from headrace.control.looping import (
    BrokerFleet,
    Clock,
    ControlLoop,
    DesiredState,
    LoopSettings,
    StatusStore,
)
from headrace.control.model import ClusterState, DeletionRequest, UnloadProgress
from headrace.control.reconcile import Decision
from headrace.control.settings import ControlSettings
from headrace.controller.store import FileStore, admitted
from headrace.dashboard.observing import Observer
from headrace.dashboard.rates import RateHistory
from headrace.errors import InvalidRequest
from headrace.fleet.clock import SystemClock
from headrace.fleet.http import HttpFleet
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.security.settings import AdminReadAccess, TlsSettings

__all__ = [
    "Controller",
    "ControllerSettings",
    "RepartitionRefused",
    "UnloadConflict",
]

log = logging.getLogger(__name__)


class UnloadConflict(InvalidRequest):
    """An Unload of that name exists with another spec, or is being deleted (spec is immutable)."""


class RepartitionRefused(InvalidRequest):
    """A Repartition that cannot run (missing topic, same count, topic mid-Unload), or one
    of that name exists with another spec; ``lines`` says each problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    state_dir: Path
    brokers: tuple[BrokerEndpoint, ...]
    cluster_id: str = "local"
    #: how often every broker's heartbeat is polled (the issue's default: 1 s)
    poll_interval_ms: int = 1000
    #: how often while an unload is unfinished or a partition is sealed: a sealed partition
    #: is unavailable until the controller sees the seal and reassigns it, so 100 ms keeps
    #: the poll a small part of a move's unavailability (brokers answer a poll in ~1 ms)
    transition_poll_interval_ms: int = 100
    #: a poll that takes longer than this counts as a missed heartbeat
    poll_timeout_ms: int = 800
    control: ControlSettings = field(default_factory=ControlSettings)
    admin_host: str = "127.0.0.1"
    admin_port: int = 9700
    #: a token naming this one ``local up`` (``local-<hex>``), reported by ``/healthz`` so
    #: the CLI refuses a controller of another cluster; None outside local mode
    instance: str | None = None
    #: the API's credentials, as on a broker's data port (docs/security.md §6): principals
    #: from this ACL file (changes need ``admin`` on each topic they touch) ...
    acl_file: Path | None = None
    #: ... or shared tokens (any may do anything); neither: the API is open
    auth_tokens: frozenset[str] = frozenset()
    #: more shared tokens, one per line, re-read on change (docs/security.md §9)
    auth_token_file: Path | None = None
    #: who may read the API and the dashboard (``/healthz``, ``/readyz`` are always open)
    admin_read_access: AdminReadAccess = AdminReadAccess.OPEN
    #: serve the API over TLS
    admin_tls: TlsSettings | None = None
    #: presented to the brokers' admin ports: a token with the ``cluster`` grant (the
    #: brokers' replication token); None when they ask for no credentials
    broker_token: str | None = None
    #: ``broker_token`` from a file re-read on change: its first line is presented (the
    #: other lines are what the brokers accept during a rotation, docs/security.md §9)
    broker_token_file: Path | None = None
    #: speak HTTPS to the brokers' admin ports, verifying them with this CA file
    broker_admin_ca: Path | None = None
    #: the local cluster's directory (``headrace apply --dir``): TopicSnapshotSchedules run
    #: their snapshots as ``headrace apply -f`` against it (``controller.schedules``);
    #: None: schedules are not run
    local_dir: Path | None = None
    #: schedule time per real time (1: the wall clock). Only tests run it faster, so that a
    #: minutely schedule fires within seconds
    schedule_clock_rate: float = 1.0

    def broker_ssl_context(self) -> ssl.SSLContext | None:
        if self.broker_admin_ca is None:
            return None
        return ssl.create_default_context(cafile=str(self.broker_admin_ca))


#: the membership set through ``set_members``, in the state directory
MEMBERS_FILE = "members.json"


def _read_members(path: Path) -> list[BrokerEndpoint]:
    doc = json.loads(path.read_text())
    return [BrokerEndpoint.from_json(b, "members") for b in doc.get("brokers", [])]


class Controller:
    def __init__(
        self,
        settings: ControllerSettings,
        *,
        fleet: BrokerFleet | None = None,
        clock: Clock | None = None,
        status_store: StatusStore | None = None,
    ) -> None:
        """``fleet``, ``clock``, ``status_store``: the loop's ports (default: HTTP, the
        system clock, the state directory)."""
        self.settings = settings
        self.clock = clock or SystemClock()
        self.files = FileStore(settings.state_dir)
        self.http: HttpFleet | None = None
        if fleet is None:
            self.http = HttpFleet(
                settings.brokers,
                self.clock,
                settings.poll_timeout_ms,
                auth_token=settings.broker_token,
                ssl_context=settings.broker_ssl_context(),
            )
            fleet = self.http
        self.loop = ControlLoop(
            status_store or self.files,
            fleet,
            self.clock,
            LoopSettings(settings.cluster_id, settings.control),
        )
        # The desired state (``desired``), starting from the documents the loop loaded.
        #: the applied Topic resources (no status), by 'namespace/name'
        self._topics: dict[str, Mapping[str, Any]] = dict(self.loop.topics)
        #: the applied Unload resources (no status), by 'namespace/name'
        self._unloads: dict[str, Mapping[str, Any]] = dict(self.loop.unloads)
        #: the applied Repartition resources (no status), by 'namespace/name'
        self._repartitions: dict[str, Mapping[str, Any]] = dict(self.loop.repartitions)
        #: the brokers the cluster should have (``set_members``); None: no moves planned
        self._members: frozenset[int] | None = None
        #: the topics ``delete`` asked to take away, until the state no longer holds them
        self._deletions: frozenset[DeletionRequest] = frozenset()
        #: the dashboard's memory (rates of the last minutes, last heartbeats), fed every step
        self.dashboard = Observer(
            settings.cluster_id, RateHistory(interval_ms=settings.poll_interval_ms)
        )
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        #: steps run and the CPU-clock seconds they took, all told (``/metrics``; the
        #: scale benchmark's controller step time). Process time, not wall time: a step
        #: awaits polls and pushes, which are the brokers' time, not the controller's.
        self.steps_run = 0
        self.step_cpu_seconds = 0.0
        self._members_file = settings.state_dir / MEMBERS_FILE
        if self._members_file.exists():
            self._use_members(_read_members(self._members_file))

    # ------------------------------------------------------------------ membership

    def set_members(self, brokers: list[BrokerEndpoint]) -> None:
        """The brokers the cluster should have, from now on (``local add-broker`` and
        ``remove-broker``). Persisted first, so a restarted controller keeps moving
        replicas towards it; brokers not named stay polled until they hold nothing."""
        ids = [b.id for b in brokers]
        if not brokers or len(set(ids)) != len(ids):
            raise InvalidRequest("members: at least one broker, each id once")
        doc = {"brokers": [b.to_json() for b in sorted(brokers, key=lambda b: b.id)]}
        files.write_json_atomic(self._members_file, doc, indent=2, sort_keys=True)
        self._use_members(brokers)
        self.kick()

    def _use_members(self, brokers: list[BrokerEndpoint]) -> None:
        if self.http is not None:
            for b in brokers:
                self.http.brokers[b.id] = b
        self._members = frozenset(b.id for b in brokers)

    @property
    def members(self) -> frozenset[int] | None:
        """The brokers the cluster should have, as last set (None: never set)."""
        return self._members

    def members_document(self) -> dict[str, Any]:
        """The membership and how the moves towards it go (``GET /v1/members``)."""
        decision = self.loop.last_decision
        summary = decision.reassignment if decision is not None else moves.Summary()
        members = self._members
        return {
            "members": None if members is None else sorted(members),
            # the moves below go towards this membership (False: no step has decided on
            # it yet, so they say nothing of it)
            "decided": decision is not None and self.loop.decided_members == members,
            **summary.to_json(),
            "live": sorted(decision.liveness.live) if decision is not None else [],
        }

    # the loop's state, for the admin surface

    @property
    def state(self) -> ClusterState:
        return self.loop.state

    @property
    def resources(self) -> Mapping[str, Mapping[str, Any]]:
        """The applied Topic resources (no status), by 'namespace/name'."""
        return MappingProxyType(self._topics)

    @property
    def unloads(self) -> Mapping[str, Mapping[str, Any]]:
        """The applied Unload resources (no status), by 'namespace/name'."""
        return MappingProxyType(self._unloads)

    @property
    def deletions(self) -> frozenset[DeletionRequest]:
        """The topics ``delete`` asked to take away that the state still holds."""
        return self._deletions

    @property
    def progress(self) -> dict[str, UnloadProgress]:
        return self.loop.progress

    @property
    def last_decision(self) -> Decision | None:
        return self.loop.last_decision

    @property
    def steps(self) -> int:
        return self.loop.steps

    @property
    def generation_bumps(self) -> int:
        return self.loop.generation_bumps

    @property
    def pushes(self) -> int:
        return self.loop.pushes

    @property
    def transitioning(self) -> bool:
        """The loop is transitioning, or an Unload or a Repartition was applied that it has
        not taken yet (one it holds without progress counts as unfinished too)."""
        return (
            self.loop.transitioning
            or any(n not in self.loop.unloads for n in self._unloads)
            or any(n not in self.loop.repartitions for n in self._repartitions)
        )

    def topology_document(self) -> dict[str, Any]:
        return self.loop.topology_document()

    def state_document(self) -> dict[str, Any]:
        return self.loop.state_document()

    def replica_log_ends(self, topic: str | None = None) -> dict[str, Any]:
        return self.loop.replica_log_ends(topic)

    def desired(self) -> DesiredState:
        """The desired state now, frozen: what the next step reconciles towards."""
        return DesiredState(
            topics=MappingProxyType(dict(self._topics)),
            unloads=MappingProxyType(dict(self._unloads)),
            repartitions=MappingProxyType(dict(self._repartitions)),
            members=self._members,
            racks=MappingProxyType({}),  # the brokers' ``--rack`` says where each runs
            deletions=self._deletions,
        )

    async def step(self) -> Decision:
        started = time.process_time()
        desired = self.desired()
        decision = await self.loop.step(desired)
        # an Unload the loop released (deleted, its moves finished) is gone, as its
        # finalizer's removal makes it gone in Kubernetes; the document handed over is
        # still this controller's (not one applied or marked during the step)
        for name, doc in desired.unloads.items():
            if name not in self.loop.unloads and self._unloads.get(name) is doc:
                del self._unloads[name]
        # a deletion is done once the state no longer holds the topic (the push without it
        # follows in the same step)
        placed = self.loop.state.topics
        self._deletions = frozenset(d for d in self._deletions if d.topic in placed)
        self.dashboard.observe(self.clock.now_ms(), self.loop.heartbeats)
        self.steps_run += 1
        self.step_cpu_seconds += time.process_time() - started
        return decision

    async def start(self) -> None:
        if self.http is not None:
            await self.http.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="controller")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self.http is not None:
            await self.http.close()

    def kick(self) -> None:
        """Run a step now (after an apply) instead of at the next poll."""
        self._kick.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:
                log.exception("controller step failed")
            self._kick.clear()
            interval = (
                self.settings.transition_poll_interval_ms
                if self.transitioning
                else self.settings.poll_interval_ms
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), interval / 1000)

    # ------------------------------------------------------------------ desired state

    def apply(self, resources: list[dict[str, Any]]) -> list[str]:
        """Create or replace Topics, as the API server would: ``metadata.generation`` is bumped
        on a spec change, and the status (with its observed generation and Ready condition)
        is left as it was until a step has reconciled the new spec."""
        specs = [spec_of(r) for r in resources]  # validates the names and counts, all first
        now = rfc3339(self.clock.now_ms())
        for resource, spec in zip(resources, specs, strict=True):
            doc = admitted(resource, self._topics.get(spec.name), now)
            self.files.put("topics", doc)
            self._topics[spec.name] = doc
        applied = {s.name for s in specs}
        # applied again before its deletion ran: it is wanted, not deleted
        self._deletions = frozenset(d for d in self._deletions if d.topic not in applied)
        self.kick()
        return [s.name for s in specs]

    def delete(self, names: list[str]) -> list[str]:
        """Delete Topics: the request the loop needs to take a topic (and its brokers'
        copies) away; the brokers remove their copies."""
        gone = [n for n in names if self._topics.pop(n, None) is not None]
        for name in gone:
            self.files.remove("topics", name)
        requested = {DeletionRequest(name, retain=False) for name in gone}
        self._deletions = self._deletions | requested
        self.kick()
        return gone

    def check_unloads(self, resources: list[dict[str, Any]]) -> None:
        """Raise ``UnloadConflict`` if any of them may not be applied (nothing is applied)."""
        problems = []
        for resource in resources:
            name = full_name(resource)
            existing = self.unloads.get(name)
            if existing is None:
                continue
            if existing["metadata"].get("deletionTimestamp") is not None:
                problems.append(
                    f"unload {name} is being deleted (its moves are finishing); apply it again"
                    " once it is gone"
                )
            elif _normal_spec(existing["spec"]) != _normal_spec(resource["spec"]):
                problems.append(
                    f"unload {name} exists with another spec: an Unload's spec is immutable;"
                    " delete it and apply a new one (or use another name)"
                )
        if problems:
            raise UnloadConflict("; ".join(problems))

    def apply_unloads(self, resources: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """(name, "created" | "unchanged") per Unload; one-shot, so re-applying is a no-op."""
        self.check_unloads(resources)
        return self._create_one_shots("unloads", self._unloads, resources)

    def _create_one_shots(
        self, kind: str, known: dict[str, Any], resources: list[dict[str, Any]]
    ) -> list[tuple[str, str]]:
        """Store each new one-shot resource (Unload, Repartition) as applied, status
        dropped; one already known is left as it is (its spec is immutable)."""
        now = rfc3339(self.clock.now_ms())
        results = []
        for resource in resources:
            name = full_name(resource)
            if name in known:
                results.append((name, "unchanged"))
                continue
            doc = json.loads(json.dumps(resource))
            doc.pop("status", None)
            meta = doc["metadata"]
            meta.setdefault("namespace", "default")
            meta["creationTimestamp"] = now
            meta["generation"] = 1
            self.files.put(kind, doc)
            known[name] = doc
            results.append((name, "created"))
        self.kick()
        return results

    def delete_unloads(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(deleted, deferred): an Unload with moves in flight stays until they finish."""
        deleted, deferred = [], []
        for name in names:
            doc = self._unloads.get(name)
            if doc is None:
                continue
            if self.loop.moving(name):
                if doc["metadata"].get("deletionTimestamp") is None:
                    # a new document, not an edit of the one the loop holds: the loop sees
                    # the deletion at its next step (the snapshot it decides on stays as taken)
                    deleted_at = rfc3339(self.clock.now_ms())
                    marked = {
                        **doc,
                        "metadata": {**doc["metadata"], "deletionTimestamp": deleted_at},
                    }
                    self.files.put("unloads", marked)
                    self._unloads[name] = marked
                deferred.append(name)
            else:
                self.files.remove("unloads", name)
                del self._unloads[name]
                # gone at once from what the loop reports too (``/v1/state``); its next
                # step would forget it anyway, as it is no longer desired
                self.loop.forget_unload(name)
                deleted.append(name)
        self.kick()
        return deleted, deferred

    # ------------------------------------------------------------------ repartitions

    @property
    def repartitions(self) -> Mapping[str, Mapping[str, Any]]:
        """The applied Repartition resources (no status), by 'namespace/name'."""
        return MappingProxyType(self._repartitions)

    def check_repartitions(self, resources: list[dict[str, Any]]) -> None:
        """Raise ``RepartitionRefused`` if any may not be applied (nothing is applied)."""
        lines: list[str] = []
        unloading = {
            documents.unload_request(doc).topic
            for name, doc in self.unloads.items()
            if name not in self.progress or not self.progress[name].finished
        } | {n for n, t in self.state.topics.items() if any(p.seal for p in t.partitions)}
        for resource in resources:
            name = full_name(resource)
            existing = self.repartitions.get(name)
            if existing is not None:
                if existing["spec"] != resource["spec"]:
                    lines.append(
                        f"repartition {name} exists with another spec: a Repartition's spec is"
                        " immutable; apply a new one under another name"
                    )
                continue
            lines += [
                p.line()
                for p in admission.repartition_problems(
                    resource,
                    topics=self.resources,
                    existing=self.state.topics,
                    unloading=unloading,
                )
            ]
        if lines:
            raise RepartitionRefused(lines)

    def apply_repartitions(self, resources: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """(name, "created" | "unchanged") per Repartition; one-shot like an Unload."""
        self.check_repartitions(resources)
        return self._create_one_shots("repartitions", self._repartitions, resources)

    def delete_repartitions(self, names: list[str]) -> list[str]:
        """Delete them. One in flight rolls forward to Finalized: the topic's transition
        marker carries everything it needs (``control.repartitions``)."""
        gone = []
        for name in names:
            if name in self._repartitions:
                self.files.remove("repartitions", name)
                del self._repartitions[name]
                # gone at once from what the loop reports too, as a deleted Unload is
                self.loop.forget_repartition(name)
                gone.append(name)
        self.kick()
        return gone


def _normal_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """An Unload spec compared by meaning: the partition list is a set."""
    return {**spec, "partitions": sorted(spec.get("partitions") or [])}
