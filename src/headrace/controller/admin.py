"""The controller's HTTP surface: health, metrics, state, apply/delete, a status page."""

from __future__ import annotations

import html
import json
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.controller.controlling import Controller
from headrace.errors import HeadraceError
from headrace.resources import Topic, load_manifests


class _ControllerCollector(Collector):
    def __init__(self, controller: Controller) -> None:
        self.c = controller

    def collect(self) -> list[Metric]:
        c = self.c
        gen = GaugeMetricFamily(
            "headrace_controller_topology_generation", "Cluster topology generation"
        )
        gen.add_metric([], c.state.generation)
        bumps = GaugeMetricFamily(
            "headrace_controller_generation_bumps", "Generation bumps since start"
        )
        bumps.add_metric([], c.generation_bumps)
        live = GaugeMetricFamily(
            "headrace_controller_live_brokers", "Brokers with a fresh heartbeat"
        )
        live.add_metric([], len(c.last_decision.liveness.live) if c.last_decision else 0)
        offline = GaugeMetricFamily(
            "headrace_controller_offline_partitions", "Partitions with no leader"
        )
        offline.add_metric(
            [], sum(1 for t in c.state.topics.values() for p in t.partitions if p.owner is None)
        )
        epochs = GaugeMetricFamily(
            "headrace_controller_leader_epoch",
            "Leader epoch per partition",
            labels=["topic", "partition"],
        )
        for name, topic in c.state.topics.items():
            for p in topic.partitions:
                epochs.add_metric([name, str(p.partition)], p.leader_epoch)
        return [gen, bumps, live, offline, epochs]


class ControllerAdmin:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.registry = CollectorRegistry()
        self.registry.register(_ControllerCollector(controller))
        self.app = web.Application()
        self.app.add_routes(
            [
                web.get("/", self.page),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.healthz),
                web.get("/metrics", self.metrics),
                web.get("/v1/state", self.state),
                web.get("/v1/topology", self.topology),
                web.post("/v1/apply", self.apply),
                web.post("/v1/delete", self.delete),
            ]
        )
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        s = self.controller.settings
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.admin_host, s.admin_port)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        self.port = sockets[0].getsockname()[1] if sockets else s.admin_port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "steps": self.controller.steps})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response(self.controller.state_document())

    async def topology(self, request: web.Request) -> web.Response:
        return web.json_response(self.controller.topology_document())

    async def apply(self, request: web.Request) -> web.Response:
        """Body: manifests as YAML or JSON text, validated by the resource models."""
        text = await request.text()
        try:
            resources = load_manifests(text, source="request")
        except HeadraceError as exc:
            return web.json_response(
                {"error": type(exc).__name__, "message": exc.message}, status=422
            )
        unsupported = [r for r in resources if not isinstance(r, Topic)]
        if unsupported:
            kinds = sorted({type(r).__name__ for r in unsupported})
            return web.json_response(
                {
                    "error": "Unsupported",
                    "message": f"local mode applies Topic resources only, not {kinds}",
                },
                status=422,
            )
        docs = [_manifest(r) for r in resources if isinstance(r, Topic)]
        try:
            names = self.controller.apply(docs)
        except HeadraceError as exc:
            return web.json_response(
                {"error": type(exc).__name__, "message": exc.message}, status=422
            )
        return web.json_response({"applied": names})

    async def delete(self, request: web.Request) -> web.Response:
        body: Any = await request.json()
        names = [str(n) for n in body.get("topics", [])] if isinstance(body, dict) else []
        return web.json_response({"deleted": self.controller.delete(names)})

    async def page(self, request: web.Request) -> web.Response:
        """A small status page: topics, partitions, leaders, LRS, epochs, states."""
        doc = self.controller.state_document()
        rows = []
        for name, topic in sorted(self.controller.state.topics.items()):
            for p in topic.partitions:
                rows.append(
                    f"<tr><td>{html.escape(name)}</td><td>{p.partition}</td><td>{p.owner}</td>"
                    f"<td>{list(p.replicas)}</td><td>{list(p.live_replicas)}</td><td>{p.leader_epoch}</td>"
                    f"<td>{html.escape(str(p.state))}</td></tr>"
                )
        body = (
            "<!doctype html><title>headrace</title><h1>headrace local cluster</h1>"
            f"<p>generation {self.controller.state.generation}; live brokers {doc['live']};"
            f" adoption floor {doc['adoptionFloor']}</p>"
            "<table border=1 cellpadding=4><tr><th>topic</th><th>partition</th><th>leader</th>"
            "<th>replicas</th><th>LRS</th><th>epoch</th><th>state</th></tr>"
            + "".join(rows)
            + "</table><pre>"
            + html.escape(json.dumps(doc["problems"], indent=2))
            + "</pre>"
        )
        return web.Response(text=body, content_type="text/html")


def _manifest(resource: Topic) -> dict[str, Any]:
    doc = resource.to_manifest()
    doc.pop("status", None)
    return dict(doc)
