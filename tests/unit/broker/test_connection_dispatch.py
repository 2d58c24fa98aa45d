"""``server.Connection``'s dispatch table: every request op has exactly one handler, bound to
the connection's own handler objects, and anything else is answered with an error frame.

A fake host stands in for the broker: these frames never reach a partition."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from headrace.broker.config import BrokerSettings
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.server import Connection
from headrace.errors import NotAuthenticated, UnknownOperation
from headrace.protocol import messages as msg
from headrace.protocol.frames import FrameDecoder, Op, encode_frame
from headrace.security.access import Access
from headrace.security.settings import AccessSettings
from headrace.testing.recording import RecordingTransport

#: the ops a client or a peer broker sends; every other op is a response or a push
REQUESTS = {
    Op.HANDSHAKE,
    Op.PING,
    Op.TOPOLOGY,
    Op.TOPOLOGY_UPDATE_ACK,
    Op.PRODUCE,
    Op.FETCH,
    Op.COHORT_JOIN,
    Op.COHORT_LEAVE,
    Op.COHORT_HEARTBEAT,
    Op.CREDIT,
    Op.ACK,
    Op.RELEASE,
    Op.SEEK,
    Op.IDENTITY,
    Op.REPLICA_FETCH,
    Op.OFFSET_FOR_EPOCH,
    Op.CREATE_TOPIC,
    Op.DELETE_TOPIC,
    Op.DESCRIBE_TOPICS,
    Op.DESCRIBE_COHORTS,
    Op.RESET_CURSORS,
}


class Host:
    """The parts of ``ports.ConnectionHost`` a connection touches before any topic."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.metrics = BrokerMetrics(list)
        # the open mode (no credentials asked), as a broker started without any
        self.access = Access(AccessSettings(), Counter())  # type: ignore[arg-type]
        self.client_issuers: frozenset[Any] = frozenset()
        self.opened: list[Connection] = []

    def connection_opened(self, conn: Connection) -> None:
        self.opened.append(conn)

    def connection_closed(self, conn: Connection) -> None:
        self.opened.remove(conn)


@pytest.fixture
def connection(tmp_path: Path) -> tuple[Connection, RecordingTransport]:
    conn = Connection(Host(BrokerSettings(data_dir=tmp_path)))  # type: ignore[arg-type]
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def answers(transport: RecordingTransport) -> list[tuple[int, int, bytes]]:
    decoder = FrameDecoder(1 << 20)
    decoder.feed(bytes(transport.written))
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append((frame.op, frame.correlation_id, frame.body))
    return frames


def test_every_request_op_has_one_handler_of_this_connection(
    connection: tuple[Connection, RecordingTransport],
) -> None:
    conn, _ = connection
    table = conn._handlers
    assert set(table) == REQUESTS
    owners = {getattr(handler, "__self__", None) for handler in table.values()}
    assert all(owner is not None and owner.conn is conn for owner in owners)


def test_a_response_op_sent_as_a_request_is_unknown(
    connection: tuple[Connection, RecordingTransport],
) -> None:
    conn, transport = connection
    conn.data_received(encode_frame(Op.PING, 1, b"hi"))
    conn.authenticated = True
    conn.data_received(encode_frame(Op.PRODUCE_OK, 2, b""))
    (pong, error) = answers(transport)
    assert pong == (Op.PONG, 1, b"hi")
    op, correlation_id, body = error
    assert (op, correlation_id) == (Op.ERROR, 2)
    assert msg.ErrorBody.decode(body).code == UnknownOperation.CODE
    assert not transport.closed


def test_only_a_handshake_or_a_ping_comes_before_the_handshake(
    connection: tuple[Connection, RecordingTransport],
) -> None:
    conn, transport = connection
    conn.data_received(encode_frame(Op.TOPOLOGY, 7, b""))
    ((op, correlation_id, body),) = answers(transport)
    assert (op, correlation_id) == (Op.ERROR, 7)
    assert msg.ErrorBody.decode(body).code == NotAuthenticated.CODE


def test_a_handshake_opens_every_op(connection: tuple[Connection, RecordingTransport]) -> None:
    conn, transport = connection
    hello = msg.Handshake(msg.PROTOCOL_VERSION, "dispatch-test")
    conn.data_received(encode_frame(Op.HANDSHAKE, 1, hello.encode()))
    ((op, _, _),) = answers(transport)
    assert op == Op.HANDSHAKE_OK
    assert conn.authenticated and conn.client_id == "dispatch-test"
