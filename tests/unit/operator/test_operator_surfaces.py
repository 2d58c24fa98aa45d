"""The operator's surfaces (/healthz, /readyz, /metrics, the dashboard) over a fake API.

The server is the real one (its own thread and event loop, a real socket); the
cluster loops are ``ClusterRuntime``s over the fake API and a scripted fleet,
living on the test's event loop as they live on kopf's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from operator_fakes import CLUSTER, FakeApi, topic
from prometheus_client.parser import text_string_to_metric_families

from headrace.operator.handlers import OperatorContext
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.operator.surfaces import LoopHealth, Surfaces, loop_health
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock, ScriptedFleet


def test_health_is_every_loop_stepping() -> None:
    now = 1000.0
    assert loop_health({}, now, 60).alive
    stepping = {("ns", "a"): LoopHealth(now - 1)}
    assert loop_health(stepping, now, 60).alive
    stuck = {**stepping, ("ns", "b"): LoopHealth(now - 61)}
    report = loop_health(stuck, now, 60)
    assert not report.alive
    assert "ns/b: no step finished for 61 s" in report.text()
    died = {("ns", "a"): LoopHealth(now, died="RuntimeError: boom")}
    assert "ns/a: loop died: RuntimeError: boom" in loop_health(died, now, 60).text()
    # a loop that waits for its cluster to be fixed is not healthy (/healthz), but alive
    # (/livez): a restart would not help
    blocked = {("ns", "a"): LoopHealth(now - 600, blocked="InvalidRequest: line 1: ...")}
    report = loop_health(blocked, now, 60)
    assert report.alive and not report.healthy
    assert "ns/a: loop cannot start: InvalidRequest" in report.text()


@pytest.fixture
async def surfaces() -> AsyncIterator[Surfaces]:
    server = Surfaces("127.0.0.1", 0, stall_after_s=60)
    await asyncio.to_thread(server.start)
    yield server
    await asyncio.to_thread(server.stop)


def runtime_of(api: FakeApi, context: OperatorContext, name: str = "demo") -> ClusterRuntime:
    fleet = ScriptedFleet(
        tuple(BrokerEndpoint(i, f"10.0.0.{i}", 9092, 9644) for i in range(3)), ManualClock()
    )
    body = {**CLUSTER, "metadata": {**CLUSTER["metadata"], "name": name}}
    runtime = ClusterRuntime(
        DesiredObjects(body, [api.body("Topic", "orders")]),
        ClusterPorts(api, ManualClock(), fleet=fleet, metrics=context.metrics),
    )
    context.loops[("ns", name)] = runtime
    return runtime


async def get(server: Surfaces, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{server.port}{path}") as response,
    ):
        return response.status, await response.text()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_standby_is_alive_and_ready_and_serves_no_dashboard(surfaces: Surfaces) -> None:
    assert await get(surfaces, "/healthz") == (200, "ok\nstandby: waiting for the Lease\n")
    assert (await get(surfaces, "/readyz"))[0] == 200
    status, text = await get(surfaces, "/metrics")
    assert status == 200 and samples(text)[("headrace_operator_leader", ())] == 0.0
    assert (await get(surfaces, "/"))[0] == 503


async def test_the_leader_serves_metrics_health_and_the_dashboard(surfaces: Surfaces) -> None:
    api = FakeApi(CLUSTER, topic())
    context = OperatorContext(api=api, clock=ManualClock(), metrics=surfaces.metrics)
    surfaces.attach(asyncio.get_running_loop(), lambda: context.loops, context.health)
    runtime = runtime_of(api, context)
    for _ in range(4):
        runtime.sync(api.body("BrokerCluster", "demo"), [api.body("Topic", "orders")])
        await runtime.step()

    status, text = await get(surfaces, "/metrics")
    assert status == 200
    found = samples(text)
    assert found[("headrace_operator_leader", ())] == 1.0
    assert found[("headrace_operator_reconciles_total", (("kind", "BrokerCluster"),))] == 4
    assert found[("headrace_operator_reconcile_errors_total", (("kind", "BrokerCluster"),))] == 0
    count = ("headrace_operator_reconcile_duration_seconds_count", (("kind", "BrokerCluster"),))
    assert found[count] == 4
    assert found[("headrace_operator_status_writes_total", ())] == runtime.store.writes > 0
    assert found[("headrace_operator_status_conflicts_total", ())] == 0
    ready = "headrace_operator_object_ready"
    cluster = (("kind", "BrokerCluster"), ("name", "demo"), ("namespace", "ns"))
    orders = (("kind", "Topic"), ("name", "orders"), ("namespace", "ns"))
    assert found[(ready, cluster)] == 1.0
    assert found[(ready, orders)] == 1.0

    assert await get(surfaces, "/healthz") == (200, "ok\nns/demo: stepping\n")

    status, page = await get(surfaces, "/")
    assert status == 200 and "dashboard/dashboard.js" in page
    status, view_text = await get(surfaces, "/dashboard/view.json")
    assert status == 200 and json.loads(view_text)["cluster"]["id"] == "demo"
    assert "ns/orders" in view_text

    # a second cluster: each at its own path, / lists them
    runtime_of(api, context, "other")
    status, listing = await get(surfaces, "/")
    assert status == 404 and "/clusters/ns/demo/\n/clusters/ns/other/" in listing
    assert (await get(surfaces, "/clusters/ns/demo/"))[0] == 200
    status, view_text = await get(surfaces, "/clusters/ns/demo/dashboard/view.json")
    assert status == 200 and "ns/orders" in view_text
    assert (await get(surfaces, "/clusters/ns/absent/dashboard/view.json"))[0] == 404


async def test_a_dead_or_stuck_loop_fails_healthz(surfaces: Surfaces) -> None:
    api = FakeApi(CLUSTER, topic())
    context = OperatorContext(api=api, clock=ManualClock(), metrics=surfaces.metrics)
    surfaces.attach(asyncio.get_running_loop(), lambda: context.loops, context.health)
    runtime = runtime_of(api, context)
    runtime.last_step_s = time.monotonic() - 61
    status, text = await get(surfaces, "/healthz")
    assert status == 503 and "ns/demo: no step finished" in text
    context.loops.clear()
    context.died[("ns", "demo")] = "RuntimeError: boom"
    status, text = await get(surfaces, "/healthz")
    assert (status, text) == (503, "unhealthy\nns/demo: loop died: RuntimeError: boom\n")


async def test_a_failing_step_counts_as_an_error(surfaces: Surfaces) -> None:
    api = FakeApi(CLUSTER, topic())
    context = OperatorContext(api=api, clock=ManualClock(), metrics=surfaces.metrics)
    runtime = runtime_of(api, context)

    async def broken(desired: object = None) -> None:
        raise RuntimeError("the API is down")

    runtime.loop.step = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError):
        await runtime.step()
    found = samples(surfaces.metrics.render().decode())
    assert found[("headrace_operator_reconcile_errors_total", (("kind", "BrokerCluster"),))] == 1
