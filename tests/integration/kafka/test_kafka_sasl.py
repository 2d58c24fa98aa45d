"""SASL on the Kafka listener of a broker with an ACL file: a Kafka client names a
principal with one of its tokens (PLAIN, or SCRAM-SHA-256/512 against the credentials
derived from it), and gets exactly that principal's grants, group names included;
anything else is refused and the connection closed."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import KafkaError as CKafkaError
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as CNewTopic
from cryptography.hazmat.primitives import serialization

from e2e.testbed import pki
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.security import scram
from headrace.security.acl import hash_token
from headrace.testing.procs import BrokerProcess, free_port
from tests.integration.kafka.conftest import KafkaBroker

WRITER, READER = "writer-token-7a1c", "reader-token-2e9f"
ACL = {
    "version": 1,
    "principals": [
        {
            "name": "writer",
            "tokens": [hash_token(WRITER)],
            "scram": [
                scram.derive(mechanism, WRITER, b"salt-of-writer").text()
                for mechanism in scram.Mechanism
            ],
            "grants": [{"operations": ["admin", "produce", "consume"], "topics": ["*"]}],
        },
        {
            "name": "reader",
            "tokens": [hash_token(READER)],
            "scram": [
                scram.derive(scram.Mechanism.SCRAM_SHA_512, READER, b"salt-of-reader").text()
            ],
            "grants": [{"operations": ["consume"], "topics": ["orders"], "cohorts": ["audit-*"]}],
        },
    ],
}


@pytest.fixture
def secured(broker_factory: object, tmp_path: Path) -> KafkaBroker:
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps(ACL))
    port = free_port()
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=["--kafka-port", str(port), "--acl-file", str(acl)]
    )
    return KafkaBroker(broker, port)


def plain(user: str, password: str) -> dict[str, str]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


async def test_a_principal_gets_its_grants_and_nothing_else(secured: KafkaBroker) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=secured.bootstrap, **plain("writer", WRITER))
    await admin.start()
    try:
        await admin.create_topics([NewTopic("orders", 1, 1)])
    finally:
        await admin.close()
    writer = AIOKafkaProducer(
        bootstrap_servers=secured.bootstrap, enable_idempotence=True, **plain("writer", WRITER)
    )
    await writer.start()
    try:
        for i in range(10):
            await writer.send_and_wait("orders", b"o%d" % i, partition=0)
    finally:
        await writer.stop()

    reader_producer = AIOKafkaProducer(
        bootstrap_servers=secured.bootstrap, **plain("reader", READER)
    )
    await reader_producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await reader_producer.send_and_wait("orders", b"nope", partition=0)
    finally:
        await reader_producer.stop()

    async def read_as_group(group: str) -> list[bytes]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=secured.bootstrap,
            group_id=group,
            enable_auto_commit=False,
            **plain("reader", READER),
        )
        await consumer.start()
        try:
            tp = TopicPartition("orders", 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            records = (await consumer.getmany(tp, timeout_ms=10_000))[tp]
            await consumer.commit({tp: records[-1].offset + 1})
            return [r.value for r in records]
        finally:
            await consumer.stop()

    assert await read_as_group("audit-eu") == [b"o%d" % i for i in range(10)]
    with pytest.raises(KafkaError):  # the grant names audit-* groups only
        await read_as_group("billing")


async def test_wrong_credentials_and_requests_before_them_are_refused(
    secured: KafkaBroker,
) -> None:
    for user, password in (("writer", "guess"), ("writer", READER)):
        producer = AIOKafkaProducer(bootstrap_servers=secured.bootstrap, **plain(user, password))
        with pytest.raises(KafkaError):
            await producer.start()
        await producer.stop()

    # a Metadata request before any SASL exchange: an ILLEGAL_SASL_STATE answer, then EOF
    api = km.SUPPORTED[km.ApiKey.METADATA]
    with socket.create_connection(("127.0.0.1", secured.kafka_port), timeout=10) as sock:
        sock.sendall(km.encode_request(api, 1, 5, "t", km.MetadataRequest(None)))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
        assert struct.unpack(">ih", frame) == (5, ErrorCode.ILLEGAL_SASL_STATE)
        assert sock.recv(1) == b""


def test_librdkafka_authenticates_with_plain(secured: KafkaBroker) -> None:
    failures: list[CKafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": secured.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "writer",
            "sasl.password": WRITER,
            "error_cb": failures.append,
        }
    )
    metadata = producer.list_topics(timeout=10)
    assert metadata.brokers and not failures

    stranger = Producer(
        {
            "bootstrap.servers": secured.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "writer",
            "sasl.password": "guess",
            "error_cb": failures.append,
        }
    )
    with pytest.raises(KafkaException):
        stranger.list_topics(timeout=5)
    assert "invalid or missing credentials" in authentication_refusal(stranger, failures)


async def test_a_client_certificate_names_the_principal_over_tls(
    broker_factory: object, tmp_path: Path
) -> None:
    """A broker with TLS, optional client certificates and an ACL: aiokafka with the
    certificate of a principal is that principal at once (no SASL), and gets its grants;
    one with a certificate naming no principal must still authenticate."""
    authority = pki.new_ca()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(authority.cert.public_bytes(serialization.Encoding.PEM))

    def issue(cn: str, **kinds: object) -> tuple[Path, Path]:
        cert, key = authority.issue(cn, **kinds)  # type: ignore[arg-type]
        (tmp_path / f"{cn}.crt").write_bytes(cert)
        (tmp_path / f"{cn}.key").write_bytes(key)
        return tmp_path / f"{cn}.crt", tmp_path / f"{cn}.key"

    server_cert, server_key = issue("broker", server=True, ips=("127.0.0.1",))
    acl = dict(ACL)
    acl["principals"] = [
        *ACL["principals"],  # type: ignore[list-item]
        {
            "name": "app",
            "certificates": ["app.example"],
            "grants": [{"operations": ["admin", "produce"], "topics": ["*"]}],
        },
    ]
    (tmp_path / "acl.json").write_text(json.dumps(acl))
    port = free_port()
    broker_factory(  # type: ignore[operator]
        extra_args=[
            "--kafka-port", str(port), "--acl-file", str(tmp_path / "acl.json"),
            "--tls-cert", str(server_cert), "--tls-key", str(server_key),
            "--tls-client-ca", str(ca_file), "--tls-client-auth", "optional",
        ]
    )  # fmt: skip

    def context(cn: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(ca_file))
        if cn is not None:
            cert, key = issue(cn, client=True)
            ctx.load_cert_chain(cert, key)
        return ctx

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{port}",
        security_protocol="SSL",
        ssl_context=context("app.example"),
    )
    await admin.start()
    try:
        await admin.create_topics([NewTopic("orders", 1, 1)])
        assert "orders" in await admin.list_topics()
    finally:
        await admin.close()

    nobody = AIOKafkaProducer(
        bootstrap_servers=f"127.0.0.1:{port}",
        security_protocol="SSL",
        ssl_context=context("nobody.example"),
    )
    with pytest.raises(KafkaError):  # a certificate naming no principal, and no SASL
        await nobody.start()
    await nobody.stop()


def test_deleting_a_group_needs_a_grant_on_its_offsets(secured: KafkaBroker) -> None:
    """A group's offsets are a cohort's: the reader, whose grant names audit-* groups
    only, cannot delete the writer's group; the writer can."""

    def sasl(user: str, password: str) -> dict[str, str]:
        return {
            "bootstrap.servers": secured.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": password,
        }

    writer = AdminClient(sasl("writer", WRITER))
    writer.create_topics([CNewTopic("orders", 1, 1)])["orders"].result(timeout=30)
    consumer = Consumer({**sasl("writer", WRITER), "group.id": "billing"})
    consumer.commit(offsets=[CTopicPartition("orders", 0, 0)], asynchronous=False)
    consumer.close()

    reader = AdminClient(sasl("reader", READER))
    refused = reader.delete_consumer_groups(["billing"], request_timeout=10)["billing"]
    with pytest.raises(KafkaException) as denied:
        refused.result(timeout=30)
    assert denied.value.args[0].code() == CKafkaError.GROUP_AUTHORIZATION_FAILED
    writer.delete_consumer_groups(["billing"], request_timeout=10)["billing"].result(timeout=30)


@pytest.fixture
def secured_tls(broker_factory: object, tmp_path: Path) -> tuple[KafkaBroker, Path]:
    """A broker with TLS (no client certificates) and the ACL file: SASL over TLS, as a
    client outside a trusted network would use it. The CA file is the second value."""
    authority = pki.new_ca()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(authority.cert.public_bytes(serialization.Encoding.PEM))
    cert, key = authority.issue("broker", server=True, ips=("127.0.0.1",))
    (tmp_path / "broker.crt").write_bytes(cert)
    (tmp_path / "broker.key").write_bytes(key)
    (tmp_path / "acl.json").write_text(json.dumps(ACL))
    port = free_port()
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=[
            "--kafka-port", str(port), "--acl-file", str(tmp_path / "acl.json"),
            "--tls-cert", str(tmp_path / "broker.crt"), "--tls-key", str(tmp_path / "broker.key"),
        ]
    )  # fmt: skip
    return KafkaBroker(broker, port), ca_file


def scram_config(
    bootstrap: str, ca_file: Path, user: str, password: str, mechanism: str = "SCRAM-SHA-512"
) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(ca_file),
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def test_librdkafka_produces_and_consumes_with_scram_over_tls(
    secured_tls: tuple[KafkaBroker, Path],
) -> None:
    broker, ca_file = secured_tls
    writer = scram_config(broker.bootstrap, ca_file, "writer", WRITER)
    admin = AdminClient(writer)  # kept: a collected client cancels its futures
    admin.create_topics([CNewTopic("orders", 1, 1)])["orders"].result(timeout=30)
    producer = Producer({**writer, "enable.idempotence": True})
    delivered: list[object] = []
    for i in range(10):
        producer.produce(
            "orders", b"o%d" % i, partition=0, on_delivery=lambda e, m: delivered.append(e)
        )
    assert producer.flush(30) == 0
    assert delivered == [None] * 10

    # the reader's grant: consume orders in audit-* groups, and no produce
    reader = scram_config(broker.bootstrap, ca_file, "reader", READER)
    consumer = Consumer(
        {
            **reader,
            "group.id": "audit-eu",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["orders"])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < 10:
        assert time.monotonic() < deadline, f"read {values} only"
        message = consumer.poll(1.0)
        if message is None:
            continue
        assert message.error() is None, message.error()
        values.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert values == [b"o%d" % i for i in range(10)]

    denied: list[object] = []
    reader_producer = Producer(reader)
    reader_producer.produce(
        "orders", b"nope", partition=0, on_delivery=lambda e, m: denied.append(e)
    )
    reader_producer.flush(30)
    assert len(denied) == 1 and denied[0] is not None
    assert denied[0].code() == CKafkaError.TOPIC_AUTHORIZATION_FAILED  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("user", "password", "mechanism"),
    [
        ("writer", "guess", "SCRAM-SHA-512"),
        ("writer", READER, "SCRAM-SHA-512"),  # another principal's token
        ("nobody", WRITER, "SCRAM-SHA-512"),
        ("reader", READER, "SCRAM-SHA-256"),  # the reader has no SHA-256 credential
    ],
)
def test_librdkafka_with_wrong_scram_credentials_is_refused(
    secured_tls: tuple[KafkaBroker, Path], user: str, password: str, mechanism: str
) -> None:
    broker, ca_file = secured_tls
    failures: list[CKafkaError] = []
    stranger = Producer(
        {
            **scram_config(broker.bootstrap, ca_file, user, password, mechanism),
            "error_cb": failures.append,
        }
    )
    with pytest.raises(KafkaException):
        stranger.list_topics(timeout=5)
    assert f"invalid credentials for user {user!r}" in authentication_refusal(stranger, failures)


def test_librdkafka_authenticates_with_scram_sha_256(secured_tls: tuple[KafkaBroker, Path]) -> None:
    broker, ca_file = secured_tls
    client = AdminClient(scram_config(broker.bootstrap, ca_file, "writer", WRITER, "SCRAM-SHA-256"))
    client.create_topics([CNewTopic("events", 1, 1)])["events"].result(timeout=30)
    assert "events" in client.list_topics(timeout=10).topics


async def test_aiokafka_scram_over_tls_and_a_scram_message_out_of_order(
    secured_tls: tuple[KafkaBroker, Path],
) -> None:
    """aiokafka's SCRAM client too; and a SaslAuthenticate before SaslHandshake is
    answered ILLEGAL_SASL_STATE, then the connection is closed."""
    broker, ca_file = secured_tls
    ctx = ssl.create_default_context(cafile=str(ca_file))
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_SSL",
        ssl_context=ctx,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="writer",
        sasl_plain_password=WRITER,
    )
    await producer.start()
    await producer.stop()

    api = km.SUPPORTED[km.ApiKey.SASL_AUTHENTICATE]
    raw = socket.create_connection(("127.0.0.1", broker.kafka_port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(
            km.encode_request(api, 1, 9, "t", km.SaslAuthenticateRequest(b"n,,n=writer,r=abc"))
        )
        size = struct.unpack(">i", _read(sock, 4))[0]
        frame = _read(sock, size)
        assert struct.unpack(">ih", frame[:6]) == (9, ErrorCode.ILLEGAL_SASL_STATE)
        assert sock.recv(1) == b""


def _read(sock: ssl.SSLSocket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed early"
        data += chunk
    return data


def test_kafkas_java_client_produces_and_consumes_with_scram_over_tls(
    secured_tls: tuple[KafkaBroker, Path], tmp_path: Path
) -> None:
    """Kafka's own SCRAM client (the console producer and consumer, from the jars), and a
    wrong password refused."""
    from tests.integration.kafka import peer_tools

    broker, ca_file = secured_tls

    def client_config(name: str, password: str) -> Path:
        path = tmp_path / f"{name}.properties"
        path.write_text(
            "security.protocol=SASL_SSL\n"
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={ca_file}\n"
            "sasl.mechanism=SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required"
            f' username="{name}" password="{password}";\n'
        )
        return path

    tools = "org.apache.kafka.tools"
    writer = client_config("writer", WRITER)
    server = ["--bootstrap-server", broker.bootstrap]
    peer_tools.run(
        peer_tools.java_command(
            f"{tools}.TopicCommand", *server, "--command-config", str(writer),
            "--create", "--topic", "orders", "--partitions", "1",
        )
    )  # fmt: skip
    peer_tools.run(
        peer_tools.java_command(
            f"{tools}.ConsoleProducer", *server, "--command-config", str(writer),
            "--topic", "orders",
        ),
        stdin="a\nb\nc\n",
    )  # fmt: skip
    # the reader: consume on orders, in audit-* groups
    done = peer_tools.run(
        peer_tools.java_command(
            f"{tools}.consumer.ConsoleConsumer", *server,
            "--command-config", str(client_config("reader", READER)),
            "--topic", "orders", "--group", "audit-java", "--from-beginning",
            "--max-messages", "3",
        )
    )  # fmt: skip
    # (the console consumer exits 0 after an error too: what it printed is the check)
    assert done.stdout.split() == ["a", "b", "c"], done.stderr[-3000:]

    refused = subprocess.run(
        peer_tools.java_command(
            f"{tools}.TopicCommand", *server,
            "--command-config", str(client_config("writer", "guess")), "--list",
        ),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "invalid credentials for user 'writer'" in refused.stdout + refused.stderr


def authentication_refusal(stranger: Producer, failures: list[CKafkaError]) -> str:
    """The text of the authentication error librdkafka reports through its error callback
    (served by ``poll``): our reason, within 30 s."""
    deadline = time.monotonic() + 30
    while not any(e.code() == CKafkaError._AUTHENTICATION for e in failures):
        assert time.monotonic() < deadline, f"no authentication error reported: {failures}"
        stranger.poll(0.5)
    refusal = next(e for e in failures if e.code() == CKafkaError._AUTHENTICATION)
    return str(refusal.str())
