"""A controller killed between any two writes of a repartition's cutover resumes it with
one version bump: the marker and the bump are one Topic status write, and the version is
bumped only when no marker exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from controller_fakes import TOPIC, Crash, CrashingStore, ManualClock, make, repartition

from headrace.controller.store import FileStore


@pytest.mark.parametrize("crash_at", range(5))
async def test_a_controller_killed_mid_cutover_resumes_with_one_bump(
    tmp_path: Path, crash_at: int
) -> None:
    clock = ManualClock()
    first = make(tmp_path, clock=clock)
    first.apply([json.loads(json.dumps(TOPIC))])
    for _ in range(3):
        await first.step()
    first.apply_repartitions([repartition(4)])
    crashing = CrashingStore(FileStore(tmp_path / "state"), crash_at)
    dying = make(tmp_path, fleet=first.fleet, status_store=crashing, clock=clock)

    async def run_until_it_dies() -> None:
        for _ in range(10):
            await dying.step()

    with pytest.raises(Crash):
        await run_until_it_dies()
    versions = []
    again = make(tmp_path, fleet=first.fleet, clock=clock)
    for _ in range(4):
        await again.step()
        versions.append(again.state.topics["default/orders"].partitioning_version)
    topic = again.state.topics["default/orders"]
    assert versions[-1] == 2 and set(versions) <= {1, 2}
    assert len(topic.partitions) == 4 and topic.transition is not None
    assert topic.transition.from_version == 1
    progress = again.loop.repartition_progress["default/grow"]
    assert progress.phase.value in ("CuttingOver", "Draining")
    assert (progress.from_version, progress.to_version) == (1, 2)
