"""Local mode: ``topics delete`` is the request that takes a topic and its data away.

The control loop deletes a topic only on an explicit request (``reconcile``'s
``deletions``); in local mode the controller makes one for each name deleted, and the
brokers remove their copies (local mode has no Retain: no finalizer waits for them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controller_fakes import TOPIC, make, settle

from headrace.control.model import DeletionRequest


def topic(name: str) -> dict[str, Any]:
    doc = json.loads(json.dumps(TOPIC))
    doc["metadata"]["name"] = name
    return dict(doc)


async def test_topics_delete_deletes_the_topic_and_its_data(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([topic("a"), topic("b")])
    await settle(c)
    assert set(c.state.topics) == {"default/a", "default/b"}
    assert c.delete(["default/a"]) == ["default/a"]
    assert c.deletions == {DeletionRequest("default/a", retain=False)}
    pushed = len(c.pushed)
    await settle(c)
    assert set(c.state.topics) == {"default/b"}
    (doc, *_) = c.pushed[pushed:]
    assert [t["name"] for t in doc["topics"]] == ["default/b"]
    assert "default/a" not in doc.get("retained", [])  # the brokers remove their copies
    assert c.deletions == frozenset(), "done once the state no longer holds it"


async def test_a_topic_applied_again_before_its_deletion_ran_stays(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([topic("a")])
    await settle(c)
    placed = c.state.topics["default/a"]
    c.delete(["default/a"])
    c.apply([topic("a")])
    await settle(c)
    assert c.state.topics["default/a"].partitions == placed.partitions


async def test_each_creation_of_a_name_is_its_own_incarnation(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([topic("a")])
    await settle(c)
    first = c.state.topics["default/a"].creation_id
    assert first, "the controller names the incarnation when the topic is first applied"
    assert c.pushed[-1]["topics"][0]["creationId"] == first
    c.apply([topic("a")])  # applied again: the same object, the same incarnation
    await settle(c)
    assert c.state.topics["default/a"].creation_id == first
    c.delete(["default/a"])
    await settle(c)
    c.apply([topic("a")])
    await settle(c)
    second = c.state.topics["default/a"].creation_id
    assert second and second != first
    assert c.pushed[-1]["topics"][0]["creationId"] == second
    # persisted: a restarted controller reads it back from the topic's status
    stored = json.loads((tmp_path / "state" / "topics" / "default.a.json").read_text())
    assert stored["status"]["creationId"] == second


async def test_a_caller_cannot_choose_the_creation_id(tmp_path: Path) -> None:
    c = make(tmp_path)
    chosen = topic("a")
    chosen["metadata"]["uid"] = "mine"
    c.apply([chosen])
    await settle(c)
    assert c.state.topics["default/a"].creation_id not in ("", "mine")
