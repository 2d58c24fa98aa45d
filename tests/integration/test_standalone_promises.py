"""What a standalone broker promises on the wire and in its metrics, checked over real sockets.

- ``acks=all`` under ``--fsync always`` asks for a sync round at once (wire-protocol.md §6.1),
  rather than waiting for the periodic one.
- A Fetch with ``max_wait_ms = 0`` and nothing to return is answered, empty (§6.2).
- With ``--port 0`` the topology and Redirects name the bound port, so clients that route
  by the topology reach the broker (operations.md §3).
- ``headrace_delivered_bytes_total`` and ``headrace_fsync_round_seconds`` move (§5).
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headrace.client import Consumer, Producer
from headrace.protocol import messages as msg
from headrace.protocol.frames import Frame, Op
from headrace.records import batch as rb
from headrace.testing import waiting
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition
from tests.integration.raw import RawConnection

#: how long a test waits for an answer that must come; far below the periodic round below
ANSWER_DEADLINE_S = 30.0
#: the periodic group-commit round under --fsync always (the recovery-point timer), made
#: far longer than ANSWER_DEADLINE_S: an answer that waited for it cannot arrive in time
PERIODIC_ROUND_MS = 600_000


@pytest.fixture
def always_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path / "data",
        fsync="always",
        extra_args=["--checkpoint-interval-ms", str(PERIODIC_ROUND_MS)],
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.kill9()


def answer_within(conn: RawConnection, correlation_id: int, deadline_s: float) -> Frame:
    """The answer to ``correlation_id``; ``AssertionError`` if none arrives by the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no answer to request {correlation_id} in {deadline_s}s")
        conn.sock.settimeout(remaining)
        try:
            frame = conn.recv()
        except TimeoutError:
            continue  # the loop head reports the missed deadline
        if frame.correlation_id == correlation_id:
            return frame


async def test_acks_all_under_fsync_always_does_not_wait_for_the_periodic_round(
    always_broker: BrokerProcess,
) -> None:
    await create_topic(always_broker.bootstrap, "durable", 1)
    conn = RawConnection(always_broker.bootstrap)
    try:
        batch = rb.encode([b"on disk before the answer"], timestamp_ms=1)
        # The produce's own timeout is longer than the deadline too: only a sync round asked
        # for by this produce can answer it in time.
        request = msg.ProduceRequest("durable", 0, 1, msg.Acks.ALL, PERIODIC_ROUND_MS, batch)
        frame = answer_within(conn, conn.send(Op.PRODUCE, request.encode()), ANSWER_DEADLINE_S)
    finally:
        conn.close()
    assert frame.op == Op.PRODUCE_OK, frame
    answer = msg.ProduceResponse.decode(frame.body)
    assert (answer.base_offset, answer.high_watermark) == (0, 1)


def test_fetch_with_no_wait_and_nothing_to_return_is_answered_empty(broker: BrokerProcess) -> None:
    asyncio.run(create_topic(broker.bootstrap, "quiet", 1))
    conn = RawConnection(broker.bootstrap)
    try:
        for isolation in msg.Isolation:
            request = msg.FetchRequest("quiet", 0, 0, 1 << 20, 0, isolation)
            frame = answer_within(conn, conn.send(Op.FETCH, request.encode()), ANSWER_DEADLINE_S)
            assert frame.op == Op.FETCH_OK, frame
            head, data = msg.FetchResponseHeader.decode(frame.body)
            assert (head.high_watermark, head.log_end_offset, len(data)) == (0, 0, 0), isolation
    finally:
        conn.close()


def bound_port(broker: BrokerProcess) -> int:
    """The data port a broker started with ``--port 0`` bound, from its ready line."""
    bound: list[int] = []

    def ready_line_logged() -> bool:
        found = re.search(r"ready on 127\.0\.0\.1:(\d+) ", broker.log_path.read_text())
        if found:
            bound.append(int(found.group(1)))
        return bool(found)

    waiting.until(ready_line_logged, ANSWER_DEADLINE_S, "the broker's ready line")
    assert bound[0] != 0
    with socket.create_connection(("127.0.0.1", bound[0]), timeout=5):
        pass  # the data port really is there
    return bound[0]


@pytest.fixture
def free_port_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, int]]:
    """A standalone broker started with ``--port 0``, and the port it bound."""
    broker = BrokerProcess(tmp_path / "data", port=0)
    broker.start()
    try:
        yield broker, bound_port(broker)
    finally:
        broker.kill9()


async def test_port_0_advertises_the_bound_port(
    free_port_broker: tuple[BrokerProcess, int],
) -> None:
    _, port = free_port_broker
    bootstrap = f"127.0.0.1:{port}"
    await create_topic(bootstrap, "anywhere", 1)
    conn = RawConnection(bootstrap)
    try:
        topology = msg.TopologySnapshot.decode(conn.call(Op.TOPOLOGY, b"").body)
        assert [(b.host, b.port) for b in topology.brokers] == [("127.0.0.1", port)]
        # A producer routed by an older partitioning version is redirected to the owner.
        batch = rb.encode([b"stale route"], timestamp_ms=1)
        stale = msg.ProduceRequest("anywhere", 0, 99, msg.Acks.LEADER, 5_000, batch)
        frame = conn.call(Op.PRODUCE, stale.encode())
        assert frame.op == Op.REDIRECT, frame
        owner = msg.Redirect.decode(frame.body).owner
        assert owner is not None and (owner.host, owner.port) == ("127.0.0.1", port)
    finally:
        conn.close()
    # Clients connect to the advertised address for every partition.
    async with Producer(bootstrap, acks="all") as producer:
        receipt = await producer.send("anywhere", b"found the broker", partition=0)
        await producer.flush()
        await receipt
    stored = await read_partition(bootstrap, "anywhere", 0)
    assert [r.value for r in stored] == [b"found the broker"]


def test_port_0_in_cluster_mode_reports_the_bound_port_to_the_controller(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", mode="cluster", port=0)
    broker.start()
    try:
        port = bound_port(broker)
        heartbeat = broker.get_json("/v1/heartbeat")
        assert heartbeat["broker"] == {
            "id": 0,
            "host": "127.0.0.1",
            "port": port,
            "adminPort": broker.admin_port,
        }
    finally:
        broker.kill9()


def scrape(broker: BrokerProcess) -> dict[str, float]:
    """Every sample of ``/metrics`` without labels, by name."""
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


async def test_delivery_and_sync_round_metrics_move(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(fsync="always")  # type: ignore[operator]
    await create_topic(broker.bootstrap, "measured", 2)
    values = [f"record {i}".encode() for i in range(200)]
    async with Producer(broker.bootstrap, acks="all") as producer:
        for partition in (0, 1):
            await producer.send_many("measured", values, partition=partition)
        await producer.flush()
    consumer = await Consumer(broker.bootstrap, "measured", "readers", start="earliest").start()
    received = 0
    try:
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        while received < 2 * len(values):
            assert time.monotonic() < deadline, f"received {received} of {2 * len(values)}"
            for batch in await consumer.getmany(timeout_s=0.2):
                received += batch.record_count
                consumer.ack_batch(batch)
    finally:
        await consumer.close()
    metrics = scrape(broker)
    # Every stored batch was pushed to the member at least once.
    assert metrics["headrace_delivered_bytes_total"] >= metrics["headrace_produced_bytes_total"]
    assert metrics["headrace_produced_bytes_total"] > 0
    # Under fsync=always acks=all waited for a group-commit round that synced its batch.
    assert metrics["headrace_fsync_round_seconds_count"] >= 1
    assert metrics["headrace_fsync_round_seconds_sum"] > 0


def test_a_retried_batch_is_counted_once_and_the_generation_shows_after_a_restart(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    conn = RawConnection(broker.bootstrap)
    assert conn.call(Op.CREATE_TOPIC, msg.CreateTopic("counted", 1).encode()).op == (
        Op.CREATE_TOPIC_OK
    )
    batch = rb.encode([b"a", b"b", b"c"], timestamp_ms=0, producer_id=11, base_sequence=0)
    body = msg.ProduceRequest("counted", 0, 1, msg.Acks.LEADER, 5000, batch).encode()
    first = msg.ProduceResponse.decode(conn.call(Op.PRODUCE, body).body)
    retried = msg.ProduceResponse.decode(conn.call(Op.PRODUCE, body).body)  # a lost answer
    assert retried.base_offset == first.base_offset  # answered as the duplicate it is
    metrics = scrape(broker)
    assert metrics["headrace_produced_records_total"] == 3
    assert metrics["headrace_produced_bytes_total"] == len(batch)
    assert (
        metrics["headrace_topology_generation"]
        == broker.get_json("/v1/status")["topology_generation"]
    )
    broker.stop()
    broker.start()
    # after a start, before any topic changes: the generation the broker serves, not 0
    generation = broker.get_json("/v1/status")["topology_generation"]
    assert isinstance(generation, int) and generation >= 1
    assert scrape(broker)["headrace_topology_generation"] == generation
