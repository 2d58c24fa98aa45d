"""The controller's HTTP surface: health, metrics, state, apply/delete, the dashboard.

Credentials as on a broker's admin port (``headrace.security.admin_access``): with
``--acl-file`` or ``--auth-token``, ``/v1/apply``, ``/v1/delete`` and ``PUT
/v1/members`` take a bearer token, and with ACLs its principal needs ``admin``
on every topic the request touches (a Topic's own name, an Unload's or
Repartition's ``topicRef``; every topic for a membership change); nothing is
applied unless all are granted. Reads per ``admin_read_access``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.aio import cancel_and_wait
from headrace.control import admission
from headrace.control.documents import full_name, spec_of
from headrace.controller.controlling import Controller, RepartitionRefused, UnloadConflict
from headrace.dashboard.observing import observed_of
from headrace.dashboard.routes import DashboardRoutes
from headrace.errors import HeadraceError, InvalidRequest
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.resources import Repartition, Resource, Topic, Unload, load_manifests
from headrace.security import admin_access
from headrace.security.access import Access, load_token_file
from headrace.security.acl import Operation
from headrace.security.settings import AccessSettings

log = logging.getLogger(__name__)

#: how often the credential files are checked for changes (as a broker's default)
ACL_RELOAD_INTERVAL_S: Final = 2.0


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
        sealed = GaugeMetricFamily(
            "headrace_controller_sealed_partitions", "Partitions sealed for a move (unavailable)"
        )
        sealed.add_metric(
            [], sum(1 for t in c.state.topics.values() for p in t.partitions if p.seal)
        )
        unloads = GaugeMetricFamily(
            "headrace_controller_unloads", "Unloads by phase", labels=["phase"]
        )
        phases = [c.progress[n].phase.value if n in c.progress else "Pending" for n in c.unloads]
        for phase in ("Pending", "Moving", "Completed", "Failed"):
            unloads.add_metric([phase], phases.count(phase))
        transitions = GaugeMetricFamily(
            "headrace_controller_transitions",
            "Repartitions in flight (topics with a transition marker) by phase",
            labels=["phase"],
        )
        in_flight = [t["phase"] for t in c.loop.transitions()]
        for phase in ("CuttingOver", "Draining", "AwaitingAdoption"):
            transitions.add_metric([phase], in_flight.count(phase))
        uncovered = GaugeMetricFamily(
            "headrace_controller_cohort_uncovered_partitions",
            "Partitions of a cohort's topic whose leader no member of the cohort is connected"
            " to (nothing delivers them to it); only cohorts with members",
            labels=["topic", "cohort"],
        )
        if c.last_decision is not None:
            for key, missing in sorted(c.last_decision.uncovered.items()):
                topic_name, _, cohort = key.rpartition(":")
                uncovered.add_metric([topic_name, cohort], sum(len(ps) for ps in missing.values()))
        steps = CounterMetricFamily("headrace_controller_steps", "Control loop steps run")
        steps.add_metric([], c.steps_run)
        step_cpu = CounterMetricFamily(
            "headrace_controller_step_cpu_seconds",
            "Process CPU seconds spent in control loop steps (polls parsed, reconcile, writes)",
        )
        step_cpu.add_metric([], c.step_cpu_seconds)
        return [
            gen,
            bumps,
            live,
            offline,
            epochs,
            sealed,
            unloads,
            transitions,
            uncovered,
            steps,
            step_cpu,
        ]


def _dashboard(controller: Controller) -> DashboardRoutes:
    """The local controller's dashboard: its view after the last step."""

    async def view(request: web.Request) -> dict[str, Any]:
        return controller.dashboard.view(observed_of(controller.loop, controller.clock.now_ms()))

    return DashboardRoutes(view, controller.settings.poll_interval_ms / 1000)


class ControllerAdmin:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.registry = CollectorRegistry()
        self.registry.register(_ControllerCollector(controller))
        self.denials = Counter(
            "headrace_acl_denials",
            "API requests refused by access control: authenticate or admin",
            ["operation"],
            registry=self.registry,
        )
        self.reloads = Counter(
            "headrace_acl_reloads",
            "Credential file reloads by source (acl, auth_tokens, broker_token) and result",
            ["source", "result"],
            registry=self.registry,
        )
        s = controller.settings
        #: the API's credentials: the brokers' ``Access`` without member identities
        self.access = Access(
            AccessSettings(
                cluster_id=s.cluster_id,
                auth_tokens=s.auth_tokens,
                auth_token_file=s.auth_token_file,
                acl_file=s.acl_file,
            ),
            self.denials,
            reloads=self.reloads,
        )
        fleet = controller.http
        if s.broker_token_file is not None and fleet is not None:
            # reloaded with the API's files (SIGHUP, the watch): the first line is presented
            self.access.files.watch(
                "broker_token",
                s.broker_token_file,
                load_token_file,
                lambda tokens: fleet.set_auth_token(tokens[0]),
            )
        self.app = web.Application()
        admin_access.AdminGuard(self.access, s.admin_read_access).install(self.app)
        self._watch: asyncio.Task[None] | None = None
        self.app.add_routes(
            [
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.healthz),
                web.get("/metrics", self.metrics),
                web.get("/v1/state", self.state),
                web.get("/v1/topology", self.topology),
                web.get("/v1/replicas", self.replicas),
                web.get("/v1/topics", self.topics),
                web.post("/v1/apply", self.apply),
                web.post("/v1/delete", self.delete),
                web.get("/v1/members", self.members),
                web.put("/v1/members", self.set_members),
            ]
        )
        _dashboard(controller).install(self.app)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        s = self.controller.settings
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            s.admin_host,
            s.admin_port,
            ssl_context=admin_access.server_ssl_context(s.admin_tls),
        )
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        self.port = sockets[0].getsockname()[1] if sockets else s.admin_port
        if self.access.files.files:
            self._watch = asyncio.get_running_loop().create_task(self._watch_credential_files())

    async def _watch_credential_files(self) -> None:
        while True:
            await asyncio.sleep(ACL_RELOAD_INTERVAL_S)
            self.access.reload_if_changed()

    async def stop(self) -> None:
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await cancel_and_wait(self._watch)
        if self._runner is not None:
            await self._runner.cleanup()

    def _authorize(self, request: web.Request, topics: list[str]) -> web.Response | None:
        """None if the request's principal holds ``admin`` on every topic, else the 403."""
        session = admin_access.session(request)
        if session is None:
            return None
        try:
            for topic in sorted(set(topics)):
                session.require(Operation.ADMIN, topic)
        except HeadraceError as exc:
            return admin_access.error_response(exc)
        return None

    async def healthz(self, request: web.Request) -> web.Response:
        """``pid`` and ``instance`` tell ``headrace local up`` and the CLI which controller
        answers on this address."""
        s = self.controller.settings
        return web.json_response(
            {
                "status": "ok",
                "steps": self.controller.steps,
                "pid": os.getpid(),
                "clusterId": s.cluster_id,
                "instance": s.instance,
            }
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def state(self, request: web.Request) -> web.Response:
        doc = self.controller.state_document()
        # the credential files: each one's path and last failed reload (None: it read well)
        doc["credentials"] = {
            "generation": self.access.generation,
            "files": self.access.files.status(),
        }
        return web.json_response(doc)

    async def replicas(self, request: web.Request) -> web.Response:
        """``?topic=<namespace/name>``: each replica's log end as the controller last heard
        it (``Controller.replica_log_ends``)."""
        topic = request.query.get("topic")
        return web.json_response(self.controller.replica_log_ends(topic))

    async def topology(self, request: web.Request) -> web.Response:
        return web.json_response(self.controller.topology_document())

    async def topics(self, request: web.Request) -> web.Response:
        """The Topic documents as applied: ``headrace topics alter``
        edits one and applies it back, as ``kubectl edit`` would."""
        resources = self.controller.resources
        docs = [resources[n] for n in sorted(resources)]
        return web.json_response({"topics": docs})

    async def apply(self, request: web.Request) -> web.Response:
        """Body: manifests as YAML or JSON text, validated by the resource models."""
        text = await request.text()
        try:
            resources = load_manifests(text, source="request")
        except HeadraceError as exc:
            return web.json_response(
                {"error": type(exc).__name__, "message": exc.message}, status=422
            )
        unsupported = [r for r in resources if not isinstance(r, Topic | Unload | Repartition)]
        if unsupported:
            kinds = ", ".join(sorted({type(r).__name__ for r in unsupported}))
            return web.json_response(
                {
                    "error": "Unsupported",
                    "message": "local mode applies Topic, Unload and Repartition resources"
                    f" only, not {kinds}",
                },
                status=422,
            )
        topics = [_manifest(r) for r in resources if isinstance(r, Topic)]
        unloads = [_manifest(r) for r in resources if isinstance(r, Unload)]
        repartitions = [_manifest(r) for r in resources if isinstance(r, Repartition)]
        refused = self._authorize(
            request, [_target_topic(doc) for doc in (*topics, *unloads, *repartitions)]
        )
        if refused is not None:
            return refused
        try:
            for doc in topics:
                spec_of(doc)  # all or nothing: every spec is checked before any is applied
            self.controller.check_unloads(unloads)
            self.controller.check_repartitions(repartitions)
            warnings = self._admit(topics, allow=_flag(request, "allowProblems"))
            names = self.controller.apply(topics) if topics else []
            results = self.controller.apply_unloads(unloads) if unloads else []
            moved = self.controller.apply_repartitions(repartitions) if repartitions else []
        except UnloadConflict as exc:
            return web.json_response({"error": "Conflict", "message": exc.message}, status=409)
        except RepartitionRefused as exc:
            return web.json_response(
                {"error": "Refused", "message": exc.message, "problems": exc.lines}, status=422
            )
        except Refused as exc:
            return web.json_response(
                {"error": "Refused", "message": exc.message, "problems": exc.lines}, status=422
            )
        except HeadraceError as exc:
            return web.json_response(
                {"error": type(exc).__name__, "message": exc.message}, status=422
            )
        applied = [{"kind": "Topic", "name": n, "result": "applied"} for n in names]
        applied += [{"kind": "Unload", "name": n, "result": r} for n, r in results]
        applied += [{"kind": "Repartition", "name": n, "result": r} for n, r in moved]
        return web.json_response({"applied": applied, "warnings": warnings})

    def _admit(self, topics: list[dict[str, Any]], *, allow: bool) -> list[str]:
        """The lines of what the cluster cannot honour in ``topics`` (``control.admission``).

        Raises ``Refused`` if there are any and ``allow`` is off; else they are warnings."""
        c = self.controller
        lines = [
            problem.line()
            for doc in topics
            for problem in admission.topic_problems(
                doc,
                cluster_name=c.settings.cluster_id,
                brokers=len(c.settings.brokers),
                existing=c.state.topics.get(full_name(doc)),
            )
        ]
        if lines and not allow:
            raise Refused(lines)
        return lines

    async def members(self, request: web.Request) -> web.Response:
        return web.json_response(self.controller.members_document())

    async def set_members(self, request: web.Request) -> web.Response:
        """``{"brokers": [{id, host, port, adminPort}]}``: the brokers the cluster should
        have; replicas move onto new ones and off the others (``control.moves``).

        It moves replicas of every topic: with ACLs it takes ``admin`` on each of them."""
        c = self.controller
        refused = self._authorize(request, [*c.resources, *c.state.topics])  # applied or placed
        if refused is not None:
            return refused
        try:
            doc = await request.json()
            if not isinstance(doc, dict) or not isinstance(doc.get("brokers"), list):
                raise InvalidRequest('expected {"brokers": [{id, host, port, adminPort}]}')
            brokers = [BrokerEndpoint.from_json(b, "members") for b in doc["brokers"]]
            self.controller.set_members(brokers)
        except ValueError as exc:
            return web.json_response(
                {"error": "InvalidRequest", "message": f"not JSON: {exc}"}, status=400
            )
        except HeadraceError as exc:
            return web.json_response(
                {"error": type(exc).__name__, "message": exc.message}, status=400
            )
        return web.json_response(self.controller.members_document())

    async def delete(self, request: web.Request) -> web.Response:
        """Body: ``{"topics": [...], "unloads": [...], "repartitions": [...]}``
        ('namespace/name' each)."""
        body: Any = await request.json()
        if not isinstance(body, dict):
            body = {}
        topics = [str(n) for n in body.get("topics", [])]
        unloads = [str(n) for n in body.get("unloads", [])]
        repartitions = [str(n) for n in body.get("repartitions", [])]
        c = self.controller
        # An Unload or Repartition that does not exist changes nothing when deleted.
        touched = [
            *topics,
            *(_target_topic(c.unloads[n]) for n in unloads if n in c.unloads),
            *(_target_topic(c.repartitions[n]) for n in repartitions if n in c.repartitions),
        ]
        refused = self._authorize(request, touched)
        if refused is not None:
            return refused
        deleted, deferred = self.controller.delete_unloads(unloads) if unloads else ([], [])
        return web.json_response(
            {
                "deleted": self.controller.delete(topics) if topics else [],
                "unloads": {"deleted": deleted, "deferred": deferred},
                "repartitions": self.controller.delete_repartitions(repartitions)
                if repartitions
                else [],
            }
        )


class Refused(HeadraceError):
    """Apply refused: the cluster cannot honour what a manifest asks (nothing was applied)."""

    def __init__(self, lines: list[str]) -> None:
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        super().__init__(lines[0] + more)
        self.lines = lines


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes")


def _target_topic(doc: Mapping[str, Any]) -> str:
    """The topic a Topic, Unload or Repartition document changes ('namespace/name')."""
    if doc.get("kind") == "Topic":
        return full_name(doc)
    namespace = (doc.get("metadata") or {}).get("namespace") or "default"
    return f"{namespace}/{doc['spec']['topicRef']['name']}"


def _manifest(resource: Resource) -> dict[str, Any]:
    doc = resource.to_manifest()
    doc.pop("status", None)
    return dict(doc)
