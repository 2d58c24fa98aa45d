"""Signed member identities (pure, no I/O; the caller passes the key, the clock and the
random bits).

Why. A cohort's delivery gates are keyed by member id. Without a binding, a
tenant who learns another's member id (``cohorts describe`` lists them) could
join as it, take over its partitions and ack its records away. With signed
identities on, a member id is only usable by the principal the cluster issued
it to.

How. The broker issues an identity on request (op IDENTITY): it draws a fresh
member id, ``<hint>.<32 hex random>``, and signs
``(cluster id, principal, member id, issued at)`` with HMAC-SHA256 under the
cluster key, which every broker of the cluster shares. The member presents the
token with every CohortJoin, on any broker. A join is refused unless the token
verifies, names this cluster, the connection's principal and the joining member
id. The issuer never signs a member id the client chose, so another principal's
id can never be bound to you: knowing an id is useless, and a stolen token names
its owner's principal, which a thief cannot authenticate as without that
principal's credentials.

Token layout: ``hri1.<payload>.<mac>``, both parts unpadded base64url;
``payload`` is compact JSON ``{"c": cluster, "p": principal, "m": member, "t": ms}``
and ``mac`` is HMAC-SHA256(key, ``"hri1." + payload``). Tokens do not expire:
removing a key from the cluster key file revokes every token it signed. During a
rotation the file holds several keys (``headrace.security.keyrings``): the first
signs, any of them verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from headrace.errors import InvalidMemberIdentity, InvalidRequest

VERSION: Final = "hri1"
#: the cluster key: 32 random bytes (the HMAC-SHA256 block is 64; 32 is its strength)
KEY_BYTES: Final = 32
#: hex digits of randomness in an issued member id (128 bits: ids never collide)
RANDOM_HEX: Final = 32
#: an issued id must still pass the cohort's member id rule (128 characters)
_HINT_MAX: Final = 128 - 1 - RANDOM_HEX
_HINT_CHARS: Final = re.compile(r"[^A-Za-z0-9._:@-]")


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    cluster_id: str
    principal: str
    member_id: str
    issued_at_ms: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, signed: str) -> bytes:
    return hmac.new(key, signed.encode(), hashlib.sha256).digest()


def member_id_for(hint: str, random_hex: str) -> str:
    """An issued member id: the client's hint (made legal, shortened) and fresh randomness."""
    cleaned = _HINT_CHARS.sub("-", hint)[:_HINT_MAX].lstrip("._:@-") or "member"
    return f"{cleaned}.{random_hex}"


def sign(key: bytes, identity: MemberIdentity) -> str:
    payload = _b64(
        json.dumps(
            {
                "c": identity.cluster_id,
                "p": identity.principal,
                "m": identity.member_id,
                "t": identity.issued_at_ms,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
    )
    signed = f"{VERSION}.{payload}"
    return f"{signed}.{_b64(_mac(key, signed))}"


def verify(
    key: bytes | Sequence[bytes], token: str, *, cluster_id: str, principal: str, member_id: str
) -> MemberIdentity:
    """The identity ``token`` carries, if it is genuine (signed by ``key``, or by one of
    the keys in force) and binds ``member_id`` to ``principal`` in ``cluster_id``; else
    ``InvalidMemberIdentity``.

    The messages never repeat the token (it is a credential)."""
    version, _, rest = token.partition(".")
    payload, _, mac_text = rest.partition(".")
    if version != VERSION or not payload or not mac_text:
        raise InvalidMemberIdentity(f"member {member_id!r}: the identity token is malformed")
    try:
        presented = _unb64(mac_text)
    except (binascii.Error, ValueError):
        raise InvalidMemberIdentity(
            f"member {member_id!r}: the identity token is malformed"
        ) from None
    keys = (key,) if isinstance(key, bytes) else tuple(key)
    signed = f"{version}.{payload}"
    # Every key is tried (no early exit): which key signed says nothing worth timing.
    genuine = False
    for candidate in keys:
        genuine |= hmac.compare_digest(presented, _mac(candidate, signed))
    if not genuine:
        raise InvalidMemberIdentity(
            f"member {member_id!r}: the identity token's signature does not verify"
            " (not issued by this cluster's key)"
        )
    try:
        doc = json.loads(_unb64(payload))
        identity = MemberIdentity(str(doc["c"]), str(doc["p"]), str(doc["m"]), int(doc["t"]))
    except (binascii.Error, ValueError, KeyError, TypeError):
        # Signed by our key but not ours in shape: another version of the format.
        raise InvalidMemberIdentity(
            f"member {member_id!r}: the identity token is malformed"
        ) from None
    if identity.cluster_id != cluster_id:
        raise InvalidMemberIdentity(
            f"member {member_id!r}: the identity token was issued by another cluster"
        )
    if identity.principal != principal or identity.member_id != member_id:
        raise InvalidMemberIdentity(
            f"member {member_id!r} is not bound to principal {principal!r} by this identity"
            " token; ask for an identity (op IDENTITY) and join with the member id it names"
        )
    return identity


def parse_key(text: str) -> bytes:
    """The cluster key file's content: 64 hex digits (one line)."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise InvalidRequest("the cluster key file does not hold hex digits") from None
    if len(key) != KEY_BYTES:
        raise InvalidRequest(
            f"the cluster key must be {KEY_BYTES} bytes ({2 * KEY_BYTES} hex digits)"
        )
    return key
