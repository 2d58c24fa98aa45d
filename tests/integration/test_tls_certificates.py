"""TLS as brokers on Kubernetes use it, against a real broker over real sockets
(docs/security.md §10): one server name for every address, a renewed certificate served
without a restart, client certificates optional, plaintext refused."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import Encoding

from e2e.testbed import pki
from headrace import tlsnames
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import AdminDenied, AuthenticationFailed, ConnectionClosed, HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.coordination import ClusterTopology
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.security.acl import hash_token
from headrace.testing.procs import BrokerProcess, free_port
from tests.integration.cluster import Cluster

#: the name a Kubernetes cluster's certificate carries (its client Service), never an IP
SERVICE_NAME = "demo.streams.svc"


def _write(path: Path, data: bytes) -> Path:
    """Replace ``path`` by a rename, as the kubelet updates a Secret volume."""
    scratch = path.with_suffix(".tmp")
    scratch.write_bytes(data)
    os.replace(scratch, path)
    return path


def _issue(ca: pki.CA, tmp_path: Path, cn: str, **kinds: object) -> tuple[Path, Path]:
    cert, key = ca.issue(cn, **kinds)  # type: ignore[arg-type]
    return _write(tmp_path / f"{cn}.crt", cert), _write(tmp_path / f"{cn}.key", key)


async def _served_cn(broker: BrokerProcess, ctx: object) -> str:
    """The subject CN of the certificate a new connection is served."""
    host, _, port = broker.bootstrap.rpartition(":")
    conn = await ClientConnection.open(host, int(port), ConnectOptions(ssl=ctx))  # type: ignore[arg-type]
    assert conn.transport is not None
    der = conn.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
    await conn.close()
    name = x509.load_der_x509_certificate(der).subject
    return str(name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)


@pytest.fixture
def ca(tmp_path: Path) -> tuple[pki.CA, Path]:
    authority = pki.new_ca()
    path = _write(tmp_path / "ca.crt", authority.cert.public_bytes(serialization.Encoding.PEM))
    return authority, path


async def test_one_server_name_for_every_address_and_a_renewed_certificate_without_restart(
    broker_factory: object, tmp_path: Path, ca: tuple[pki.CA, Path]
) -> None:
    authority, ca_file = ca
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first_cert, first_key = authority.issue("first", server=True, dns=(SERVICE_NAME,))
    _write(cert, first_cert), _write(key, first_key)
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=[
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--acl-reload-interval-ms",
            "100",
        ]
    )
    named = tlsnames.client_context(ca_file, SERVICE_NAME)
    assert await _served_cn(broker, named) == "first"
    # the certificate names the Service, not 127.0.0.1: verifying the dialled host fails
    with pytest.raises(ConnectionClosed, match="certificate"):
        await _served_cn(broker, tlsnames.client_context(ca_file))
    # a plaintext client gets a typed error, not a hang
    host, _, port = broker.bootstrap.rpartition(":")
    with pytest.raises(HeadraceError):
        await ClientConnection.open(host, int(port), ConnectOptions(connect_timeout_s=5))

    # a renewal (cert-manager through the kubelet): both files replaced
    second_cert, second_key = authority.issue("second", server=True, dns=(SERVICE_NAME,))
    _write(key, second_key), _write(cert, second_cert)
    await _until(lambda: _served_cn(broker, named), "second")

    # a half-done replacement (a key that does not match) is refused: the pair in force stays
    _, stray_key = authority.issue("stray", server=True, dns=(SERVICE_NAME,))
    _write(key, stray_key)
    await _until(lambda: _status_error(broker), True)
    assert await _served_cn(broker, named) == "second"
    _write(key, second_key)
    await _until(lambda: _status_error(broker), False)


async def _status_error(broker: BrokerProcess) -> bool:
    """Whether the broker's status shows a failed certificate reload."""
    import urllib.request

    def read() -> bool:
        with urllib.request.urlopen(f"{broker.admin_url}/v1/status", timeout=5) as answer:
            files = json.loads(answer.read())["credentials"]["files"]
        return any(f.get("reload_error") for k, f in files.items() if k.startswith("tls"))

    return await asyncio.to_thread(read)


async def _until(probe: object, expected: object, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    seen: object = None
    while asyncio.get_running_loop().time() < deadline:
        seen = await probe()  # type: ignore[operator]
        if seen == expected:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still {seen!r}, expected {expected!r}")


async def test_optional_client_certificates_let_token_clients_in(
    broker_factory: object, tmp_path: Path, ca: tuple[pki.CA, Path]
) -> None:
    authority, ca_file = ca
    cert, key = _issue(authority, tmp_path, "broker", server=True, dns=(SERVICE_NAME,))
    acl = {
        "version": 1,
        "principals": [
            {
                "name": "app",
                "certificates": ["app.example"],
                "grants": [{"operations": ["admin"], "topics": ["*"]}],
            },
            {"name": "writer", "tokens": [hash_token("writer-token-1")], "grants": []},
        ],
    }
    acl_file = tmp_path / "acl.json"
    acl_file.write_text(json.dumps(acl))
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=[
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--tls-client-ca",
            str(ca_file),
            "--tls-client-auth",
            "optional",
            "--acl-file",
            str(acl_file),
        ]
    )
    host, _, port = broker.bootstrap.rpartition(":")

    async def connect(ctx: object, token: str | None = None) -> ClientConnection:
        return await ClientConnection.open(
            host,
            int(port),
            ConnectOptions(ssl=ctx, auth_token=token),  # type: ignore[arg-type]
        )

    app_cert, app_key = _issue(authority, tmp_path, "app.example", client=True)
    app = await connect(tlsnames.client_context(ca_file, SERVICE_NAME, app_cert, app_key))
    # the certificate names the principal: its admin grant creates a topic
    await app.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    await app.close()
    without = tlsnames.client_context(ca_file, SERVICE_NAME)
    writer = await connect(without, "writer-token-1")  # no certificate: the token decides
    with pytest.raises(AdminDenied):
        await writer.request(Op.CREATE_TOPIC, msg.CreateTopic("other", 1).encode())
    await writer.close()
    with pytest.raises(AuthenticationFailed):
        await connect(without)


async def test_only_the_client_ca_names_principals_not_the_serving_ca(
    broker_factory: object, tmp_path: Path
) -> None:
    """The serving CA (often a cluster-wide issuer) is trusted at the handshake so that
    brokers fetch from one another with their own certificates, but a certificate it
    issued with a User's CN is not that User: only the client CA's certificates name
    principals; the brokers' own certificates get in with the replication token."""
    serving = pki.new_ca("serving-issuer")
    clients = pki.new_ca("client-issuer")
    serving_ca = _write(tmp_path / "serving-ca.crt", serving.cert.public_bytes(Encoding.PEM))
    client_ca = _write(tmp_path / "client-ca.crt", clients.cert.public_bytes(Encoding.PEM))
    cert, key = _issue(serving, tmp_path, "broker", server=True, client=True, dns=(SERVICE_NAME,))
    acl = {
        "version": 1,
        "principals": [
            {
                "name": "app",
                "certificates": ["app.example"],
                "grants": [{"operations": ["admin"], "topics": ["*"]}],
            }
        ],
    }
    acl_file = tmp_path / "acl.json"
    acl_file.write_text(json.dumps(acl))
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=[
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--tls-ca",
            str(serving_ca),
            "--tls-client-ca",
            str(client_ca),
            "--tls-client-auth",
            "required",
            "--tls-server-name",
            SERVICE_NAME,
            "--replication-token",
            "replication-token-1",
            "--acl-file",
            str(acl_file),
        ]
    )
    host, _, port = broker.bootstrap.rpartition(":")

    async def connect(cert: Path, key: Path, token: str | None = None) -> ClientConnection:
        ctx = tlsnames.client_context(serving_ca, SERVICE_NAME, cert, key)
        return await ClientConnection.open(
            host,
            int(port),
            ConnectOptions(ssl=ctx, auth_token=token),  # type: ignore[arg-type]
        )

    # the serving CA's certificate with the User's CN passes the handshake, names no one
    forged_cert, forged_key = _issue(serving, tmp_path, "app.example", client=True)
    forged_cert = _write(tmp_path / "forged.crt", forged_cert.read_bytes())
    forged_key = _write(tmp_path / "forged.key", forged_key.read_bytes())
    with pytest.raises(AuthenticationFailed):
        await connect(forged_cert, forged_key)
    # the client CA's certificate with that CN is the User
    app_cert, app_key = _issue(clients, tmp_path, "app.example", client=True)
    app = await connect(app_cert, app_key)
    await app.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    await app.close()
    # a broker's own certificate (the serving CA) with the replication token gets in
    peer = await connect(cert, key, "replication-token-1")  # the handshake is accepted
    await peer.close()
    with pytest.raises(AuthenticationFailed):
        await connect(cert, key)  # and without the token it is no one


def _push_topology(admin_url: str, doc: object, token: str) -> None:
    request = urllib.request.Request(
        f"{admin_url}/v1/topology",
        data=json.dumps(doc).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


async def test_brokers_replicate_with_client_certificates_required(tmp_path: Path) -> None:
    """Two brokers with ``clientAuth: required`` and a client CA of its own: the follower
    fetches from the leader with its serving-CA certificate and the replication token
    (no principal from its CN), so an acks=all write with min in-sync 2 is acknowledged."""
    serving = pki.new_ca("serving-issuer")
    clients = pki.new_ca("client-issuer")
    serving_ca = _write(tmp_path / "serving-ca.crt", serving.cert.public_bytes(Encoding.PEM))
    client_ca = _write(tmp_path / "client-ca.crt", clients.cert.public_bytes(Encoding.PEM))
    cert, key = _issue(serving, tmp_path, "broker", server=True, client=True, dns=(SERVICE_NAME,))
    acl = {
        "version": 1,
        "principals": [
            {
                "name": "app",
                "certificates": ["app.example"],
                "grants": [{"operations": ["produce", "consume"], "topics": ["*"]}],
            }
        ],
    }
    acl_file = tmp_path / "acl.json"
    acl_file.write_text(json.dumps(acl))
    token = "replication-token-1"
    cluster_key = tmp_path / "cluster.key"
    cluster_key.write_text("ab" * 32 + "\n")
    cluster_key.chmod(0o600)
    cluster = Cluster(
        tmp_path,
        size=2,
        extra_args=[
            "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(serving_ca),
            "--tls-client-ca", str(client_ca), "--tls-client-auth", "required",
            "--tls-server-name", SERVICE_NAME, "--replication-token", token,
            "--acl-file", str(acl_file), "--cluster-key-file", str(cluster_key),
        ],
    )  # fmt: skip
    cluster.start()
    try:
        cluster.set_topic("default/orders", [([0, 1], 0, 1, [0, 1])], min_in_sync=2)
        brokers = cluster.brokers
        endpoints = [
            BrokerEndpoint(b.broker_id, "127.0.0.1", b.port, b.admin_port) for b in brokers
        ]
        doc = ClusterTopology(1, "test", endpoints, list(cluster.topics.values())).to_json()
        for b in brokers:  # with the replication token, as the operator pushes
            _push_topology(b.admin_url, doc, token)
        app_cert, app_key = _issue(clients, tmp_path, "app.example", client=True)
        leader = cluster.brokers[0]
        host, _, port = leader.bootstrap.rpartition(":")
        ctx = tlsnames.client_context(serving_ca, SERVICE_NAME, app_cert, app_key)
        conn = await ClientConnection.open(host, int(port), ConnectOptions(ssl=ctx))
        batch = rb.encode([b"replicated"], timestamp_ms=0)
        request_body = msg.ProduceRequest("orders", 0, 1, msg.Acks.ALL, 20_000, batch).encode()
        await conn.request(Op.PRODUCE, request_body)  # acknowledged: broker 1 has it too
        await conn.close()
    finally:
        cluster.stop()


async def test_a_named_listener_serves_a_certificate_of_its_own(
    broker_factory: object, tmp_path: Path, ca: tuple[pki.CA, Path]
) -> None:
    """``--listener-tls-cert``: the external listener serves the certificate naming the
    address outside clients dial; the data port keeps the in-cluster one."""
    authority, ca_file = ca
    inside_cert, inside_key = _issue(
        authority, tmp_path, "inside", server=True, dns=(SERVICE_NAME,)
    )
    outside_cert, outside_key = _issue(
        authority, tmp_path, "outside", server=True, ips=("127.0.0.1",)
    )
    port = free_port()
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=[
            "--tls-cert",
            str(inside_cert),
            "--tls-key",
            str(inside_key),
            "--listener",
            f"external=127.0.0.1:{port}",
            "--listener-tls-cert",
            f"external={outside_cert}",
            "--listener-tls-key",
            f"external={outside_key}",
        ]
    )
    # the external listener's certificate names the dialled address: verified as it is
    conn = await ClientConnection.open(
        "127.0.0.1", port, ConnectOptions(ssl=tlsnames.client_context(ca_file))
    )
    assert conn.transport is not None
    der = conn.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
    await conn.close()
    subject = x509.load_der_x509_certificate(der).subject
    assert subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "outside"
    # the data port still serves the in-cluster name only
    assert await _served_cn(broker, tlsnames.client_context(ca_file, SERVICE_NAME)) == "inside"
    with pytest.raises(ConnectionClosed, match="certificate"):
        await _served_cn(broker, tlsnames.client_context(ca_file))
