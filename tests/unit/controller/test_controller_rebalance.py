"""Preferred-leader rebalance through the whole control loop, over scripted brokers.

A broker that leads partitions dies, its partitions fail over, it comes back
and catches up; after the quiet period every partition is led by its
preferred replica again, each at a higher epoch, and every move was pushed
to the brokers before they acted on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controller_fakes import TOPIC, ManualClock, make, settle

from headrace.control.settings import ControlSettings

SETTINGS = ControlSettings()


def topic() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(TOPIC))
    doc["spec"].update({"partitions": 3, "replicas": 3, "minInSync": 1})
    return doc


async def test_leadership_returns_to_the_preferred_replica_after_the_quiet_period(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    c = make(tmp_path, clock=clock)
    c.apply([topic()])
    await settle(c)
    before = c.state.topics["default/orders"].partitions
    preferred = {p.partition: p.replicas[0] for p in before}
    assert {p.partition: p.leader for p in before} == preferred
    victim = before[0].replicas[0]

    c.fleet.down.add(victim)
    clock.advance(SETTINGS.liveness_ttl_ms + 1)
    await settle(c)
    failed_over = c.state.topics["default/orders"].partitions
    assert all(p.leader not in (victim, None) for p in failed_over)

    c.fleet.down.discard(victim)
    clock.advance(1_000)
    await settle(c)
    waiting = c.state.topics["default/orders"].partitions
    assert all(p.leader != victim for p in waiting), "no move before the quiet period"
    moved = [p for p in waiting if p.replicas[0] == victim]
    assert moved and all(p.deadline_ms is not None for p in moved)

    clock.advance(SETTINGS.preferred_leader_quiet_ms)
    await settle(c)
    after = c.state.topics["default/orders"].partitions
    assert {p.partition: p.leader for p in after} == preferred
    for old, new in zip(failed_over, after, strict=True):
        if new.replicas[0] == victim:
            assert new.leader_epoch > old.leader_epoch
        assert new.deadline_ms is None
    # every broker holds the state that says so
    assert {c.fleet.generation(b) for b in range(3)} == {c.state.generation}
