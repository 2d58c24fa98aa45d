"""SCRAM (RFC 5802; SHA-256 and SHA-512 as RFC 7677 and Kafka name them): the server's
side of one exchange, and the credentials it checks (pure: no I/O, no randomness; the
caller passes the server nonce and the credential lookup).

Theory of operation. The server never holds a password. Per user and mechanism it
keeps what Kafka keeps: a salt, an iteration count, ``StoredKey = H(ClientKey)`` and
``ServerKey``, where ``SaltedPassword = PBKDF2-HMAC(password, salt, iterations)``,
``ClientKey = HMAC(SaltedPassword, "Client Key")`` and ``ServerKey = HMAC(SaltedPassword,
"Server Key")`` (``derive``, run where the secret is made). One exchange is two
messages from the client, each answered:

====================== ======================== ======================== =============
state                  client sends             server answers           next state
====================== ======================== ======================== =============
AWAITING_CLIENT_FIRST  ``n,,n=user,r=cnonce``   ``r=cnonce+snonce,       AWAITING_
                                                s=salt,i=iterations``    CLIENT_FINAL
AWAITING_CLIENT_FINAL  ``c=biws,r=nonce,        ``v=ServerSignature``    SUCCEEDED
                       p=ClientProof``
SUCCEEDED, FAILED      anything                 ``IllegalSaslState``     (unchanged)
====================== ======================== ======================== =============

A message that does not parse, a nonce other than the one the server answered, or a
proof that matches no credential raises ``AuthenticationFailed`` and the exchange is
FAILED. The proof is checked by recovering ``ClientKey = ClientProof XOR
HMAC(StoredKey, AuthMessage)`` and comparing its hash with ``StoredKey``.

- An unknown user gets a decoy salt (an HMAC of its name under the caller's key, so
  asking twice gives the same salt) and fails at the proof like a wrong password: the
  answers do not say which user names exist.
- A user with several credentials for a mechanism (a token being rotated) is answered
  with the first one's salt and iterations, and a proof matching any credential with
  that same salt and count is accepted; so a rotation keeps the user's salt.
- Not offered: channel binding (``p=`` is refused; ``y`` is accepted, as the RFC says
  for a server that offers none), and Kafka's delegation tokens (``tokenauth=true``).
  Names and passwords are used as UTF-8 without SASLprep, as Kafka's clients do.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from headrace.errors import AuthenticationFailed, IllegalSaslState, InvalidRequest

#: RFC 7677 and Kafka: fewer iterations make a leaked StoredKey cheap to brute-force
MIN_ITERATIONS: Final = 4096
#: Kafka's bound: a client computes PBKDF2 with the count the server names
MAX_ITERATIONS: Final = 16384
#: what ``derive`` uses unless told: Kafka's default; our tokens are 256 random bits,
#: which no iteration count makes weaker or stronger against guessing
DEFAULT_ITERATIONS: Final = 4096
SALT_BYTES: Final = 16
#: a client nonce or a user name longer than this is not a SCRAM client's
_MAX_FIELD: Final = 1024


class Mechanism(enum.Enum):
    """The SASL mechanisms, by their registered names."""

    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"

    @property
    def hash_name(self) -> str:
        return "sha256" if self is Mechanism.SCRAM_SHA_256 else "sha512"

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    @classmethod
    def named(cls, name: str) -> Mechanism | None:
        try:
            return cls(name)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps of one secret for one mechanism."""

    mechanism: Mechanism
    salt: bytes
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    def text(self) -> str:
        """``<mechanism>:<iterations>:<salt>:<StoredKey>:<ServerKey>``, base64: the ACL
        file's form."""
        parts = (self.salt, self.stored_key, self.server_key)
        encoded = ":".join(base64.b64encode(p).decode() for p in parts)
        return f"{self.mechanism.value}:{self.iterations}:{encoded}"

    @classmethod
    def parse(cls, text: str) -> ScramCredential:
        """The credential ``text()`` wrote; ``InvalidRequest`` naming the problem (never
        the keys)."""
        fields = text.split(":")
        if len(fields) != 5:
            raise InvalidRequest(
                "a SCRAM credential is '<mechanism>:<iterations>:<salt>:<stored key>:<server"
                " key>' (headrace acl token prints them)"
            )
        name, iterations_text, *encoded = fields
        mechanism = Mechanism.named(name)
        if mechanism is None:
            known = ", ".join(m.value for m in Mechanism)
            raise InvalidRequest(f"SCRAM mechanism {name!r}: not one of {known}")
        if not iterations_text.isdigit():
            raise InvalidRequest("a SCRAM credential's iteration count is not a number")
        iterations = int(iterations_text)
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise InvalidRequest(
                f"a SCRAM credential's iteration count {iterations} is outside"
                f" {MIN_ITERATIONS}-{MAX_ITERATIONS}"
            )
        try:
            salt, stored_key, server_key = (base64.b64decode(e, validate=True) for e in encoded)
        except (binascii.Error, ValueError):
            raise InvalidRequest("a SCRAM credential's salt or keys are not base64") from None
        size = mechanism.digest_size
        if not salt or len(stored_key) != size or len(server_key) != size:
            raise InvalidRequest(
                f"a {mechanism.value} credential needs a salt and {size}-byte keys"
            )
        return cls(mechanism, salt, iterations, stored_key, server_key)


def derive(
    mechanism: Mechanism, password: str, salt: bytes, iterations: int = DEFAULT_ITERATIONS
) -> ScramCredential:
    """The credential of ``password`` (RFC 5802 §3); the password is not kept."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise InvalidRequest(f"SCRAM iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}")
    name = mechanism.hash_name
    salted = hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    server_key = hmac.new(salted, b"Server Key", name).digest()
    return ScramCredential(
        mechanism, salt, iterations, hashlib.new(name, client_key).digest(), server_key
    )


class ServerState(enum.Enum):
    AWAITING_CLIENT_FIRST = "awaiting client-first"
    AWAITING_CLIENT_FINAL = "awaiting client-final"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


#: looks up a user's credentials (any mechanism; the exchange keeps its own)
CredentialLookup = Callable[[str], Sequence[ScramCredential]]


class ScramServer:
    """One exchange, server side: feed each client message to ``receive``."""

    def __init__(
        self,
        mechanism: Mechanism,
        server_nonce: str,
        credentials: CredentialLookup,
        decoy_key: bytes,
    ) -> None:
        """``server_nonce``: fresh random printable characters, no ``,`` (the caller
        draws them); ``decoy_key``: a secret that makes unknown users' salts."""
        if not server_nonce or not _printable(server_nonce):
            raise ValueError("the server nonce must be printable ASCII without ','")
        self.mechanism = mechanism
        self.state = ServerState.AWAITING_CLIENT_FIRST
        #: after SUCCEEDED: who authenticated, and with which credential
        self.username: str | None = None
        self.credential: ScramCredential | None = None
        self._server_nonce = server_nonce
        self._lookup = credentials
        self._decoy_key = decoy_key
        self._gs2_header = b""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._candidates: tuple[ScramCredential, ...] = ()
        self._user = ""

    def receive(self, message: bytes) -> bytes:
        """The answer to the client's next message; ``AuthenticationFailed`` (the exchange
        FAILED) or ``IllegalSaslState`` (it had already ended)."""
        step = _STEPS.get(self.state)
        if step is None:
            raise IllegalSaslState(f"the SCRAM exchange has {self.state.value}")
        try:
            text = message.decode()
        except UnicodeDecodeError:
            self.state = ServerState.FAILED
            raise AuthenticationFailed("malformed SCRAM message: not UTF-8") from None
        try:
            return step(self, text)
        except AuthenticationFailed:
            self.state = ServerState.FAILED
            raise

    # ------------------------------------------------------------------ the steps

    def _client_first(self, text: str) -> bytes:
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise _malformed("client-first", "no GS2 header")
        binding, authzid, bare = parts
        if binding.startswith("p="):
            raise AuthenticationFailed("SCRAM channel binding is not offered")
        if binding not in ("n", "y"):
            raise _malformed("client-first", "bad channel binding flag")
        attributes = bare.split(",")
        if attributes[0].startswith("m="):
            raise AuthenticationFailed("SCRAM mandatory extensions are not supported")
        if len(attributes) < 2 or not attributes[0].startswith("n="):
            raise _malformed("client-first", "no user name")
        if not attributes[1].startswith("r="):
            raise _malformed("client-first", "no nonce")
        user = _unescape(attributes[0][2:])
        client_nonce = attributes[1][2:]
        if not client_nonce or len(client_nonce) > _MAX_FIELD or not _printable(client_nonce):
            raise _malformed("client-first", "bad nonce")
        for extension in attributes[2:]:
            key, sep, value = extension.partition("=")
            if not sep or not key:
                raise _malformed("client-first", "bad extension")
            if key == "tokenauth" and value.lower() == "true":
                raise AuthenticationFailed("delegation tokens are not supported")
        if authzid and (not authzid.startswith("a=") or _unescape(authzid[2:]) != user):
            raise AuthenticationFailed("acting as another user is not supported")
        own = [c for c in self._lookup(user) if c.mechanism is self.mechanism]
        if own:
            first = own[0]
            salt, iterations = first.salt, first.iterations
            self._candidates = tuple(
                c for c in own if c.salt == salt and c.iterations == iterations
            )
        else:
            decoy = hmac.new(
                self._decoy_key, f"{self.mechanism.value}\0{user}".encode(), "sha256"
            ).digest()
            salt, iterations = decoy[:SALT_BYTES], DEFAULT_ITERATIONS
        self._user = user
        self._gs2_header = f"{binding},{authzid},".encode()
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        self.state = ServerState.AWAITING_CLIENT_FINAL
        return self._server_first.encode()

    def _client_final(self, text: str) -> bytes:
        without_proof, sep, proof_text = text.rpartition(",p=")
        if not sep or "," in proof_text:
            raise _malformed("client-final", "the proof is not its last attribute")
        attributes = without_proof.split(",")
        if len(attributes) < 2 or not attributes[0].startswith("c="):
            raise _malformed("client-final", "no channel binding attribute")
        if not attributes[1].startswith("r="):
            raise _malformed("client-final", "no nonce")
        if _b64(attributes[0][2:]) != self._gs2_header:
            raise AuthenticationFailed("SCRAM channel binding differs from the first message")
        if not hmac.compare_digest(attributes[1][2:].encode(), self._nonce.encode()):
            raise AuthenticationFailed("the SCRAM nonce is not this exchange's")
        proof = _b64(proof_text)
        name = self.mechanism.hash_name
        if proof is None or len(proof) != self.mechanism.digest_size:
            raise _malformed("client-final", "bad proof")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        for credential in self._candidates:
            signature = hmac.new(credential.stored_key, auth_message, name).digest()
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            if hmac.compare_digest(hashlib.new(name, client_key).digest(), credential.stored_key):
                self.state = ServerState.SUCCEEDED
                self.username = self._user
                self.credential = credential
                server_signature = hmac.new(credential.server_key, auth_message, name).digest()
                return b"v=" + base64.b64encode(server_signature)
        raise AuthenticationFailed(f"invalid credentials for user {self._user!r}")


_STEPS: Final[dict[ServerState, Callable[[ScramServer, str], bytes]]] = {
    ServerState.AWAITING_CLIENT_FIRST: ScramServer._client_first,
    ServerState.AWAITING_CLIENT_FINAL: ScramServer._client_final,
}


def _malformed(message: str, why: str) -> AuthenticationFailed:
    return AuthenticationFailed(f"malformed SCRAM {message} message: {why}")


def _printable(text: str) -> bool:
    return all(0x21 <= ord(ch) <= 0x7E and ch != "," for ch in text)


def _unescape(name: str) -> str:
    """A ``saslname``: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is malformed."""
    if not name or len(name) > _MAX_FIELD:
        raise _malformed("client-first", "bad user name")
    pieces = name.split("=")
    out = [pieces[0]]
    for piece in pieces[1:]:
        if piece[:2] == "2C":
            out.append("," + piece[2:])
        elif piece[:2] == "3D":
            out.append("=" + piece[2:])
        else:
            raise _malformed("client-first", "bad escape in the user name")
    return "".join(out)


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
