"""Admin HTTP and the controller's API take the data plane's credentials, and the ACL file
is reloaded without a restart (docs/security.md §3, §6): real broker and controller
processes over real sockets."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import AuthenticationFailed, ConnectionClosed, ConsumeDenied, ProduceDenied
from headrace.protocol import messages as msg
from headrace.protocol.coordination import ClusterTopology
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.security.acl import hash_token
from headrace.testing import procs, waiting
from headrace.testing.procs import BrokerProcess
from tests.integration.localcluster import topic_manifest

OPS, WRITER, READER = "ops-3c9e1f7a2b", "writer-8a1d4e6c0f", "reader-5b7f2a9d3e"
REPLICATION = "replication-6e0c8b1a4d"


def acl(*, writer_grants: bool = True, reader: bool = True) -> dict[str, Any]:
    principals: list[dict[str, Any]] = [
        {
            "name": "ops",
            "tokens": [hash_token(OPS)],
            "grants": [{"operations": ["admin", "produce", "consume"], "topics": ["*"]}],
        },
        {
            "name": "writer",
            "tokens": [hash_token(WRITER)],
            "grants": [{"operations": ["produce"], "topics": ["orders*"]}] if writer_grants else [],
        },
    ]
    if reader:
        principals.append(
            {
                "name": "reader",
                "tokens": [hash_token(READER)],
                "grants": [{"operations": ["consume"], "topics": ["orders*"]}],
            }
        )
    return {"version": 1, "principals": principals}


def call(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def write_acl(path: Path, doc: dict[str, Any]) -> None:
    """Replace the file by a rename, as editors and ConfigMap updates do."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def metric(url: str, name: str, labels: str) -> float:
    status, text = call(f"{url}/metrics", token=OPS)
    assert status == 200
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", str(text), re.M)
    return float(match.group(1)) if match else 0.0


def produce_body(topic: str, value: bytes) -> bytes:
    batch = rb.encode([value], timestamp_ms=0)
    return msg.ProduceRequest(topic, 0, 1, msg.Acks.LEADER, 5000, batch).encode()


async def connect(broker: BrokerProcess, token: str) -> ClientConnection:
    host, _, port = broker.bootstrap.rpartition(":")
    return await ClientConnection.open(host, int(port), ConnectOptions(auth_token=token))


# ---------------------------------------------------------------------------- broker admin HTTP


@pytest.fixture
def cluster_broker(tmp_path: Path) -> Any:
    """A cluster-mode broker with ACLs, its replication token in its environment."""
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file, acl())
    key = tmp_path / "cluster.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o600)
    broker = BrokerProcess(
        tmp_path / "data",
        mode="cluster",
        extra_args=["--acl-file", str(acl_file), "--cluster-key-file", str(key)],
        env={"HEADRACE_REPLICATION_TOKEN": REPLICATION},
    )
    broker.start()
    yield broker
    broker.kill9()


def topology(broker: BrokerProcess, generation: int) -> bytes:
    doc = ClusterTopology(
        generation,
        "test",
        [BrokerEndpoint(0, "127.0.0.1", broker.port, broker.admin_port)],
        [],
    ).to_json()
    return json.dumps(doc).encode()


def test_a_topology_push_takes_the_cluster_grant(cluster_broker: BrokerProcess) -> None:
    """Whoever pushes a topology decides who leads what: only the cluster grant may."""
    url = f"{cluster_broker.admin_url}/v1/topology"
    for token, expected in ((None, 401), ("not-a-token", 401), (OPS, 403), (WRITER, 403)):
        status, doc = call(url, "POST", topology(cluster_broker, 7), token)
        assert status == expected, (token, doc)
        assert REPLICATION not in json.dumps(doc) and OPS not in json.dumps(doc)
    # nothing changed: the broker is still at generation 0
    assert cluster_broker.get_json("/v1/heartbeat")["generation"] == 0
    status, doc = call(url, "POST", topology(cluster_broker, 7), REPLICATION)
    assert status == 200, doc
    assert cluster_broker.get_json("/v1/heartbeat")["generation"] == 7
    assert (
        metric(cluster_broker.admin_url, "headrace_acl_denials_total", 'operation="cluster"') == 2
    )
    assert (
        metric(cluster_broker.admin_url, "headrace_acl_denials_total", 'operation="authenticate"')
        == 2
    )


def test_reads_are_open_by_default_and_authenticated_when_configured(
    broker_factory: Any, tmp_path: Path
) -> None:
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file, acl())
    open_reads: BrokerProcess = broker_factory(extra_args=["--acl-file", str(acl_file)])
    for path in ("/healthz", "/readyz", "/metrics", "/v1/topics", "/v1/status", "/v1/heartbeat"):
        assert call(f"{open_reads.admin_url}{path}")[0] == 200, path

    closed: BrokerProcess = broker_factory(
        extra_args=["--acl-file", str(acl_file), "--admin-read-access", "authenticated"]
    )
    for path in ("/healthz", "/readyz"):  # probes carry no credentials
        assert call(f"{closed.admin_url}{path}")[0] == 200, path
    for path in ("/metrics", "/v1/topics", "/v1/status", "/v1/heartbeat"):
        assert call(f"{closed.admin_url}{path}")[0] == 401, path
        assert call(f"{closed.admin_url}{path}", token="wrong")[0] == 401, path
        assert call(f"{closed.admin_url}{path}", token=READER)[0] == 200, path


def test_shared_tokens_guard_admin_http_changes(broker_factory: Any) -> None:
    broker: BrokerProcess = broker_factory(extra_args=["--auth-token", "shared-1f2e3d"])
    topics = f"{broker.admin_url}/v1/topics"
    body = json.dumps({"name": "orders", "partitions": 1}).encode()
    assert call(topics, "POST", body)[0] == 401
    assert call(topics, "POST", body, "wrong")[0] == 401
    assert call(topics)[1]["topics"] == []  # nothing was created
    assert call(topics, "POST", body, "shared-1f2e3d")[0] == 201
    assert call(f"{topics}/default/orders", "DELETE")[0] == 401
    assert call(f"{topics}/default/orders", "DELETE", token="shared-1f2e3d")[0] == 200


def test_admin_http_over_tls(broker_factory: Any, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    from e2e.testbed import pki

    ca = pki.new_ca()
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    cert, key = ca.issue("127.0.0.1", ips=("127.0.0.1",), server=True)
    (tmp_path / "admin.pem").write_bytes(cert)
    (tmp_path / "admin.key").write_bytes(key)
    broker = BrokerProcess(
        tmp_path / "data",
        extra_args=[
            "--auth-token",
            "shared-1f2e3d",
            "--admin-tls-cert",
            str(tmp_path / "admin.pem"),
            "--admin-tls-key",
            str(tmp_path / "admin.key"),
        ],
    )
    broker.spawn()
    https = f"https://127.0.0.1:{broker.admin_port}"
    context = ssl.create_default_context(cafile=str(ca_path))
    try:
        waiting.until(
            lambda: call(f"{https}/readyz", context=context)[0] == 200,
            30,
            "the broker's admin HTTPS answers",
            retry_on=(OSError,),
        )
        body = json.dumps({"name": "orders", "partitions": 1}).encode()
        assert call(f"{https}/v1/topics", "POST", body, context=context)[0] == 401
        assert call(f"{https}/v1/topics", "POST", body, "shared-1f2e3d", context)[0] == 201
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP
            urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/healthz", timeout=5)
    finally:
        broker.kill9()


# ---------------------------------------------------------------------------- the controller's API


@pytest.fixture
def controller(tmp_path: Path) -> Any:
    """A controller with ACLs; its one broker is not running (the API is what is tested)."""
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file, acl())
    port = procs.free_port()
    proc = procs.spawn(
        [
            *procs.HEADRACE_CLI,
            "controller",
            "--state-dir",
            str(tmp_path / "state"),
            "--admin-port",
            str(port),
            "--acl-file",
            str(acl_file),
            "--broker",
            f"0=127.0.0.1:{procs.free_port()}",
        ],
        tmp_path / "controller.log",
    )
    url = f"http://127.0.0.1:{port}"
    waiting.until(
        lambda: call(f"{url}/healthz")[0] == 200, 30, "the controller answers", retry_on=(OSError,)
    )
    yield url, acl_file, proc
    procs.reap(proc)


def applied(url: str) -> list[str]:
    return [d["metadata"]["name"] for d in call(f"{url}/v1/topics")[1]["topics"]]


def test_the_controller_api_takes_admin_on_every_topic_it_touches(controller: Any) -> None:
    url, _, _ = controller
    manifest = (topic_manifest("orders", 2, replicas=1, min_in_sync=1)).encode()
    for token, expected in ((None, 401), ("wrong", 401), (WRITER, 403)):
        status, doc = call(f"{url}/v1/apply", "POST", manifest, token)
        assert status == expected, (token, doc)
        assert WRITER not in json.dumps(doc)
    assert applied(url) == []  # nothing was applied
    status, doc = call(f"{url}/v1/apply", "POST", manifest, OPS)
    assert status == 200, doc
    assert applied(url) == ["orders"]
    # a membership change moves replicas of every topic: admin on each of them
    not_a_membership = json.dumps({"brokers": "none"}).encode()
    assert call(f"{url}/v1/members", "PUT", not_a_membership)[0] == 401
    assert call(f"{url}/v1/members", "PUT", not_a_membership, READER)[0] == 403
    # past the access check, the body is judged: the ops principal may
    assert call(f"{url}/v1/members", "PUT", not_a_membership, OPS)[0] == 400
    delete = json.dumps({"topics": ["default/orders"]}).encode()
    assert call(f"{url}/v1/delete", "POST", delete)[0] == 401
    assert call(f"{url}/v1/delete", "POST", delete, READER)[0] == 403
    assert applied(url) == ["orders"]
    status, doc = call(f"{url}/v1/delete", "POST", delete, OPS)
    assert status == 200 and doc["deleted"] == ["default/orders"], doc
    assert applied(url) == []


def test_the_controller_reloads_its_acl_file_on_sighup(controller: Any) -> None:
    url, acl_file, proc = controller
    orders = topic_manifest("orders", 1, replicas=1, min_in_sync=1).encode()
    payments = topic_manifest("payments", 1, replicas=1, min_in_sync=1).encode()
    doc = acl()
    doc["principals"].append(
        {
            "name": "orders-admin",
            "tokens": [hash_token("orders-admin-0a9b8c")],
            "grants": [{"operations": ["admin"], "topics": ["orders"]}],
        }
    )
    assert call(f"{url}/v1/apply", "POST", orders, "orders-admin-0a9b8c")[0] == 401
    write_acl(acl_file, doc)
    os.killpg(proc.pid, signal.SIGHUP)
    waiting.until(
        lambda: call(f"{url}/v1/apply", "POST", orders, "orders-admin-0a9b8c")[0] == 200,
        10,
        "the new principal applies its topic",
    )
    both = orders + b"\n---\n" + payments
    assert call(f"{url}/v1/apply", "POST", both, "orders-admin-0a9b8c")[0] == 403
    assert applied(url) == ["orders"]


# ---------------------------------------------------------------------------- ACL reload


async def test_a_changed_acl_file_applies_to_open_connections(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The file watch: a removed grant is refused on a connection opened before the change,
    a removed principal's connection is refused, a new principal may connect."""
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file, acl(reader=False))
    broker: BrokerProcess = broker_factory(
        extra_args=["--acl-file", str(acl_file), "--acl-reload-interval-ms", "100"]
    )
    ops = await connect(broker, OPS)
    await ops.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    writer = await connect(broker, WRITER)
    await writer.request(Op.PRODUCE, produce_body("orders", b"before"))
    with pytest.raises(AuthenticationFailed):
        await connect(broker, READER)

    write_acl(acl_file, acl(writer_grants=False, reader=True))
    waiting.until(
        lambda: (
            metric(broker.admin_url, "headrace_acl_reloads_total", 'result="ok",source="acl"') == 1
        ),
        10,
        "the broker reloads the changed file",
    )
    with pytest.raises(ProduceDenied):  # same connection, the grant is gone
        await writer.request(Op.PRODUCE, produce_body("orders", b"after"))
    reader = await connect(broker, READER)  # a new principal
    await reader.close()

    # the writer principal removed: its open connection is refused (and closed)
    no_writer = acl()
    no_writer["principals"] = [p for p in no_writer["principals"] if p["name"] != "writer"]
    write_acl(acl_file, no_writer)
    waiting.until(
        lambda: (
            metric(broker.admin_url, "headrace_acl_reloads_total", 'result="ok",source="acl"') == 2
        ),
        10,
        "the broker reloads the file again",
    )
    with pytest.raises(AuthenticationFailed) as refused:
        await writer.request(Op.PRODUCE, produce_body("orders", b"revoked"))
    assert WRITER not in refused.value.message and hash_token(WRITER) not in refused.value.message
    await writer.close()
    # only the record produced while granted is stored
    req = msg.FetchRequest("orders", 0, 0, 1024, 0, msg.Isolation.UNCOMMITTED)
    head, _ = msg.FetchResponseHeader.decode((await ops.request(Op.FETCH, req.encode())).body)
    assert head.log_end_offset == 1
    await ops.close()


async def test_sighup_reloads_and_a_bad_file_keeps_the_grants_in_force(
    broker_factory: Any, tmp_path: Path
) -> None:
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file, acl(reader=False))
    # no file watch: only SIGHUP reloads
    broker: BrokerProcess = broker_factory(
        extra_args=["--acl-file", str(acl_file), "--acl-reload-interval-ms", "0"]
    )
    ops = await connect(broker, OPS)
    await ops.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())

    def reloads(result: str) -> float:
        return metric(
            broker.admin_url, "headrace_acl_reloads_total", f'result="{result}",source="acl"'
        )

    for bad in ("principals: [\n", json.dumps({"version": 1, "principals": [{"name": "x"}]})):
        acl_file.write_text(bad)
        errors = reloads("error")
        os.kill(broker.pid, signal.SIGHUP)
        waiting.until(lambda e=errors: reloads("error") == e + 1, 10, "a failed reload")
        status = broker.get_json("/v1/status")["acl"]
        assert isinstance(status, dict) and status["reload_error"], status
        assert status["generation"] == 0
        # the old grants hold: ops still administers, the writer still produces
        writer = await connect(broker, WRITER)
        await writer.request(Op.PRODUCE, produce_body("orders", b"kept"))
        await writer.close()
        with pytest.raises(AuthenticationFailed):
            await connect(broker, READER)
    assert "failed" in broker.log_tail(200) and "ACL reload" in broker.log_tail(200)

    write_acl(acl_file, acl())
    os.kill(broker.pid, signal.SIGHUP)
    waiting.until(lambda: reloads("ok") == 1, 10, "a good reload")
    assert broker.get_json("/v1/status")["acl"] == {"generation": 1, "reload_error": None}
    reader = await connect(broker, READER)
    await reader.close()
    await ops.close()
    assert broker.alive


def test_the_cli_sends_its_token_to_the_controller(controller: Any, tmp_path: Path) -> None:
    url, _, _ = controller
    path = tmp_path / "orders.yaml"
    path.write_text(topic_manifest("orders", 1, replicas=1, min_in_sync=1))
    refused = procs.run_headrace("apply", "-f", str(path), "--controller", url)
    assert refused.returncode != 0
    ok = procs.run_headrace(
        "apply", "-f", str(path), "--controller", url, env={"HEADRACE_AUTH_TOKEN": OPS}
    )
    assert ok.returncode == 0, ok.stderr.decode()
    assert applied(url) == ["orders"]
    deleted = subprocess.run(
        [
            *procs.HEADRACE_CLI,
            "topics",
            "delete",
            "orders",
            "--controller",
            url,
            "--auth-token",
            OPS,
        ],
        capture_output=True,
        env=procs.child_env(),
        check=False,
        timeout=60,
    )
    assert deleted.returncode == 0, deleted.stderr.decode()
    assert applied(url) == []


def test_the_controller_polls_and_pushes_over_https_with_its_token(
    tmp_path: Path,
) -> None:
    """The controller's fleet (the operator's too) presents its token and verifies the
    brokers' admin TLS: the broker gets its topology only that way."""
    from cryptography.hazmat.primitives import serialization

    from e2e.testbed import pki

    ca = pki.new_ca()
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    cert, key = ca.issue("127.0.0.1", ips=("127.0.0.1",), server=True)
    (tmp_path / "admin.pem").write_bytes(cert)
    (tmp_path / "admin.key").write_bytes(key)
    broker = BrokerProcess(
        tmp_path / "data",
        mode="cluster",
        extra_args=[
            "--auth-token",
            "shared-1f2e3d",
            "--admin-tls-cert",
            str(tmp_path / "admin.pem"),
            "--admin-tls-key",
            str(tmp_path / "admin.key"),
        ],
    )
    broker.spawn()
    https = f"https://127.0.0.1:{broker.admin_port}"
    context = ssl.create_default_context(cafile=str(ca_path))
    port = procs.free_port()
    controller = procs.spawn(
        [
            *procs.HEADRACE_CLI,
            "controller",
            "--state-dir",
            str(tmp_path / "state"),
            "--admin-port",
            str(port),
            "--broker-admin-ca",
            str(ca_path),
            "--broker",
            f"0=127.0.0.1:{broker.admin_port}",
        ],
        tmp_path / "controller.log",
        env={**procs.child_env(), "HEADRACE_REPLICATION_TOKEN": "shared-1f2e3d"},
    )
    try:

        def generation() -> int:
            status, doc = call(f"{https}/v1/heartbeat", context=context)
            assert status == 200, doc
            return int(doc["generation"])

        waiting.until(
            lambda: generation() >= 1, 30, "a topology pushed over HTTPS", retry_on=(OSError,)
        )
        status, state = call(f"http://127.0.0.1:{port}/v1/state")
        assert status == 200 and state["live"] == [0], state
    finally:
        procs.reap(controller)
        broker.kill9()


def test_an_admin_client_certificate_names_its_principal(tmp_path: Path) -> None:
    """``--admin-tls-client-ca``: the certificate's CN is the principal, as on the data port."""
    from cryptography.hazmat.primitives import serialization

    from e2e.testbed import pki

    ca = pki.new_ca()
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))

    def pair(cn: str, **kinds: bool) -> tuple[str, str]:
        cert, key = ca.issue(cn, ips=("127.0.0.1",), **kinds)
        (tmp_path / f"{cn}.pem").write_bytes(cert)
        (tmp_path / f"{cn}.key").write_bytes(key)
        return str(tmp_path / f"{cn}.pem"), str(tmp_path / f"{cn}.key")

    server_cert, server_key = pair("127.0.0.1", server=True)
    doc = acl()
    doc["principals"].append(
        {
            "name": "ops-by-certificate",
            "certificates": ["ops.example"],
            "grants": [{"operations": ["admin"], "topics": ["*"]}],
        }
    )
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file, doc)
    broker = BrokerProcess(
        tmp_path / "data",
        extra_args=[
            "--acl-file",
            str(acl_file),
            "--admin-tls-cert",
            server_cert,
            "--admin-tls-key",
            server_key,
            "--admin-tls-client-ca",
            str(ca_path),
        ],
    )
    broker.spawn()
    https = f"https://127.0.0.1:{broker.admin_port}"

    def client(cn: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca_path))
        context.load_cert_chain(*pair(cn, client=True))
        return context

    ops, stranger = client("ops.example"), client("stranger.example")
    body = json.dumps({"name": "orders", "partitions": 1}).encode()
    try:
        waiting.until(
            lambda: call(f"{https}/readyz", context=ops)[0] == 200,
            30,
            "the broker's admin HTTPS answers",
            retry_on=(OSError,),
        )
        assert call(f"{https}/v1/topics", "POST", body, context=stranger)[0] == 401
        assert call(f"{https}/v1/topics", "POST", body, READER, stranger)[0] == 403
        assert call(f"{https}/v1/topics", "POST", body, context=ops)[0] == 201
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no client certificate
            call(
                f"{https}/readyz",
                context=ssl.create_default_context(cafile=str(ca_path)),
            )
    finally:
        broker.kill9()


async def test_a_joined_consumer_is_refused_once_its_principal_is_removed(
    broker_factory: Any, tmp_path: Path
) -> None:
    """A member sends only credit, acks and heartbeats once joined: those frames must
    authenticate again after a reload too, or a revoked token keeps an open consumer fed."""
    acl_file = tmp_path / "acl.yaml"
    write_acl(acl_file, acl())
    broker: BrokerProcess = broker_factory(
        extra_args=["--acl-file", str(acl_file), "--acl-reload-interval-ms", "100"]
    )
    ops = await connect(broker, OPS)
    await ops.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    reader = await connect(broker, READER)
    issued = msg.IdentityOk.decode(
        (await reader.request(Op.IDENTITY, msg.IdentityRequest("r").encode())).body
    )
    join = msg.CohortJoin("team", "orders", issued.member_id, identity=issued.token)
    await reader.request(Op.COHORT_JOIN, join.encode())
    await reader.request(Op.COHORT_HEARTBEAT, b"{}")  # a member in good standing

    no_reader = acl(reader=False)
    write_acl(acl_file, no_reader)
    waiting.until(
        lambda: (
            metric(broker.admin_url, "headrace_acl_reloads_total", 'result="ok",source="acl"') == 1
        ),
        10,
        "the broker reloads the changed file",
    )
    with pytest.raises(AuthenticationFailed):
        await reader.request(Op.COHORT_HEARTBEAT, b"{}")
    await reader.close()

    # the token kept but the consume grant gone: refused, and the connection (so the
    # membership) ends, since a later frame is not checked again
    write_acl(acl_file, acl())
    waiting.until(
        lambda: (
            metric(broker.admin_url, "headrace_acl_reloads_total", 'result="ok",source="acl"') == 2
        ),
        10,
        "the broker reloads the file again",
    )
    reader = await connect(broker, READER)
    issued = msg.IdentityOk.decode(
        (await reader.request(Op.IDENTITY, msg.IdentityRequest("r").encode())).body
    )
    join = msg.CohortJoin("team", "orders", issued.member_id, identity=issued.token)
    await reader.request(Op.COHORT_JOIN, join.encode())
    no_grant = acl()
    for principal in no_grant["principals"]:
        if principal["name"] == "reader":
            principal["grants"] = []
    write_acl(acl_file, no_grant)
    waiting.until(
        lambda: (
            metric(broker.admin_url, "headrace_acl_reloads_total", 'result="ok",source="acl"') == 3
        ),
        10,
        "the broker reloads the file a third time",
    )
    with pytest.raises(ConsumeDenied):
        await reader.request(Op.COHORT_HEARTBEAT, b"{}")
    with pytest.raises(ConnectionClosed):  # closed: no heartbeat is answered any more
        await reader.request(Op.COHORT_HEARTBEAT, b"{}")
    await reader.close()
    await ops.close()
