"""The data port: one ``Connection`` (an asyncio BufferedProtocol) per client socket.

``Connection`` is the protocol adapter: it decodes frames incrementally, lets only a
handshake or a ping through before the handshake, dispatches each frame by its op
code through one table (built once per connection from the handler objects of
``broker.handlers``), turns a handler's error into an error frame, and writes. What
a frame means is the handlers' business. Produce and fetch handlers run
synchronously on the loop (validate, append or read, respond); only durability
waits and long polls leave a callback behind. Responses may complete out of order;
the correlation id pairs them with requests, so a client can pipeline as many
requests as it likes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

from headrace import transports
from headrace.broker.handlers.fetching import Fetching
from headrace.broker.handlers.membership import Membership
from headrace.broker.handlers.producing import Producing
from headrace.broker.handlers.replica_serving import ReplicaServing
from headrace.broker.handlers.session import Session
from headrace.broker.handlers.topic_admin import TopicAdmin
from headrace.broker.ports import ConnectionHost, Handler, RedirectRequired
from headrace.errors import (
    AuthenticationFailed,
    FrameTooLarge,
    HeadraceError,
    MalformedFrame,
    NotAuthenticated,
    UnknownOperation,
)
from headrace.protocol import messages as msg
from headrace.protocol.endpoints import DEFAULT_LISTENER
from headrace.protocol.frames import (
    FLAG_NO_REPLY,
    FLAG_PUSH,
    FLAG_RESPONSE,
    Frame,
    FrameDecoder,
    Op,
    encode_frame,
    frame_header,
)

log = logging.getLogger(__name__)


class Connection(asyncio.BufferedProtocol):
    """One client's (or a peer broker's) socket. A ``BufferedProtocol``: the socket is
    read straight into the frame decoder's buffer (``get_buffer``), one copy fewer of
    every produced and replicated byte than ``data_received`` would take."""

    def __init__(self, broker: ConnectionHost, listener: str = DEFAULT_LISTENER) -> None:
        #: the broker, seen through the port a connection needs (``ports.ConnectionHost``)
        self.broker = broker
        #: the listener that accepted it: the addresses its topology and redirects name
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(
            broker.access.max_frame_bytes_before_handshake(broker.settings.max_frame_bytes)
        )
        self.peer = "?"
        self.client_id = ""
        self.authenticated = False
        #: who this connection is and what it may do (``access.ConnectionAccess``)
        self.access = broker.access.session()
        #: an error that ends the connection (a joined member refused after a reload)
        self._close_after_error = False
        self._writable = True
        self.closed = False
        self.session = Session(self)
        self.membership = Membership(self)
        self.fetching = Fetching(self)
        self.replica_serving = ReplicaServing(self)
        #: op -> its handler, bound to this connection's handler objects: one lookup a frame
        self._handlers: dict[int, Handler] = {}
        for routes in (
            self.session.routes(),
            Producing(self).routes(),
            self.fetching.routes(),
            self.membership.routes(),
            self.replica_serving.routes(),
            TopicAdmin(self).routes(),
        ):
            for op, handler in routes.items():
                assert op not in self._handlers, f"two handlers for op {op!r}"
                self._handlers[op] = handler

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transports.adopt(transport)
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.transport.set_write_buffer_limits(high=8 * 1024 * 1024, low=2 * 1024 * 1024)
        self.broker.connection_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.replica_serving.close()
        self.fetching.close()
        self.membership.disconnect()
        self.broker.connection_closed(self)

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self.membership.wake()

    @property
    def writable(self) -> bool:
        return self._writable and not self.closed

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.decoder.buffer_updated(nbytes)
        self._dispatch_frames()

    def data_received(self, data: bytes) -> None:
        """Bytes from a caller that read them itself (tests drive a connection so)."""
        self.decoder.feed(data)
        self._dispatch_frames()

    def _dispatch_frames(self) -> None:
        while True:
            try:
                frame = self.decoder.next_frame()
            except (FrameTooLarge, MalformedFrame) as exc:
                # The stream has lost its framing: say why, then hang up.
                self.broker.metrics.errors.labels(type(exc).__name__).inc()
                self.send_error(0, exc)
                self.close()
                return
            if frame is None:
                return
            self._dispatch(frame)

    # ------------------------------------------------------------------ the session

    def peercert(self) -> object:
        return self.transport.get_extra_info("peercert") if self.transport else None

    def authenticated_as(self, client_id: str) -> None:
        self.client_id = client_id
        self.authenticated = True
        self.decoder.max_frame_bytes = self.broker.settings.max_frame_bytes

    def close_after_error(self) -> None:
        self._close_after_error = True

    @property
    def acked_generation(self) -> int | None:
        """Highest topology generation this connection acked (op 102); None until it acks."""
        return self.session.acked_generation

    # ------------------------------------------------------------------ sending

    def write(self, data: bytes | memoryview) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def writelines(self, parts: Sequence[bytes | memoryview]) -> None:
        if self.transport is not None and not self.closed:
            self.transport.writelines(parts)

    def respond(self, frame: Frame, op: Op, body: bytes = b"") -> None:
        if frame.flags & FLAG_NO_REPLY:
            return
        self.write(encode_frame(op, frame.correlation_id, body, FLAG_RESPONSE))

    def send_error(self, correlation_id: int, exc: HeadraceError) -> None:
        body = msg.ErrorBody(exc.CODE, exc.message).encode()
        self.write(encode_frame(Op.ERROR, correlation_id, body, FLAG_RESPONSE))

    def push(self, op: Op, body: bytes) -> None:
        self.write(encode_frame(op, 0, body, FLAG_PUSH))

    def membership_ended(self) -> None:
        self.membership.ended()

    def push_assignment(self, assignment: msg.Assignment) -> None:
        self.push(Op.ASSIGNMENT, assignment.encode())

    def push_delivery(
        self, partition: int, epoch: int, hw: int, first_offset: int, data: bytes | memoryview
    ) -> None:
        if self.transport is None or self.closed:
            return
        head = msg.DELIVERY_HEADER.pack(partition, epoch, hw, first_offset)
        self.transport.writelines(
            [frame_header(Op.DELIVERY, 0, len(head) + len(data), FLAG_PUSH), head, data]
        )

    def push_topology(self, snapshot: msg.TopologySnapshot, routing: object) -> None:
        self.session.push_topology(snapshot, routing)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, frame: Frame) -> None:
        try:
            if not self.authenticated and frame.op not in (Op.HANDSHAKE, Op.PING):
                raise NotAuthenticated("send a handshake first")
            handler = self._handlers.get(frame.op)
            if handler is None:
                raise UnknownOperation(f"unknown op {frame.op}")
            handler(frame)
        except RedirectRequired as redirect:
            self.broker.metrics.redirects.inc()
            answer = redirect.redirect
            if answer.owner is not None:
                # an owner with no address on this listener yet is no owner to its clients
                answer = dataclasses.replace(answer, owner=answer.owner.on(self.listener))
            self.respond(frame, Op.REDIRECT, answer.encode())
        except HeadraceError as exc:
            self.broker.metrics.errors.labels(type(exc).__name__).inc()
            if not frame.flags & FLAG_NO_REPLY:
                self.send_error(frame.correlation_id, exc)
            if isinstance(exc, AuthenticationFailed) or self._close_after_error:
                self.close()
        except Exception:
            log.exception("internal error handling op %s from %s", frame.op, self.peer)
            self.broker.metrics.errors.labels("internal").inc()
            self.send_error(frame.correlation_id, HeadraceError("internal broker error"))
