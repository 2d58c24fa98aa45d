"""The kubelet's ``/containerLogs`` endpoint, so ``kubectl logs`` works (I/O adapter).

The API server proxies ``pods/log`` to ``https://<node InternalIP>:<kubeletEndpoint
port>/containerLogs/<ns>/<pod>/<container>``, verifying our serving certificate against
the test bed CA and presenting its kubelet-client certificate, which we require.
Supported query parameters: ``follow``, ``previous``, ``tailLines``, ``limitBytes``.
Logs are plain files (one per container start); ``timestamps`` is accepted and ignored.
"""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("e2e.testbed.logserving")

#: Given (namespace, pod, container): the container's log files, oldest first, and
#: whether it is running now (for ``follow``).
LogLookup = Callable[[str, str, str], tuple[list[Path], bool]]


def tail_bytes(data: bytes, lines: int) -> bytes:
    """The last ``lines`` lines of ``data`` (pure)."""
    if lines < 0:
        return data
    if lines == 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.debug(format, *args)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        if url.path in ("/healthz", "/readyz"):
            self._plain(200, b"ok")
            return
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._plain(404, b"not found")
            return
        _, ns, pod, container = parts
        files, running = self.server.lookup(ns, pod, container)
        previous = q.get("previous") == "true"
        if previous:
            files = files[:-1]
            running = False
        if not files:
            what = "previous terminated container" if previous else "container"
            self._plain(400, f'{what} "{container}" in pod "{pod}" has no logs'.encode())
            return
        path = files[-1]
        data = path.read_bytes()
        if "tailLines" in q:
            data = tail_bytes(data, int(q["tailLines"]))
        limit = int(q["limitBytes"]) if "limitBytes" in q else None
        if limit is not None:
            data = data[:limit]
        follow = q.get("follow") == "true" and running and limit is None
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if not follow:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(data)
        offset = path.stat().st_size
        try:
            while not self.server.stopping.is_set():
                with path.open("rb") as f:
                    f.seek(offset)
                    more = f.read()
                if more:
                    offset += len(more)
                    self._chunk(more)
                    continue
                files, running = self.server.lookup(ns, pod, container)
                if not running or (files and files[-1] != path):
                    break
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _plain(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    lookup: LogLookup
    stopping: threading.Event


def serve(port: int, pki_dir: Path, lookup: LogLookup, stopping: threading.Event) -> _Server:
    """Start serving on 127.0.0.1:``port`` in a daemon thread; returns the server."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki_dir / "runner-server.crt"), str(pki_dir / "runner-server.key"))
    ctx.load_verify_locations(str(pki_dir / "ca.crt"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    server = _Server(("127.0.0.1", port), _Handler, bind_and_activate=False)
    server.allow_reuse_address = True
    server.server_bind()
    server.server_activate()
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.lookup = lookup
    server.stopping = stopping
    threading.Thread(target=server.serve_forever, name="logserver", daemon=True).start()
    return server
