"""Topology pushes over real HTTP: a broker that never answers holds up nobody.

Two admin endpoints on loopback (aiohttp servers): one answers pushes at once, the
other accepts them and never answers, as a paused broker's kernel does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from headrace.fleet import http as fleets
from headrace.fleet.clock import SystemClock
from headrace.protocol.endpoints import BrokerEndpoint


@dataclass
class Admin:
    """A broker's admin port that holds the topology it was pushed. With a ``gate``, it
    answers a push only once the gate is set (never, for a paused broker)."""

    gate: asyncio.Event | None = None
    generation: int = 0
    requests: int = 0
    #: set when a push's connection went away before its answer (the fleet gave up on it)
    dropped: asyncio.Event = field(default_factory=asyncio.Event)

    async def topology(self, request: web.Request) -> web.Response:
        self.requests += 1
        doc = await request.json()
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.dropped.set()
                raise
        self.generation = max(self.generation, int(doc["generation"]))
        return web.json_response({"applied": True, "generation": self.generation})


@pytest.fixture
async def brokers() -> AsyncIterator[tuple[fleets.HttpFleet, dict[int, Admin]]]:
    admins = {0: Admin(gate=asyncio.Event()), 1: Admin()}
    runners, endpoints = [], []
    for broker_id, admin in admins.items():
        app = web.Application()
        app.router.add_post("/v1/topology", admin.topology)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        runners.append(runner)
        endpoints.append(BrokerEndpoint(broker_id, "127.0.0.1", 9092, admin_port=port))
    fleet = fleets.HttpFleet(endpoints, SystemClock(), 1000)
    await fleet.start()
    try:
        yield fleet, admins
    finally:
        await fleet.close()
        for runner in runners:
            await runner.cleanup()


async def test_a_broker_that_never_answers_a_push_holds_up_no_other(
    brokers: tuple[fleets.HttpFleet, dict[int, Admin]],
) -> None:
    fleet, admins = brokers
    # the push to the paused broker stops waiting (it goes on in the background) ...
    # (the limit: the old push waited out its 30 s timeout and returned None too)
    assert await asyncio.wait_for(fleet.push(0, {"generation": 7}), 5) is None
    # ... so the next broker gets its push at once, in the same step
    assert await fleet.push(1, {"generation": 7}) == 7
    assert admins[1].generation == 7
    # the next step sends the paused broker nothing more while its push still hangs
    assert await asyncio.wait_for(fleet.push(0, {"generation": 8}), 5) is None
    assert admins[0].requests == 1
    # closing the fleet (the controller stopping) ends the hanging push
    await fleet.close()
    await asyncio.wait_for(admins[0].dropped.wait(), 10)
    assert admins[0].generation == 0


async def test_a_late_answer_lands_in_the_background_and_frees_the_broker(
    brokers: tuple[fleets.HttpFleet, dict[int, Admin]],
) -> None:
    fleet, admins = brokers
    late = admins[0]
    assert await fleet.push(0, {"generation": 3}) is None  # not answered in PUSH_WAIT_S
    assert late.gate is not None
    late.gate.set()  # the broker comes back and applies it

    async def applied() -> None:
        while late.generation != 3:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(applied(), 10)

    # once that push has ended, the next one goes out and is answered
    async def answered() -> int | None:
        while (held := await fleet.push(0, {"generation": 4})) is None:
            await asyncio.sleep(0.01)
        return held

    assert await asyncio.wait_for(answered(), 10) == 4
    assert late.requests == 2
    assert not late.dropped.is_set()


async def test_a_broker_that_reads_no_such_format_gets_no_push_in_it_again_soon() -> None:
    requests = 0

    async def topology(request: web.Request) -> web.Response:
        nonlocal requests
        requests += 1
        error = {"error": "UnsupportedDocument", "code": 47, "message": "format 2"}
        return web.json_response(error, status=422)

    app = web.Application()
    app.router.add_post("/v1/topology", topology)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fleet = fleets.HttpFleet(
        [BrokerEndpoint(0, "127.0.0.1", 9092, admin_port=port)], SystemClock(), 1000
    )
    await fleet.start()
    try:
        assert await fleet.push(0, {"format": 2, "generation": 7}) is None
        for generation in (8, 9, 10):  # the next steps: no request, no refusal to log
            assert await fleet.push(0, {"format": 2, "generation": generation}) is None
        assert requests == 1
        # a push in another format (the controller rolled back) goes out at once
        assert await fleet.push(0, {"format": 1, "generation": 11}) is None
        assert requests == 2
    finally:
        await fleet.close()
        await runner.cleanup()
