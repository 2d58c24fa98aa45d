"""``POST /v1/apply`` refuses what the cluster cannot honour, all or nothing, unless allowed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from controller_fakes import ScriptedController, make, settle

from headrace.controller.admin import ControllerAdmin


def topic_yaml(name: str, partitions: int = 2, replicas: int = 1, cluster: str = "local") -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata: {{name: {name}}}
spec: {{clusterRef: {{name: {cluster}}}, partitions: {partitions}, replicas: {replicas},
        minInSync: 1}}
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


async def test_one_refused_topic_refuses_the_whole_apply(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    body = topic_yaml("fine") + "---\n" + topic_yaml("wide", replicas=4)
    resp = await client.post("/v1/apply", data=body)
    assert resp.status == 422
    doc = await resp.json()
    assert doc["error"] == "Refused"
    assert doc["problems"] == ["topic default/wide: 4 replicas need 4 brokers, the cluster has 3"]
    assert "\n" not in doc["message"]
    assert c.resources == {}, "nothing may be applied from a refused set"


async def test_allow_problems_applies_with_warnings(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    resp = await client.post(
        "/v1/apply?allowProblems=true", data=topic_yaml("elsewhere", cluster="main")
    )
    assert resp.status == 200, await resp.text()
    doc = await resp.json()
    assert doc["warnings"] == [
        "topic default/elsewhere: clusterRef 'main' is not this cluster: it is named 'local'"
    ]
    assert list(c.resources) == ["default/elsewhere"]


def repartition_yaml(name: str, topic: str, partitions: int) -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Repartition
metadata: {{name: {name}}}
spec: {{topicRef: {{name: {topic}}}, partitions: {partitions}}}
"""


async def test_a_partition_count_edit_of_a_placed_topic_starts_a_repartition(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    assert (await client.post("/v1/apply", data=topic_yaml("orders"))).status == 200
    await settle(c)
    assert len(c.state.topics["default/orders"].partitions) == 2
    resp = await client.post("/v1/apply", data=topic_yaml("orders", partitions=4))
    assert resp.status == 200, await resp.text()
    await c.step()
    topic = c.state.topics["default/orders"]
    assert topic.transition is not None and topic.transition.request == "Topic.spec.partitions"
    assert (len(topic.partitions), topic.partitioning_version) == (4, 2)


async def test_bad_repartitions_are_refused_with_a_reason_and_nothing_is_applied(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    assert (await client.post("/v1/apply", data=topic_yaml("orders"))).status == 200
    await settle(c)
    cases = {
        repartition_yaml("same", "orders", 2): "repartition default/same: topic default/orders"
        " already has 2 partitions: nothing to repartition",
        repartition_yaml("lost", "nope", 4): "repartition default/lost: topic default/nope"
        " does not exist",
    }
    for body, line in cases.items():
        resp = await client.post("/v1/apply", data=body)
        assert resp.status == 422
        assert (await resp.json())["problems"] == [line]
    zero = await client.post("/v1/apply", data=repartition_yaml("zero", "orders", 0))
    assert zero.status == 422
    assert "partitions" in (await zero.json())["message"]
    assert c.loop.repartitions == {}
    ok = await client.post("/v1/apply", data=repartition_yaml("grow", "orders", 4))
    assert ok.status == 200, await ok.text()
    assert (await ok.json())["applied"] == [
        {"kind": "Repartition", "name": "default/grow", "result": "created"}
    ]
    await c.step()
    assert c.loop.repartition_progress["default/grow"].phase.value == "CuttingOver"
    metrics = await (await client.get("/metrics")).text()
    assert 'headrace_controller_transitions{phase="CuttingOver"} 1.0' in metrics
    again = await client.post("/v1/apply", data=repartition_yaml("grow", "orders", 6))
    assert again.status == 422
    assert "immutable" in (await again.json())["message"]
