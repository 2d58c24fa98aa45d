"""Every client request has a timeout, not only produce.

A real TCP server on loopback that speaks just enough of the protocol: it
answers the handshake (or not) and then swallows every request. Before the
fix the client waited forever; the hang guard below turns that into a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from headrace.client import Consumer
from headrace.client.cluster import ClusterClient
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import RequestTimedOut
from headrace.protocol import messages as msg
from headrace.protocol.frames import FLAG_RESPONSE, FrameDecoder, Op, encode_frame

#: bounds a regression's hang; never part of the synchronisation
HANG_GUARD_S = 10
OPTIONS = ConnectOptions(request_timeout_s=0.3)


async def start_mute_server(
    *, answer_handshake: bool, topology: msg.TopologySnapshot | None = None
) -> tuple[asyncio.Server, int]:
    """Answers the handshake (or not), and topology requests with ``topology`` if given;
    swallows everything else."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(1 << 20)
        while data := await reader.read(65536):
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                if frame.op == Op.HANDSHAKE and answer_handshake:
                    ok = msg.HandshakeOk(msg.PROTOCOL_VERSION, 0, "mute", 1 << 20, 1 << 20).encode()
                    writer.write(
                        encode_frame(Op.HANDSHAKE_OK, frame.correlation_id, ok, FLAG_RESPONSE)
                    )
                elif frame.op == Op.TOPOLOGY and topology is not None:
                    body = topology.encode()
                    writer.write(
                        encode_frame(Op.TOPOLOGY_OK, frame.correlation_id, body, FLAG_RESPONSE)
                    )
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def mute_after_handshake() -> AsyncIterator[int]:
    server, port = await start_mute_server(answer_handshake=True)
    async with server:
        yield port


async def test_an_unanswered_handshake_times_out_and_hangs_up() -> None:
    server, port = await start_mute_server(answer_handshake=False)
    async with server:
        with pytest.raises(RequestTimedOut, match="HANDSHAKE"):
            await asyncio.wait_for(ClientConnection.open("127.0.0.1", port, OPTIONS), HANG_GUARD_S)


@pytest.mark.parametrize(
    "op",
    [Op.TOPOLOGY, Op.FETCH, Op.COHORT_JOIN, Op.COHORT_HEARTBEAT, Op.ACK, Op.SEEK, Op.PING],
)
async def test_every_request_times_out(mute_after_handshake: int, op: Op) -> None:
    conn = await ClientConnection.open("127.0.0.1", mute_after_handshake, OPTIONS)
    try:
        with pytest.raises(RequestTimedOut, match=op.name):
            await asyncio.wait_for(conn.request(op, b"{}"), HANG_GUARD_S)
        assert not conn._pending, "a timed-out request must not stay pending"
    finally:
        await conn.close()


async def test_a_request_may_wait_longer_than_the_default(mute_after_handshake: int) -> None:
    """A long poll passes its own limit; the default does not cut it short."""
    conn = await ClientConnection.open("127.0.0.1", mute_after_handshake, OPTIONS)
    try:
        patient = conn.request(Op.FETCH, b"", timeout_s=HANG_GUARD_S)
        hasty = conn.request(Op.FETCH, b"")
        with pytest.raises(RequestTimedOut):
            await hasty
        assert not patient.done()
        patient.cancel()
    finally:
        await conn.close()


async def test_cluster_start_and_consumer_start_time_out(mute_after_handshake: int) -> None:
    bootstrap = f"127.0.0.1:{mute_after_handshake}"
    cluster = ClusterClient(bootstrap, OPTIONS)
    with pytest.raises(RequestTimedOut):
        await asyncio.wait_for(cluster.start(), HANG_GUARD_S)
    await cluster.close()
    consumer = Consumer(bootstrap, "t", "c", options=OPTIONS)
    with pytest.raises(RequestTimedOut):
        await asyncio.wait_for(consumer.start(), HANG_GUARD_S)
    await consumer.cluster.close()


async def test_a_refresh_is_not_held_by_a_broker_that_never_answers(
    mute_after_handshake: int,
) -> None:
    """A paused broker first in the list: the refresh asked it alone and waited out the
    request timeout before asking anyone else. Now it asks three at once."""
    answering, port = await start_mute_server(
        answer_handshake=True, topology=msg.TopologySnapshot(5, "c", [], [])
    )
    async with answering:
        patient = ConnectOptions(request_timeout_s=HANG_GUARD_S)  # the old code waited this
        cluster = ClusterClient(f"127.0.0.1:{mute_after_handshake},127.0.0.1:{port}", patient)
        try:
            await asyncio.wait_for(cluster.refresh(), HANG_GUARD_S / 2)
            assert cluster.routing.generation == 5
        finally:
            await cluster.close()
