"""The Kafka listener: Kafka's wire protocol over the same partitions, logs and replication.

One ``KafkaConnection`` per client socket. It is the protocol adapter: frames (a
big-endian int32 size, then the request) are cut from the stream here,
``headrace.kafka`` decodes and encodes them, and each request goes by its API key
through one dispatch table to its handler in ``broker.kafka_handlers``, which
decides the answer. The connection also keeps the session: until a credential is
accepted (SASL, or a client certificate) it serves only ApiVersions and SASL.
Kafka clients expect the responses of one connection in request order, so each
request takes a slot and slots are written in order as they complete (a
long-polling fetch holds back the answers behind it, as in Kafka).

What this slice serves is ``kafka.messages.SUPPORTED``; anything else gets
``UNSUPPORTED_VERSION``, a request that does not parse gets ``INVALID_REQUEST``,
and the connection stays open unless its framing is lost. ``docs/kafka.md`` says
what differs from Kafka.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from headrace import transports
from headrace.broker import certificates
from headrace.broker.kafka_handlers import session
from headrace.broker.kafka_handlers.committed_offsets import CommittedOffsets
from headrace.broker.kafka_handlers.consumer_protocol import ConsumerProtocol
from headrace.broker.kafka_handlers.context import (
    KafkaHandler,
    KafkaRequestContext,
    KafkaRoutes,
)
from headrace.broker.kafka_handlers.fetching import Fetching
from headrace.broker.kafka_handlers.group_coordination import GroupCoordination
from headrace.broker.kafka_handlers.log_offsets import LogOffsets
from headrace.broker.kafka_handlers.metadata import Metadata
from headrace.broker.kafka_handlers.producing import ACKS_NONE, Producing
from headrace.broker.kafka_handlers.topic_admin import TopicAdmin
from headrace.broker.kafka_handlers.topic_configs import TopicConfigs
from headrace.errors import AuthenticationFailed
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.kafka.wire import MalformedKafkaRequest, Reader, Writer

if TYPE_CHECKING:
    from headrace.broker.kafka_groups import KafkaGroups
    from headrace.broker.ports import ConnectionHost

log = logging.getLogger(__name__)

Parts = list[bytes | bytearray | memoryview]

#: what a connection may ask before it has authenticated (as Kafka's SASL listeners)
_BEFORE_AUTHENTICATION: Final = frozenset(
    {km.ApiKey.API_VERSIONS, km.ApiKey.SASL_HANDSHAKE, km.ApiKey.SASL_AUTHENTICATE}
)


class _Slot:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: Parts | None = None


class KafkaConnection(asyncio.Protocol):
    def __init__(
        self,
        broker: ConnectionHost,
        advertised: Callable[[], tuple[str, int]],
        connections: set[KafkaConnection],
        groups: KafkaGroups,
    ) -> None:
        self.broker = broker
        self.groups = groups
        self.connections = connections
        self.advertised = advertised
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._buffer = bytearray()
        self._slots: deque[_Slot] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.access = broker.access.session()
        #: until a credential is accepted (SASL, or a client certificate) only
        #: ``_BEFORE_AUTHENTICATION`` is served; without credentials to check, at once
        self.authenticated = not broker.access.asks_credentials
        self.sasl = session.SaslSession(self.access, self.peer)
        #: the answer being written ends the connection (a failed authentication)
        self._close_after_answer = False
        #: API key -> its handler; built once the peer is known (``connection_made``)
        self._handlers: dict[km.ApiKey, KafkaHandler] = {}

    def _dispatch_table(self) -> dict[km.ApiKey, KafkaHandler]:
        context = KafkaRequestContext(self.broker, self.access, self.peer, self.advertised)
        own: KafkaRoutes = {
            km.ApiKey.API_VERSIONS: session.api_versions,
            km.ApiKey.SASL_HANDSHAKE: self._sasl_handshake,
            km.ApiKey.SASL_AUTHENTICATE: self._sasl_authenticate,
        }
        table: dict[km.ApiKey, KafkaHandler] = {}
        for routes in (
            own,
            Metadata(context).routes(),
            Producing(context).routes(),
            Fetching(context).routes(),
            LogOffsets(context).routes(),
            GroupCoordination(context, self.groups).routes(),
            CommittedOffsets(context, self.groups).routes(),
            ConsumerProtocol(context, self.groups).routes(),
            TopicAdmin(context).routes(),
            TopicConfigs(context).routes(),
        ):
            for key, handler in routes.items():
                assert key not in table, f"two handlers for {key!r}"
                table[key] = handler
        return table

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transports.adopt(transport)
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.sasl.peer = self.peer
        self._handlers = self._dispatch_table()
        self.connections.add(self)
        certificate = self._client_certificate()
        if not self.authenticated and certificate is not None:
            # a client certificate names a principal as Kafka's SSL listeners take it
            try:
                self.access.authenticate(None, certificate)
                self.authenticated = True
            except AuthenticationFailed:
                pass  # SASL may still name one

    def _client_certificate(self) -> object:
        assert self.transport is not None
        peercert = self.transport.get_extra_info("peercert")
        # only the client CA's certificates name principals, not the brokers' own CA's
        return certificates.client_certificate(peercert, self.broker.client_issuers)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        for task in list(self._tasks):
            task.cancel()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        limit = self.broker.settings.max_frame_bytes
        if not self.authenticated:
            limit = self.broker.access.max_frame_bytes_before_handshake(limit)
        while len(self._buffer) >= 4:
            size = int.from_bytes(self._buffer[:4], "big", signed=True)
            if size < 8 or size > limit:
                # The framing is lost or hostile: answer what can be answered, then close.
                if len(self._buffer) >= 12:
                    self._send_error_only(self._buffer[8:12], ErrorCode.MESSAGE_TOO_LARGE)
                log.warning("kafka: %s sent a frame of %d bytes; closing", self.peer, size)
                self.close()
                return
            if len(self._buffer) < 4 + size:
                return
            frame = bytes(self._buffer[4 : 4 + size])
            del self._buffer[: 4 + size]
            self._handle(frame)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    # ------------------------------------------------------------------ requests

    def _handle(self, frame: bytes) -> None:
        decoded = self._decode(frame)
        if decoded is None:
            return
        api, header, body = decoded
        if not self.authenticated and api.key not in _BEFORE_AUTHENTICATION:
            log.info("kafka: %s sent %s before authenticating; closing", self.peer, api.key.name)
            self._send_error_only(frame[4:8], ErrorCode.ILLEGAL_SASL_STATE)
            self.close()
            return
        handler = self._handlers[api.key]
        if isinstance(body, km.ProduceRequest) and body.acks == ACKS_NONE:
            try:
                handler(header, body)  # Kafka sends no answer to acks=0
            except Exception:
                log.exception("kafka: acks=0 produce from %s failed", self.peer)
            return
        slot = _Slot()
        self._slots.append(slot)
        try:
            answer = handler(header, body)
            if asyncio.isfuture(answer):
                # a produce waiting on its replicas or on fsync: its future never fails
                answer.add_done_callback(
                    lambda done: self._complete(slot, api, header, done.result())
                )
            elif asyncio.iscoroutine(answer):
                self._spawn(self._answer_later(slot, api, header, answer))
            else:
                self._complete(slot, api, header, answer)
        except Exception:
            self._failed(slot, api, header)
        if self._close_after_answer:
            self.close()

    def _decode(self, frame: bytes) -> tuple[km.Api, km.RequestHeader, Any] | None:
        """The request's API, header and body; None once a request that does not parse or
        is not served has been answered."""
        r = Reader(frame)
        try:
            header = km.decode_request_header(r)
        except MalformedKafkaRequest:
            self._send_error_only(frame[4:8], ErrorCode.INVALID_REQUEST)
            return None
        api = km.SUPPORTED.get(header.api_key)
        if api is None or not api.supports(header.api_version):
            self._unsupported(header)
            return None
        try:
            if api.flexible(header.api_version):
                km.skip_header_tags(r)
            body = km.decode_request(api, header.api_version, r)
        except MalformedKafkaRequest as exc:
            log.info(
                "kafka: malformed %s v%d from %s: %s (frame starts %s)",
                api.key.name,
                header.api_version,
                self.peer,
                exc,
                frame[:64].hex(),
            )
            self._send_error_only(frame[4:8], ErrorCode.INVALID_REQUEST)
            return None
        return api, header, body

    async def _answer_later(
        self,
        slot: _Slot,
        api: km.Api,
        header: km.RequestHeader,
        answer: Coroutine[Any, Any, object],
    ) -> None:
        try:
            body = await answer
        except Exception:
            self._failed(slot, api, header)
            return
        self._complete(slot, api, header, body)

    def _failed(self, slot: _Slot, api: km.Api, header: km.RequestHeader) -> None:
        log.exception("kafka: %s v%d from %s failed", api.key.name, header.api_version, self.peer)
        slot.parts = _error_only(header.correlation_id, ErrorCode.UNKNOWN_SERVER_ERROR)
        self._flush()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _unsupported(self, header: km.RequestHeader) -> None:
        if header.api_key == km.ApiKey.API_VERSIONS:
            # KIP-511: answer in v0 with the error and our table; the client retries with it.
            api = km.SUPPORTED[km.ApiKey.API_VERSIONS]
            answer = km.ApiVersionsResponse(ErrorCode.UNSUPPORTED_VERSION, km.advertised_versions())
            slot = _Slot()
            self._slots.append(slot)
            self._complete(
                slot, api, km.RequestHeader(header.api_key, 0, header.correlation_id, None), answer
            )
            return
        log.info(
            "kafka: %s asked for api %d v%d, not served",
            self.peer,
            header.api_key,
            header.api_version,
        )
        self._send_error_only(
            header.correlation_id.to_bytes(4, "big", signed=True), ErrorCode.UNSUPPORTED_VERSION
        )

    def _send_error_only(self, correlation_id: bytes | bytearray, code: ErrorCode) -> None:
        """Header v0 and an int16 error code: the answer to a request we cannot parse or do not
        serve. Its body is no schema's, so a client raises on it rather than hanging."""
        slot = _Slot()
        slot.parts = _error_only(int.from_bytes(correlation_id, "big", signed=True), code)
        self._slots.append(slot)
        self._flush()

    def _complete(self, slot: _Slot, api: km.Api, header: km.RequestHeader, body: Any) -> None:
        slot.parts = km.encode_response(api, header.api_version, header.correlation_id, body)
        self._flush()

    def _flush(self) -> None:
        while self._slots and self._slots[0].parts is not None:
            parts = self._slots.popleft().parts
            if self.transport is not None and not self.closed and parts:
                self.transport.writelines(parts)

    # ------------------------------------------------------------------ SASL session

    def _sasl_handshake(
        self, header: km.RequestHeader, req: km.SaslHandshakeRequest
    ) -> km.SaslHandshakeResponse:
        return self.sasl.handshake(req)

    def _sasl_authenticate(
        self, header: km.RequestHeader, req: km.SaslAuthenticateRequest
    ) -> km.SaslAuthenticateResponse:
        answer, outcome = self.sasl.authenticate(req, self._client_certificate())
        if outcome is session.Outcome.AUTHENTICATED:
            self.authenticated = True
        elif outcome is session.Outcome.REFUSED:
            self._close_after_answer = True  # as Kafka: a failed authentication ends it
        return answer


def _error_only(correlation_id: int, code: ErrorCode) -> Parts:
    w = Writer()
    w.int32(6)
    w.int32(correlation_id)
    w.int16(code)
    return w.parts()
