"""A controller killed between any two writes of a commit recovers, and reuses no generation.

The store port is wrapped to die after the k-th write, for every k of a
commit that changes several Topic statuses, deletes a topic and creates one
(and, for every k, again after the j-th write of the recovery's own commit).
A fresh controller over the same files and the same brokers must then push
the content it loaded under a generation no broker holds and no document was
ever stamped with, and the brokers must end up holding exactly the
controller's state. The scripted brokers fence pushes by generation as real
ones do, and fail the test if a generation is ever accepted with two
different contents.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from controller_fakes import (
    TOPIC,
    Crash,
    CrashingStore,
    ManualClock,
    ScriptedController,
    ScriptedFleet,
    make,
)

from headrace.control import documents
from headrace.control.settings import ControlSettings
from headrace.controller.store import FileStore
from headrace.protocol.endpoints import BrokerEndpoint

TTL = ControlSettings().liveness_ttl_ms


def topic(name: str) -> dict[str, Any]:
    doc = json.loads(json.dumps(TOPIC))
    doc["metadata"]["name"] = name
    doc["spec"].update({"partitions": 3, "replicas": 2})
    return dict(doc)


def stamps(root: Path) -> list[int]:
    """Every generation a persisted document names."""
    found = [int(json.loads((root / "cluster.json").read_text())["topologyGeneration"])]
    for path in (root / "topics").glob("*.json"):
        status = json.loads(path.read_text()).get("status") or {}
        found.extend(v for k, v in status.items() if k == "topologyGeneration")
    return found


async def prepared(tmp_path: Path) -> tuple[ScriptedFleet, ManualClock, int]:
    """Three topics on three brokers, settled: every broker holds the state. The generation."""
    clock = ManualClock()
    c = make(tmp_path, clock=clock)
    c.apply([topic("a"), topic("b"), topic("c")])
    for _ in range(3):
        await c.step()
    assert {c.fleet.generation(b) for b in range(3)} == {c.state.generation}
    assert c.fleet.held[0] == c.topology_document()
    return c.fleet, clock, c.state.generation


async def the_big_commit(c: ScriptedController, clock: ManualClock) -> None:
    """One step whose commit rewrites every Topic status, drops one topic and adds one."""
    c.delete(["default/c"])
    c.apply([topic("d")])
    c.fleet.down.add(0)  # silent: dead once the TTL has passed, so its partitions elect
    clock.advance(TTL + 1)
    await c.step()


async def recovered(
    tmp_path: Path, fleet: ScriptedFleet, clock: ManualClock, crash_at: int | None = None
) -> ScriptedController:
    """A fresh controller over the same files and brokers, stepped until it has caught up."""
    store = FileStore(tmp_path / "state")
    crashing = CrashingStore(store, crash_at if crash_at is not None else 1 << 30)
    c = make(tmp_path, fleet=fleet, status_store=crashing, clock=clock)
    await c.step()
    # Before anything else happens (warming up, it acts on positive evidence only, and
    # none comes while its candidates have not been told), the brokers hold its state.
    for b in sorted(set(range(3)) - fleet.down):
        assert fleet.held[b] == c.topology_document(), f"broker {b} holds other content"
    for _ in range(4):
        clock.advance(TTL // 2)  # the election's candidates promote themselves on the way
        await c.step()
    return c


def assert_consistent(c: ScriptedController, root: Path, before: int) -> None:
    fleet = c.fleet
    live = [b for b in range(3) if b not in fleet.down]
    assert c.state.generation > before
    for b in live:
        assert fleet.generation(b) == c.state.generation, f"broker {b} is behind"
        assert fleet.held[b] == c.topology_document(), f"broker {b} holds other content"
    names = [t["name"] for t in fleet.held[live[0]]["topics"]]
    assert names == ["default/a", "default/b", "default/d"]
    loaded = FileStore(root).load()
    again = documents.restore(
        loaded.cluster, {n: d.get("status") or {} for n, d in loaded.topics.items()}
    )
    assert not again.torn, "the last commit is whole"
    assert again.state == c.state, "what is on disk is what the brokers hold"


async def writes_of_the_big_commit(tmp_path: Path) -> int:
    fleet, clock, _ = await prepared(tmp_path)
    counter = CrashingStore(FileStore(tmp_path / "state"), 1 << 30)
    c = make(tmp_path, fleet=fleet, status_store=counter, clock=clock)
    await c.step()
    counter.log.clear()
    await the_big_commit(c, clock)
    assert counter.log == [
        "topic default/a",
        "topic default/b",
        "topic default/d",
        "cluster",
    ], counter.log
    return len(counter.log)


WRITES = 4  # checked by test_the_big_commit_writes_the_topics_then_the_cluster_document


async def test_the_big_commit_writes_the_topics_then_the_cluster_document(
    tmp_path: Path,
) -> None:
    assert await writes_of_the_big_commit(tmp_path) == WRITES


@pytest.mark.parametrize("k", range(WRITES + 1))
async def test_a_crash_after_any_write_is_recovered_under_a_new_generation(
    tmp_path: Path, k: int
) -> None:
    fleet, clock, generation = await prepared(tmp_path)
    store = CrashingStore(FileStore(tmp_path / "state"), 1 << 30)
    c = make(tmp_path, fleet=fleet, status_store=store, clock=clock)
    await c.step()
    store.writes = k
    if k < WRITES:
        with pytest.raises(Crash):
            await the_big_commit(c, clock)
    else:
        await the_big_commit(c, clock)
    persisted = max(stamps(tmp_path / "state"))
    held = max(fleet.generation(b) for b in range(3))
    after = await recovered(tmp_path, fleet, clock)
    assert_consistent(after, tmp_path / "state", max(generation, held))
    first = min(g for g in fleet.accepted if g > held)
    assert first > held
    if 0 < k < WRITES:  # documents stamped, no commit record: the recovery goes above them
        assert first > persisted, f"generation {first} was already stamped on a document"


@pytest.mark.parametrize("k", range(1, WRITES))
@pytest.mark.parametrize("j", range(WRITES))
async def test_a_crash_during_the_recovery_is_recovered_too(tmp_path: Path, k: int, j: int) -> None:
    fleet, clock, generation = await prepared(tmp_path)
    store = CrashingStore(FileStore(tmp_path / "state"), 1 << 30)
    c = make(tmp_path, fleet=fleet, status_store=store, clock=clock)
    await c.step()
    store.writes = k
    with pytest.raises(Crash):
        await the_big_commit(c, clock)
    with pytest.raises(Crash):
        await recovered(tmp_path, fleet, clock, crash_at=j)
    after = await recovered(tmp_path, fleet, clock)
    assert_consistent(after, tmp_path / "state", generation)


async def test_a_clean_restart_commits_and_pushes_nothing(tmp_path: Path) -> None:
    fleet, clock, generation = await prepared(tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "state").rglob("*.json")}
    again = make(tmp_path, fleet=fleet, clock=clock)
    for _ in range(3):
        await again.step()
    assert again.state.generation == generation and again.generation_bumps == 0
    assert max(fleet.accepted) == generation
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "state").rglob("*.json")}
    assert after == before, "nothing rewritten"


@pytest.mark.parametrize("k", range(1, WRITES))
async def test_a_failed_commit_in_a_running_controller_is_not_reused(
    tmp_path: Path, k: int
) -> None:
    fleet, clock, generation = await prepared(tmp_path)
    store = CrashingStore(FileStore(tmp_path / "state"), 1 << 30)
    c = make(tmp_path, fleet=fleet, status_store=store, clock=clock)
    await c.step()
    store.writes = k
    with pytest.raises(Crash):
        await the_big_commit(c, clock)  # the store failed; the process lives on
    stamped = max(stamps(tmp_path / "state"))
    assert stamped == generation + 1
    store.writes = 1 << 30
    await c.step()
    assert c.state.generation > stamped, "not under the generation the failed commit stamped"
    assert_consistent(c, tmp_path / "state", stamped)


@pytest.mark.parametrize("last", ["delete", "broker moved"])
async def test_a_lost_commit_record_is_recommitted_above_what_the_brokers_hold(
    tmp_path: Path, last: str
) -> None:
    """The cluster document lost after a commit that stamped no Topic status (a deletion,
    a broker's new address): the Topic statuses restore an older generation than the
    brokers hold. The controller must number its commits above the brokers' (else they
    ignore its pushes, and it counts their old topology as its own applied), so a topic
    created afterwards reaches them."""
    fleet, clock, _ = await prepared(tmp_path)
    c = make(tmp_path, fleet=fleet, clock=clock)
    await c.step()
    if last == "delete":
        c.delete(["default/c"])
    else:
        moved = fleet.endpoints[2]
        fleet.endpoints[2] = BrokerEndpoint(2, "127.0.0.9", moved.port, moved.admin_port)
    await c.step()
    held = c.state.generation
    assert {fleet.generation(b) for b in range(3)} == {held}
    assert max(stamps(tmp_path / "state")[1:]) < held  # no Topic status names it
    (tmp_path / "state" / "cluster.json").unlink()

    again = make(tmp_path, fleet=fleet, clock=clock)
    again.apply([topic("d")])
    for _ in range(4):
        clock.advance(TTL // 2)
        await again.step()
    assert again.state.generation > held
    for b in range(3):
        assert fleet.held[b] == again.topology_document(), f"broker {b} holds other content"
    assert "default/d" in [t["name"] for t in fleet.held[0]["topics"]]


async def test_a_controller_that_lost_its_whole_state_does_not_push_over_the_brokers(
    tmp_path: Path,
) -> None:
    """Its state directory gone, a controller knows none of the topics the brokers host: a
    push of its state would delete them all, so it does not number its commits above
    the brokers' (which then ignore them, as they always did)."""
    fleet, clock, generation = await prepared(tmp_path)
    held = {b: fleet.held[b] for b in range(3)}
    shutil.rmtree(tmp_path / "state")
    again = make(tmp_path, fleet=fleet, clock=clock)
    for _ in range(4):
        clock.advance(TTL // 2)
        await again.step()
    assert again.state.generation <= generation
    assert {b: fleet.held[b] for b in range(3)} == held, "the brokers' topics are kept"
