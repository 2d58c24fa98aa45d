"""One client connection: pipelined requests matched to responses by correlation id."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from headrace import transports
from headrace.client import tokens
from headrace.errors import (
    AuthenticationFailed,
    ConnectionClosed,
    HeadraceError,
    Redirected,
    RequestTimedOut,
    TokenRotated,
    error_for_code,
)
from headrace.protocol import messages as msg
from headrace.protocol.frames import (
    FLAG_NO_REPLY,
    FLAG_PUSH,
    Frame,
    FrameDecoder,
    Op,
    encode_frame,
    frame_header,
)

log = logging.getLogger(__name__)


class RedirectReceived(Redirected):
    """The broker answered with a Redirect; ``redirect`` names the current owner."""

    def __init__(self, redirect: msg.Redirect) -> None:
        super().__init__(redirect.reason or "redirected")
        self.redirect = redirect


#: ConnectOptions.request_timeout_s's default, for connections made without options
DEFAULT_REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    client_id: str = "headrace-python"
    #: the token to present: a string, fixed for the client's life, or a token source
    #: (``tokens.TokenSource``, e.g. ``tokens.TokenFile``) read at each new connection, so
    #: a long-lived client follows a rotation (a refused connection reconnects with the
    #: source's new token: ``TokenRotated``)
    auth_token: str | tokens.TokenSource | None = None
    ssl: ssl.SSLContext | None = None
    connect_timeout_s: float = 10.0
    max_frame_bytes: int = 64 * 1024 * 1024
    #: how long any request waits for its answer, in seconds, before it fails with the
    #: retriable RequestTimedOut (a half-dead connection must not hang a caller forever).
    #: 30 s, like produce's default; a long poll passes its own ``timeout_s`` to ``request``.
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S


PushHandler = Callable[["ClientConnection", Frame], None]


class ClientConnection(asyncio.BufferedProtocol):
    """One connection to a broker. A ``BufferedProtocol``: responses are read straight
    into the frame decoder's buffer (``get_buffer``), which saves a copy of every
    fetched byte (a follower's replica fetches, a consumer's deliveries)."""

    def __init__(
        self,
        on_push: PushHandler | None,
        max_frame_bytes: int,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self._decoder = FrameDecoder(max_frame_bytes)
        self.request_timeout_s = request_timeout_s
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self._on_push = on_push
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()
        self.close_reason: str = ""
        #: called once the connection is gone (after its pending requests failed)
        self.close_listeners: list[Callable[[ClientConnection], None]] = []
        self.handshake: msg.HandshakeOk | None = None
        #: the token this connection presented in its handshake, and where it came from
        self.token: str | None = None
        self.token_source: str | tokens.TokenSource | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    @classmethod
    async def open(
        cls, host: str, port: int, options: ConnectOptions, on_push: PushHandler | None = None
    ) -> ClientConnection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: cls(on_push, options.max_frame_bytes, options.request_timeout_s),
                    host,
                    port,
                    ssl=options.ssl,
                    server_hostname=host if options.ssl else None,
                ),
                options.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise ConnectionClosed(f"cannot connect to {host}:{port}: {exc}") from exc
        conn.token_source = options.auth_token
        try:
            # read at each connect: a source's token may have been rotated since the last
            conn.token = tokens.current_token(options.auth_token)
            hello = msg.Handshake(
                msg.PROTOCOL_VERSION,
                options.client_id,
                conn.token,
                min_protocol_version=msg.MIN_PROTOCOL_VERSION,
            )
            frame = await conn.request(Op.HANDSHAKE, hello.encode())
            conn.handshake = msg.HandshakeOk.decode(frame.body)
            # a broker from before negotiation answers with its own (only) version
            msg.negotiate(conn.handshake.protocol_version, conn.handshake.protocol_version)
        except HeadraceError:
            if conn.transport is not None:
                conn.transport.close()  # a handshake that failed or never came: hang up
            raise
        return conn

    def token_rotated(self) -> bool:
        """Whether this connection's token source yields another token now than the one
        it presented. Never for a fixed token; a source that fails says nothing changed."""
        source = self.token_source
        if source is None or isinstance(source, str):
            return False
        try:
            return source() != self.token
        except Exception as exc:  # a caller's callable: whatever it raises, the refusal stands
            log.warning("the token source failed: %s", exc)
            return False

    # ------------------------------------------------------------------ protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transports.adopt(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._decoder.buffer_updated(nbytes)
        self._take_frames()

    def data_received(self, data: bytes) -> None:
        """Bytes from a caller that read them itself (tests drive a connection so)."""
        self._decoder.feed(data)
        self._take_frames()

    def _take_frames(self) -> None:
        while True:
            try:
                frame = self._decoder.next_frame()
            except HeadraceError as exc:
                self._fail_all(exc)
                if self.transport is not None:
                    self.transport.close()
                return
            if frame is None:
                return
            if frame.flags & FLAG_PUSH:
                if self._on_push is not None:
                    self._on_push(self, frame)
                continue
            fut = self._pending.pop(frame.correlation_id, None)
            if fut is None:
                if frame.op == Op.ERROR:
                    # An error for no request in particular: the broker is hanging up.
                    body = msg.ErrorBody.decode(frame.body)
                    self.close_reason = body.message
                continue
            if fut.done():
                continue
            if frame.op == Op.ERROR:
                body = msg.ErrorBody.decode(frame.body)
                error = error_for_code(body.code, body.message)
                if isinstance(error, AuthenticationFailed) and self.token_rotated():
                    # The broker refused our token and hangs up; the source has a new one:
                    # hang up first (so the pool opens a new connection, with it) and tell
                    # the caller to retry. Still the refused one: the refusal stands.
                    log.info("%s; reconnecting with the token source's new token", body.message)
                    error = TokenRotated(
                        f"{body.message}; the token source yields a new token: reconnect"
                    )
                    if self.transport is not None:
                        self.transport.close()
                fut.set_exception(error)
            elif frame.op == Op.REDIRECT:
                fut.set_exception(RedirectReceived(msg.Redirect.decode(frame.body)))
            else:
                fut.set_result(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = self.close_reason or (str(exc) if exc else "connection closed by the broker")
        self._fail_all(ConnectionClosed(reason))
        self.closed.set()
        self._writable.set()
        listeners, self.close_listeners = self.close_listeners, []
        for listener in listeners:
            listener(self)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _fail_all(self, exc: HeadraceError) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)
                # Mark retrieved: a caller that gave up on this request must not see a warning.
                fut.exception()

    # ------------------------------------------------------------------ sending

    @property
    def is_closed(self) -> bool:
        return self.closed.is_set() or self.transport is None or self.transport.is_closing()

    def request(
        self,
        op: Op,
        body: bytes = b"",
        *parts: bytes | memoryview,
        timeout_s: float | None = None,
    ) -> asyncio.Future[Frame]:
        """Send a request; the future resolves with the response frame or raises its error.

        No answer within ``timeout_s`` (default: the connection's ``request_timeout_s``)
        fails it with RequestTimedOut; an answer arriving later is dropped.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Frame] = loop.create_future()
        if self.is_closed:
            fut.set_exception(ConnectionClosed(self.close_reason or "connection is closed"))
            return fut
        cid = next(self._ids) & 0xFFFFFFFF
        self._pending[cid] = fut
        limit = self.request_timeout_s if timeout_s is None else timeout_s
        timer = loop.call_later(limit, self._expire, cid, op, limit)
        fut.add_done_callback(lambda _: timer.cancel())
        assert self.transport is not None
        if parts:
            length = len(body) + sum(len(p) for p in parts)
            self.transport.writelines([frame_header(op, cid, length), body, *parts])
        else:
            self.transport.write(encode_frame(op, cid, body))
        return fut

    def _expire(self, cid: int, op: Op, limit: float) -> None:
        fut = self._pending.pop(cid, None)
        if fut is not None and not fut.done():
            name = op.name if isinstance(op, Op) else str(op)
            fut.set_exception(RequestTimedOut(f"no answer to {name} within {limit:g} s"))
            fut.exception()  # retrieved: a caller that stopped waiting must not see a warning

    def send_no_reply(self, op: Op, body: bytes, *parts: bytes | memoryview) -> None:
        """Send a request the broker must not answer (credits, acks=none, topology acks)."""
        if self.is_closed:
            return
        assert self.transport is not None
        if parts:
            length = len(body) + sum(len(p) for p in parts)
            self.transport.writelines([frame_header(op, 0, length, FLAG_NO_REPLY), body, *parts])
        else:
            self.transport.write(encode_frame(op, 0, body, FLAG_NO_REPLY))

    async def wait_writable(self) -> None:
        await self._writable.wait()

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        await self.closed.wait()
