"""A token User's credentials over time: made once, rotated on request, the previous
token honoured for a grace period (pure: no I/O, no clock, no randomness).

Theory of operation. A token User has one *current* token (its Secret's key ``token``,
what applications mount) and, for a while after a rotation, one *previous* token. The
brokers accept both while the previous one is within its grace, so clients that still
hold the old token keep working until they pick up the new one.

* **Made.** The first token is generation 1. It answers the User's ``rotateToken`` value
  at that moment, so a User created with ``rotateToken`` set is not rotated at once.
* **Rotated.** When ``spec.authentication.rotateToken`` holds a value other than the one
  the current token answers, a fresh token becomes current (generation + 1), the current
  one becomes the previous, and ``rotatedAt`` is now. A rotation within the grace of the
  last one drops the older previous token at once: at most two tokens are ever valid.
  Clearing ``rotateToken`` rotates nothing (only a new value asks for a rotation).
* **Expired.** The previous token expires ``previousTokenGracePeriodSeconds`` after
  ``rotatedAt``; the grace is read at each step, so shortening it (to 0 for a leaked
  token) takes effect at once. An expired previous token is dropped from the state.

SCRAM. The brokers' SCRAM-SHA-256/512 (the Kafka listener) check credentials derived
from each accepted token (``security.scram``: salt, iterations, StoredKey, ServerKey),
never the token. They are derived here, from the current token, under one salt per User
(``scram_salt``: stable across rotations, so that during a grace one salt serves both
tokens, as a SCRAM server can answer with one salt only). The previous token's
credentials are derived at the rotation, while the token is still at hand, and kept
with its hash until it expires.

The state is kept with the token (the adapter stores it in the Secret's annotations),
so a lost status or an operator restart loses nothing. The previous token is kept as its
hash only (``sha256:<hex>``, what the brokers' ACL file holds): once rotated away, it is
never readable again. The planner is
called with the stored state, the User's spec values, the time and a fresh random token
(used only when it decides to make or rotate one), and returns the state to store and
the tokens the brokers must accept.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass, replace

from headrace.security import acl, scram


class TokenEvent(enum.StrEnum):
    """What a step did to a User's tokens (an Event on the User, a log line)."""

    CREATED = "TokenCreated"
    ROTATED = "TokenRotated"
    PREVIOUS_EXPIRED = "PreviousTokenExpired"


@dataclass(frozen=True, slots=True)
class TokenState:
    """A User's tokens as stored."""

    token: str
    #: 1 for the first token, + 1 per rotation
    generation: int = 1
    #: the ``rotateToken`` value the current token answers (None: none was set)
    rotation: str | None = None
    #: when the current token replaced the previous one, ms since the epoch (None: never)
    rotated_at_ms: int | None = None
    #: the hash of the token before the current one, while it may be within its grace
    previous_token_hash: str | None = None
    #: that token's SCRAM credentials (``ScramCredential.text``), for the same while
    previous_scram: tuple[str, ...] = ()

    def previous_expires_at_ms(self, grace_ms: int) -> int | None:
        """When the previous token stops being accepted (None: there is none)."""
        if self.previous_token_hash is None:
            return None
        if self.rotated_at_ms is None:  # a state without its time: not trusted any longer
            return 0
        return self.rotated_at_ms + grace_ms


@dataclass(frozen=True, slots=True)
class TokenPlan:
    """The outcome of one step."""

    state: TokenState
    #: whether ``state`` differs from what is stored (the adapter writes only then)
    changed: bool
    #: what happened, in order (a rotation can expire nothing and make one token)
    events: tuple[TokenEvent, ...]
    #: the hashes of the tokens the brokers accept: the current's, then the previous's
    accepted_hashes: tuple[str, ...]
    #: when the previous token expires (ms since the epoch), so the adapter comes back then
    previous_expires_at_ms: int | None
    #: the SCRAM credentials the brokers accept: the current token's, then the previous's
    #: (none when planned without a salt)
    accepted_scram: tuple[str, ...] = ()


def scram_salt(cluster: str, principal: str) -> bytes:
    """A User's SCRAM salt: its own (the cluster and principal name it), the same at every
    render and across rotations. Not secret: a SCRAM server shows it to whoever asks."""
    digest = hashlib.sha256(f"headrace scram salt\0{cluster}\0{principal}".encode()).digest()
    return digest[: scram.SALT_BYTES]


@functools.lru_cache(maxsize=1024)
def scram_credentials(token: str, salt: bytes) -> tuple[str, ...]:
    """``token``'s credentials for every SCRAM mechanism (cached: each is 4096 rounds of
    PBKDF2, and every render of a cluster's ACL file asks again)."""
    return tuple(scram.derive(m, token, salt).text() for m in scram.Mechanism)


def plan(
    stored: TokenState | None,
    rotate_token: str | None,
    grace_ms: int,
    now_ms: int,
    fresh_token: str,
    *,
    scram_salt: bytes | None = None,
) -> TokenPlan:
    """One step of a token User's credentials; ``fresh_token`` is used only if a token is
    made or rotated now (the caller draws it from a secure random source). With
    ``scram_salt`` (``scram_salt()``) the tokens' SCRAM credentials are planned too."""
    if grace_ms < 0:
        raise ValueError(f"grace_ms must be >= 0, not {grace_ms}")
    events: list[TokenEvent] = []
    if stored is None:
        state = TokenState(token=fresh_token, rotation=rotate_token)
        events.append(TokenEvent.CREATED)
    else:
        state = stored
        if rotate_token is not None and rotate_token != state.rotation:
            state = TokenState(
                token=fresh_token,
                generation=state.generation + 1,
                rotation=rotate_token,
                rotated_at_ms=now_ms,
                previous_token_hash=acl.hash_token(state.token),
                previous_scram=(
                    scram_credentials(state.token, scram_salt) if scram_salt is not None else ()
                ),
            )
            events.append(TokenEvent.ROTATED)
    expires = state.previous_expires_at_ms(grace_ms)
    if expires is not None and now_ms >= expires:
        state = replace(state, previous_token_hash=None, previous_scram=())
        if TokenEvent.ROTATED not in events:
            events.append(TokenEvent.PREVIOUS_EXPIRED)
        expires = None
    accepted: tuple[str, ...] = (acl.hash_token(state.token),)
    if state.previous_token_hash is not None:
        accepted += (state.previous_token_hash,)
    accepted_scram: tuple[str, ...] = ()
    if scram_salt is not None:
        accepted_scram = scram_credentials(state.token, scram_salt) + state.previous_scram
    return TokenPlan(
        state=state,
        changed=state != stored,
        events=tuple(events),
        accepted_hashes=accepted,
        previous_expires_at_ms=expires,
        accepted_scram=accepted_scram,
    )
