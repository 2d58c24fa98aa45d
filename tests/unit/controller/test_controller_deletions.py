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
    assert c.loop.deletions == {DeletionRequest("default/a", retain=False)}
    pushed = len(c.pushed)
    await settle(c)
    assert set(c.state.topics) == {"default/b"}
    (doc, *_) = c.pushed[pushed:]
    assert [t["name"] for t in doc["topics"]] == ["default/b"]
    assert "default/a" not in doc.get("retained", [])  # the brokers remove their copies
    assert c.loop.deletions == frozenset(), "done once the state no longer holds it"


async def test_a_topic_applied_again_before_its_deletion_ran_stays(tmp_path: Path) -> None:
    c = make(tmp_path)
    c.apply([topic("a")])
    await settle(c)
    placed = c.state.topics["default/a"]
    c.delete(["default/a"])
    c.apply([topic("a")])
    await settle(c)
    assert c.state.topics["default/a"].partitions == placed.partitions
