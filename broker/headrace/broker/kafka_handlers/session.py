"""ApiVersions and SASL PLAIN: what a connection may ask before it has authenticated.

The connection keeps the session's state (the mechanism its handshake chose, whether
it has authenticated); these functions decide each answer from it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from headrace.errors import AuthenticationFailed
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode

if TYPE_CHECKING:
    from headrace.security.access import ConnectionAccess

log = logging.getLogger(__name__)

PLAIN: Final = "PLAIN"


def api_versions(header: km.RequestHeader, req: km.ApiVersionsRequest) -> km.ApiVersionsResponse:
    return km.ApiVersionsResponse(0, km.advertised_versions())


def sasl_handshake(req: km.SaslHandshakeRequest) -> tuple[km.SaslHandshakeResponse, str | None]:
    """The answer, and the mechanism the session uses from now on (None: none chosen)."""
    if req.mechanism != PLAIN:
        return km.SaslHandshakeResponse(ErrorCode.UNSUPPORTED_SASL_MECHANISM, [PLAIN]), None
    return km.SaslHandshakeResponse(ErrorCode.NONE, [PLAIN]), PLAIN


def sasl_authenticate(
    req: km.SaslAuthenticateRequest,
    *,
    mechanism: str | None,
    access: ConnectionAccess,
    certificate: object,
    peer: str,
) -> km.SaslAuthenticateResponse:
    """PLAIN (RFC 4616): the password is one of our tokens. With an ACL file the user
    name must be the token's principal; with shared tokens it is not checked. On
    success ``access`` holds the principal."""

    def refused(code: ErrorCode, why: str) -> km.SaslAuthenticateResponse:
        log.info("kafka: %s: authentication refused: %s", peer, why)
        return km.SaslAuthenticateResponse(code, why)

    if mechanism is None:
        return refused(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake")
    fields = bytes(req.auth_bytes).split(b"\0")
    if len(fields) != 3:
        return refused(ErrorCode.SASL_AUTHENTICATION_FAILED, "malformed PLAIN credentials")
    try:
        authzid, user, password = (f.decode() for f in fields)
    except UnicodeDecodeError:
        return refused(ErrorCode.SASL_AUTHENTICATION_FAILED, "malformed PLAIN credentials")
    if authzid and authzid != user:
        return refused(
            ErrorCode.SASL_AUTHENTICATION_FAILED, "acting as another user is not supported"
        )
    try:
        access.authenticate(password, certificate)
    except AuthenticationFailed as exc:
        return refused(ErrorCode.SASL_AUTHENTICATION_FAILED, exc.message)
    principal = access.principal
    if principal is not None and principal.name != user:
        access.principal = None
        return refused(
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            f"the password is not a token of user {user!r}",
        )
    return km.SaslAuthenticateResponse(ErrorCode.NONE, None, b"", 0)
