"""The controller's HTTP surface for Unloads: apply (one-shot, immutable), delete, state, dashboard.

The app runs in-process on a loopback test server; the brokers behind the
controller are scripted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from controller_fakes import ScriptedController, make, settle

from headrace.controller.admin import ControllerAdmin

TOPIC_YAML = """apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata: {name: orders}
spec: {clusterRef: {name: local}, partitions: 2, replicas: 1}
"""


def unload_yaml(target: int = 1, partitions: str = "[0]") -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Unload
metadata: {{name: move}}
spec: {{topicRef: {{name: orders}}, partitions: {partitions}, targetBroker: {target}}}
"""


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[tuple[ScriptedController, TestClient]]:
    controller = make(tmp_path)
    client = TestClient(TestServer(ControllerAdmin(controller).app))
    await client.start_server()
    try:
        yield controller, client
    finally:
        await client.close()


async def test_apply_takes_topics_and_unloads_together(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    resp = await client.post("/v1/apply", data=TOPIC_YAML + "---\n" + unload_yaml())
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["applied"] == [
        {"kind": "Topic", "name": "default/orders", "result": "applied"},
        {"kind": "Unload", "name": "default/move", "result": "created"},
    ]
    resp = await client.post("/v1/apply", data=unload_yaml())
    assert (await resp.json())["applied"] == [
        {"kind": "Unload", "name": "default/move", "result": "unchanged"}
    ]
    resp = await client.post("/v1/apply", data=TOPIC_YAML + "---\n" + unload_yaml(target=2))
    assert resp.status == 409
    body = await resp.json()
    assert body["error"] == "Conflict" and "immutable" in body["message"]
    assert c.resources["default/orders"]["spec"]["partitions"] == 2


async def test_other_kinds_are_refused(admin: tuple[ScriptedController, TestClient]) -> None:
    _, client = admin
    compaction = """apiVersion: headrace.dev/v1alpha1
kind: Compaction
metadata: {name: squash}
spec: {topicRef: {name: orders}}
"""
    resp = await client.post("/v1/apply", data=compaction)
    assert resp.status == 422
    assert "Topic, Unload and Repartition resources only" in (await resp.json())["message"]


async def test_state_page_and_delete_show_and_remove_unloads(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    await client.post("/v1/apply", data=TOPIC_YAML)
    await settle(c)
    owner = c.state.topics["default/orders"].partitions[0].leader
    assert owner is not None
    await client.post("/v1/apply", data=unload_yaml(target=(owner + 1) % 3))
    for _ in range(5):
        await c.step()
    state = await (await client.get("/v1/state")).json()
    (doc,) = state["unloads"]
    assert doc["metadata"]["name"] == "move"
    assert doc["status"]["phase"] == "Completed"
    assert doc["status"]["moves"][0]["toBroker"] == (owner + 1) % 3
    view = await (await client.get("/dashboard/view.json")).json()
    (finished,) = view["transitions"]["finishedUnloads"]
    assert (finished["name"], finished["phase"]) == ("default/move", "Completed")
    assert finished["moves"][0]["to"] == (owner + 1) % 3
    assert view["transitions"]["unloads"] == [], "a completed unload is no longer in flight"
    metrics = await (await client.get("/metrics")).text()
    assert 'headrace_controller_unloads{phase="Completed"} 1.0' in metrics
    resp = await client.post("/v1/delete", json={"unloads": ["default/move"]})
    assert await resp.json() == {
        "deleted": [],
        "unloads": {"deleted": ["default/move"], "deferred": []},
        "repartitions": [],
    }
    assert (await (await client.get("/v1/state")).json())["unloads"] == []
    resp = await client.post("/v1/delete", json={"topics": ["default/orders"]})
    assert (await resp.json())["deleted"] == ["default/orders"]
