"""Admin HTTP, CLI, topology pushes, redirects, auth and TLS against a real broker."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.client.cluster import ClusterClient
from headrace.client.connection import ConnectOptions
from headrace.errors import AuthenticationFailed, HeadraceError, UnknownTopic
from headrace.testing import procs
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition


def http(
    method: str, url: str, body: dict[str, object] | None = None
) -> tuple[int, dict[str, object] | str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            raw = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode()
        status = exc.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw


def test_admin_http_health_metrics_and_topic_admin(broker: BrokerProcess) -> None:
    assert http("GET", f"{broker.admin_url}/healthz")[0] == 200
    assert http("GET", f"{broker.admin_url}/readyz")[0] == 200
    status, created = http(
        "POST", f"{broker.admin_url}/v1/topics", {"name": "ops/orders", "partitions": 3}
    )
    assert status == 201 and isinstance(created, dict) and created["partitions"] == 3
    assert (
        http("POST", f"{broker.admin_url}/v1/topics", {"name": "ops/orders", "partitions": 3})[0]
        == 409
    )
    assert (
        http("POST", f"{broker.admin_url}/v1/topics", {"name": "Bad Name", "partitions": 3})[0]
        == 422
    )
    assert http("POST", f"{broker.admin_url}/v1/topics", {"name": "x", "partitions": 0})[0] == 422
    status, listing = http("GET", f"{broker.admin_url}/v1/topics")
    assert status == 200 and isinstance(listing, dict)
    assert [t["name"] for t in listing["topics"]] == ["ops/orders"]  # type: ignore[union-attr, index]
    assert http("GET", f"{broker.admin_url}/v1/topics/ops/orders")[0] == 200
    assert http("GET", f"{broker.admin_url}/v1/topics/ops/missing")[0] == 404
    status, metrics = http("GET", f"{broker.admin_url}/metrics")
    assert status == 200 and isinstance(metrics, str)
    assert 'headrace_partition_log_end_offset{partition="2",topic="ops/orders"} 0.0' in metrics
    assert http("DELETE", f"{broker.admin_url}/v1/topics/ops/orders")[0] == 200
    assert http("GET", f"{broker.admin_url}/v1/topics/ops/orders")[0] == 404


def cli(
    broker: BrokerProcess, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return procs.run_headrace(*args, "--bootstrap", broker.bootstrap, stdin=stdin, timeout=60)


def test_cli_round_trip_and_one_line_errors(broker: BrokerProcess) -> None:
    assert cli(broker, "topics", "create", "clidemo", "--partitions", "2").returncode == 0
    out = cli(broker, "produce", "clidemo", "--key-sep", "=", stdin=b"a=1\nb=2\nc=3\n")
    assert out.returncode == 0, out.stderr
    listing = cli(broker, "topics", "list")
    assert b"default/clidemo" in listing.stdout
    consumed = cli(
        broker,
        "consume",
        "clidemo",
        "--cohort",
        "cli",
        "--from-beginning",
        "--count",
        "3",
        "--print-offsets",
    )
    assert consumed.returncode == 0, consumed.stderr
    lines = consumed.stdout.decode().splitlines()
    assert sorted(line.split("\t")[1] for line in lines) == ["1", "2", "3"]
    assert sorted(line.split(" ")[1].split("\t")[0] for line in lines) == ["a", "b", "c"]

    missing = cli(broker, "produce", "nosuchtopic", stdin=b"x\n")
    assert missing.returncode != 0
    assert missing.stderr.decode().strip().splitlines()[-1].startswith("error: UnknownTopic")
    down = procs.run_headrace("topics", "list", "--bootstrap", "127.0.0.1:1", timeout=60)
    assert down.returncode != 0
    assert len(down.stderr.decode().strip().splitlines()) == 1


def test_cli_pointed_at_an_http_port_says_so(broker: BrokerProcess) -> None:
    admin = broker.admin_url.removeprefix("http://")
    out = procs.run_headrace("topics", "list", "--bootstrap", admin, timeout=60)
    assert out.returncode != 0
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "this is an HTTP port" in lines[0], lines


def test_cli_output_into_a_closed_pipe_ends_quietly(broker: BrokerProcess) -> None:
    """`headrace consume ... | head -1`: no "Broken pipe" error when head stops reading."""
    records = b"".join(b"record-%06d-%s\n" % (i, b"x" * 64) for i in range(20_000))
    assert cli(broker, "topics", "create", "piped", "--partitions", "1").returncode == 0
    assert cli(broker, "produce", "piped", stdin=records).returncode == 0
    consume = [
        *procs.HEADRACE_CLI,
        *("consume", "piped", "--cohort", "pipe", "--from-beginning", "--count", "20000"),
        *("--bootstrap", broker.bootstrap),
    ]
    # 1.4 MB of output into `head -1`, which exits after one line: the pipe closes under
    # the consumer mid-write, every time (the pipe buffer is 64 KiB).
    reader = subprocess.Popen(["head", "-1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    writer = subprocess.run(
        consume,
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        timeout=120,
        check=False,
        env=procs.child_env(),
    )
    assert reader.stdin is not None and reader.stdout is not None
    reader.stdin.close()  # our copy of the pipe's write end
    first = reader.stdout.read()
    reader.wait(timeout=30)
    assert first.startswith(b"record-000000"), first
    assert writer.stderr == b"", writer.stderr.decode()
    assert writer.returncode == 128 + signal.SIGPIPE


async def test_topology_push_is_applied_and_acked(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "first", 1)
    watcher = ClusterClient(broker.bootstrap)
    await watcher.start()
    before = watcher.routing.generation
    await create_topic(broker.bootstrap, "second", 4)
    for _ in range(100):
        if watcher.routing.generation > before:
            break
        await asyncio.sleep(0.02)
    assert watcher.routing.topic("second").partitions == 4
    assert watcher.acked_generations and watcher.acked_generations[-1] == watcher.routing.generation
    # the broker counts the ack once it has read it: wait for the floor, with a deadline
    deadline = asyncio.get_running_loop().time() + 10
    while (floor := broker.get_json("/v1/status")["adoption_floor"]) != watcher.routing.generation:
        assert asyncio.get_running_loop().time() < deadline, (
            f"adoption floor {floor}, not {watcher.routing.generation}"
        )
        await asyncio.sleep(0.02)
    await watcher.close()


async def test_producer_follows_a_redirect_after_stale_routing(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "redir", 1)
    async with Producer(broker.bootstrap) as producer:
        # Pretend our cache is stale: the broker must redirect, the producer must recover.
        routing = producer.cluster.routing.topic("redir")
        assert producer.cluster.routing.topics is not None
        producer.cluster.routing.topics["default/redir"] = type(routing)(
            routing.name,
            routing.partitions,
            routing.partitioning_version + 5,
            routing.owners,
            routing.epochs,
        )
        meta = await (await producer.send("redir", b"hello"))
    assert meta.offset == 0
    assert [r.value for r in await read_partition(broker.bootstrap, "redir", 0)] == [b"hello"]


async def test_unknown_topic_is_a_typed_error_for_clients(broker: BrokerProcess) -> None:
    async with Producer(broker.bootstrap) as producer:
        with pytest.raises(UnknownTopic):
            await producer.send("ghost", b"x")
    with pytest.raises(UnknownTopic):
        await Consumer(broker.bootstrap, "ghost", "c").start()


async def test_a_send_waits_for_a_topic_created_meanwhile(broker: BrokerProcess) -> None:
    """A topic just created reaches brokers one push at a time: a client that asks before
    it arrives waits for it (refreshing), as Kafka clients block on metadata."""
    async with Producer(broker.bootstrap) as producer:
        sending = asyncio.ensure_future(producer.send("late", b"first"))
        # let the send start: it finds no such topic and keeps refreshing
        await asyncio.sleep(0)
        status, _ = await asyncio.to_thread(
            http, "POST", f"{broker.admin_url}/v1/topics", {"name": "late", "partitions": 1}
        )
        assert status == 201
        meta = await (await sending)
    assert meta.offset == 0


async def test_auth_token_is_required_when_configured(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(extra_args=["--auth-token", "s3cret"])  # type: ignore[operator]
    with pytest.raises(AuthenticationFailed):
        await ClusterClient(broker.bootstrap, ConnectOptions(auth_token="wrong")).start()
    with pytest.raises(AuthenticationFailed):
        await ClusterClient(broker.bootstrap).start()
    client = ClusterClient(broker.bootstrap, ConnectOptions(auth_token="s3cret"))
    await client.start()
    await client.close()


def _serving_pair(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, serving certificate for 127.0.0.1, its key): the test bed's PKI."""
    from cryptography.hazmat.primitives import serialization

    from e2e.testbed import pki

    ca = pki.new_ca()
    cert, key = ca.issue("127.0.0.1", server=True, ips=("127.0.0.1",))
    ca_path, cert_path, key_path = (directory / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca_path.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert)
    key_path.write_bytes(key)
    return ca_path, cert_path, key_path


async def test_tls_listener_serves_tls_clients_only(broker_factory: object, tmp_path: Path) -> None:
    ca, cert, key = _serving_pair(tmp_path)
    broker: BrokerProcess = broker_factory(
        extra_args=["--tls-cert", str(cert), "--tls-key", str(key)]
    )  # type: ignore[operator]
    ctx = ssl.create_default_context(cafile=str(ca))
    options = ConnectOptions(ssl=ctx)
    await create_topic_tls(broker.bootstrap, options)
    async with Producer(broker.bootstrap, options=options) as producer:
        meta = await (await producer.send("secure", b"over tls"))
    assert meta.offset == 0
    with pytest.raises(
        (HeadraceError, TimeoutError)
    ):  # a plaintext client cannot complete the handshake
        await asyncio.wait_for(ClusterClient(broker.bootstrap).start(), 5)


async def create_topic_tls(bootstrap: str, options: ConnectOptions) -> None:
    from headrace.protocol import messages as msg
    from headrace.protocol.frames import Op

    client = ClusterClient(bootstrap, options)
    conn = await client.bootstrap_connection()
    await conn.request(Op.CREATE_TOPIC, msg.CreateTopic("secure", 1).encode())
    await client.close()


def test_blocking_facade_round_trip(broker: BrokerProcess) -> None:
    from headrace.client.blocking import BlockingConsumer, BlockingProducer

    asyncio.run(create_topic(broker.bootstrap, "blocking", 2))
    with BlockingProducer(broker.bootstrap) as producer:
        meta = producer.send("blocking", b"one", partition=1)
        assert (meta.partition, meta.offset) == (1, 0)
        results = producer.send_many("blocking", [b"a", b"b", b"c"])
        assert sum(r.record_count for r in results) == 3
    with BlockingConsumer(broker.bootstrap, "blocking", "sync", start="earliest") as consumer:
        values: list[bytes] = []
        for _ in range(50):
            for batch in consumer.poll(timeout_s=0.2):
                values.extend(batch.values())
                consumer.ack(batch.partition, batch.last_offset)
            if len(values) >= 4:
                break
    assert sorted(values) == [b"a", b"b", b"c", b"one"]
