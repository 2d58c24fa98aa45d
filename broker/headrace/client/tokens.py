"""Where a client's token comes from: a fixed string, or a source read at each connect.

``ConnectOptions.auth_token`` takes either. A source is a zero-argument callable that
returns the token to present now; ``ClientConnection.open`` calls it for every new
connection and remembers what it presented. When a broker refuses that token and the
source yields another one (the token was rotated), the client reconnects with the new
one and goes on (``errors.TokenRotated``), as Kafka clients do with an OAUTHBEARER
refresh callback. ``TokenFile`` is the ready-made source: a file in the brokers' token
file format (``headrace.security.keyrings``), re-read at each call, so a client follows
a mounted Secret without a restart (docs/security.md §9).

A source is called in the event loop, at each connect and after a refusal: it must
return quickly (a small file read is fine; a network round trip is not).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from headrace.errors import InvalidRequest
from headrace.security import keyrings

log = logging.getLogger(__name__)

#: a callable returning the token to present now
TokenSource = Callable[[], str]


def current_token(token: str | TokenSource | None) -> str | None:
    """The token to present now: the string itself, or what the source yields."""
    if token is None or isinstance(token, str):
        return token
    return token()


class TokenFile:
    """A token source reading ``path`` at each call: its first token line (blank lines
    and ``#`` comments skipped), the one a broker's ``--auth-token-file`` lists first.

    The whole file is checked as a broker checks its own (one token a line, no repeats),
    so a client and the brokers can share one Secret. A file that cannot be read or is
    malformed on the first call raises ``InvalidRequest``; on a later call it keeps the
    last good token (logged, never the token itself): a file caught mid-rewrite must not
    fail the client's next connect, as a broker keeps its tokens in force then.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._last: str | None = None

    def __call__(self) -> str:
        try:
            token = self._read()
        except InvalidRequest as exc:
            if self._last is None:
                raise
            log.warning("keeping the token read before: %s", exc.message)
            return self._last
        self._last = token
        return token

    def _read(self) -> str:
        try:
            text = self.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise InvalidRequest(f"cannot read the token file {self.path}: {reason}") from exc
        return keyrings.parse_tokens(text, f"the token file {self.path}")[0]

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r})"
