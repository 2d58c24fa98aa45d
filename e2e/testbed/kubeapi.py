"""A small typed Kubernetes REST client over ``http.client`` (I/O adapter).

Why not the official ``kubernetes`` package: the runner needs only a dozen verbs, wants
raw JSON (the generated models drop fields they do not know and cost a lot of CPU to
build), and must be typed for ``mypy --strict``. Objects are plain ``dict``s as the
API server sends them.

One keep-alive connection per thread; a request that fails on a stale connection is
retried once on a fresh one. Errors are translated to :class:`ApiError` at this edge.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Obj = dict[str, Any]


class ApiError(Exception):
    """The API server answered with an error status (or could not be reached: 0)."""

    def __init__(self, status: int, reason: str, body: Obj | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body or {}

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


@dataclass(frozen=True)
class Credentials:
    """How to reach and authenticate to the API server."""

    host: str
    port: int
    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str | None = None


class Client:
    """Blocking client; safe to share between threads."""

    def __init__(self, creds: Credentials, timeout_s: float = 30.0) -> None:
        self._creds = creds
        self._timeout = timeout_s
        ctx = ssl.create_default_context(cafile=str(creds.ca_file))
        if creds.cert_file is not None:
            ctx.load_cert_chain(str(creds.cert_file), str(creds.key_file or creds.cert_file))
        self._ssl = ctx
        self._local = threading.local()

    def _connection(
        self, fresh: bool = False, timeout: float | None = None
    ) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None or fresh or timeout is not None:
            if conn is not None and timeout is None:
                conn.close()
            conn = http.client.HTTPSConnection(
                self._creds.host,
                self._creds.port,
                context=self._ssl,
                timeout=timeout if timeout is not None else self._timeout,
            )
            if timeout is None:
                self._local.conn = conn
        return conn

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "headrace-testbed"}
        if content_type:
            headers["Content-Type"] = content_type
        if self._creds.token:
            headers["Authorization"] = f"Bearer {self._creds.token}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """Send one request; return the decoded JSON body or raise :class:`ApiError`."""
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        data = json.dumps(body).encode() if body is not None else None
        headers = self._headers(content_type if data is not None else None)
        for attempt in (0, 1):
            conn = self._connection(fresh=attempt == 1)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                self._local.conn = None
                if attempt == 1:
                    raise ApiError(0, f"{method} {path}: {exc}") from exc
        decoded: Obj = {}
        if raw:
            try:
                decoded = json.loads(raw)
            except ValueError:
                decoded = {"message": raw[:500].decode(errors="replace")}
        if resp.status >= 400:
            raise ApiError(resp.status, str(decoded.get("message", resp.reason)), decoded)
        return decoded

    # Verbs -----------------------------------------------------------------------
    def get(self, path: str, **query: str) -> Obj:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def replace(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body)

    def merge_patch(self, path: str, body: Obj) -> Obj:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        return self.request("DELETE", path, body)

    def watch(
        self, path: str, resource_version: str, timeout_s: int = 60, **query: str
    ) -> Iterator[tuple[str, Obj]]:
        """Yield ``(type, object)`` events until the server ends the watch.

        The server closes the stream after ``timeout_s``; the socket timeout is a little
        longer so a silent server cannot block the caller forever.
        """
        q = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
            **query,
        }
        url = f"{path}?{urllib.parse.urlencode(q)}"
        conn = self._connection(timeout=timeout_s + 15)
        try:
            conn.request("GET", url, headers=self._headers(None))
            resp = conn.getresponse()
            if resp.status >= 400:
                raw = resp.read()
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                raise ApiError(resp.status, str(body.get("message", resp.reason)), body)
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    event = json.loads(line)
                    yield str(event["type"]), event["object"]
        except (http.client.HTTPException, OSError, ValueError) as exc:
            raise ApiError(0, f"watch {path}: {exc}") from exc
        finally:
            conn.close()


def from_kubeconfig_files(
    host: str, port: int, pki_dir: Path, identity: str, timeout_s: float = 30.0
) -> Client:
    """A client authenticating with ``<pki_dir>/<identity>.crt`` (see :mod:`.pki`)."""
    return Client(
        Credentials(
            host,
            port,
            pki_dir / "ca.crt",
            pki_dir / f"{identity}.crt",
            pki_dir / f"{identity}.key",
        ),
        timeout_s,
    )
