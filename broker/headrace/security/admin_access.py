"""Who may use an admin HTTP port: the data plane's credentials, as bearer tokens.

One aiohttp middleware for the broker's admin port and the controller's API
(``headrace.controller.admin``), over the same ``Access`` the data port uses
(the same ACL file, shared tokens, or neither):

- ``/healthz`` and ``/readyz`` are always open: kubelet probes and
  ``headrace local up`` carry no credentials, and they say only that the
  process is up;
- every other ``GET`` (metrics, topics, status, heartbeat, the dashboard) is
  open by default and takes credentials with ``AdminReadAccess.AUTHENTICATED``;
- every other method (a change) takes credentials whenever the data port does:
  ``Authorization: Bearer <token>``, or a verified TLS client certificate when
  the listener asks for one. The handler then checks the grant its change needs
  (``admin`` on each topic it touches, ``cluster`` for a topology push) with
  ``session(request)``.

Refusals are the data port's typed errors as the admin error document: 401
for no or bad credentials, 403 for a missing grant. Each is counted as on the
data port (``headrace_acl_denials_total``).
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from aiohttp import web

from headrace.errors import AccessDenied, AuthenticationFailed, HeadraceError, InvalidRequest
from headrace.security.access import Access, ConnectionAccess
from headrace.security.settings import AdminReadAccess, TlsSettings

#: routes that never ask for credentials (liveness and readiness probes)
PROBES: Final = frozenset({"/healthz", "/readyz"})
_SESSION_KEY: Final = web.RequestKey("headrace_admin_session", ConnectionAccess)
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(exc: HeadraceError) -> web.Response:
    """The admin error document: 401 for credentials, 403 for grants, else 400."""
    if isinstance(exc, AuthenticationFailed):
        status = 401
    elif isinstance(exc, AccessDenied):
        status = 403
    else:
        status = 400
    headers = {"WWW-Authenticate": 'Bearer realm="headrace"'} if status == 401 else None
    return web.json_response(
        {"error": type(exc).__name__, "code": exc.CODE, "message": exc.message},
        status=status,
        headers=headers,
    )


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without one."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def check_read_access(access: Access, reads: AdminReadAccess) -> None:
    """Refuse a setting that cannot be honoured: credentials on reads need credentials."""
    if reads is AdminReadAccess.AUTHENTICATED and not access.asks_credentials:
        raise InvalidRequest(
            "--admin-read-access authenticated needs credentials to check:"
            " --acl-file or --auth-token"
        )


def server_ssl_context(tls: TlsSettings | None) -> ssl.SSLContext | None:
    """TLS for an admin listener; with a client CA, client certificates are required."""
    if tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file is not None:
        ctx.load_verify_locations(tls.client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class AdminGuard:
    """The middleware's policy: one per admin listener."""

    def __init__(self, access: Access, reads: AdminReadAccess = AdminReadAccess.OPEN) -> None:
        check_read_access(access, reads)
        self.access = access
        self.reads = reads

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self.middleware)

    def needs_credentials(self, request: web.Request) -> bool:
        if not self.access.asks_credentials or request.path in PROBES:
            return False
        if request.method in _SAFE_METHODS:
            return self.reads is AdminReadAccess.AUTHENTICATED
        return True

    def authenticate(self, request: web.Request) -> ConnectionAccess:
        """The request's session; raises ``AuthenticationFailed`` for bad credentials."""
        session = self.access.session()
        if self.access.asks_credentials:
            peercert = None
            transport = request.transport
            sslobj = transport.get_extra_info("ssl_object") if transport is not None else None
            if sslobj is not None:
                peercert = sslobj.getpeercert()
            session.authenticate(bearer_token(request.headers), peercert)
        return session

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.needs_credentials(request):
            try:
                request[_SESSION_KEY] = self.authenticate(request)
            except HeadraceError as exc:
                return error_response(exc)
        return await handler(request)


def session(request: web.Request) -> ConnectionAccess | None:
    """The authenticated session of a request that needed credentials (else None: the
    listener asks for none, and any grant check passes)."""
    return request.get(_SESSION_KEY)
