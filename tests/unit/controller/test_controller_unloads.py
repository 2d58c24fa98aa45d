"""The local controller with unloads: documents on disk, the step loop, apply/delete rules.

Brokers are scripted: ``_poll`` and ``_push`` are replaced by a fake fleet that
answers from the last pushed state (a leader told to seal reports its seal,
a reassigned leader reports its new incarnation), so no sockets are opened.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from controller_fakes import TOPIC, make, settle, unload

from headrace.control import documents as store
from headrace.controller.controlling import UnloadConflict
from headrace.resources import Unload
from headrace.resources.operations import Unload as UnloadModel


def unload_doc(tmp_path: Path, name: str = "move") -> dict[str, Any]:
    return dict(json.loads((tmp_path / "state" / "unloads" / f"default.{name}.json").read_text()))


async def test_an_unload_is_carried_out_and_its_documents_validate(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([TOPIC])
    await settle(c)
    owner = c.state.topics["default/orders"].partitions[0].leader
    target = (owner + 1) % 3  # type: ignore[operator]
    assert c.apply_unloads([unload(target=target)]) == [("default/move", "created")]
    assert c.transitioning
    doc = unload_doc(tmp_path)
    assert doc["metadata"]["generation"] == 1 and "creationTimestamp" in doc["metadata"]
    for _ in range(6):
        await c.step()
    doc = unload_doc(tmp_path)
    Unload.from_manifest(doc)  # strict, as the API server validates
    UnloadModel.model_validate(doc)
    status = doc["status"]
    assert status["phase"] == "Completed"
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Completed")
    (move,) = status["moves"]
    assert move["fromBroker"] == owner and move["toBroker"] == target
    assert move["sealedOffset"] == c.log_end - 1
    assert move["verification"]["result"] == "Passed"
    assert move["moves"] == 1 and "recovery" not in move
    assert not c.transitioning
    p = c.state.topics["default/orders"].partitions[0]
    assert (p.leader, p.moves, p.start_offset, p.seal) == (target, 1, c.log_end, False)
    topic_doc = json.loads((tmp_path / "state" / "topics" / "default.orders.json").read_text())
    assert topic_doc["status"]["partitions"][0]["moves"] == 1
    assert topic_doc["status"]["partitions"][0]["startOffset"] == c.log_end
    sealing = [d for d in c.pushed if d["topics"][0]["assignments"][0]["seal"]]
    assert sealing, "the seal marker was pushed"
    last = c.pushed[-1]["topics"][0]["assignments"][0]
    assert (last["seal"], last["moves"], last["startOffset"], last["leader"]) == (
        False,
        1,
        c.log_end,
        target,
    )
    state = c.state_document()
    assert [u["metadata"]["name"] for u in state["unloads"]] == ["move"]


async def test_a_restarted_controller_reloads_the_progress_and_carries_on(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([TOPIC])
    await settle(c)
    owner = c.state.topics["default/orders"].partitions[0].leader
    assert owner is not None
    c.stuck.add(owner)
    c.apply_unloads([unload(target=(owner + 1) % 3)])
    await settle(c, 2)
    assert c.progress["default/move"].moves[0].phase.value == "Sealing"
    before_doc = unload_doc(tmp_path)

    again = make(tmp_path)
    again.stuck.add(owner)
    assert again.progress == c.progress, "the document round-trips the core's progress exactly"
    assert again.unloads == c.unloads
    await again.step()
    assert unload_doc(tmp_path) == before_doc, "nothing new: nothing rewritten"
    again.stuck.clear()
    for _ in range(4):
        await again.step()
    assert again.progress["default/move"].phase.value == "Completed"


async def test_an_unload_is_one_shot_and_its_spec_immutable(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([TOPIC])
    c.apply_unloads([unload(partitions=[0, 1])])
    assert c.apply_unloads([unload(partitions=[1, 0])]) == [("default/move", "unchanged")]
    with pytest.raises(UnloadConflict, match="spec is immutable"):
        c.apply_unloads([unload(partitions=[1])])
    with pytest.raises(UnloadConflict):
        c.check_unloads([unload(target=2)])
    assert c.unloads["default/move"]["spec"]["partitions"] == [0, 1]


async def test_deleting_a_moving_unload_waits_for_its_moves(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([TOPIC])
    await settle(c)
    owner = c.state.topics["default/orders"].partitions[0].leader
    assert owner is not None
    c.stuck.add(owner)
    c.apply_unloads([unload(target=(owner + 1) % 3)])
    c.apply_unloads([unload("idle", target=7)])  # unknown target: fails, never moves
    await settle(c, 2)
    assert c.delete_unloads(["default/move", "default/idle", "default/none"]) == (
        ["default/idle"],
        ["default/move"],
    )
    assert "deletionTimestamp" in unload_doc(tmp_path)["metadata"]
    assert not (tmp_path / "state" / "unloads" / "default.idle.json").exists()
    with pytest.raises(UnloadConflict, match="being deleted"):
        c.apply_unloads([unload(target=(owner + 1) % 3)])
    await c.step()
    assert "default/move" in c.unloads, "still sealing: kept"
    c.stuck.clear()
    for _ in range(4):
        await c.step()
    assert "default/move" not in c.unloads
    assert not (tmp_path / "state" / "unloads" / "default.move.json").exists()
    assert c.state.topics["default/orders"].partitions[0].moves == 1, "the move finished"


async def test_deleting_an_unload_cancels_its_moves_not_started(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([TOPIC])
    await settle(c)
    owner = c.state.topics["default/orders"].partitions[0].leader
    assert owner is not None
    c.stuck.add(owner)
    c.apply_unloads([unload("first", target=(owner + 1) % 3)])
    await c.step()
    c.apply_unloads([unload("second", partitions=[0, 1], target=(owner + 2) % 3)])
    await c.step()
    assert c.delete_unloads(["default/second"]) == ([], ["default/second"])
    await c.step()
    second = c.progress["default/second"]
    assert second.moves[0].phase.value == "Failed" and "cancelled" in second.moves[0].message


def test_topic_config_carries_only_the_settings_that_are_set() -> None:
    topic = json.loads(json.dumps(TOPIC))
    assert store.topic_config(topic) == {}
    topic["spec"].update(
        {
            "retention": {"ms": 60_000, "bytes": -1},
            "segments": {"bytes": 1 << 20, "ms": 5_000},
            "maxBatchBytes": 65536,
            "tieredStorage": {
                "enabled": True,
                "uploadIntervalSeconds": 2,
                "localRetentionMs": 1000,
                "localRetentionBytes": 4096,
            },
        }
    )
    assert store.topic_config(topic) == {
        "retention_ms": 60_000,
        "retention_bytes": -1,
        "segment_bytes": 1 << 20,
        "segment_ms": 5_000,
        "max_batch_bytes": 65536,
        "tiered": True,
        "upload_interval_ms": 2_000,
        "local_retention_ms": 1000,
        "local_retention_bytes": 4096,
    }
    topic["spec"] = {**TOPIC["spec"], "tieredStorage": {"enabled": False}}  # type: ignore[dict-item]
    assert store.topic_config(topic) == {"tiered": False}
    assert store.spec_of(topic).tiered is False
    assert store.spec_of(TOPIC).tiered is True  # type: ignore[arg-type]


async def test_the_topology_document_carries_the_topic_config(tmp_path: Path) -> None:
    c = make(tmp_path)
    topic = json.loads(json.dumps(TOPIC))
    topic["spec"]["tieredStorage"] = {"uploadIntervalSeconds": 5}
    c.apply([topic])
    await settle(c)
    (t,) = c.pushed[-1]["topics"]
    assert t["config"] == {"uploadIntervalMs": 5000}
    assert {"seal", "moves", "startOffset"} <= set(t["assignments"][0])


async def test_an_unload_of_an_untiered_topic_fails_with_a_reason(tmp_path: Path) -> None:
    c = make(tmp_path)
    topic = json.loads(json.dumps(TOPIC))
    topic["spec"]["tieredStorage"] = {"enabled": False}
    c.apply([topic])
    await settle(c)
    c.apply_unloads([unload()])
    await c.step()
    status = unload_doc(tmp_path)["status"]
    assert status["phase"] == "Failed"
    assert "tiered storage disabled" in status["conditions"][0]["message"]
    assert not c.transitioning
