"""ApiVersions and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512): what a connection may ask
before it has authenticated.

Each connection keeps one ``SaslSession``: the mechanism its handshake chose and, for
SCRAM, the exchange under way (``security.scram``, the pure state machine; this is its
adapter: it draws the server nonce and turns the exchange's typed errors into Kafka's
codes). PLAIN takes one of our tokens as the password. SCRAM is offered only with an
ACL file, whose principals carry the credentials derived from their tokens; the user
name is the principal's name either way, and the principal's grants apply as to any
other connection.
"""

from __future__ import annotations

import enum
import logging
import secrets
from typing import TYPE_CHECKING, Final

from headrace.errors import AuthenticationFailed, IllegalSaslState
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.security import scram

if TYPE_CHECKING:
    from collections.abc import Callable

    from headrace.security.access import ConnectionAccess

log = logging.getLogger(__name__)

PLAIN: Final = "PLAIN"
#: the server nonce's random bytes (RFC 5802 asks for enough to be unpredictable)
_NONCE_BYTES: Final = 24


def api_versions(header: km.RequestHeader, req: km.ApiVersionsRequest) -> km.ApiVersionsResponse:
    return km.ApiVersionsResponse(0, km.advertised_versions())


class Outcome(enum.Enum):
    """What a ``SaslAuthenticate`` answer means for the connection."""

    AUTHENTICATED = "authenticated"
    #: a SCRAM exchange answered its first message: the client sends its proof next
    CONTINUE = "continue"
    #: refused: the connection closes once the answer is written (as Kafka)
    REFUSED = "refused"


class SaslSession:
    """One connection's SASL state."""

    def __init__(
        self,
        access: ConnectionAccess,
        peer: str,
        *,
        server_nonce: Callable[[], str] = lambda: secrets.token_urlsafe(_NONCE_BYTES),
    ) -> None:
        self.access = access
        self.peer = peer
        #: what the last successful SaslHandshake chose (None: none yet)
        self.mechanism: str | None = None
        self._server_nonce = server_nonce
        self._exchange: scram.ScramServer | None = None

    def mechanisms(self) -> list[str]:
        """PLAIN always; SCRAM where principals can hold its credentials (an ACL file)."""
        if self.access.access.enabled:
            return [PLAIN, *(m.value for m in scram.Mechanism)]
        return [PLAIN]

    def handshake(self, req: km.SaslHandshakeRequest) -> km.SaslHandshakeResponse:
        offered = self.mechanisms()
        if req.mechanism not in offered:
            return km.SaslHandshakeResponse(ErrorCode.UNSUPPORTED_SASL_MECHANISM, offered)
        self.mechanism = req.mechanism
        self._exchange = None  # a new handshake starts a new exchange
        return km.SaslHandshakeResponse(ErrorCode.NONE, offered)

    def authenticate(
        self, req: km.SaslAuthenticateRequest, certificate: object
    ) -> tuple[km.SaslAuthenticateResponse, Outcome]:
        """The answer to one SaslAuthenticate; on AUTHENTICATED ``access`` holds the
        principal."""
        if self.mechanism is None:
            return self._refused(
                ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake"
            )
        mechanism = scram.Mechanism.named(self.mechanism)
        if mechanism is None:
            return self._plain(bytes(req.auth_bytes), certificate)
        return self._scram(mechanism, bytes(req.auth_bytes), certificate)

    def _refused(self, code: ErrorCode, why: str) -> tuple[km.SaslAuthenticateResponse, Outcome]:
        log.info("kafka: %s: authentication refused: %s", self.peer, why)
        return km.SaslAuthenticateResponse(code, why), Outcome.REFUSED

    def _plain(
        self, auth_bytes: bytes, certificate: object
    ) -> tuple[km.SaslAuthenticateResponse, Outcome]:
        """PLAIN (RFC 4616): the password is one of our tokens. With an ACL file the user
        name must be the token's principal; with shared tokens it is not checked."""
        fields = auth_bytes.split(b"\0")
        if len(fields) != 3:
            return self._refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED, "malformed PLAIN credentials"
            )
        try:
            authzid, user, password = (f.decode() for f in fields)
        except UnicodeDecodeError:
            return self._refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED, "malformed PLAIN credentials"
            )
        if authzid and authzid != user:
            return self._refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED, "acting as another user is not supported"
            )
        access = self.access
        try:
            access.authenticate(password, certificate)
        except AuthenticationFailed as exc:
            return self._refused(ErrorCode.SASL_AUTHENTICATION_FAILED, exc.message)
        principal = access.principal
        if principal is not None and principal.name != user:
            access.principal = None
            return self._refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                f"the password is not a token of user {user!r}",
            )
        return km.SaslAuthenticateResponse(ErrorCode.NONE, None, b"", 0), Outcome.AUTHENTICATED

    def _scram(
        self, mechanism: scram.Mechanism, auth_bytes: bytes, certificate: object
    ) -> tuple[km.SaslAuthenticateResponse, Outcome]:
        """One message of a SCRAM exchange: the first makes it, the second ends it."""
        exchange = self._exchange
        if exchange is None:
            exchange = self._exchange = scram.ScramServer(
                mechanism,
                self._server_nonce(),
                self.access.scram_credentials,
                self.access.access.scram_decoy_key,
            )
        try:
            answer = exchange.receive(auth_bytes)
            if exchange.state is not scram.ServerState.SUCCEEDED:
                return km.SaslAuthenticateResponse(
                    ErrorCode.NONE, None, answer, 0
                ), Outcome.CONTINUE
            username, credential = exchange.username, exchange.credential
            assert username is not None
            assert credential is not None
            self.access.authenticate_scram(username, credential, certificate)
        except IllegalSaslState as exc:
            return self._refused(ErrorCode.ILLEGAL_SASL_STATE, exc.message)
        except AuthenticationFailed as exc:
            if exchange.state is scram.ServerState.FAILED:
                self.access.access.deny("authenticate")  # authenticate_scram counts its own
            return self._refused(ErrorCode.SASL_AUTHENTICATION_FAILED, exc.message)
        return km.SaslAuthenticateResponse(ErrorCode.NONE, None, answer, 0), Outcome.AUTHENTICATED
