"""The handlers as kopf itself runs them: the real kopf reactor (watches, indices,
handler dispatch, daemons, its own API client) against kmock's emulator (``server``).

The other handler tests call the handler functions directly; this one shows that kopf
delivers what they expect: a watched Topic of a missing cluster gets its status, a
created BrokerCluster gets its workload applied, its daemon starts the control loop
from the indices and looks for the cluster's pods. No control plane: kopf runs for under a
second, the whole test takes a few (closing the watch streams).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import kopf
from kopf._cogs.structs.credentials import Vault
from kube_server import ApiServer
from operator_fakes import CLUSTER, topic

from headrace.operator import handlers
from headrace.operator.kube import ClientApi
from headrace.operator.running import RuntimeSettings
from headrace.testing.waiting import until_async
from tests.unit.controller.controller_fakes import ManualClock


@contextlib.asynccontextmanager
async def kopf_running(
    server: ApiServer, api: ClientApi, runtime: RuntimeSettings | None = None
) -> AsyncIterator[handlers.OperatorContext]:
    """kopf with the headrace handlers, watching namespace ``ns`` of ``server``. (kmock's
    watch streams what is stored when kopf connects; objects stored later by the test
    itself are not announced, so a test stores its objects first.)"""
    # kopf's credentials, given (its Vault is not public API: kopf's own tests use it so),
    # so no login handler runs
    vault = Vault()
    await vault.populate({"kmock": kopf.ConnectionInfo(server=str(server.url), token="kmock")})
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    settings.watching.server_timeout = 5  # end quickly when stopped
    # kmock 0.8 cannot parse a list of namespaces (GET /api/v1/namespaces answers 500), so
    # kopf is told its namespace instead of finding it (the operator lists them for real)
    settings.scanning.disabled = True
    context = handlers.OperatorContext(
        api=api, clock=ManualClock(), runtime=runtime or RuntimeSettings()
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=kopf.get_default_registry(),
            settings=settings,
            standalone=True,
            namespaces=["ns"],
            vault=vault,
            memo=kopf.Memo(context=context),
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    await asyncio.wait_for(ready.wait(), 30)
    try:
        yield context
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def until(what: str, condition: Any, timeout_s: float = 30) -> None:
    await until_async(condition, timeout_s, what, poll_s=0.02)


async def test_kopf_runs_the_handlers_on_watched_objects(server: ApiServer, api: ClientApi) -> None:
    orphan = topic("lost")
    orphan["spec"]["clusterRef"]["name"] = "absent"
    server.put(orphan)
    server.put(CLUSTER)
    async with kopf_running(server, api) as context:
        await handled(server, context)


async def handled(server: ApiServer, context: handlers.OperatorContext) -> None:
    await until(
        "the orphan Topic's status (after its data finalizer)",
        lambda: "status" in server.body("Topic", "lost"),
    )
    ready = server.body("Topic", "lost")["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "ClusterNotFound")

    def statefulset() -> Any:
        try:  # stored once the apply is through (the request is recorded as it arrives)
            return server.objects["apps/v1/statefulsets", "ns", "demo"].raw.get("spec")
        except KeyError:
            return None

    await until("the StatefulSet applied", statefulset)
    assert statefulset()["replicas"] == 3
    await until("the control loop", lambda: ("ns", "demo") in context.loops)
    # the brokers' pods are watched (the loop reads them from the watch cache)
    assert any(
        r.resource is not None and r.resource.plural == "pods" and r.params.get("watch")
        for r in server["get"]
    )
    # kopf's own writes go to its annotations and finalizer, never to the spec
    body = server.body("BrokerCluster", "demo")
    assert body["spec"] == CLUSTER["spec"]
    assert f"{handlers.ANNOTATION_PREFIX}/finalizer" in body["metadata"].get("finalizers", [])


def statefulset_of(server: ApiServer) -> Any:
    try:  # stored once the apply is through (the request is recorded as it arrives)
        return server.objects["apps/v1/statefulsets", "ns", "demo"].raw.get("spec")
    except KeyError:
        return None


def reads_by_the_loop(server: ApiServer, plural: str) -> int:
    """Requests for ``plural`` the operator's own client made (kopf's watches and lists,
    which feed its indices, are not counted)."""
    return sum(
        1
        for r in server["get"]
        if r.resource is not None
        and r.resource.plural == plural
        and not r.headers.get("User-Agent", "").startswith("kopf/")
    )


async def test_a_step_reads_pods_and_the_statefulset_from_the_watch_cache(
    server: ApiServer, api: ClientApi
) -> None:
    # every step used to list the cluster's pods and get its StatefulSet: two calls a step,
    # about 20 a second per cluster while a transition polls fast
    server.put(CLUSTER)
    fast = RuntimeSettings(poll_interval_ms=20, transition_poll_interval_ms=20)
    async with kopf_running(server, api, fast) as context:
        await until("the control loop", lambda: ("ns", "demo") in context.loops)
        runtime = context.loops[("ns", "demo")]
        await until("the StatefulSet applied", lambda: statefulset_of(server) is not None)
        steps = runtime.loop.steps
        # a few steps for the watch to deliver it
        await until("five steps after that", lambda: runtime.loop.steps >= steps + 5)
        pods, statefulsets = (
            reads_by_the_loop(server, "pods"),
            reads_by_the_loop(server, "statefulsets"),
        )
        steps = runtime.loop.steps
        await until("ten more steps", lambda: runtime.loop.steps >= steps + 10)
        assert reads_by_the_loop(server, "pods") == pods, "a step listed the pods"
        assert reads_by_the_loop(server, "statefulsets") == statefulsets, (
            "a step read the StatefulSet"
        )
