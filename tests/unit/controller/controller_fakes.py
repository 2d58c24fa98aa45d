"""Fakes for the controller's tests: a controller whose brokers are scripted (no HTTP)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrace.control.model import (
    Heartbeat,
    PartitionReport,
    PartitionState,
    SealReport,
)
from headrace.control.reconcile import Decision
from headrace.controller.controlling import (
    Controller,
    ControllerSettings,
    wall_ms,
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


class ScriptedController(Controller):
    """A controller whose brokers are a fake fleet: no HTTP."""

    def __init__(self, settings: ControllerSettings) -> None:
        super().__init__(settings)
        self.down: set[int] = set()
        #: brokers that do not seal when told to
        self.stuck: set[int] = set()
        self.pushed: list[dict[str, Any]] = []
        self.log_end = 10

    async def _poll(self, broker: BrokerEndpoint) -> None:
        if broker.id in self.down:
            return
        reports = []
        for topic in self.state.topics.values():
            for p in topic.partitions:
                if broker.id not in p.replicas:
                    continue
                leads = p.state is PartitionState.ONLINE and p.leader == broker.id
                sealed = None
                if leads and p.seal and broker.id not in self.stuck:
                    sealed = SealReport(self.log_end - 1, p.leader_epoch, p.moves, True)
                start = p.start_offset if p.start_offset is not None else 0
                reports.append(
                    PartitionReport(
                        topic.name,
                        p.partition,
                        "leader" if leads else "follower",
                        p.leader_epoch,
                        self.log_end,
                        self.log_end,
                        (broker.id,) if leads else (),
                        p.moves,
                        start,
                        sealed,
                    )
                )
        info = BrokerEndpoint(broker.id, broker.host, 9092, broker.admin_port)
        self.heartbeats[broker.id] = Heartbeat(info, wall_ms(), partitions=tuple(reports))
        self.broker_generations[broker.id] = self.state.generation

    async def _push(self, decision: Decision) -> None:
        self.pushed.append(self.topology_document())


def make(tmp_path: Path, brokers: int = 3) -> ScriptedController:
    endpoints = tuple(
        BrokerEndpoint(b, f"127.0.0.{2 + b}", admin_port=9644) for b in range(brokers)
    )
    return ScriptedController(ControllerSettings(tmp_path / "state", endpoints))


async def settle(c: Controller, steps: int = 3) -> None:
    for _ in range(steps):
        await c.step()
