"""Token files, the replication token and the cluster key reload without a restart, and
rotate without an outage (docs/security.md §9): real broker and controller processes
over real sockets.

- a token added to ``--auth-token-file`` is accepted after SIGHUP, or after a plain
  rewrite of the file, and a removed one is refused on the next request of a connection
  opened with it;
- a malformed file keeps the credentials in force, and the error shows;
- the replication token and the cluster key of a running 3-broker local cluster rotate
  in three steps under acks=all load: nothing is lost, every live replica set stays whole
  throughout, and a consumer that joins afterwards gets an identity under the new key.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import Consumer, Producer
from headrace.client.blocking import BlockingConsumer, BlockingProducer
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.client.tokens import TokenFile
from headrace.errors import AuthenticationFailed
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.security.acl import hash_token
from headrace.testing import procs, waiting
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import read_partition
from headrace.testing.waiting import until_async
from tests.integration.keyed import KeyedLoad
from tests.integration.localcluster import LocalCluster, topic_manifest

FIRST, SECOND = "first-token-5c1e9a", "second-token-8d2f0b"
OPS = "ops-token-3b7e1d9c"
#: one principal that may do everything but replicate
ACL = {
    "version": 1,
    "principals": [
        {
            "name": "ops",
            "tokens": [hash_token(OPS)],
            "grants": [{"operations": ["admin", "produce", "consume"], "topics": ["*"]}],
        }
    ],
}


def metric(url: str, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def reloads(url: str, source: str, result: str = "ok") -> float:
    return metric(url, "headrace_acl_reloads_total", f'result="{result}",source="{source}"')


def replace(path: Path, text: str) -> None:
    """Replace a file by a rename, as editors and the kubelet's Secret updates do."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(path.stat().st_mode & 0o777)
    os.replace(tmp, path)


async def connect(broker: BrokerProcess, token: str) -> ClientConnection:
    host, _, port = broker.bootstrap.rpartition(":")
    return await ClientConnection.open(host, int(port), ConnectOptions(auth_token=token))


async def produce(conn: ClientConnection, value: bytes) -> None:
    batch = rb.encode([value], timestamp_ms=0)
    await conn.request(
        Op.PRODUCE, msg.ProduceRequest("orders", 0, 1, msg.Acks.LEADER, 5000, batch).encode()
    )


# ---------------------------------------------------------------------------- token files


@pytest.mark.parametrize("trigger", ["sighup", "rewrite"])
async def test_a_token_file_reloads_for_new_and_open_connections(
    broker_factory: Any, tmp_path: Path, trigger: str
) -> None:
    """``sighup``: no file watch, only the signal reloads. ``rewrite``: the watch notices
    a plain in-place rewrite. Either way without a restart."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{FIRST}\n")
    interval = "0" if trigger == "sighup" else "100"
    broker: BrokerProcess = broker_factory(
        extra_args=["--auth-token-file", str(tokens), "--acl-reload-interval-ms", interval]
    )
    pid = broker.pid

    def rewrite(text: str, reloaded: float, result: str = "ok") -> None:
        tokens.write_text(text)  # in place: truncate and write
        if trigger == "sighup":
            os.kill(broker.pid, signal.SIGHUP)
        waiting.until(
            lambda: reloads(broker.admin_url, "auth_tokens", result) == reloaded,
            10,
            f"reload {reloaded:.0f} ({result}) of the token file",
        )

    first = await connect(broker, FIRST)
    await first.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    await produce(first, b"first-1")
    with pytest.raises(AuthenticationFailed):
        await connect(broker, SECOND)

    # added: accepted on a new connection; the open one goes on
    rewrite(f"{FIRST}\n{SECOND}\n", 1)
    second = await connect(broker, SECOND)
    await produce(second, b"second-1")
    await produce(first, b"first-2")

    # removed: refused on the next request of the connection opened with it
    rewrite(f"# {FIRST} is revoked\n{SECOND}\n", 2)
    with pytest.raises(AuthenticationFailed, match="no longer accepted") as refused:
        await produce(first, b"first-3")
    assert FIRST not in refused.value.message
    await first.close()
    with pytest.raises(AuthenticationFailed):
        await connect(broker, FIRST)
    await produce(second, b"second-2")

    # malformed: the tokens in force stay, the error shows (never the file's content)
    rewrite(f"{SECOND}\n{FIRST} with a blank\n", 1, "error")
    status = broker.get_json("/v1/status")["credentials"]
    assert isinstance(status, dict)
    error = status["files"]["auth_tokens"]["reload_error"]
    assert "line 2 is not a token" in error and FIRST not in error and SECOND not in error
    assert "auth tokens reload failed" in broker.log_tail(100)
    await produce(second, b"second-3")
    with pytest.raises(AuthenticationFailed):
        await connect(broker, FIRST)
    rewrite(f"{SECOND}\n", 3)
    status = broker.get_json("/v1/status")["credentials"]
    assert isinstance(status, dict) and status["files"]["auth_tokens"]["reload_error"] is None

    await second.close()
    stored = await read_partition(
        broker.bootstrap, "orders", 0, options=ConnectOptions(auth_token=SECOND)
    )
    assert [r.value for r in stored] == [
        b"first-1",
        b"second-1",
        b"first-2",
        b"second-2",
        b"second-3",
    ]
    assert broker.alive and broker.pid == pid  # never restarted


async def test_malformed_key_and_replication_token_files_keep_what_is_in_force(
    broker_factory: Any, tmp_path: Path
) -> None:
    """ACL mode: a bad cluster key file (not hex, then readable by others) and an empty
    replication token file are refused; identities are still issued and verified with
    the key in force, and the errors show in /v1/status and the metrics."""
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(json.dumps(ACL))
    key = tmp_path / "cluster.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o600)
    replication = tmp_path / "replication.token"
    replication.write_text("replication-1f4e\n")
    broker: BrokerProcess = broker_factory(
        extra_args=[
            "--acl-file",
            str(acl_file),
            "--cluster-key-file",
            str(key),
            "--replication-token-file",
            str(replication),
            "--acl-reload-interval-ms",
            "0",
        ]
    )
    ops = ConnectOptions(auth_token=OPS)
    conn = await connect(broker, OPS)
    await conn.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    await produce(conn, b"kept")

    replace(key, "not a key\n")
    replication.write_text("")
    os.kill(broker.pid, signal.SIGHUP)
    waiting.until(
        lambda: (
            reloads(broker.admin_url, "cluster_key", "error") == 1
            and reloads(broker.admin_url, "replication_token", "error") == 1
        ),
        10,
        "both reloads refused",
    )
    files = broker.get_json("/v1/status")["credentials"]["files"]  # type: ignore[index]
    assert (
        "line 1: the cluster key file does not hold hex digits"
        in files["cluster_key"]["reload_error"]
    )
    assert "holds no value" in files["replication_token"]["reload_error"]
    assert files["acl"]["reload_error"] is None

    replace(key, "cd" * 32 + "\n")
    key.chmod(0o644)
    os.kill(broker.pid, signal.SIGHUP)
    waiting.until(
        lambda: reloads(broker.admin_url, "cluster_key", "error") == 2, 10, "a refused key"
    )
    files = broker.get_json("/v1/status")["credentials"]["files"]  # type: ignore[index]
    assert "chmod 600" in files["cluster_key"]["reload_error"]
    assert "cd" * 32 not in files["cluster_key"]["reload_error"]

    # the key in force (ab...) still issues and verifies identities
    assert await join_and_read(broker.bootstrap, "orders", ops) == [b"kept"]
    await conn.close()


async def test_a_consumer_whose_identity_key_was_rotated_away_asks_for_a_new_one(
    broker_factory: Any, tmp_path: Path
) -> None:
    """After step 3 of a cluster key rotation, a consumer that must join again (here: its
    broker restarted) is refused with its old identity; it asks for a new one and goes on
    without being restarted."""
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(json.dumps(ACL))
    key = tmp_path / "cluster.key"
    old, new = "ab" * 32, "cd" * 32
    key.write_text(old + "\n")
    key.chmod(0o600)
    broker: BrokerProcess = broker_factory(
        extra_args=["--acl-file", str(acl_file), "--cluster-key-file", str(key)]
    )
    ops = ConnectOptions(auth_token=OPS)
    conn = await connect(broker, OPS)
    await conn.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    await produce(conn, b"before")
    await conn.close()
    consumer = await Consumer(
        broker.bootstrap, "orders", "readers", member_id="reader", start="earliest", options=ops
    ).start()
    try:
        got: list[bytes] = []
        await until_async(lambda: _poll(consumer, got), 30, "the first record delivered", poll_s=0)
        first_identity = consumer.identity
        for step, text in enumerate((f"{old}\n{new}\n", f"{new}\n{old}\n", f"{new}\n"), 1):
            replace(key, text)
            os.kill(broker.pid, signal.SIGHUP)
            waiting.until(
                lambda step=step: reloads(broker.admin_url, "cluster_key") == step,
                10,
                f"step {step}",
            )
        await asyncio.to_thread(broker.restart, crash=False)
        conn = await connect(broker, OPS)
        await produce(conn, b"after")
        await conn.close()
        # (at least once: "before" may come again, its ack lost with the restart)
        await until_async(
            lambda: _poll(consumer, got, b"after"), 30, "the record after the restart", poll_s=0
        )
        assert consumer.identity not in (None, first_identity)
        assert consumer.member_id.startswith("reader.")
    finally:
        await consumer.close(grace_s=0)
    denied = metric(broker.admin_url, "headrace_acl_denials_total", 'operation="identity"')
    assert denied >= 1  # the old identity was refused once, then a new one issued


async def join_and_read(bootstrap: str, topic: str, options: ConnectOptions) -> list[bytes]:
    """Join a fresh cohort (a new member: a new identity, signed with the key in force)
    and return its first deliveries."""
    consumer = await Consumer(
        bootstrap, topic, "fresh-cohort", start="earliest", options=options
    ).start()
    try:
        got: list[bytes] = []
        await until_async(
            lambda: _poll(consumer, got), 30, f"records of {topic} delivered", poll_s=0
        )
        return got
    finally:
        await consumer.close(grace_s=0)


async def _poll(consumer: Consumer, got: list[bytes], want: bytes | None = None) -> bool:
    """Take what is delivered into ``got``; whether ``want`` (or anything) came."""
    for batch in await consumer.getmany(timeout_s=0.5):
        got.extend(batch.values())
        consumer.ack_batch(batch)
    return want in got if want is not None else bool(got)


# ---------------------------------------------------------------------------- a client's own token


async def _token_rotation_broker(broker_factory: Any, tmp_path: Path) -> tuple[BrokerProcess, Path]:
    """A broker accepting FIRST and SECOND (step 1 of a client-token rotation done), with
    topic ``orders`` holding one record; the file is re-read every 100 ms."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{FIRST}\n{SECOND}\n")
    broker: BrokerProcess = broker_factory(
        extra_args=["--auth-token-file", str(tokens), "--acl-reload-interval-ms", "100"]
    )
    conn = await connect(broker, SECOND)
    await conn.request(Op.CREATE_TOPIC, msg.CreateTopic("orders", 1).encode())
    await produce(conn, b"before")
    await conn.close()
    return broker, tokens


def _remove_first(broker: BrokerProcess, tokens: Path) -> None:
    """The last step of the rotation: FIRST is no longer accepted."""
    replace(tokens, f"{SECOND}\n")
    waiting.until(
        lambda: reloads(broker.admin_url, "auth_tokens") == 1, 10, "the token file re-read"
    )


def _first_token(kind: str, tmp_path: Path) -> ConnectOptions:
    """FIRST as a string, or as a ``TokenFile`` that still names it when FIRST is removed
    (the client's file not rotated): either way the refusal stands."""
    if kind == "string":
        return ConnectOptions(auth_token=FIRST)
    unrotated = tmp_path / "client.token"
    unrotated.write_text(f"{FIRST}\n")
    return ConnectOptions(auth_token=TokenFile(unrotated))


@pytest.mark.parametrize("kind", ["string", "unrotated-file"])
async def test_a_producer_whose_token_was_removed_fails_and_a_new_one_goes_on(
    broker_factory: Any, tmp_path: Path, kind: str
) -> None:
    """Once the broker stops accepting the token a client presents, and the client has
    no other, every send fails with the typed, non-retriable AuthenticationFailed (not a
    silent stall), and the application goes on with a new Producer made with the new
    token."""
    broker, tokens = await _token_rotation_broker(broker_factory, tmp_path)
    async with Producer(broker.bootstrap, options=_first_token(kind, tmp_path)) as old:
        await (await old.send("orders", b"first-1"))
        _remove_first(broker, tokens)
        with pytest.raises(AuthenticationFailed):
            await (await old.send("orders", b"first-2"))
    async with Producer(broker.bootstrap, options=ConnectOptions(auth_token=SECOND)) as new:
        await (await new.send("orders", b"second-1"))
    stored = await read_partition(
        broker.bootstrap, "orders", 0, options=ConnectOptions(auth_token=SECOND)
    )
    assert [r.value for r in stored] == [b"before", b"first-1", b"second-1"]


@pytest.mark.parametrize("kind", ["string", "unrotated-file"])
async def test_a_consumer_whose_token_was_removed_is_told_so(
    broker_factory: Any, tmp_path: Path, kind: str
) -> None:
    """Removing a token a consumer still uses closes its connections; it cannot join again
    with that token. The application must learn it (to make a consumer with the new token),
    not wait for records that will never come."""
    broker, tokens = await _token_rotation_broker(broker_factory, tmp_path)
    consumer = await Consumer(
        broker.bootstrap,
        "orders",
        "readers",
        start="earliest",
        options=_first_token(kind, tmp_path),
    ).start()
    try:
        await until_async(lambda: _poll(consumer, []), 30, "the first record delivered", poll_s=0)
        _remove_first(broker, tokens)
        with pytest.raises(AuthenticationFailed):
            await _read_for(consumer, 15)
        with pytest.raises(AuthenticationFailed):  # and every later call: it has ended
            await consumer.getmany(timeout_s=0.1)
    finally:
        await consumer.close(grace_s=0)


def test_blocking_clients_whose_token_was_removed_raise_it(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The blocking facade hands on what its async clients raise: once the token is
    removed, ``BlockingProducer.send`` and ``BlockingConsumer.poll`` raise
    AuthenticationFailed, not a timeout or an empty poll for ever."""
    broker, tokens = asyncio.run(_token_rotation_broker(broker_factory, tmp_path))
    first = ConnectOptions(auth_token=FIRST)
    with (
        BlockingProducer(broker.bootstrap, options=first) as producer,
        BlockingConsumer(
            broker.bootstrap, "orders", "readers", start="earliest", options=first
        ) as consumer,
    ):
        producer.send("orders", b"first-1")
        got: list[bytes] = []
        waiting.until(
            lambda: _poll_blocking(consumer, got, b"first-1"), 30, "the records delivered"
        )
        _remove_first(broker, tokens)
        with pytest.raises(AuthenticationFailed):
            producer.send("orders", b"first-2")
        with pytest.raises(AuthenticationFailed):
            _poll_for(consumer, got, 15)
        with pytest.raises(AuthenticationFailed):
            consumer.poll(timeout_s=0.1)  # and keeps raising: the consumer has ended
    assert got == [b"before", b"first-1"]


def test_headrace_consume_whose_token_was_removed_exits_with_the_error(
    broker_factory: Any, tmp_path: Path
) -> None:
    """``headrace consume`` is one Consumer: once its token is removed it prints the error
    and exits 1, not idle until ``--idle-timeout`` (here longer than the test waits)."""
    broker, tokens = asyncio.run(_token_rotation_broker(broker_factory, tmp_path))
    command = [
        *procs.HEADRACE_CLI, "consume", "orders", "--cohort", "readers", "--from-beginning",
        "--idle-timeout", "600", "--bootstrap", broker.bootstrap,
    ]  # fmt: skip
    env = {**procs.child_env(), "HEADRACE_AUTH_TOKEN": FIRST}
    consume = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert consume.stdout is not None
        assert consume.stdout.readline() == b"before\n"
        _remove_first(broker, tokens)
        _, stderr = consume.communicate(timeout=60)
    finally:
        if consume.poll() is None:
            consume.kill()
            consume.wait()
    assert consume.returncode == 1, stderr.decode()
    assert b"error: AuthenticationFailed" in stderr, stderr.decode()


async def test_a_producer_and_a_consumer_reading_a_token_file_follow_its_rotation(
    broker_factory: Any, tmp_path: Path
) -> None:
    """Clients whose token is a ``TokenFile``: the client's file switches to SECOND, then
    the broker drops FIRST. Each connection opened with FIRST is refused once and the
    client reconnects with SECOND: the producer keeps sending (pipelined) and the consumer
    keeps receiving, the same objects throughout; every acknowledged record is stored
    once and delivered, and no AuthenticationFailed reaches the application."""
    broker, tokens = await _token_rotation_broker(broker_factory, tmp_path)
    client_file = tmp_path / "client.token"
    client_file.write_text(f"# the client's token\n{FIRST}\n")
    options = ConnectOptions(auth_token=TokenFile(client_file))
    acked: list[bytes] = []
    received: list[bytes] = []
    stop = asyncio.Event()
    producer = await Producer(broker.bootstrap, linger_ms=2, options=options).start()
    consumer = await Consumer(
        broker.bootstrap, "orders", "readers", start="earliest", options=options
    ).start()

    async def send() -> None:
        """Windows of 20 records in flight at once, until stopped (raises what a send does)."""
        while not stop.is_set():
            values = [f"r-{len(acked) + i}".encode() for i in range(20)]
            receipts = [await producer.send("orders", value) for value in values]
            for value, receipt in zip(values, receipts, strict=True):
                await receipt
                acked.append(value)

    async def receive() -> None:
        while not stop.is_set():
            await _poll(consumer, received)

    running = [asyncio.create_task(send()), asyncio.create_task(receive())]

    async def more(count: int) -> None:
        """Until ``count`` more records are acked; a task that failed fails it at once."""
        target = len(acked) + count
        await until_async(
            lambda: len(acked) >= target, 30, f"{count} more records acked", watching=running
        )

    def tokens_presented() -> set[str | None]:
        """The tokens the clients' open connections presented."""
        conns = [*producer.cluster._pool.values(), *consumer.cluster._pool.values()]
        return {conn.token for conn in conns if not conn.is_closed}

    try:
        await more(100)
        replace(client_file, f"{SECOND}\n")  # step 2: the client sends the new token
        await more(100)
        assert tokens_presented() == {FIRST}  # open connections go on with it
        await asyncio.to_thread(_remove_first, broker, tokens)  # step 3
        await more(200)
        await until_async(
            lambda: set(acked) <= set(received),
            30,
            "every acked record delivered",
            watching=running,
        )
        await until_async(
            lambda: tokens_presented() == {SECOND}, 30, "every open connection presenting SECOND"
        )
    finally:
        stop.set()
        outcomes = await asyncio.gather(*running, return_exceptions=True)
        await consumer.close(grace_s=0)
        await producer.close()
    assert all(outcome is None for outcome in outcomes), outcomes
    # the rotation reached connections opened with FIRST: the broker refused them
    denied = metric(broker.admin_url, "headrace_acl_denials_total", 'operation="authenticate"')
    assert denied >= 1
    stored = await read_partition(
        broker.bootstrap, "orders", 0, options=ConnectOptions(auth_token=SECOND)
    )
    counts = Counter(r.value for r in stored)
    assert stored[0].value == b"before"
    assert [v for v in acked if counts[v] != 1] == [], "acked records lost or stored twice"
    assert set(acked) <= set(received)


def test_blocking_clients_reading_a_token_file_follow_its_rotation(
    broker_factory: Any, tmp_path: Path
) -> None:
    """The blocking facade over the same clients: after the rotation ``send`` goes on
    and ``poll`` delivers, with no AuthenticationFailed."""
    broker, tokens = asyncio.run(_token_rotation_broker(broker_factory, tmp_path))
    client_file = tmp_path / "client.token"
    client_file.write_text(f"{FIRST}\n")
    options = ConnectOptions(auth_token=TokenFile(client_file))
    with (
        BlockingProducer(broker.bootstrap, options=options) as producer,
        BlockingConsumer(
            broker.bootstrap, "orders", "readers", start="earliest", options=options
        ) as consumer,
    ):
        producer.send("orders", b"first-1")
        got: list[bytes] = []
        waiting.until(lambda: _poll_blocking(consumer, got, b"first-1"), 30, "first-1")
        replace(client_file, f"{SECOND}\n")
        _remove_first(broker, tokens)
        producer.send("orders", b"second-1")
        waiting.until(lambda: _poll_blocking(consumer, got, b"second-1"), 30, "second-1")
    # (at least once: a record whose ack went on a refused connection comes again)
    assert list(dict.fromkeys(got)) == [b"before", b"first-1", b"second-1"]
    stored = asyncio.run(
        read_partition(broker.bootstrap, "orders", 0, options=ConnectOptions(auth_token=SECOND))
    )
    assert [r.value for r in stored] == [b"before", b"first-1", b"second-1"]


def test_headrace_consume_reading_a_token_file_follows_its_rotation(
    broker_factory: Any, tmp_path: Path
) -> None:
    """``headrace consume --auth-token-file``: its file switches to SECOND, the broker
    drops FIRST, and the same process goes on printing records."""
    broker, tokens = asyncio.run(_token_rotation_broker(broker_factory, tmp_path))
    client_file = tmp_path / "client.token"
    client_file.write_text(f"{FIRST}\n")
    command = [
        *procs.HEADRACE_CLI, "consume", "orders", "--cohort", "readers", "--from-beginning",
        "--idle-timeout", "600", "--bootstrap", broker.bootstrap,
    ]  # fmt: skip
    env = {**procs.child_env(), "HEADRACE_AUTH_TOKEN_FILE": str(client_file)}
    env.pop("HEADRACE_AUTH_TOKEN", None)
    consume = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    lines: queue.Queue[bytes] = queue.Queue()

    def read_lines() -> None:
        assert consume.stdout is not None
        for line in consume.stdout:
            lines.put(line)
        lines.put(b"")  # the end: the process exited

    threading.Thread(target=read_lines, daemon=True).start()
    try:
        assert lines.get(timeout=30) == b"before\n"
        replace(client_file, f"{SECOND}\n")
        _remove_first(broker, tokens)

        async def produce_after() -> None:
            options = ConnectOptions(auth_token=SECOND)
            async with Producer(broker.bootstrap, options=options) as producer:
                await (await producer.send("orders", b"after"))

        asyncio.run(produce_after())
        # (at least once: "before" may come again, its ack lost on the refused connection)
        seen = [lines.get(timeout=30)]
        while seen[-1] not in (b"after\n", b""):
            seen.append(lines.get(timeout=30))
        assert seen[-1] == b"after\n", seen
        assert consume.poll() is None  # still running: never ended, never restarted
    finally:
        consume.terminate()
        _, stderr = consume.communicate(timeout=30)
    assert b"AuthenticationFailed" not in stderr, stderr.decode()


def test_headrace_produce_reading_a_token_file_follows_its_rotation(
    broker_factory: Any, tmp_path: Path
) -> None:
    """``headrace produce --auth-token-file`` fed through a pipe: a line acknowledged
    under FIRST, the file switched to SECOND and FIRST removed, then more lines on the
    same process: it exits 0 and every line is stored once."""
    broker, tokens = asyncio.run(_token_rotation_broker(broker_factory, tmp_path))
    client_file = tmp_path / "client.token"
    client_file.write_text(f"{FIRST}\n")
    command = [
        *procs.HEADRACE_CLI, "produce", "orders", "--acks", "all",
        "--bootstrap", broker.bootstrap, "--auth-token-file", str(client_file),
    ]  # fmt: skip
    env = procs.child_env()
    env.pop("HEADRACE_AUTH_TOKEN", None)
    produce = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    second = ConnectOptions(auth_token=SECOND)

    def stored() -> list[bytes]:
        return [
            r.value
            for r in asyncio.run(read_partition(broker.bootstrap, "orders", 0, options=second))
        ]

    try:
        assert produce.stdin is not None
        produce.stdin.write(b"first-1\n")
        produce.stdin.flush()
        waiting.until(lambda: b"first-1" in stored(), 30, "first-1 stored under FIRST")
        replace(client_file, f"{SECOND}\n")
        _remove_first(broker, tokens)
        produce.stdin.write(b"second-1\nsecond-2\n")
        _, stderr = produce.communicate(timeout=60)  # closes its input: it ends
    finally:
        if produce.poll() is None:
            produce.kill()
            produce.wait()
    assert produce.returncode == 0, stderr.decode()
    assert stored() == [b"before", b"first-1", b"second-1", b"second-2"]


def _poll_blocking(consumer: BlockingConsumer, got: list[bytes], want: bytes) -> bool:
    """Take what ``poll`` delivers into ``got`` and ack it; whether ``want`` came."""
    for batch in consumer.poll(timeout_s=0.5):
        got.extend(batch.values())
        consumer.ack(batch.partition, batch.last_offset)
    return want in got


def _poll_for(consumer: BlockingConsumer, got: list[bytes], seconds: float) -> None:
    """Poll for ``seconds`` (whatever ``poll`` raises goes through)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _poll_blocking(consumer, got, b"")


async def _read_for(consumer: Consumer, seconds: float) -> None:
    """Take what is delivered for ``seconds`` (whatever ``getmany`` raises goes through)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        for batch in await consumer.getmany(timeout_s=0.5):
            consumer.ack_batch(batch)


# ---------------------------------------------------------------------------- rotation on a cluster

TOPIC = "default/rotation"
PARTITIONS = 6


@pytest.fixture
def secured_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(json.dumps(ACL))
    c = LocalCluster(tmp_path / "local")
    c.api_token = OPS
    c.up("--acl-file", str(acl_file))
    try:
        yield c
    finally:
        c.down()


class ReplicaSetWatch:
    """Polls the controller in a thread until stopped; remembers every moment a partition
    of ``TOPIC`` was not Online with its 3 replicas live, or a broker was not live."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.polls = 0
        self.broken: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReplicaSetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                state = self.cluster.state()
            except OSError as exc:
                self.broken.append(f"the controller did not answer: {exc}")
                continue
            self.polls += 1
            if state["live"] != [0, 1, 2]:
                self.broken.append(f"live brokers {state['live']}")
            for t in state["cluster"].get("topics", []):
                if t["name"] != TOPIC:
                    continue
                for p in t["partitions"]:
                    if p["state"] != "Online" or sorted(p["liveReplicas"]) != [0, 1, 2]:
                        self.broken.append(
                            f"partition {p['partition']}: {p['state']}, LRS {p['liveReplicas']}"
                        )


async def test_rotating_the_replication_token_and_cluster_key_under_load_loses_nothing(
    secured_cluster: LocalCluster,
) -> None:
    """The three steps of docs/security.md §9 on a running cluster, each waited for on
    every process: add the new values second, make them first, remove the old ones."""
    c = secured_cluster
    token_file, key_file = c.dir / "replication.token", c.dir / "cluster.key"
    old_token = token_file.read_text().strip()
    old_key = key_file.read_text().strip()
    new_token, new_key = "rotated-replication-7a3c9e", "5e" * 32
    assert c.apply(topic_manifest("rotation", PARTITIONS)).returncode == 0

    def whole() -> bool:
        parts = c.partitions(TOPIC)
        return len(parts) == PARTITIONS and all(
            p["state"] == "Online" and sorted(p["liveReplicas"]) == [0, 1, 2] for p in parts
        )

    c.wait(whole, 60, "the topic online with every live replica set whole")
    brokers = [f"http://{b['host']}:{b['admin_port']}" for b in c.record["brokers"]]
    ops = ConnectOptions(auth_token=OPS)
    async with Producer(c.bootstrap, acks="all", linger_ms=2, options=ops) as producer:
        load = KeyedLoad(producer, "rotation", keys=24)
        running = asyncio.create_task(load.run())

        async def flowing(more: int = 100) -> None:
            target = load.total_acked + more
            await until_async(
                lambda: _at_least(load, target), 30, f"{more} more acks=all records", poll_s=0
            )

        try:
            await flowing()
            with ReplicaSetWatch(c) as watch:
                for step, (tokens, keys) in enumerate(
                    [
                        ((old_token, new_token), (old_key, new_key)),
                        ((new_token, old_token), (new_key, old_key)),
                        ((new_token,), (new_key,)),
                    ],
                    start=1,
                ):
                    replace(token_file, "\n".join(tokens) + "\n")
                    replace(key_file, "\n".join(keys) + "\n")

                    def applied(step: int = step) -> bool:
                        return reloads(c.controller_url, "broker_token") >= step and all(
                            reloads(url, "replication_token") >= step
                            and reloads(url, "cluster_key") >= step
                            for url in brokers
                        )

                    await asyncio.to_thread(c.wait, applied, 30, f"step {step} everywhere")
                    await flowing()  # acks=all: every replica keeps fetching
                # after the last step the followers present the new token: a connection
                # still on the old one would now be refused and leave the LRS
                await flowing(300)
                # and the controller: a new topic is a topology push, which takes the
                # cluster grant (heartbeat polls are reads, open by default)
                assert c.apply(topic_manifest("after", 1)).returncode == 0
                await asyncio.to_thread(
                    c.wait,
                    lambda: any(p["state"] == "Online" for p in c.partitions("default/after")),
                    30,
                    "a topic created after the rotation online",
                )
            assert watch.polls > 10
            assert watch.broken == [], watch.broken[:10]
        finally:
            load.stop.set()
            await running
    assert load.failures == [], load.failures[:3]
    for url in brokers:
        assert reloads(url, "replication_token", "error") == 0
        assert reloads(url, "cluster_key", "error") == 0
        # no credentials were ever refused: not a follower's fetch, not a controller poll
        # (each switched to the new token before any process dropped the old one)
        denied = metric(url, "headrace_acl_denials_total", 'operation="authenticate"')
        assert denied == 0, f"{url}: {denied:.0f} authentications refused during the rotation"

    # nothing lost, nothing twice: every key's acked sequence numbers stored exactly once
    stored: Counter[tuple[bytes, int]] = Counter()
    for p in range(PARTITIONS):
        for record in await read_partition(c.bootstrap, TOPIC, p, options=ops):
            assert record.key is not None
            stored[(record.key, int(record.value))] += 1
    assert all(n == 1 for n in stored.values()), "a record is stored twice"
    for key, top in load.acked.items():
        missing = [s for s in range(top + 1) if stored[(key.encode(), s)] != 1]
        assert not missing, f"key {key}: acknowledged {missing[:5]} lost"

    # a member joining now gets an identity signed with the new key, valid on every broker
    assert await join_and_read(c.bootstrap, "rotation", ops)
    # `local restart` drains first: the drain presents the rotated token (a change on the
    # broker's admin port), so the broker's leadership moves away before it stops
    restart = await asyncio.to_thread(c.cli, "local", "restart", "1", "--dir", str(c.dir))
    assert b"not all moved away" not in restart.stderr, restart.stderr.decode()
    await asyncio.to_thread(c.wait, whole, 60, "every live replica set whole after the restart")
    print(
        f"\nrotated the replication token and cluster key under load: {load.total_acked}"
        f" acks=all records, none lost; {watch.polls} controller polls, LRS always whole"
    )


async def _at_least(load: KeyedLoad, target: int) -> bool:
    if load.failures:
        raise AssertionError(f"acks=all sends failed: {load.failures[:3]}")
    await asyncio.sleep(0.05)
    return load.total_acked >= target
