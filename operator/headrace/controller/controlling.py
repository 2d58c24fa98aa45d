"""The controller loop: poll heartbeats, reconcile, persist, push.

Every ``poll_interval_ms`` it fetches ``/v1/heartbeat`` from every broker it
knows, runs one pure ``reconcile`` step, persists the state if (and only if)
the step changed it, and pushes the topology to every live broker whose last
heartbeat shows an older generation. Pushes are idempotent and the brokers
fence them by generation, so repeating one is harmless.

A restarted controller loads the persisted state, waits out the warm-up the
core prescribes, and changes nothing unless the cluster did: no generation
bump, no leader change.

Unloads: the applied Unload documents and their progress live beside the
topics (``store``). Each step passes them to the core, oldest first, and
persists the progress it returns when it changed: after the cluster state
and before the push, so a broker never acts on a decision that is not on
disk, and the core recognises the one crash window left (state written,
progress not). While an unload is unfinished or a partition is sealed the
loop polls every ``transition_poll_interval_ms`` instead of every
``poll_interval_ms``, so that a move's unavailability is the brokers' work,
not the poll interval. An Unload is one-shot: applying the same spec again
is a no-op, a different one is refused; deleting one whose moves are in
flight marks it (``deletionTimestamp``) and removes it once they finish,
cancelling the moves that have not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from headrace.aio import cancel_and_wait
from headrace.control import topology
from headrace.control.model import Heartbeat, TopicSpec, UnloadRequest
from headrace.control.reconcile import Decision, reconcile
from headrace.control.settings import ControlSettings
from headrace.controller.store import (
    StateStore,
    full_name,
    rfc3339,
    spec_of,
    topic_config,
    unload_request,
)
from headrace.errors import HeadraceError, InvalidRequest
from headrace.protocol.endpoints import BrokerEndpoint

log = logging.getLogger(__name__)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class UnloadConflict(InvalidRequest):
    """An Unload of that name exists with another spec, or is being deleted (spec is immutable)."""


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


class Controller:
    def __init__(self, settings: ControllerSettings) -> None:
        self.settings = settings
        self.store = StateStore(settings.state_dir)
        self.state, self.resources = self.store.load()
        #: applied Unload documents (no status) and their progress, by 'namespace/name'
        self.unloads, self.progress = self.store.load_unloads()
        self.heartbeats: dict[int, Heartbeat] = {}
        #: the topology generation each broker last reported
        self.broker_generations: dict[int, int] = {}
        self.started_ms = wall_ms()
        self.last_decision: Decision | None = None
        self.steps = 0
        self.generation_bumps = 0
        self.pushes = 0
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        #: the problems behind the Ready conditions last written (rewrite only on change)
        self._saved_problems: dict[str, tuple[str, str]] | None = None

    @property
    def specs(self) -> list[TopicSpec]:
        return [spec_of(r) for r in self.resources.values()]

    def unload_requests(self) -> list[UnloadRequest]:
        """The Unloads, oldest first (a partition's moves are served in this order)."""

        def age(name: str) -> tuple[str, str]:
            return (str(self.unloads[name]["metadata"].get("creationTimestamp", "")), name)

        return [unload_request(self.unloads[n]) for n in sorted(self.unloads, key=age)]

    @property
    def transitioning(self) -> bool:
        """An unload is unfinished or a partition sealed: poll fast."""
        return any(
            name not in self.progress or not self.progress[name].finished for name in self.unloads
        ) or any(p.seal for t in self.state.topics.values() for p in t.partitions)

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.poll_timeout_ms / 1000)
        self._session = aiohttp.ClientSession(timeout=timeout)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="controller")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self._session is not None:
            await self._session.close()

    def kick(self) -> None:
        """Run a step now (after an apply) instead of at the next poll."""
        self._kick.set()

    # ------------------------------------------------------------------ desired state

    def apply(self, resources: list[dict[str, Any]]) -> list[str]:
        names = []
        for resource in resources:
            spec = spec_of(resource)  # validates the name and counts
            self.resources[spec.name] = resource
            names.append(spec.name)
        self.store.save(self.state, self.resources)
        self.kick()
        return names

    def delete(self, names: list[str]) -> list[str]:
        gone = [n for n in names if self.resources.pop(n, None) is not None]
        self.store.save(self.state, self.resources)
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
        now = rfc3339(wall_ms())
        results = []
        for resource in resources:
            name = full_name(resource)
            if name in self.unloads:
                results.append((name, "unchanged"))
                continue
            doc = json.loads(json.dumps(resource))
            doc.pop("status", None)
            meta = doc["metadata"]
            meta.setdefault("namespace", "default")
            meta["creationTimestamp"] = now
            meta["generation"] = 1
            self.unloads[name] = doc
            results.append((name, "created"))
        self.store.save_unloads(self.unloads, self.progress, _rfc3339())
        self.kick()
        return results

    def delete_unloads(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(deleted, deferred): an Unload with moves in flight stays until they finish."""
        deleted, deferred = [], []
        for name in names:
            doc = self.unloads.get(name)
            if doc is None:
                continue
            if self._moving(name):
                doc["metadata"].setdefault("deletionTimestamp", rfc3339(wall_ms()))
                deferred.append(name)
            else:
                del self.unloads[name]
                self.progress.pop(name, None)
                deleted.append(name)
        self.store.save_unloads(self.unloads, self.progress, _rfc3339())
        self.kick()
        return deleted, deferred

    def _moving(self, name: str) -> bool:
        progress = self.progress.get(name)
        return progress is not None and any(m.in_flight for m in progress.moves)

    def _finalize_deletions(self) -> bool:
        """Remove deleted Unloads whose moves are no longer in flight; True if any was."""
        done = [
            n
            for n, doc in self.unloads.items()
            if doc["metadata"].get("deletionTimestamp") is not None and not self._moving(n)
        ]
        for name in done:
            del self.unloads[name]
            self.progress.pop(name, None)
            log.info("unload %s deleted: its moves have finished", name)
        return bool(done)

    # ------------------------------------------------------------------ the loop

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

    async def step(self) -> Decision:
        await asyncio.gather(*(self._poll(b) for b in self.settings.brokers))
        now = wall_ms()
        decision = reconcile(
            self.state,
            self.specs,
            self.heartbeats,
            now,
            self.settings.control,
            observing_since_ms=self.started_ms,
            unload_requests=self.unload_requests(),
            unload_progress=self.progress,
        )
        self.steps += 1
        self.last_decision = decision
        for event in decision.events:
            log.info("%s %s: %s", event.kind, event.subject, event.message)
        problems = {p.topic: (p.reason, p.message) for p in reversed(decision.problems)}
        if decision.changed or problems != self._saved_problems:
            # Persist first: a decision that is not on disk must never be pushed (a restart
            # from the older documents could hand the same epoch to another leader).
            self.store.save(decision.state, self.resources, problems, _rfc3339())
            self._saved_problems = problems
            if decision.changed:
                self.generation_bumps += 1
                self.state = decision.state
        if decision.unloads_changed or set(decision.unloads) != set(self.progress):
            # After the state (the core recognises a reassignment whose progress was lost,
            # not the other way round), before the push.
            self.progress = dict(decision.unloads)
            self._finalize_deletions()
            self.store.save_unloads(self.unloads, self.progress, _rfc3339())
        elif self._finalize_deletions():
            self.store.save_unloads(self.unloads, self.progress, _rfc3339())
        await self._push(decision)
        return decision

    async def _poll(self, broker: BrokerEndpoint) -> None:
        assert self._session is not None
        try:
            async with self._session.get(f"{broker.admin_url}/v1/heartbeat") as resp:
                doc = await resp.json()
            heartbeat = Heartbeat.from_json(doc, received_ms=wall_ms())
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError) and broker.id in self.heartbeats:
                # Nothing listens on the admin port: the process is gone. That is proof, not
                # silence, so do not wait out the liveness TTL (a timeout still does).
                log.warning("broker %s refused the heartbeat poll: treating it as down", broker.id)
                del self.heartbeats[broker.id]
            return
        except (aiohttp.ClientError, TimeoutError, ValueError, HeadraceError) as exc:
            log.debug("no heartbeat from broker %s: %s", broker.id, exc)
            return
        if heartbeat.broker_id != broker.id:
            log.error(
                "broker at %s says it is %s, expected %s",
                broker.admin_url,
                heartbeat.broker_id,
                broker.id,
            )
            return
        self.heartbeats[broker.id] = heartbeat
        self.broker_generations[broker.id] = int(doc.get("generation", 0))

    def topology_document(self) -> dict[str, Any]:
        """The document brokers apply (see ``broker.replicating.ClusterTopology``)."""
        specs = {s.name: s for s in self.specs}
        state = self.state
        decision = self.last_decision
        live = decision.liveness.live if decision is not None else frozenset(state.brokers)
        # generation, cluster id and brokers from the one snapshot builder (the one clients
        # route by), so brokers and clients are told the same
        snapshot = topology.snapshot(state, self.settings.cluster_id)
        return {
            "generation": snapshot.generation,
            "cluster_id": snapshot.cluster_id,
            "brokers": [
                {"id": b.id, "host": b.host, "port": b.port, "admin_port": b.admin_port}
                for b in snapshot.brokers
            ],
            "topics": [
                {
                    "name": name,
                    "partitions": len(topic.partitions),
                    "partitioning_version": topic.partitioning_version,
                    "min_in_sync": specs[name].min_in_sync if name in specs else 1,
                    "config": topic_config(self.resources[name]) if name in self.resources else {},
                    "assignments": [
                        {
                            "partition": p.partition,
                            "replicas": list(p.replicas),
                            # a candidate is told it leads, so it can promote itself
                            "leader": p.owner,
                            "epoch": p.leader_epoch,
                            # A new leader seeds its LRS from this: never with dead brokers,
                            # whose missing fetches would hold the HW (and acks=all) back
                            # until they time out of the set.
                            "lrs": [r for r in p.live_replicas if r in live],
                            # unloads: the leader seals; a higher ``moves`` makes every
                            # replica drop its copy and open it empty at ``startOffset``
                            # (null: after the last offset in the object store)
                            "seal": p.seal,
                            "moves": p.moves,
                            "startOffset": p.start_offset,
                        }
                        for p in topic.partitions
                    ],
                    "cohort_plans": {
                        cohort: {m: list(ps) for m, ps in plan.assignment.items()}
                        for cohort, plan in topic.cohort_plans.items()
                    },
                }
                for name, topic in sorted(state.topics.items())
            ],
        }

    async def _push(self, decision: Decision) -> None:
        assert self._session is not None
        if self.state.generation == 0:
            return
        doc = self.topology_document()
        behind = [
            b
            for b in self.settings.brokers
            if b.id in decision.liveness.live
            and self.broker_generations.get(b.id, 0) < self.state.generation
        ]
        for broker in behind:
            try:
                async with self._session.post(f"{broker.admin_url}/v1/topology", json=doc) as resp:
                    body = await resp.json()
                if resp.status == 200:
                    self.pushes += 1
                    self.broker_generations[broker.id] = int(body.get("generation") or 0)
                else:
                    log.warning(
                        "broker %s refused topology %d: %s", broker.id, self.state.generation, body
                    )
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.info("push to broker %s failed: %s", broker.id, exc)

    def state_document(self) -> dict[str, Any]:
        decision = self.last_decision
        return {
            "cluster": self.state.to_json(),
            "live": sorted(decision.liveness.live) if decision else [],
            "adoptionFloor": decision.adoption_floor if decision else None,
            "problems": [
                {"topic": p.topic, "reason": p.reason, "message": p.message}
                for p in decision.problems
            ]
            if decision
            else [],
            "unloads": self.store.unload_documents(),
            "steps": self.steps,
            "generationBumps": self.generation_bumps,
            "pushes": self.pushes,
        }


def _normal_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """An Unload spec compared by meaning: the partition list is a set."""
    return {**spec, "partitions": sorted(spec.get("partitions") or [])}
