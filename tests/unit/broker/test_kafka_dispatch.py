"""``kafka_listener.KafkaConnection``'s dispatch table and answer slots: every API the
listener serves has exactly one handler, and answers go out in request order even when
an earlier one waits or fails.

A fake host stands in for the broker: these requests never reach a partition. The tests
that need an answer to wait put their own handler in the table."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from headrace.broker.config import BrokerSettings
from headrace.broker.kafka_groups import KafkaGroups
from headrace.broker.kafka_listener import KafkaConnection
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.kafka.wire import Reader
from headrace.security.access import Access
from headrace.security.settings import AccessSettings
from headrace.testing.recording import RecordingTransport
from headrace.testing.waiting import until_async

API_VERSIONS = km.SUPPORTED[km.ApiKey.API_VERSIONS]
LIST_GROUPS = km.SUPPORTED[km.ApiKey.LIST_GROUPS]


class Host:
    """The parts of ``ports.ConnectionHost`` a Kafka connection touches before any topic."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        # the open mode (no credentials asked), as a broker started without any
        self.access = Access(AccessSettings(), Counter())  # type: ignore[arg-type]
        self.client_issuers: frozenset[Any] = frozenset()


@pytest.fixture
def connection(tmp_path: Path) -> tuple[KafkaConnection, RecordingTransport]:
    host = Host(BrokerSettings(data_dir=tmp_path))
    groups = KafkaGroups(tmp_path / "kafka-groups")
    conn = KafkaConnection(host, lambda: ("127.0.0.1", 9092), set(), groups)  # type: ignore[arg-type]
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def answers(transport: RecordingTransport) -> list[tuple[int, bytes]]:
    """(correlation id, the rest of the frame) of each answer written, in order."""
    out = []
    data = bytes(transport.written)
    while data:
        size = int.from_bytes(data[:4], "big")
        frame, data = data[4 : 4 + size], data[4 + size :]
        out.append((Reader(frame).int32(), frame))
    return out


def api_versions(correlation_id: int) -> bytes:
    return km.encode_request(
        API_VERSIONS, 3, correlation_id, "dispatch-test", km.ApiVersionsRequest("t", "1")
    )


def test_every_served_api_has_exactly_one_handler(
    connection: tuple[KafkaConnection, RecordingTransport],
) -> None:
    conn, _ = connection
    assert set(conn._handlers) == set(km.SUPPORTED)


async def test_answers_keep_request_order_while_an_earlier_one_waits(
    connection: tuple[KafkaConnection, RecordingTransport],
) -> None:
    conn, transport = connection
    released = asyncio.Event()

    async def waits(header: km.RequestHeader, req: km.ListGroupsRequest) -> km.ListGroupsResponse:
        await released.wait()
        return km.ListGroupsResponse(0, ErrorCode.NONE, [])

    conn._handlers[km.ApiKey.LIST_GROUPS] = waits
    conn.data_received(km.encode_request(LIST_GROUPS, 0, 1, "t", km.ListGroupsRequest()))
    conn.data_received(api_versions(2))
    await asyncio.sleep(0)  # let the waiting handler start; it must not be answered yet
    assert answers(transport) == []
    released.set()
    await until_async(lambda: len(answers(transport)) == 2, 5, "both answers", poll_s=0.01)
    assert [correlation_id for correlation_id, _ in answers(transport)] == [1, 2]


async def test_a_handler_that_fails_is_answered_and_later_answers_still_go_out(
    connection: tuple[KafkaConnection, RecordingTransport],
) -> None:
    conn, transport = connection

    async def fails(header: km.RequestHeader, req: km.ListGroupsRequest) -> km.ListGroupsResponse:
        raise RuntimeError("a handler's bug")

    conn._handlers[km.ApiKey.LIST_GROUPS] = fails
    conn.data_received(km.encode_request(LIST_GROUPS, 0, 1, "t", km.ListGroupsRequest()))
    conn.data_received(api_versions(2))
    await until_async(lambda: len(answers(transport)) == 2, 5, "both answers", poll_s=0.01)
    (failed, versions) = answers(transport)
    assert failed[0] == 1
    assert Reader(failed[1][4:]).int16() == ErrorCode.UNKNOWN_SERVER_ERROR
    _, body = km.decode_response(API_VERSIONS, 3, versions[1])
    assert body.error_code == ErrorCode.NONE
    assert not transport.closed
