"""The operator's own HTTP surfaces: ``/healthz``, ``/readyz``, ``/metrics`` and the dashboard.

They are served from a thread of their own with its own event loop, started before
the Lease is taken: a standby replica (waiting for the Lease, no kopf yet) must
answer its liveness probe too, or Kubernetes would restart it forever. What
concerns the running cluster loops is computed *on kopf's event loop*
(``on_kopf``), never read across threads, and that round trip is also the
liveness check: a kopf loop that does not answer within ``KOPF_TIMEOUT_S`` is
not alive.

``/healthz``  200 while every cluster loop reconciles: a standby, or the leader whose
              kopf loop answers and whose cluster loops are all stepping; 503, with
              one line per loop, if one is not: it died (its task ended with an
              error), has not finished a step for ``stall_after_s``, cannot start
              until a person fixes its cluster (a spec the model refuses, a
              replication token that does not parse), or steps on an older spec
              because its cluster's workload was not applied. For monitors and people.
``/livez``    the liveness probe's: 503 only for what restarting the operator can fix
              (kopf's loop does not answer, a loop died or is stuck); a loop blocked
              by its cluster's spec or Secret is listed but stays 200, since a
              restart would not fix it and would interrupt every other loop.
``/readyz``   200 once the process plays its part: a standby waiting for the Lease,
              or the leader once kopf has started (a standby is ready so that
              ``helm --wait`` and rollouts of several replicas finish).
``/metrics``  Prometheus text: reconciles, their durations and errors per kind, status
              writes and conflicts, readiness per object, the role.
``/``         the dashboard (``headrace.dashboard.routes``, as the local
              controller serves it): of the only cluster; with several, each is at
              ``/clusters/<namespace>/<name>/`` and ``/`` lists them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from headrace.dashboard.routes import DashboardRoutes
from headrace.operator.metrics import OperatorMetrics
from headrace.operator.running import ClusterRuntime

T = TypeVar("T")

#: how long ``/healthz`` waits for kopf's event loop to answer
KOPF_TIMEOUT_S: Final = 5.0
#: a cluster loop that has not finished a step for this long is stuck
DEFAULT_STALL_AFTER_S: Final = 120.0
#: the port of the surfaces in the pod (the chart's ``operator.metricsPort``)
DEFAULT_PORT: Final = 8081


@dataclass
class LoopHealth:
    """What ``/healthz`` knows of one cluster loop."""

    last_step_s: float
    died: str | None = None
    #: why the loop cannot start (a spec the model refuses, a bad auth Secret): unhealthy
    #: on /healthz, but alive on /livez, as a restart of the operator would not fix it
    #: (the BrokerCluster's Ready says so too)
    blocked: str | None = None
    #: why the loop steps on a spec older than the cluster's (its workload was not
    #: applied): unhealthy on /healthz, alive on /livez, for the same reason
    unapplied: str | None = None


@dataclass
class HealthReport:
    #: nothing a restart of the operator could fix is wrong (``/livez``)
    alive: bool
    #: every cluster loop reconciles (``/healthz``)
    healthy: bool = True
    lines: list[str] = field(default_factory=list)

    def text(self, healthy: bool | None = None) -> str:
        ok = self.alive and self.healthy if healthy is None else healthy
        return "\n".join(["ok" if ok else "unhealthy", *self.lines]) + "\n"


def loop_health(
    loops: Mapping[tuple[str, str], LoopHealth], now_s: float, stall_after_s: float
) -> HealthReport:
    """Whether every cluster loop is running (pure: the decision ``/healthz`` and
    ``/livez`` serve)."""
    report = HealthReport(alive=True)
    for (namespace, name), health in sorted(loops.items()):
        if health.died is not None:
            report.alive = report.healthy = False
            report.lines.append(f"{namespace}/{name}: loop died: {health.died}")
        elif health.blocked is not None:
            report.healthy = False
            report.lines.append(f"{namespace}/{name}: loop cannot start: {health.blocked}")
        elif now_s - health.last_step_s > stall_after_s:
            report.alive = report.healthy = False
            report.lines.append(
                f"{namespace}/{name}: no step finished for {now_s - health.last_step_s:.0f} s"
            )
        elif health.unapplied is not None:
            report.healthy = False
            report.lines.append(
                f"{namespace}/{name}: stepping, spec not applied: {health.unapplied}"
            )
        else:
            report.lines.append(f"{namespace}/{name}: stepping")
    return report


def object_readiness(
    runtimes: Mapping[tuple[str, str], ClusterRuntime],
) -> Iterator[tuple[str, str, str, float]]:
    """(kind, namespace, name, 1.0 or 0.0) of every object the loops own: its Ready
    condition as last written; an object with none yet is not ready."""
    for (namespace, name), runtime in sorted(runtimes.items()):
        cluster = runtime.store.workload_conditions()
        yield ("BrokerCluster", namespace, name, _ready(cluster))
        for topic in sorted(runtime.wanted_topics):
            status = runtime.store.topic_status(topic) or {}
            short = topic.partition("/")[2]
            yield ("Topic", namespace, short, _ready(status.get("conditions") or []))


def _ready(conditions: Iterable[Mapping[str, Any]]) -> float:
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    return 1.0 if ready is not None and ready.get("status") == "True" else 0.0


class _StateCollector(Collector):
    """Gauges read at scrape time (on kopf's loop): readiness per object, the role."""

    def __init__(self, surfaces: Surfaces) -> None:
        self.surfaces = surfaces

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ready = GaugeMetricFamily(
            "headrace_operator_object_ready",
            "1 if the object's Ready condition is True, else 0.",
            labels=["kind", "namespace", "name"],
        )
        for kind, namespace, name, value in self.surfaces.readiness_snapshot:
            ready.add_metric([kind, namespace, name], value)
        yield ready
        yield GaugeMetricFamily(
            "headrace_operator_leader",
            "1 if this replica holds the Lease and runs the control loops, 0 while standby.",
            value=1.0 if self.surfaces.leader else 0.0,
        )
        yield GaugeMetricFamily(
            "headrace_operator_cluster_loops",
            "BrokerCluster control loops running in this replica.",
            value=float(len(self.surfaces.readiness_clusters)),
        )


class Surfaces:
    """The HTTP server of the surfaces; see the module."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        metrics: OperatorMetrics | None = None,
        stall_after_s: float = DEFAULT_STALL_AFTER_S,
        interval_s: float = 1.0,
    ) -> None:
        self.host = host
        self.port = port
        self.metrics = metrics or OperatorMetrics()
        self.stall_after_s = stall_after_s
        #: set by ``attach`` once kopf runs (this replica holds the Lease)
        self.kopf_loop: asyncio.AbstractEventLoop | None = None
        self.runtimes: Callable[[], Mapping[tuple[str, str], ClusterRuntime]] | None = None
        self.health: Callable[[], Mapping[tuple[str, str], LoopHealth]] | None = None
        self.readiness_snapshot: list[tuple[str, str, str, float]] = []
        self.readiness_clusters: set[tuple[str, str]] = set()
        self.metrics.registry.register(_StateCollector(self))
        self._interval_s = interval_s
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def leader(self) -> bool:
        return self.kopf_loop is not None

    def attach(
        self,
        kopf_loop: asyncio.AbstractEventLoop,
        runtimes: Callable[[], Mapping[tuple[str, str], ClusterRuntime]],
        health: Callable[[], Mapping[tuple[str, str], LoopHealth]],
    ) -> None:
        """kopf has started (on ``kopf_loop``): serve its loops from now on."""
        self.runtimes = runtimes
        self.health = health
        self.kopf_loop = kopf_loop

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        """Serve in a daemon thread; returns once listening (raises if it cannot bind)."""
        self._thread = threading.Thread(target=self._serve, name="surfaces", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._runner = web.AppRunner(self.app(), handle_signals=False)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            loop.run_until_complete(site.start())
            if self.port == 0:  # an ephemeral port (tests): say which one
                server = site._server
                sockets = getattr(server, "sockets", None) or []
                self.port = int(sockets[0].getsockname()[1])
        except BaseException as exc:  # handed to the caller of start()
            self._error = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        loop.run_forever()
        loop.close()

    async def on_kopf(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on kopf's event loop (where the runtimes live), from this thread."""
        assert self.kopf_loop is not None

        async def call() -> T:
            return fn()

        future: Future[T] = asyncio.run_coroutine_threadsafe(call(), self.kopf_loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), KOPF_TIMEOUT_S)

    # ------------------------------------------------------------------ routes

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/healthz", self.healthz),
                web.get("/livez", self.livez),
                web.get("/readyz", self.readyz),
                web.get("/metrics", self.metrics_page),
            ]
        )
        DashboardRoutes(self._only_view, self._interval_s).install(app)
        DashboardRoutes(
            self._cluster_view, self._interval_s, "/clusters/{namespace}/{name}"
        ).install(app)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return await self._health(live=False)

    async def livez(self, request: web.Request) -> web.Response:
        return await self._health(live=True)

    async def _health(self, live: bool) -> web.Response:
        if self.kopf_loop is None or self.health is None:
            return web.Response(text="ok\nstandby: waiting for the Lease\n")
        health = self.health
        try:
            loops = await self.on_kopf(lambda: dict(health()))
        except TimeoutError:
            return web.Response(status=503, text="unhealthy\nkopf's event loop does not answer\n")
        report = loop_health(loops, time.monotonic(), self.stall_after_s)
        ok = report.alive if live else report.alive and report.healthy
        return web.Response(status=200 if ok else 503, text=report.text(ok))

    async def readyz(self, request: web.Request) -> web.Response:
        return web.Response(text="ready\n" + ("leader\n" if self.leader else "standby\n"))

    async def metrics_page(self, request: web.Request) -> web.Response:
        if self.runtimes is not None:
            runtimes = self.runtimes
            try:
                self.readiness_snapshot, self.readiness_clusters = await self.on_kopf(
                    lambda: (list(object_readiness(runtimes())), set(runtimes()))
                )
            except TimeoutError:
                pass  # the last snapshot; /healthz says what is wrong
        return web.Response(
            body=self.metrics.render(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def _views(self, pick: Callable[[Mapping[tuple[str, str], ClusterRuntime]], Any]) -> Any:
        if self.runtimes is None:
            raise web.HTTPServiceUnavailable(text="standby: no cluster loops run here\n")
        runtimes = self.runtimes
        return await self.on_kopf(lambda: pick(runtimes()))

    async def _only_view(self, request: web.Request) -> dict[str, Any]:
        def pick(runtimes: Mapping[tuple[str, str], ClusterRuntime]) -> Any:
            if len(runtimes) == 1:
                return next(iter(runtimes.values())).view()
            return sorted(runtimes)

        found = await self._views(pick)
        if isinstance(found, dict):
            return found
        listing = "".join(f"/clusters/{ns}/{name}/\n" for ns, name in found)
        raise web.HTTPNotFound(
            text=f"{len(found)} BrokerClusters: each has its page at\n{listing}"
            if found
            else "no BrokerCluster loop runs yet\n"
        )

    async def _cluster_view(self, request: web.Request) -> dict[str, Any]:
        key = (request.match_info["namespace"], request.match_info["name"])
        found = await self._views(
            lambda runtimes: runtimes[key].view() if key in runtimes else None
        )
        if found is None:
            raise web.HTTPNotFound(text=f"no BrokerCluster loop {key[0]}/{key[1]} runs here\n")
        assert isinstance(found, dict)
        return found
