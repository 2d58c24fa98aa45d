"""The controller's ``/v1/topics``: the applied Topic documents, as ``topics alter`` reads them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from controller_fakes import ScriptedController, make

from headrace.controller.admin import ControllerAdmin

TOPIC_YAML = """apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata: {name: orders, namespace: team}
spec: {clusterRef: {name: local}, partitions: 2, replicas: 1, retention: {ms: 60000}}
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


async def test_topics_lists_the_applied_documents(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    _, client = admin
    assert (await (await client.get("/v1/topics")).json()) == {"topics": []}
    resp = await client.post("/v1/apply", data=TOPIC_YAML)
    assert resp.status == 200, await resp.text()
    (doc,) = (await (await client.get("/v1/topics")).json())["topics"]
    assert doc["metadata"]["name"] == "orders" and doc["metadata"]["namespace"] == "team"
    assert doc["spec"]["partitions"] == 2 and doc["spec"]["retention"] == {"ms": 60000}
    await client.post("/v1/delete", json={"topics": ["team/orders"]})
    assert (await (await client.get("/v1/topics")).json()) == {"topics": []}
