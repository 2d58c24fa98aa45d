"""The local controller keeps the desired state and hands the loop a frozen snapshot of it.

Nothing outside ``ControlLoop`` changes what the loop reconciles towards: its ``topics``,
``unloads``, ``repartitions``, ``racks`` are read-only views, ``members`` and ``deletions`` read-only
properties, and what is applied while a step awaits its brokers reaches the loop at the
next step, never in the middle of one (as in the kopf operator).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from controller_fakes import TOPIC, ManualClock, ScriptedFleet, make, repartition, settle, unload

from headrace.control.looping import Report
from headrace.control.model import DeletionRequest
from headrace.protocol.endpoints import BrokerEndpoint

ORDERS = "default/orders"
AUDIT = "default/audit"
ENDPOINTS = tuple(BrokerEndpoint(b, f"127.0.0.{2 + b}", admin_port=9644) for b in range(3))


def topic(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(TOPIC))
    doc["metadata"]["name"] = name
    return doc


class FleetWithAHook(ScriptedFleet):
    """A scripted fleet that runs ``during_poll`` while a step awaits its heartbeats."""

    def __init__(self) -> None:
        super().__init__(ENDPOINTS, ManualClock())
        self.during_poll: Callable[[], None] | None = None

    async def poll(self) -> dict[int, Report | None]:
        if self.during_poll is not None:
            self.during_poll()
        return dict(await super().poll())


async def test_the_loops_desired_state_cannot_be_changed_from_outside(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([topic("orders")])
    c.apply_unloads([unload()])
    await settle(c)
    loop = c.loop
    with pytest.raises(TypeError):
        loop.topics[AUDIT] = topic("audit")  # type: ignore[index]
    with pytest.raises(TypeError):
        del loop.topics[ORDERS]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        loop.unloads["default/other"] = unload("other")  # type: ignore[index]
    with pytest.raises(TypeError):
        loop.repartitions["default/grow"] = repartition(3)  # type: ignore[index]
    with pytest.raises(TypeError):
        loop.racks[0] = "eu-1a"  # type: ignore[index]
    with pytest.raises(AttributeError):
        loop.topics = {}  # type: ignore[misc]
    with pytest.raises(AttributeError):
        loop.members = frozenset({0})  # type: ignore[misc]
    with pytest.raises(AttributeError):
        loop.deletions = frozenset({DeletionRequest(ORDERS, retain=False)})  # type: ignore[misc]
    assert set(loop.topics) == {ORDERS} and set(loop.unloads) == {"default/move"}
    assert loop.members is None and loop.deletions == frozenset()

    # what the controller hands over is frozen too: a later change of its own is not in it
    snapshot = c.desired()
    with pytest.raises(TypeError):
        snapshot.topics[AUDIT] = topic("audit")  # type: ignore[index]
    c.apply([topic("audit")])
    assert set(snapshot.topics) == {ORDERS}
    assert set(c.desired().topics) == {ORDERS, AUDIT}


async def test_what_changes_during_a_step_reaches_the_loop_at_the_next_step(
    tmp_path: Path,
) -> None:
    fleet = FleetWithAHook()
    c = make(tmp_path, fleet=fleet)
    c.apply([topic("orders")])
    await settle(c)
    assert ORDERS in c.state.topics

    def change_everything() -> None:
        c.apply([topic("audit")])
        c.apply_repartitions([repartition(3)])
        c.apply_unloads([unload()])
        c.delete([ORDERS])
        c.set_members(list(ENDPOINTS[:2]))

    fleet.during_poll = change_everything
    await c.step()
    fleet.during_poll = None
    # the step decided on what it took at its start, and the loop still holds just that
    assert set(c.loop.topics) == {ORDERS}
    assert dict(c.loop.unloads) == {}
    assert dict(c.loop.repartitions) == {}
    assert c.loop.members is None
    assert c.loop.deletions == frozenset()
    assert set(c.state.topics) == {ORDERS}, "deleted only by the step that took the request"
    assert "default/move" not in c.progress

    await c.step()
    assert set(c.loop.topics) == {AUDIT}
    assert set(c.loop.unloads) == {"default/move"}
    assert set(c.loop.repartitions) == {"default/grow"}
    assert c.loop.members == {0, 1}
    assert c.loop.deletions == {DeletionRequest(ORDERS, retain=False)}
    assert ORDERS not in c.state.topics and AUDIT in c.state.topics
