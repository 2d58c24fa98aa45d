"""Admin HTTP (aiohttp): health, readiness, Prometheus metrics, topic admin, drain.

When the data port asks for credentials (``--acl-file`` or ``--auth-token``),
every change here does too, as ``Authorization: Bearer <token>``
(``headrace.security.admin_access``): creating and deleting a topic takes the
``admin`` grant on it, the controller's topology push the ``cluster`` grant
(the replication token's). Reads are open unless ``--admin-read-access
authenticated``; ``/healthz`` and ``/readyz`` always are (docs/security.md §6).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from headrace.errors import (
    AccessDenied,
    AuthenticationFailed,
    HeadraceError,
    InvalidTopicSpec,
    TopicAlreadyExists,
    UnknownTopic,
    UnsupportedDocument,
)
from headrace.protocol.coordination import TopologyReply
from headrace.security import admin_access
from headrace.security.acl import Operation

if TYPE_CHECKING:
    from headrace.broker.ports import AdminHost

#: the largest request body taken (aiohttp's default is 1 MiB). The controller's topology
#: push names every partition (about 100 B each): 1 MiB stopped at ~9,000 partitions, and a
#: refused push leaves brokers on an old topology for good.
MAX_REQUEST_BYTES = 256 * 1024 * 1024

_STATUS: dict[type[HeadraceError], int] = {
    UnknownTopic: 404,
    TopicAlreadyExists: 409,
    InvalidTopicSpec: 422,
    UnsupportedDocument: 422,
    AuthenticationFailed: 401,
    AccessDenied: 403,
}


def _error(exc: HeadraceError) -> web.Response:
    status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 400)
    return web.json_response(
        {"error": type(exc).__name__, "code": exc.CODE, "message": exc.message}, status=status
    )


class AdminServer:
    def __init__(self, broker: AdminHost) -> None:
        self.broker = broker
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        self.app.add_routes(
            [
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
                web.get("/metrics", self.metrics),
                web.get("/v1/topics", self.list_topics),
                web.post("/v1/topics", self.create_topic),
                web.get("/v1/topics/{namespace}/{name}", self.describe_topic),
                web.delete("/v1/topics/{namespace}/{name}", self.delete_topic),
                web.get("/v1/status", self.status),
                web.get("/v1/heartbeat", self.heartbeat),
                web.post("/v1/topology", self.topology),
                web.get("/v1/drain", self.drain_status),
                web.post("/v1/drain", self.drain),
                web.delete("/v1/drain", self.undrain),
            ]
        )
        admin_access.AdminGuard(broker.access, broker.settings.admin_read_access).install(self.app)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.broker.settings.admin_host,
            self.broker.settings.admin_port,
            ssl_context=self.broker.admin_ssl,
        )
        await site.start()
        # aiohttp has no public accessor for the bound port (needed when asked for port 0)
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def healthz(self, request: web.Request) -> web.Response:
        """``pid``: lets ``headrace local up`` tell its own process from another one that
        holds the address."""
        return web.json_response(
            {"status": "ok", "pid": os.getpid(), "clusterId": self.broker.settings.cluster_id}
        )

    async def readyz(self, request: web.Request) -> web.Response:
        if not self.broker.ready:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response(
            {"status": "ready", "recovery_seconds": self.broker.recovery_seconds}
        )

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.broker.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def list_topics(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "topics": [
                    self.broker.registry.topics[n].to_json()
                    for n in sorted(self.broker.registry.topics)
                ]
            }
        )

    async def create_topic(self, request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
        except json.JSONDecodeError:
            return _error(InvalidTopicSpec("request body is not JSON"))
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return _error(
                InvalidTopicSpec('expected {"name": str, "partitions": int, "config": {...}}')
            )
        try:
            self._authorize_admin(request, body["name"])
        except HeadraceError as exc:
            return _error(exc)
        partitions = body.get("partitions", 1)
        config = body.get("config", {})
        if (
            not isinstance(partitions, int)
            or isinstance(partitions, bool)
            or not isinstance(config, dict)
        ):
            return _error(InvalidTopicSpec("partitions must be an integer and config an object"))
        try:
            topic = self.broker.create_topic(body["name"], partitions, config)
        except HeadraceError as exc:
            return _error(exc)
        return web.json_response(self.broker.describe_topic(topic.name), status=201)

    async def describe_topic(self, request: web.Request) -> web.Response:
        name = f"{request.match_info['namespace']}/{request.match_info['name']}"
        try:
            return web.json_response(self.broker.describe_topic(name))
        except HeadraceError as exc:
            return _error(exc)

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = f"{request.match_info['namespace']}/{request.match_info['name']}"
        try:
            self._authorize_admin(request, name)
            self.broker.delete_topic(name)
        except HeadraceError as exc:
            return _error(exc)
        return web.json_response({"deleted": name})

    def _authorize_admin(self, request: web.Request, topic: str) -> None:
        """The request's principal (authenticated by the guard) must hold ``admin`` on
        ``topic``; with shared tokens any valid token may, as on the data port."""
        session = admin_access.session(request)
        if session is not None:
            session.require(Operation.ADMIN, topic)

    async def heartbeat(self, request: web.Request) -> web.Response:
        """Every partition's report; with ``?since=instance:seq`` (from the previous answer's
        ``journal``) only those that changed since (``broker.reporting``)."""
        return web.json_response(self.broker.heartbeat(request.query.get("since")).to_json())

    async def topology(self, request: web.Request) -> web.Response:
        """The controller pushes the cluster topology here (idempotent, generation-fenced).

        It decides who leads what, so it takes the ``cluster`` grant (the replication
        token's principal) when the broker asks for credentials."""
        session = admin_access.session(request)
        try:
            if session is not None:
                session.require_cluster()
        except HeadraceError as exc:
            return _error(exc)
        try:
            doc: Any = await request.json()
        except json.JSONDecodeError:
            return _error(InvalidTopicSpec("request body is not JSON"))
        if not isinstance(doc, dict):
            return _error(InvalidTopicSpec("the topology must be a JSON object"))
        try:
            applied = await self.broker.receive_topology(doc)
        except HeadraceError as exc:
            return _error(exc)
        current = self.broker.cluster_generation
        return web.json_response(TopologyReply(applied, current).to_json())

    async def drain_status(self, request: web.Request) -> web.Response:
        return web.json_response(self.broker.drain_report())

    async def drain(self, request: web.Request) -> web.Response:
        """Controlled shutdown, first half: say ``draining`` in the heartbeat, so the
        controller moves leadership to other in-sync replicas and places nothing new here.
        The caller polls ``GET /v1/drain`` until ``drained`` (``headrace drain``)."""
        self.broker.draining = True
        return web.json_response(self.broker.drain_report())

    async def undrain(self, request: web.Request) -> web.Response:
        """A drain called off (the stop did not happen): the broker may lead again (the
        preferred-leader rebalance hands its partitions back)."""
        self.broker.draining = False
        return web.json_response(self.broker.drain_report())

    async def status(self, request: web.Request) -> web.Response:
        b = self.broker
        return web.json_response(
            {
                "broker_id": b.settings.broker_id,
                "cluster_id": b.settings.cluster_id,
                "ready": b.ready,
                "connections": len(b.connections),
                "topology_generation": b.registry.generation,
                "adoption_floor": b.adoption_floor(),
                "acl": {
                    "generation": b.access.files.generation("acl"),
                    "reload_error": b.access.reload_error,
                }
                if b.access.enabled
                else None,
                # every credential file: its path and its last failed reload (None: fine)
                "credentials": {
                    "generation": b.access.generation,
                    "files": b.access.files.status(),
                },
                "cohorts": [
                    {
                        "topic": t,
                        "cohort": c,
                        "generation": r.gates.generation,
                        "members": sorted(r.gates.members),
                        "holders": r.gates.holders(),
                    }
                    for (t, c), r in sorted(b.cohorts.items())
                ],
            }
        )
