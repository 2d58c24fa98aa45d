"""The dashboard's HTTP route (aiohttp): the page, its view model as JSON, and a live stream.

A thin adapter: a controller's ``dashboard.observing.Observer`` (fed after
every step) gives the view model, ``headrace.dashboard.views`` decides what the
page shows and ``headrace.dashboard.assets`` holds the page. The same routes serve
the local controller (``headrace.controller.admin``, at the admin root) and the kopf
operator (``headrace.operator.surfaces``, one view per BrokerCluster, possibly under a
``prefix`` such as ``/clusters/{namespace}/{name}``: the page's links are relative).
Routes, below the prefix:

``GET /``                        the page (``index.html``)
``GET /dashboard/{asset}``       its CSS and JavaScript
``GET /dashboard/view.json``     the view model now (for polling, scripts and tests)
``GET /dashboard/events``        server-sent events: one ``data:`` line with the view
                                 model every ``interval_s``, for as long as the page is open

The stream ends when the server shuts down (``on_shutdown``), so an open page
never holds up a controller's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from headrace.dashboard import assets
from headrace.errors import InvalidRequest

#: the view model for a request (may raise an aiohttp HTTP error, e.g. 404 for no such cluster)
ViewSource = Callable[[web.Request], Awaitable[dict[str, Any]]]


class DashboardRoutes:
    def __init__(self, view: ViewSource, interval_s: float, prefix: str = "") -> None:
        """``interval_s``: how often the stream sends the view (the poll interval: the view
        cannot change faster than the controller learns anything)."""
        self.source = view
        self.interval_s = interval_s
        self.prefix = prefix
        self._closing = asyncio.Event()

    def install(self, app: web.Application) -> None:
        p = self.prefix
        app.add_routes(
            [
                web.get(f"{p}/", self.page),
                web.get(f"{p}/dashboard/view.json", self.view_json),
                web.get(f"{p}/dashboard/events", self.events),
                web.get(f"{p}/dashboard/{{asset}}", self.asset),
            ]
        )
        app.on_shutdown.append(self._close_streams)

    async def page(self, request: web.Request) -> web.Response:
        await self.source(request)  # no such view (a cluster): its error, not an empty page
        return _asset_response("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        try:
            return _asset_response(request.match_info["asset"])
        except InvalidRequest as exc:
            raise web.HTTPNotFound(text=exc.message) from exc

    async def view_json(self, request: web.Request) -> web.Response:
        return web.json_response(await self.source(request), headers={"Cache-Control": "no-store"})

    async def events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # a proxy in front must not hold the stream back
            }
        )
        await response.prepare(request)
        # A closed page shows up as a failed write: the handler just ends.
        with contextlib.suppress(ConnectionResetError):
            # After a reconnect, EventSource waits this long (ms) before trying again.
            await response.write(b"retry: 1000\n\n")
            while not self._closing.is_set():
                payload = json.dumps(await self.source(request), separators=(",", ":"))
                await response.write(f"data: {payload}\n\n".encode())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self.interval_s)
        return response

    async def _close_streams(self, app: web.Application) -> None:
        self._closing.set()


def _asset_response(name: str) -> web.Response:
    return web.Response(
        body=assets.asset(name),
        content_type=assets.CONTENT_TYPES[name],
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )
