"""A fault-injecting HTTP reverse proxy in front of a real S3 server (MinIO).

MinIO cannot be told to throttle or to hang, so the object-store faults are made here,
between the client and a real server: a share of requests is answered ``503 SlowDown``
with S3's XML error body, held longer than the client's read timeout, or has its
connection reset; everything else goes to the server unchanged. Request headers (the
SigV4 signature covers ``Host``) and bodies are passed through byte for byte.

The proxy runs its own event loop in a daemon thread, so blocking callers (a
``MinioStore`` in a test) and asyncio callers (the chaos campaign) use it alike; its
``faults`` are read at each request and may be replaced at any time.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from headrace.testing.procs import free_port

#: S3's answer to a client that sends too fast (the body AWS sends with 503 SlowDown)
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<Resource>{resource}</Resource><RequestId>headrace-fault-proxy</RequestId></Error>"
)
#: hop-by-hop headers, and the ones the proxy's HTTP stacks set themselves
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}


@dataclass(frozen=True, slots=True)
class Faults:
    """What the proxy does to each request; the shares are drawn independently, in order."""

    #: share of requests answered 503 SlowDown without reaching the server
    slowdown: float = 0.0
    #: share of requests whose connection is reset (closed without an answer)
    reset: float = 0.0
    #: share of requests held ``delay_s`` before they are forwarded (a delay longer than
    #: the client's read timeout: the client gives up first)
    delay: float = 0.0
    delay_s: float = 0.0
    #: share of requests forwarded to the server whose answer is then lost (the
    #: connection reset after the server acted): the case a retry must not double
    lost_answer: float = 0.0
    #: only requests with these methods are faulted (empty: all)
    methods: frozenset[str] = frozenset()

    def applies(self, method: str) -> bool:
        return not self.methods or method in self.methods


NONE = Faults()


class FaultProxy:
    """``http://127.0.0.1:<port>`` forwarding to ``upstream`` (``host:port``)."""

    def __init__(self, upstream: str, port: int | None = None, seed: int = 0) -> None:
        self.upstream = upstream
        self.port = port or free_port()
        self.faults = NONE
        #: requests seen, by what happened to them (``forwarded``, ``slowdown``, ``reset``,
        #: ``delayed``, ``lost-answer``, ``upstream-down``, ``client-gone``)
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0),
        )
        app = web.Application(client_max_size=2 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        faults = self.faults
        if faults.applies(request.method):
            if self._rng.random() < faults.slowdown:
                self.counts["slowdown"] += 1
                await request.read()  # a real server reads the body before it answers
                body = SLOWDOWN_BODY.replace(b"{resource}", request.path.encode())
                return web.Response(
                    status=503,
                    body=body,
                    headers={"Content-Type": "application/xml", "Retry-After": "1"},
                )
            if self._rng.random() < faults.reset:
                self.counts["reset"] += 1
                _reset(request)
                return web.Response(status=500)  # never reaches the client
            if self._rng.random() < faults.delay:
                self.counts["delayed"] += 1
                await asyncio.sleep(faults.delay_s)
        assert self._session is not None
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        try:
            body = await request.read()
        except (ConnectionResetError, aiohttp.ClientPayloadError):
            self.counts["client-gone"] += 1  # it gave up while the request was held
            return web.Response(status=499)
        url = URL(f"http://{self.upstream}{request.raw_path}", encoded=True)
        try:
            async with self._session.request(
                request.method,
                url,
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent", "Accept"),
            ) as upstream:
                answer = await upstream.read()
                out = web.Response(status=upstream.status, body=answer or None)
                for k, v in upstream.headers.items():
                    if k.lower() not in _HOP:
                        out.headers.add(k, v)
                if request.method == "HEAD" and "Content-Length" in upstream.headers:
                    # a HEAD answer has no body, but its length is the object's size
                    out.headers["Content-Length"] = upstream.headers["Content-Length"]
            if faults.applies(request.method) and self._rng.random() < faults.lost_answer:
                self.counts["lost-answer"] += 1
                _reset(request)
                return out
        except (aiohttp.ClientError, OSError):
            # the server is down (killed, restarting): the client sees what it would
            # see without the proxy, a connection that fails
            self.counts["upstream-down"] += 1
            _reset(request)
            return web.Response(status=502)
        self.counts["forwarded"] += 1
        return out


def _reset(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
