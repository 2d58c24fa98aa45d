"""A cluster loop never stops reconciling in silence, and a workload the API server
refuses shows in status: the daemon and the workload handler as kopf calls them, over
the operator's ``ClientApi`` and kmock's API emulator (``server``), with the surfaces'
real HTTP server.

* A BrokerCluster whose spec the model refuses (a cpu request above its limit, stored
  before the CRD had its CEL twin): its daemon does not die for good; the cluster is
  ``Ready=False``/``Stalled`` ``InvalidSpec`` with the model's message, ``/healthz`` says
  503 (``/livez`` stays 200: a restart would not fix it), and the loop starts once the
  spec is fixed.
* An apply the API server refuses (422): ``observedGeneration`` stays at the generation
  last applied, ``Ready=False`` carries the API server's reason and message; the next
  apply that goes through moves both on.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER

from headrace.operator import handlers
from headrace.operator.kube import ClientApi
from headrace.operator.surfaces import Surfaces, loop_health
from headrace.testing.waiting import until_async
from tests.unit.controller.controller_fakes import ManualClock

#: what ``kubectl patch`` of a StatefulSet's volumeClaimTemplates gets back
REFUSAL = (
    'StatefulSet.apps "demo" is invalid: spec: Forbidden: updates to statefulset spec for'
    " fields other than 'replicas', 'ordinals', 'template', 'updateStrategy',"
    " 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
)


def cluster_body(generation: int, **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(CLUSTER)
    body["metadata"]["generation"] = generation
    body["spec"].update(spec)
    return body


def edit(server: ApiServer, generation: int, **spec: Any) -> dict[str, Any]:
    """A spec edit, as ``kubectl patch`` makes it: the status stays."""
    body = server.body("BrokerCluster", "demo")
    body["metadata"]["generation"] = generation
    body["spec"] = {**CLUSTER["spec"], **spec}
    return server.put(body)


def status_of(server: ApiServer) -> dict[str, Any]:
    return server.body("BrokerCluster", "demo").get("status") or {}


def conditions_of(server: ApiServer) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status_of(server).get("conditions") or []}


def reason_of(server: ApiServer) -> str | None:
    """The Ready reason now (None while the status has no Ready condition)."""
    return conditions_of(server).get("Ready", {}).get("reason")


async def until(what: str, condition: Callable[[], bool], timeout_s: float = 20) -> None:
    await until_async(condition, timeout_s, what, poll_s=0.02)


@pytest.fixture
async def surfaces() -> AsyncIterator[Surfaces]:
    served = Surfaces("127.0.0.1", 0, stall_after_s=60)
    await asyncio.to_thread(served.start)
    yield served
    await asyncio.to_thread(served.stop)


async def get(surfaces: Surfaces, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{surfaces.port}{path}") as response,
    ):
        return response.status, await response.text()


@contextlib.asynccontextmanager
async def daemon(memo: Any, indices: dict[str, Any]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(
        handlers.cluster_loop(namespace="ns", name="demo", memo=memo, **indices)
    )
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_spec_the_model_refuses_shows_and_the_loop_starts_once_it_is_fixed(
    server: ApiServer, api: ClientApi, surfaces: Surfaces
) -> None:
    invalid = server.put(
        cluster_body(2, resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}})
    )
    context = handlers.OperatorContext(api=api, clock=ManualClock())
    surfaces.attach(asyncio.get_running_loop(), lambda: context.loops, context.health)
    memo = SimpleNamespace(context=context)
    indices: dict[str, Any] = {
        "clusters_index": {("ns", "demo"): [invalid]},
        "topics_index": {},
        "unloads_index": {},
    }

    # kopf starts the daemon again after a TemporaryError (a PermanentError would end it
    # for good, with nothing on /healthz or in status)
    with pytest.raises(kopf.TemporaryError):
        await handlers.cluster_loop(namespace="ns", name="demo", memo=memo, **indices)
    ready, stalled = conditions_of(server)["Ready"], conditions_of(server)["Stalled"]
    assert (ready["status"], ready["reason"]) == ("False", handlers.INVALID_SPEC)
    assert "requests.cpu (2) exceeds limits.cpu (1)" in ready["message"]
    assert ready["observedGeneration"] == 2
    assert (stalled["status"], stalled["reason"]) == ("True", handlers.INVALID_SPEC)
    status, text = await get(surfaces, "/healthz")
    assert status == 503, text
    assert "ns/demo: loop cannot start: invalid spec: spec.resources" in text
    assert (await get(surfaces, "/livez"))[0] == 200  # a restart would not fix the spec

    fixed = edit(server, 3, resources={"requests": {"cpu": "1"}, "limits": {"cpu": "1"}})
    indices["clusters_index"] = {("ns", "demo"): [fixed]}
    async with daemon(memo, indices):  # kopf's next start of the daemon
        await until("the loop", lambda: ("ns", "demo") in context.loops)
        await until(
            "the loop's own Ready",
            lambda: reason_of(server) not in (None, handlers.INVALID_SPEC),
        )
        assert "Stalled" not in conditions_of(server)
        assert context.blocked == {} and context.died == {}
        status, text = await get(surfaces, "/healthz")
        assert (status, text) == (200, "ok\nns/demo: stepping\n")


async def test_an_apply_the_api_server_refuses_is_not_observed_and_says_why(
    server: ApiServer, api: ClientApi
) -> None:
    first = server.put(cluster_body(1))
    context = handlers.OperatorContext(api=api, clock=ManualClock())
    memo = SimpleNamespace(context=context)
    indices: dict[str, Any] = {
        "clusters_index": {("ns", "demo"): [first]},
        "topics_index": {},
        "unloads_index": {},
    }
    await handlers.cluster_workload(body=first, namespace="ns", name="demo", memo=memo)
    async with daemon(memo, indices):
        await until(
            "generation 1 observed", lambda: status_of(server).get("observedGeneration") == 1
        )

        refused = edit(server, 2, image="headrace:2")
        indices["clusters_index"][("ns", "demo")] = [refused]  # the watch delivers it
        statefulsets = kmock.resource("apps/v1/statefulsets")
        server["patch", statefulsets][1:2] << kmock.KubernetesError(422, "Invalid", REFUSAL)
        with pytest.raises(Exception, match="Forbidden: updates to statefulset spec") as failed:
            await handlers.cluster_workload(body=refused, namespace="ns", name="demo", memo=memo)
        await until(
            "Ready with the API server's reason",
            lambda: reason_of(server) == "Invalid",
        )
        ready = conditions_of(server)["Ready"]
        assert ready["status"] == "False"
        assert "Forbidden: updates to statefulset spec" in ready["message"]
        assert ready["observedGeneration"] == 2
        assert status_of(server)["observedGeneration"] == 1, "generation 2 was not applied"
        assert conditions_of(server)["Stalled"]["reason"] == "Invalid"
        report = loop_health(context.health(), time.monotonic(), 60)
        assert report.alive and not report.healthy  # /livez 200, /healthz 503
        assert "ns/demo: stepping, spec not applied: Invalid: " in report.text()
        # kopf does not retry it: the same spec would be refused again (the next edit runs it)
        assert isinstance(failed.value, kopf.PermanentError), failed.value

        reverted = edit(server, 3)
        indices["clusters_index"][("ns", "demo")] = [reverted]  # the watch delivers it
        await handlers.cluster_workload(body=reverted, namespace="ns", name="demo", memo=memo)
        await until(
            "generation 3 observed", lambda: status_of(server).get("observedGeneration") == 3
        )
        assert conditions_of(server)["Ready"]["reason"] != "Invalid"
        assert "Stalled" not in conditions_of(server)
        assert loop_health(context.health(), time.monotonic(), 60).healthy
