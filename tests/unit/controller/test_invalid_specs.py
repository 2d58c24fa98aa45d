"""A stored Topic whose spec does not parse is that Topic's problem, not the loop's.

The store can hold a Topic the models refuse: a file edited by hand, or one
written before a model grew stricter (the API server validates against the
CRD it has, which may be older than the operator). The loop must report it
on that Topic (Ready False, ``InvalidSpec``), keep reconciling every other
topic, and never delete a placed topic because its spec became unreadable.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller_fakes import TOPIC, make, settle

from headrace.controller.store import FileStore

ORDERS = "default/orders"
BAD = "default/bad"


def topic(name: str, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(TOPIC))
    doc["metadata"]["name"] = name
    doc["spec"].update(spec)
    return doc


def status(tmp_path: Path, name: str) -> dict[str, Any]:
    path = tmp_path / "state" / "topics" / f"default.{name}.json"
    found: dict[str, Any] = json.loads(path.read_text()).get("status", {})
    return found


def stored_as_is(tmp_path: Path, resource: dict[str, Any]) -> None:
    """Put a Topic in the store without the checks ``apply`` makes (as a hand edit would)."""
    doc = json.loads(json.dumps(resource))
    doc["metadata"].setdefault("generation", 1)
    FileStore(tmp_path / "state").put("topics", doc)


async def test_an_invalid_topic_does_not_stall_the_others(tmp_path: Path) -> None:
    stored_as_is(tmp_path, topic("bad", replicas=1, minInSync=2))
    c = make(tmp_path)
    c.apply([TOPIC])
    await settle(c)
    assert ORDERS in c.state.topics and BAD not in c.state.topics
    pushed = c.fleet.held[0]
    assert [t["name"] for t in pushed["topics"]] == [ORDERS]
    assert pushed["generation"] == c.state.generation > 0
    assert status(tmp_path, "orders")["conditions"][0]["status"] == "True"
    bad = status(tmp_path, "bad")
    (ready,) = bad["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "minInSync" in ready["message"]
    assert bad["observedGeneration"] == 1 and "partitions" not in bad
    assert c.last_decision is not None
    assert [p.reason for p in c.last_decision.problems if p.topic == BAD] == ["InvalidSpec"]
    assert json.loads((tmp_path / "state" / "cluster.json").read_text())["topics"] == [ORDERS]


async def test_a_placed_topic_whose_spec_stops_parsing_keeps_its_partitions(
    tmp_path: Path,
) -> None:
    c = make(tmp_path)
    c.apply([topic("orders", replicas=3, minInSync=3, partitions=2)])
    await settle(c)
    before = c.state
    held = c.topology_document()
    # in this process: the spec it last parsed still holds (minInSync too); ``apply``
    # refuses such a spec, so the loop is handed it directly
    unreadable = topic("orders", replicas=3, minInSync=3, partitions="two")
    unreadable["metadata"] = c.resources[ORDERS]["metadata"]
    await c.loop.step(replace(c.desired(), topics={**c.resources, ORDERS: unreadable}))
    assert c.state == before and c.fleet.held[0] == held
    assert c.topology_document()["topics"][0]["minInSync"] == 3
    (ready,) = status(tmp_path, "orders")["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")

    # after a restart over the unreadable document: held as its status says, not deleted
    stored_as_is(tmp_path, topic("orders", replicas=3, partitions="two"))
    again = make(tmp_path, fleet=c.fleet, clock=c.clock)
    await settle(again)
    assert again.state.topics == before.topics
    assert again.generation_bumps == 0 and again.fleet.held[0] == held
    (ready,) = status(tmp_path, "orders")["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")

    # fixed: reconciled under its spec again
    again.apply([topic("orders", replicas=3, minInSync=3, partitions=2)])
    await settle(again)
    assert status(tmp_path, "orders")["conditions"][0]["status"] == "True"
    assert again.state.topics == before.topics


async def test_the_settings_pushed_for_an_unreadable_spec_are_never_its_garbage(
    tmp_path: Path,
) -> None:
    # brokers are told a topic's settings with every topology: one Topic whose stored
    # spec carries a value of the wrong type must not hand that value to them
    c = make(tmp_path)
    c.apply([topic("orders", retention={"ms": 60_000}, segments={"bytes": 1 << 20})])
    await settle(c)
    unreadable = topic("orders", retention={"ms": "soon"}, segments={"bytes": 1 << 20})
    unreadable["spec"]["maxBatchBytes"] = "big"
    unreadable["metadata"] = c.resources[ORDERS]["metadata"]
    await c.loop.step(replace(c.desired(), topics={**c.resources, ORDERS: unreadable}))
    c.apply([topic("audit")])  # a new generation: the topology is built again
    await c.loop.step(replace(c.desired(), topics={**c.resources, ORDERS: unreadable}))
    (orders,) = [t for t in c.topology_document()["topics"] if t["name"] == ORDERS]
    # in this process: the settings of the spec it last parsed
    assert orders["config"] == {"retentionMs": 60_000, "segmentBytes": 1 << 20}

    # after a restart over it: what of it still reads (the segments), never the rest
    stored_as_is(tmp_path, unreadable)
    again = make(tmp_path, fleet=c.fleet, clock=c.clock)
    await settle(again)
    (orders,) = [t for t in again.topology_document()["topics"] if t["name"] == ORDERS]
    assert orders["config"] == {"segmentBytes": 1 << 20}
