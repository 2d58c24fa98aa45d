"""Principals, ACLs and signed member identities against a real broker over real sockets
(docs/security.md): each refusal is its typed error, nothing leaks, and the broker counts it."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import (
    AdminDenied,
    AuthenticationFailed,
    ClusterDenied,
    ConsumeDenied,
    HeadraceError,
    InvalidMemberIdentity,
    ProduceDenied,
)
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.security.acl import hash_token
from headrace.testing.procs import BrokerProcess

TOKENS = {
    "ops": "ops-9f2c1e7a5b",
    "writer": "writer-4d8e0b3f1a",
    "reader": "reader-7c1a9e2d6f",
    "tenant-a": "tenant-a-2b6f8d0c4e",
    "tenant-b": "tenant-b-5e3a7c9b1d",
}
ACL = {
    "version": 1,
    "principals": [
        {
            "name": "ops",
            "tokens": [hash_token(TOKENS["ops"])],
            "grants": [{"operations": ["admin", "produce", "consume"], "topics": ["*"]}],
        },
        {
            "name": "writer",
            "tokens": [hash_token(TOKENS["writer"])],
            "grants": [{"operations": ["produce"], "topics": ["default/orders*"]}],
        },
        {
            "name": "reader",
            "tokens": [hash_token(TOKENS["reader"])],
            "grants": [{"operations": ["consume"], "topics": ["default/orders*"]}],
        },
        {
            "name": "tenant-a",
            "tokens": [hash_token(TOKENS["tenant-a"])],
            "grants": [{"operations": ["consume"], "topics": ["shared"]}],
        },
        {
            "name": "tenant-b",
            "tokens": [hash_token(TOKENS["tenant-b"])],
            "grants": [
                {"operations": ["consume"], "topics": ["shared"], "cohorts": ["team", "b-*"]}
            ],
        },
    ],
}


@pytest.fixture
def secured(broker_factory: object, tmp_path: Path) -> BrokerProcess:
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(json.dumps(ACL))  # JSON is YAML
    broker: BrokerProcess = broker_factory(extra_args=["--acl-file", str(acl_file)])  # type: ignore[operator]
    return broker


def options(principal: str | None, token: str | None = None) -> ConnectOptions:
    return ConnectOptions(auth_token=token if principal is None else TOKENS[principal])


async def connect(broker: BrokerProcess, principal: str) -> ClientConnection:
    host, _, port = broker.bootstrap.rpartition(":")
    return await ClientConnection.open(host, int(port), options(principal))


async def setup_topics(broker: BrokerProcess) -> None:
    ops = await connect(broker, "ops")
    for name, partitions in (("orders", 2), ("payments", 1), ("shared", 2)):
        await ops.request(Op.CREATE_TOPIC, msg.CreateTopic(name, partitions).encode())
    await ops.close()


def denials(broker: BrokerProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^headrace_acl_denials_total\{operation="(\w+)"\} (\S+)$', text, re.M)
    }


def assert_no_secret(exc: HeadraceError) -> None:
    for token in TOKENS.values():
        assert token not in exc.message, exc.message
        assert hash_token(token) not in exc.message, exc.message


def produce_body(topic: str, value: bytes) -> bytes:
    batch = rb.encode([value], timestamp_ms=0)
    return msg.ProduceRequest(topic, 0, 1, msg.Acks.LEADER, 5000, batch).encode()


async def log_end(broker: BrokerProcess, topic: str, partition: int) -> int:
    ops = await connect(broker, "ops")
    try:
        req = msg.FetchRequest(topic, partition, 0, 1024, 0, msg.Isolation.UNCOMMITTED)
        head, _ = msg.FetchResponseHeader.decode((await ops.request(Op.FETCH, req.encode())).body)
        return head.log_end_offset
    finally:
        await ops.close()


async def test_wrong_or_missing_credentials_are_refused(secured: BrokerProcess) -> None:
    host, _, port = secured.bootstrap.rpartition(":")
    for token in ("wrong-token-0000", None, TOKENS["ops"] + "x"):
        with pytest.raises(AuthenticationFailed) as info:
            await ClientConnection.open(host, int(port), options(None, token))
        assert_no_secret(info.value)
        assert "wrong-token-0000" not in info.value.message
    assert denials(secured)["authenticate"] == 3


async def test_grants_decide_produce_consume_and_admin(secured: BrokerProcess) -> None:
    await setup_topics(secured)
    async with Producer(secured.bootstrap, options=options("writer")) as producer:
        meta = await (await producer.send("orders", b"allowed", partition=0))
    assert meta.offset == 0

    # a produce to a topic outside the writer's pattern: refused, and nothing stored
    writer = await connect(secured, "writer")
    with pytest.raises(ProduceDenied) as produce_denied:
        await writer.request(Op.PRODUCE, produce_body("default/payments", b"must not land"))
    assert_no_secret(produce_denied.value)
    assert await log_end(secured, "payments", 0) == 0
    # the connection stays usable after a denial
    assert (await writer.request(Op.PING, b"x")).op == Op.PONG

    # a consume without the grant: fetch and cohort join
    with pytest.raises(ConsumeDenied):
        await writer.request(
            Op.FETCH, msg.FetchRequest("orders", 0, 0, 1024, 0, msg.Isolation.COMMITTED).encode()
        )
    with pytest.raises(ConsumeDenied):
        await Consumer(secured.bootstrap, "orders", "c", options=options("writer")).start()

    # an admin op without the grant: nothing created or deleted
    reader = await connect(secured, "reader")
    with pytest.raises(AdminDenied):
        await reader.request(Op.CREATE_TOPIC, msg.CreateTopic("orders-new", 1).encode())
    with pytest.raises(AdminDenied):
        await reader.request(Op.DELETE_TOPIC, msg.TopicName("orders").encode())
    with pytest.raises(AdminDenied):
        await reader.request(Op.RESET_CURSORS, msg.ResetCursors("orders", "c", "earliest").encode())
    topics = json.loads((await reader.request(Op.DESCRIBE_TOPICS, b"{}")).body)["topics"]
    assert sorted(t["name"] for t in topics) == [
        "default/orders",
        "default/payments",
        "default/shared",
    ]

    # broker-to-broker operations need the cluster grant
    with pytest.raises(ClusterDenied):
        await reader.request(Op.REPLICA_FETCH, b"")
    with pytest.raises(ClusterDenied):
        await reader.request(Op.OFFSET_FOR_EPOCH, b"")
    await writer.close()
    await reader.close()

    # the reader may consume what the writer produced
    consumer = await Consumer(
        secured.bootstrap, "orders", "readers", start="earliest", options=options("reader")
    ).start()
    try:
        batches = await consumer.getmany(timeout_s=10)
        assert [v for b in batches for v in b.values()] == [b"allowed"]
    finally:
        await consumer.close(grace_s=0)

    # admin HTTP's topic admin asks for the same grant, as a bearer token
    def http_create(token: str | None) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(
            f"{secured.admin_url}/v1/topics",
            data=json.dumps({"name": "orders-http", "partitions": 1}).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert http_create(None)[0] == 401
    assert http_create("not-a-token")[0] == 401
    status, body = http_create(TOKENS["reader"])
    assert status == 403 and "AdminDenied" in body and TOKENS["reader"] not in body
    assert http_create(TOKENS["ops"])[0] == 201

    counted = denials(secured)
    assert counted["produce"] == 1
    assert counted["consume"] == 2
    assert counted["admin"] == 4
    assert counted["cluster"] == 2
    assert counted["authenticate"] == 2


async def test_a_member_id_is_bound_to_the_principal_it_was_issued_to(
    secured: BrokerProcess,
) -> None:
    await setup_topics(secured)
    victim = await Consumer(
        secured.bootstrap, "shared", "team", member_id="worker", options=options("tenant-a")
    ).start()
    try:
        # the issued id keeps the hint readable; the rest is the cluster's randomness
        assert re.fullmatch(r"worker\.[0-9a-f]{32}", victim.member_id)
        assert victim.identity is not None
        stolen_id, stolen_token = victim.member_id, victim.identity

        attacker = await connect(secured, "tenant-b")
        own_id, own_token = (lambda ok: (ok.member_id, ok.token))(
            msg.IdentityOk.decode(
                (await attacker.request(Op.IDENTITY, msg.IdentityRequest("worker").encode())).body
            )
        )
        assert own_id != stolen_id

        def join(member: str, token: str | None) -> bytes:
            return msg.CohortJoin("team", "shared", member, identity=token).encode()

        # no token, the victim's own token, the attacker's token, a forged token: all refused
        forged = stolen_token[: stolen_token.rindex(".")] + ".AAAA"
        for token in (None, stolen_token, own_token, forged):
            with pytest.raises(InvalidMemberIdentity) as info:
                await attacker.request(Op.COHORT_JOIN, join(stolen_id, token))
            assert stolen_token not in info.value.message
            assert own_token not in info.value.message
            assert_no_secret(info.value)
        # the attacker's own identity works for its own id
        joined = msg.Assignment.decode(
            (await attacker.request(Op.COHORT_JOIN, join(own_id, own_token))).body
        )
        assert joined.cohort == "team"
        # a cohort outside the attacker's cohort patterns: refused even with a good identity
        other = await connect(secured, "tenant-b")
        with pytest.raises(ConsumeDenied, match="cohort"):
            await other.request(
                Op.COHORT_JOIN,
                msg.CohortJoin("a-private", "shared", own_id, identity=own_token).encode(),
            )
        await other.close()
        await attacker.close()

        # the victim still holds its membership: nobody took its id
        ops = await connect(secured, "ops")
        described = json.loads(
            (await ops.request(Op.DESCRIBE_COHORTS, msg.DescribeCohorts("team").encode())).body
        )
        await ops.close()
        members = {m for c in described["cohorts"] for m in c["members"]}
        assert stolen_id in members
        assert denials(secured)["identity"] == 4
        assert denials(secured)["consume"] == 1
    finally:
        await victim.close(grace_s=0)


async def test_describe_cohorts_shows_only_topics_the_principal_may_read(
    secured: BrokerProcess,
) -> None:
    await setup_topics(secured)
    tenant = await Consumer(
        secured.bootstrap, "shared", "team", options=options("tenant-a")
    ).start()
    reader = await Consumer(
        secured.bootstrap, "orders", "readers", options=options("reader")
    ).start()
    try:
        conn = await connect(secured, "reader")
        seen = json.loads((await conn.request(Op.DESCRIBE_COHORTS, b"{}")).body)
        await conn.close()
        assert {c["topic"] for c in seen["cohorts"]} == {"default/orders"}
    finally:
        await tenant.close(grace_s=0)
        await reader.close(grace_s=0)


async def test_the_cluster_key_is_made_private_and_refused_when_not(
    broker_factory: object, tmp_path: Path
) -> None:
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(json.dumps(ACL))
    broker: BrokerProcess = broker_factory(extra_args=["--acl-file", str(acl_file)])  # type: ignore[operator]
    key = broker.data_dir / "cluster.key"
    assert key.stat().st_mode & 0o777 == 0o600
    broker.stop()
    key.chmod(0o644)
    with pytest.raises(Exception):  # noqa: B017,PT011 (the harness's start failure)
        broker.start()
    assert "chmod 600" in broker.log_path.read_text()


async def test_a_local_cluster_with_acls_replicates_and_shares_identities(tmp_path: Path) -> None:
    """``local up --acl-file``: brokers replicate as their own principal (the replication
    token), and an identity one broker issued is accepted by the others (one cluster key)."""
    from tests.integration.localcluster import LocalCluster, topic_manifest

    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(json.dumps(ACL))
    cluster = LocalCluster(tmp_path / "local")
    cluster.up("--acl-file", str(acl_file))
    try:
        # the controller's API takes the same credentials: apply needs admin on the topic
        assert cluster.apply(topic_manifest("orders", 3)).returncode != 0
        assert cluster.partitions("default/orders") == []
        cluster.api_token = TOKENS["ops"]
        key = cluster.dir / "cluster.key"
        assert key.stat().st_mode & 0o777 == 0o600
        record = cluster.record
        assert record["acl_file"] == str(acl_file.resolve())
        # secrets stay off command lines (ps shows them to every user)
        for b in record["brokers"]:
            with open(f"/proc/{b['pid']}/cmdline", "rb") as f:
                cmdline = f.read().decode()
            assert record["replication_token"] not in cmdline
        with open(f"/proc/{record['controller_pid']}/cmdline", "rb") as f:
            assert record["replication_token"] not in f.read().decode()
        assert cluster.apply(topic_manifest("orders", 3)).returncode == 0

        def online() -> bool:
            parts = cluster.partitions("default/orders")
            return len(parts) == 3 and all(
                p["state"] == "Online" and len(p["liveReplicas"]) == 3 for p in parts
            )

        cluster.wait(online, what="orders online with a full LRS")
        async with Producer(cluster.bootstrap, acks="all", options=options("writer")) as producer:
            for i in range(6):
                await (await producer.send("orders", f"r{i}".encode(), partition=i % 3))
        with pytest.raises(ProduceDenied):
            async with Producer(cluster.bootstrap, options=options("reader")) as producer:
                await (await producer.send("orders", b"no", partition=0))

        consumer = await Consumer(
            cluster.bootstrap, "orders", "readers", start="earliest", options=options("reader")
        ).start()
        try:
            # three partitions on three leaders: one issued identity joined every broker
            got: list[bytes] = []
            for _ in range(50):
                for b in await consumer.getmany(timeout_s=1):
                    got.extend(b.values())
                    consumer.ack_batch(b)
                if len(got) >= 6:
                    break
            assert sorted(got) == [f"r{i}".encode() for i in range(6)]
            assert consumer.identity is not None
            assert len(consumer._sessions) >= 2, "the identity should serve several brokers"
        finally:
            await consumer.close(grace_s=0)
    finally:
        cluster.down()


async def test_a_client_certificate_names_its_principal(
    broker_factory: object, tmp_path: Path
) -> None:
    """Mutual TLS: the certificate's subject CN is the principal; a token naming another
    principal on the same connection is refused."""
    import ssl

    from cryptography.hazmat.primitives import serialization

    from e2e.testbed import pki

    ca = pki.new_ca()
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))

    def pair(cn: str, **kinds: bool) -> tuple[Path, Path]:
        cert, key = ca.issue(cn, ips=("127.0.0.1",), **kinds)
        (tmp_path / f"{cn}.pem").write_bytes(cert)
        (tmp_path / f"{cn}.key").write_bytes(key)
        return tmp_path / f"{cn}.pem", tmp_path / f"{cn}.key"

    server_cert, server_key = pair("127.0.0.1", server=True)
    acl = {
        "version": 1,
        "principals": [
            {
                "name": "ops",
                "certificates": ["ops.example"],
                "grants": [{"operations": ["admin", "produce"], "topics": ["*"]}],
            },
            {
                "name": "reader",
                "certificates": ["reader.example"],
                "grants": [{"operations": ["consume"], "topics": ["orders"]}],
            },
            ACL["principals"][1],  # writer, by token
        ],
    }
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(json.dumps(acl))
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=[
            "--tls-cert",
            str(server_cert),
            "--tls-key",
            str(server_key),
            "--tls-client-ca",
            str(ca_path),
            "--acl-file",
            str(acl_file),
        ]
    )
    host, _, port = broker.bootstrap.rpartition(":")

    async def open_as(cn: str, token: str | None = None) -> ClientConnection:
        cert, key = pair(cn, client=True)
        ctx = ssl.create_default_context(cafile=str(ca_path))
        ctx.load_cert_chain(str(cert), str(key))
        return await ClientConnection.open(
            host, int(port), ConnectOptions(ssl=ctx, auth_token=token)
        )

    ops = await open_as("ops.example")
    await ops.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    await ops.request(Op.PRODUCE, produce_body("orders", b"by certificate"))
    await ops.close()

    reader = await open_as("reader.example")
    with pytest.raises(ProduceDenied):
        await reader.request(Op.PRODUCE, produce_body("orders", b"no"))
    req = msg.FetchRequest("orders", 0, 0, 1024, 0, msg.Isolation.UNCOMMITTED)
    head, _ = msg.FetchResponseHeader.decode((await reader.request(Op.FETCH, req.encode())).body)
    assert head.log_end_offset == 1
    await reader.close()

    with pytest.raises(AuthenticationFailed):
        await open_as("stranger.example")
    with pytest.raises(AuthenticationFailed):  # certificate says reader, token says writer
        await open_as("reader.example", TOKENS["writer"])
    writer = await open_as("stranger.example", TOKENS["writer"])  # the token names the principal
    await writer.request(Op.PRODUCE, produce_body("orders", b"by token"))
    await writer.close()


async def test_a_second_handshake_does_not_keep_the_first_principals_grants(
    secured: BrokerProcess,
) -> None:
    await setup_topics(secured)
    conn = await connect(secured, "ops")
    await conn.request(Op.PRODUCE, produce_body("orders", b"as ops"))  # decision cached
    hello = msg.Handshake(msg.PROTOCOL_VERSION, "again", TOKENS["reader"])
    await conn.request(Op.HANDSHAKE, hello.encode())
    with pytest.raises(ProduceDenied):
        await conn.request(Op.PRODUCE, produce_body("orders", b"as reader"))
    await conn.close()
    assert await log_end(secured, "orders", 0) == 1


async def test_a_stranger_may_not_send_large_frames_before_the_handshake(
    secured: BrokerProcess,
) -> None:
    """Until the handshake names a principal, frames are limited to 64 KiB; after it, to
    the broker's limit (a large batch goes through)."""
    from headrace import errors
    from headrace.protocol.frames import FRAME_HEADER
    from tests.integration.raw import RawConnection, error_of

    await setup_topics(secured)
    stranger = RawConnection(secured.bootstrap, handshake=False)
    stranger.send_raw(FRAME_HEADER.pack(1 << 20, Op.HANDSHAKE, 0, 1))
    assert error_of(stranger.recv()).code == errors.FrameTooLarge.CODE
    assert stranger.closed_by_peer()

    writer = RawConnection(secured.bootstrap, token=TOKENS["writer"])
    frame = writer.call(Op.PRODUCE, produce_body("orders", b"x" * (512 * 1024)))
    assert frame.op == Op.PRODUCE_OK, error_of(frame)
    writer.close()
