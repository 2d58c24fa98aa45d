"""Keyrings: credential files that hold every value in force, the current one first
(pure, no I/O; ``headrace.security.reloading`` reads and re-reads the files).

A token file (the broker's ``--auth-token-file`` and ``--replication-token-file``,
the controller's ``--auth-token-file`` and ``--broker-token-file``) and the cluster key
file hold one value per line. Every listed value is accepted; the first is the one
the process sends (a token) or signs with (the cluster key). So a credential shared by
many processes rotates without an outage in three edits, each one waited for on every
process before the next (docs/security.md §9):

1. add the new value as the second line: everyone accepts both and still sends the old;
2. swap the lines: everyone sends the new, and the old is still accepted from a
   process that has not re-read its file yet;
3. remove the old line.

Blank lines and lines starting with ``#`` are ignored. A file with no value, a value
listed twice, a token with blanks or characters a header cannot carry, or a key that
is not 64 hex digits is refused as a whole. The messages name line numbers, never a
value: these files are secrets.
"""

from __future__ import annotations

import re
from typing import Final

from headrace.errors import InvalidRequest
from headrace.security import identities

#: a token travels in a JSON handshake and an ``Authorization: Bearer`` header: visible
#: ASCII only, and short enough that nobody mistakes a key or a certificate for one
TOKEN: Final = re.compile(r"^[\x21-\x7e]{1,4096}$")


def _values(text: str, source: str) -> list[tuple[int, str]]:
    """(line number, value) of each value line; refuses a file without any."""
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        value = line.strip()
        if value and not value.startswith("#"):
            values.append((number, value))
    if not values:
        raise InvalidRequest(f"{source} holds no value (one per line; the first is the one in use)")
    return values


def _no_repeats(values: list[tuple[int, str]], source: str) -> None:
    first_seen: dict[str, int] = {}
    for number, value in values:
        if value in first_seen:
            raise InvalidRequest(
                f"{source}: line {number} repeats line {first_seen[value]}; list each value once"
            )
        first_seen[value] = number


def parse_tokens(text: str, source: str = "the token file") -> tuple[str, ...]:
    """The tokens of a token file, the one to send first."""
    values = _values(text, source)
    for number, value in values:
        if not TOKEN.fullmatch(value):
            raise InvalidRequest(
                f"{source}: line {number} is not a token (1-4096 visible ASCII characters,"
                " no blanks; one token per line)"
            )
    _no_repeats(values, source)
    return tuple(value for _, value in values)


def parse_keys(text: str, source: str = "the cluster key file") -> tuple[bytes, ...]:
    """The keys of a cluster key file (64 hex digits each), the one to sign with first."""
    values = _values(text, source)
    keys = []
    for number, value in values:
        try:
            keys.append(identities.parse_key(value))
        except InvalidRequest as exc:
            raise InvalidRequest(f"{source}: line {number}: {exc.message}") from None
    _no_repeats(
        [(number, key.hex()) for (number, _), key in zip(values, keys, strict=True)], source
    )
    return tuple(keys)
