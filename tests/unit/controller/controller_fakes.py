"""Fakes for the controller's tests: a scripted broker fleet (no HTTP) and a store that crashes.

Both implement the control loop's ports (``headrace.control.looping``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headrace.control.looping import Clock, Report, StatusStore, Stored
from headrace.controller.controlling import Controller, ControllerSettings
from headrace.fleet.clock import SystemClock
from headrace.protocol.coordination import (
    CohortReport,
    Heartbeat,
    PartitionReport,
    SealReport,
)
from headrace.protocol.endpoints import BrokerEndpoint

TOPIC = {
    "apiVersion": "headrace.dev/v1alpha1",
    "kind": "Topic",
    "metadata": {"name": "orders", "namespace": "default"},
    "spec": {"clusterRef": {"name": "local"}, "partitions": 2, "replicas": 1, "minInSync": 1},
}


def unload(
    name: str = "move", partitions: list[int] | None = None, target: int | None = 1
) -> dict[str, Any]:
    spec: dict[str, Any] = {"topicRef": {"name": "orders"}, "partitions": partitions or [0]}
    if target is not None:
        spec["targetBroker"] = target
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Unload",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def repartition(partitions: int, name: str = "grow") -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Repartition",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"topicRef": {"name": "orders"}, "partitions": partitions},
    }


class ScriptedFleet:
    """Brokers that act on the topology pushed to them (a ``BrokerFleet``).

    Each broker holds the last topology it accepted and fences pushes by
    generation as a real one does. It reports from what it holds: it leads
    what it was told to lead (a candidate promotes itself, unless it
    ``refuses``), with every replica that is not ``down`` in its live replica
    set; a leader told to seal reports its seal (unless ``stuck``), a
    reassigned leader its new incarnation, and every broker the cohort
    ``members`` connected to it.

    ``accepted`` records every generation any broker accepted, with its
    content: a generation accepted twice with different content fails the
    test that made it.
    """

    def __init__(self, endpoints: tuple[BrokerEndpoint, ...], clock: Clock) -> None:
        self.endpoints = {b.id: b for b in endpoints}
        self.clock = clock
        self.down: set[int] = set()
        #: brokers that do not seal when told to
        self.stuck: set[int] = set()
        #: brokers that do not promote themselves when nominated (leaders stay leaders)
        self.refuses: set[int] = set()
        #: broker -> (topic, cohort) -> the ids of the members connected to it
        self.members: dict[int, dict[tuple[str, str], set[str]]] = {}
        #: broker -> (topic, partition) -> the epoch it leads at
        self.leading: dict[int, dict[tuple[str, int], int]] = {}
        #: every topology document a broker accepted with a new generation, in order
        self.pushed: list[dict[str, Any]] = []
        self.log_end = 10
        #: what each broker holds
        self.held: dict[int, dict[str, Any]] = {}
        self.accepted: dict[int, dict[str, Any]] = {}

    def generation(self, broker_id: int) -> int:
        return int(self.held.get(broker_id, {}).get("generation", 0))

    async def poll(self) -> Mapping[int, Report | None]:
        return {b: self._report(b) for b in self.endpoints if b not in self.down}

    def _report(self, broker_id: int) -> Report:
        endpoint = self.endpoints[broker_id]
        topology = self.held.get(broker_id, {})
        reports = []
        for topic in topology.get("topics", []):
            for a in topic["assignments"]:
                if broker_id not in a["replicas"]:
                    continue
                key = (topic["name"], a["partition"])
                leading = self.leading.setdefault(broker_id, {})
                leads = a["leader"] == broker_id and (
                    broker_id not in self.refuses or leading.get(key) == a["epoch"]
                )
                if leads:
                    leading[key] = a["epoch"]
                sealed = None
                if leads and a["seal"] and broker_id not in self.stuck:
                    sealed = SealReport(self.log_end - 1, a["epoch"], a["moves"], True)
                start = a["startOffset"] if a["startOffset"] is not None else 0
                reports.append(
                    PartitionReport(
                        topic["name"],
                        a["partition"],
                        "leader" if leads else "follower",
                        a["epoch"],
                        self.log_end,
                        self.log_end,
                        tuple(r for r in a["replicas"] if r not in self.down) if leads else (),
                        a["moves"],
                        start,
                        sealed,
                    )
                )
        info = BrokerEndpoint(broker_id, endpoint.host, 9092, endpoint.admin_port)
        cohorts = tuple(
            CohortReport(t, c, tuple(sorted(ms)))
            for (t, c), ms in sorted(self.members.get(broker_id, {}).items())
        )
        heartbeat = Heartbeat(
            info,
            self.clock.now_ms(),
            partitions=tuple(reports),
            cohorts=cohorts,
            generation=self.generation(broker_id),  # as a broker reports it
        )
        return Report(heartbeat, self.generation(broker_id))

    async def push(self, broker_id: int, topology: Mapping[str, Any]) -> int | None:
        if broker_id in self.down:
            return None
        generation = int(topology["generation"])
        if generation > self.generation(broker_id):  # fenced by generation, as brokers are
            doc = dict(topology)
            known = self.accepted.setdefault(generation, doc)
            assert known == doc, f"generation {generation} was accepted with other content"
            if known is doc:
                self.pushed.append(doc)
            self.held[broker_id] = doc
        return self.generation(broker_id)


class ManualClock:
    """A ``Clock`` that moves only when told to."""

    def __init__(self, now_ms: int = 1_767_225_600_000) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Crash(Exception):
    """The process died here."""


class CrashingStore:
    """A ``StatusStore`` that dies after ``writes`` more successful writes."""

    def __init__(self, store: StatusStore, writes: int) -> None:
        self.store = store
        self.writes = writes
        self.log: list[str] = []

    def load(self) -> Stored:
        return self.store.load()

    def _tick(self, what: str) -> None:
        if self.writes == 0:
            raise Crash(f"crashed before writing {what} (after {self.log})")
        self.writes -= 1
        self.log.append(what)

    async def write_topic_status(self, name: str, status: Mapping[str, Any]) -> None:
        self._tick(f"topic {name}")
        await self.store.write_topic_status(name, status)

    async def write_cluster_status(self, status: Mapping[str, Any]) -> None:
        self._tick("cluster")
        await self.store.write_cluster_status(status)

    async def write_unload_status(self, name: str, status: Mapping[str, Any]) -> None:
        self._tick(f"unload {name}")
        await self.store.write_unload_status(name, status)

    async def release_unload(self, name: str) -> None:
        self._tick(f"release {name}")
        await self.store.release_unload(name)

    async def write_repartition_status(self, name: str, status: Mapping[str, Any]) -> None:
        self._tick(f"repartition {name}")
        await self.store.write_repartition_status(name, status)


class ScriptedController(Controller):
    """A controller over a scripted fleet (the fleet's knobs are reachable from it)."""

    def __init__(
        self,
        settings: ControllerSettings,
        fleet: ScriptedFleet | None = None,
        status_store: StatusStore | None = None,
        clock: Clock | None = None,
    ) -> None:
        clock = clock or (fleet.clock if fleet is not None else SystemClock())
        self.fleet = fleet or ScriptedFleet(settings.brokers, clock)
        super().__init__(settings, fleet=self.fleet, clock=clock, status_store=status_store)

    @property
    def down(self) -> set[int]:
        return self.fleet.down

    @property
    def stuck(self) -> set[int]:
        return self.fleet.stuck

    @property
    def pushed(self) -> list[dict[str, Any]]:
        return self.fleet.pushed

    @property
    def log_end(self) -> int:
        return self.fleet.log_end


def make(
    tmp_path: Path,
    brokers: int = 3,
    fleet: ScriptedFleet | None = None,
    status_store: StatusStore | None = None,
    clock: Clock | None = None,
) -> ScriptedController:
    endpoints = tuple(
        BrokerEndpoint(b, f"127.0.0.{2 + b}", admin_port=9644) for b in range(brokers)
    )
    settings = ControllerSettings(tmp_path / "state", endpoints)
    return ScriptedController(settings, fleet, status_store, clock)


async def settle(c: Controller, steps: int = 3) -> None:
    for _ in range(steps):
        await c.step()
