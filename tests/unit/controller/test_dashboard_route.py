"""The controller's dashboard route: the page and its files, the view model, the live stream.

The app runs in-process on a loopback test server over a scripted fleet and a
manual clock; the browser test (tests/integration/test_dashboard_browser.py)
covers what the page draws.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from controller_fakes import ManualClock, ScriptedController, make, settle

from headrace.controller.admin import ControllerAdmin
from headrace.dashboard import assets

TOPIC_YAML = """apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata: {name: orders}
spec: {clusterRef: {name: local}, partitions: 2, replicas: 1}
"""


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[tuple[ScriptedController, TestClient]]:
    controller = make(tmp_path, clock=ManualClock())
    client = TestClient(TestServer(ControllerAdmin(controller).app))
    await client.start_server()
    try:
        yield controller, client
    finally:
        # Deadline, not timing: an open event stream must not hold the shutdown up.
        await asyncio.wait_for(client.close(), 30)


async def test_the_page_and_its_files_are_served_and_nothing_comes_from_outside(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    _, client = admin
    page = await client.get("/")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert 'src="dashboard/dashboard.js"' in html and 'href="dashboard/dashboard.css"' in html
    for name, kind in assets.CONTENT_TYPES.items():
        resp = await client.get(f"/dashboard/{name}" if name != "index.html" else "/")
        assert (resp.status, resp.content_type) == (200, kind)
        text = await resp.text()
        # no CDN, no web font, no remote script: nothing outside the cluster is reachable
        assert not re.search(r"""(src|href)=["']?(https?:)?//|url\(\s*["']?(https?:)?//""", text)
        assert not re.search(r"fetch\(\s*[\"']https?:|@import", text)
    assert (await client.get("/dashboard/secrets.txt")).status == 404


async def test_the_view_model_shows_brokers_partitions_and_rates(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    assert (await client.post("/v1/apply", data=TOPIC_YAML)).status == 200
    clock = c.clock
    assert isinstance(clock, ManualClock)
    for log_end in (10, 10, 30, 70):
        c.fleet.log_end = log_end
        clock.advance(1_000)
        await c.step()
    view = await (await client.get("/dashboard/view.json")).json()
    assert [b["health"] for b in view["brokers"]] == ["up", "up", "up"]
    assert [(p["partition"], p["state"], p["highWatermark"]) for p in view["partitions"]] == [
        (0, "Online", 70),
        (1, "Online", 70),
    ]
    (produce,) = view["charts"]["produce"]["series"]
    assert produce["name"] == "default/orders"
    assert [value for _, value in produce["points"]][-2:] == [40.0, 80.0], (
        "two partitions, 20 then 40 records each per second"
    )
    assert view["summary"]["healthy"] is True and view["problems"] == []

    leader = view["partitions"][0]["leader"]
    c.down.add(leader)
    clock.advance(c.settings.control.liveness_ttl_ms + 1)
    await settle(c)
    view = await (await client.get("/dashboard/view.json")).json()
    (down,) = [b for b in view["brokers"] if b["health"] == "down"]
    assert down["id"] == leader and down["lastHeartbeatAgoMs"] is not None
    assert view["partitions"][0]["offline"] is True
    assert view["partitions"][0]["offsetsStale"] is True
    assert view["problems"][0].startswith(f"Broker {leader} ")


async def read_event(content: Any) -> dict[str, Any]:
    """The next ``data:`` event of a server-sent event stream."""
    while True:
        line = (await content.readline()).decode()
        if line.startswith("data: "):
            return dict(json.loads(line[len("data: ") :]))
        assert line, "the stream ended"


async def test_the_event_stream_sends_the_view_again_after_each_interval(
    admin: tuple[ScriptedController, TestClient],
) -> None:
    c, client = admin
    await client.post("/v1/apply", data=TOPIC_YAML)
    await settle(c)
    resp = await client.get("/dashboard/events")
    assert resp.content_type == "text/event-stream"
    first = await asyncio.wait_for(read_event(resp.content), 30)
    assert len(first["partitions"]) == 2
    await c.step()
    second = await asyncio.wait_for(read_event(resp.content), 30)
    assert second["cluster"]["steps"] > first["cluster"]["steps"]


async def test_stopping_the_controller_ends_open_streams(tmp_path: Path) -> None:
    c = make(tmp_path, clock=ManualClock())
    c.settings = replace(c.settings, admin_port=0)
    admin = ControllerAdmin(c)
    await admin.start()
    async with aiohttp.ClientSession() as session:
        resp = await session.get(f"http://127.0.0.1:{admin.port}/dashboard/events")
        await asyncio.wait_for(read_event(resp.content), 30)
        # A deadline, not a timing: aiohttp would otherwise wait a minute for the handler.
        await asyncio.wait_for(admin.stop(), 30)
        with pytest.raises((AssertionError, aiohttp.ClientPayloadError)):
            await asyncio.wait_for(read_event(resp.content), 30)
