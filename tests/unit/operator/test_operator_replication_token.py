"""The replication token on Kubernetes as it rotates: the operator re-reads the cluster's
auth Secret (over the operator's ``ClientApi`` and kmock's API emulator) and presents the
first token it lists; ``headrace drain`` reads the broker's own copy of the file."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp.web
import kopf
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER

from headrace.cli import drain
from headrace.control.reconcile import Event
from headrace.errors import InvalidRequest
from headrace.fleet.http import HttpFleet
from headrace.operator import auth, handlers, running
from headrace.operator.bodies import parse_cluster
from headrace.operator.kube import ClientApi
from headrace.operator.running import (
    ClusterPorts,
    ClusterRuntime,
    Credentials,
    DesiredObjects,
    RuntimeSettings,
)
from headrace.operator.surfaces import loop_health
from headrace.protocol.endpoints import BrokerEndpoint
from tests.unit.controller.controller_fakes import ManualClock

AUTH_CLUSTER = {**CLUSTER, "spec": {"replicas": 3, "auth": {"enabled": True}}}
INTERVAL_MS = RuntimeSettings().token_reread_interval_ms


def write_tokens(server: ApiServer, text: str) -> None:
    """Edit the Secret's ``replicationToken`` as ``kubectl patch`` would."""
    secret = server.body("Secret", "demo-cluster-auth")
    secret["data"][auth.REPLICATION_TOKEN_KEY] = base64.b64encode(text.encode()).decode()
    server.put(secret)


async def runtime_over(api: ClientApi, clock: ManualClock) -> tuple[ClusterRuntime, list[Event]]:
    events: list[Event] = []
    token = await auth.replication_token(
        api, parse_cluster(AUTH_CLUSTER)
    )  # makes the Secret, as the handler

    async def read_tokens() -> tuple[str, ...] | None:
        return await auth.read_replication_tokens(api, parse_cluster(AUTH_CLUSTER))

    runtime = ClusterRuntime(
        DesiredObjects(AUTH_CLUSTER),
        ClusterPorts(api, clock, events=events.append),
        credentials=Credentials(token=token, read_tokens=read_tokens),
    )
    return runtime, events


async def test_the_loop_presents_the_secrets_first_token_as_a_rotation_goes_by(
    server: ApiServer, api: ClientApi
) -> None:
    clock = ManualClock()
    runtime, events = await runtime_over(api, clock)
    old = runtime.auth_token
    assert old and not await runtime.refresh_token()  # first read: the same token

    # step 1: the new token second; still the old one sent
    write_tokens(server, f"{old}\nnew-token-2\n")
    clock.advance(INTERVAL_MS)
    assert not await runtime.refresh_token()
    assert runtime.auth_token == old

    # step 2: the new one first. Not read again before the interval (one GET per interval)
    write_tokens(server, f"new-token-2\n{old}\n")
    clock.advance(INTERVAL_MS - 1)
    assert not await runtime.refresh_token() and runtime.auth_token == old
    clock.advance(1)
    assert await runtime.refresh_token()
    assert runtime.auth_token == "new-token-2"
    assert runtime.rollout.auth_headers == {"Authorization": "Bearer new-token-2"}
    assert runtime.pods is not None
    assert runtime.pods.http._headers == {"Authorization": "Bearer new-token-2"}
    [event] = events
    assert event.kind == running.TOKEN_CHANGED and event.subject == "ns/demo"
    assert "first of 2" in event.message and "new-token-2" not in event.message

    # step 3: the old one removed; nothing changes for the operator
    write_tokens(server, "new-token-2\n")
    clock.advance(INTERVAL_MS)
    assert not await runtime.refresh_token() and len(events) == 1


async def test_a_bad_or_missing_secret_keeps_the_token_in_force(
    server: ApiServer, api: ClientApi, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    runtime, events = await runtime_over(api, clock)
    old = runtime.auth_token
    for bad in ("", "# nothing\n", "a b\n", f"{old}\n{old}\n"):
        write_tokens(server, bad)
        clock.advance(INTERVAL_MS)
        assert not await runtime.refresh_token()
        assert runtime.auth_token == old
    assert "not re-read" in caplog.text and old not in caplog.text  # never the value
    del server.objects["v1/secrets", "ns", "demo-cluster-auth"]
    clock.advance(INTERVAL_MS)
    assert not await runtime.refresh_token() and runtime.auth_token == old
    assert events == []


async def test_a_refused_poll_makes_the_loop_read_the_secret_at_once(
    server: ApiServer, api: ClientApi
) -> None:
    clock = ManualClock()
    runtime, _ = await runtime_over(api, clock)
    assert not await runtime.refresh_token()
    write_tokens(server, "rotated-elsewhere\n")
    assert not await runtime.refresh_token()  # not due yet
    assert runtime.pods is not None
    runtime.pods.http.refusals += 1  # a broker answered 401 (see the next test)
    assert await runtime.refresh_token()
    assert runtime.auth_token == "rotated-elsewhere"


async def test_the_fleet_counts_the_polls_and_pushes_a_broker_refuses() -> None:
    async def refuse(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(status=401, text="AuthenticationFailed")

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fleet = HttpFleet([BrokerEndpoint(0, "127.0.0.1", 9092, port)], ManualClock(), 2000)
    await fleet.start()
    try:
        assert await fleet.poll() == {}  # no answer, not a dead broker
        assert await fleet.push(0, {"generation": 1}) is None
        assert fleet.refusals == 2
    finally:
        await fleet.close()
        await runner.cleanup()


def test_the_secret_lists_the_token_to_present_first() -> None:
    def secret(text: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "s"},
            "data": {"replicationToken": base64.b64encode(text.encode()).decode()},
        }

    assert auth.replication_tokens_of(secret("only")) == ("only",)  # a Secret made before rotation
    assert auth.replication_tokens_of(secret("new\n# note\nold\n")) == ("new", "old")
    with pytest.raises(InvalidRequest, match="line 2 repeats line 1"):
        auth.replication_tokens_of(secret("x\nx\n"))
    with pytest.raises(LookupError):
        auth.replication_tokens_of({"metadata": {"name": "s"}, "data": {}})


def test_drain_reads_the_brokers_token_file_and_falls_back_to_the_env(tmp_path: Path) -> None:
    token_file = tmp_path / "replication.token"
    token_file.write_text("new\nold\n")
    env = {drain.TOKEN_FILE_ENV: str(token_file), drain.TOKEN_ENV: "from-env"}
    assert drain.default_tokens(env) == ("new", "old")
    # a pod made before the file (a rolling upgrade): the env var
    assert drain.default_tokens({drain.TOKEN_ENV: "from-env"}) == ("from-env",)
    # a file that does not parse: the broker keeps its previous tokens, the env is the guess
    token_file.write_text("a b\n")
    assert drain.default_tokens(env) == ("from-env",)
    assert drain.default_tokens({}) == ()


def test_drain_tries_the_next_token_when_the_broker_refuses_one() -> None:
    seen: list[str | None] = []

    async def admin(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer old":
            return aiohttp.web.Response(status=401)
        return aiohttp.web.json_response({"brokerId": 1, "draining": True, "movable": []})

    loop = asyncio.new_event_loop()
    app = aiohttp.web.Application()
    app.router.add_route("*", "/v1/drain", admin)
    runner = aiohttp.web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        report = drain._call(f"http://127.0.0.1:{port}/v1/drain", "POST", 5.0, ("new", "old"))
        assert report["brokerId"] == 1
        assert seen == ["Bearer new", "Bearer old"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


async def test_a_workload_reconcile_hands_the_running_loop_the_first_token_and_survives_a_bad_edit(
    server: ApiServer, api: ClientApi
) -> None:
    clock = ManualClock()
    runtime, _ = await runtime_over(api, clock)
    old = runtime.auth_token
    context = handlers.OperatorContext(api=api, clock=clock)
    context.loops["ns", "demo"] = runtime
    body = {**AUTH_CLUSTER, "apiVersion": "headrace.dev/v1alpha1"}
    server.put({**body, "kind": "BrokerCluster"})

    write_tokens(server, f"next\n{old}\n")
    applied = await handlers.apply_workload(body, context)
    assert "StatefulSet/demo" in applied and runtime.auth_token == "next"

    write_tokens(server, "next\nnext\n")  # a bad edit: still applied, the token stays
    applied = await handlers.apply_workload(body, context)
    assert "StatefulSet/demo" in applied and runtime.auth_token == "next"
    sts = server.body("StatefulSet", "demo")
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--replication-token-file") + 1] == auth.REPLICATION_TOKEN_PATH


async def test_a_loop_that_cannot_start_on_a_bad_token_says_so_and_starts_once_it_is_fixed(
    server: ApiServer, api: ClientApi
) -> None:
    """An operator restart with a bad ``replicationToken`` in the Secret: no token to poll
    with, so no loop; /healthz (503, while /livez stays 200) and the BrokerCluster say why
    (a line, never the value), kopf retries soon, and the loop starts once the Secret is
    fixed."""
    body = server.put(
        {**AUTH_CLUSTER, "apiVersion": "headrace.dev/v1alpha1", "kind": "BrokerCluster"}
    )
    await auth.replication_token(
        api, parse_cluster(AUTH_CLUSTER)
    )  # the Secret, as the workload handler
    write_tokens(server, "secret-one secret-two\n")
    memo = SimpleNamespace(context=handlers.OperatorContext(api=api, clock=ManualClock()))
    indices = {"clusters_index": {("ns", "demo"): [body]}, "topics_index": {}, "unloads_index": {}}

    with pytest.raises(kopf.TemporaryError) as raised:
        await handlers.cluster_loop(namespace="ns", name="demo", memo=memo, **indices)
    assert raised.value.delay == INTERVAL_MS / 1000
    health = memo.context.health()["ns", "demo"]
    why = health.blocked
    assert why is not None and "replicationToken" in why and "secret-one" not in why
    # unhealthy on /healthz, but alive on /livez: restarting the operator would not fix
    # the Secret
    report = loop_health(memo.context.health(), time.monotonic(), 60)
    assert report.alive and not report.healthy
    assert "ns/demo: loop cannot start" in report.text()
    conditions = {
        c["type"]: c for c in server.body("BrokerCluster", "demo")["status"]["conditions"]
    }
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == handlers.TOKEN_UNREADABLE
    assert "line" in conditions["Ready"]["message"]
    assert "secret-one" not in conditions["Ready"]["message"]
    assert conditions["Stalled"]["status"] == "True"

    write_tokens(server, "fixed-token\n")  # kopf starts the daemon again after the delay
    task = asyncio.create_task(
        handlers.cluster_loop(namespace="ns", name="demo", memo=memo, **indices)
    )

    async def recovered() -> None:
        while True:
            status = server.body("BrokerCluster", "demo").get("status") or {}
            reasons = {c["type"]: c["reason"] for c in status.get("conditions") or []}
            if reasons.get("Ready") != handlers.TOKEN_UNREADABLE and "Stalled" not in reasons:
                return
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(recovered(), 10)
        assert memo.context.loops["ns", "demo"].auth_token == "fixed-token"
        assert memo.context.blocked == {} and memo.context.died == {}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
