"""``headrace drain``: controlled shutdown's first half, for a pod's ``preStop`` hook.

It asks one cluster broker to drain (``POST /v1/drain`` on its admin port): the
broker says ``draining`` in its heartbeat, and the controller (the operator's
loop, or the local controller) hands every partition it leads to another
in-sync replica at ``epoch + 1`` (``control.election``, rule
``LeaderDraining``) and places nothing new on it. The command then polls
``GET /v1/drain`` until the broker leads nothing it could hand off, or until
``--timeout`` (kept below the pod's ``terminationGracePeriodSeconds``, so
SIGTERM still comes in time to flush and close). It exits 0 either way: a
drain that did not finish is a slower failover, not a reason to keep the pod.

``drain_finished`` is the pure rule; the rest is HTTP.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from headrace import tlsnames
from headrace.errors import InvalidRequest
from headrace.security import keyrings

#: how often the broker is asked where the drain stands, in seconds
POLL_INTERVAL_S = 0.25


def drain_finished(report: Mapping[str, Any]) -> bool:
    """The broker leads nothing that another in-sync replica could lead."""
    return bool(report.get("draining")) and not report.get("movable")


#: a broker with credentials on refuses an unauthenticated drain (a state change on its
#: admin port). Broker pods of a cluster with auth name the replication token file here
#: (the file the broker reads, kept current by the kubelet, so a rotation reaches it)...
TOKEN_FILE_ENV = "HEADRACE_REPLICATION_TOKEN_FILE"
#: ... and pods made before that file carry the token itself here
TOKEN_ENV = "HEADRACE_REPLICATION_TOKEN"
#: an ``https`` admin URL is verified with this CA and server name (broker pods of a
#: cluster with ``spec.tls`` have both: ``workloads.tls_env``)
ADMIN_CA_ENV = "HEADRACE_ADMIN_CA"
SERVER_NAME_ENV = "HEADRACE_TLS_SERVER_NAME"


def _tls_context(url: str) -> ssl.SSLContext | None:
    if not url.startswith("https:"):
        return None
    ca = os.environ.get(ADMIN_CA_ENV)
    return tlsnames.client_context(
        Path(ca) if ca else None, os.environ.get(SERVER_NAME_ENV) or None
    )


def default_tokens(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The replication tokens to present, the one to try first first: the values of
    ``$HEADRACE_REPLICATION_TOKEN_FILE`` (``keyrings`` format, the broker's own file), or
    ``$HEADRACE_REPLICATION_TOKEN`` when no file is named or it cannot be read; () for
    none. A file that does not parse is passed over, as the broker keeps its previous
    tokens then: the environment's token is the best guess left."""
    path = environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            return keyrings.parse_tokens(Path(path).read_text(), path)
        except (OSError, UnicodeDecodeError, InvalidRequest) as exc:
            click.echo(f"drain: {exc}; trying ${TOKEN_ENV}", err=True)
    token = environ.get(TOKEN_ENV)
    return (token,) if token else ()


def _call(
    url: str, method: str, timeout_s: float, tokens: Sequence[str] | None = None
) -> dict[str, Any]:
    """``tokens``: bearer tokens to present, in order (default ``default_tokens()``): the
    next is tried only when the broker answers 401, which is how a drain still gets
    through while the broker has not re-read a rotated file yet (it accepts every value
    listed in its copy, and ours may list the new one first already)."""
    candidates: Sequence[str | None] = tokens if tokens is not None else default_tokens()
    if not candidates:
        candidates = (None,)
    for index, token in enumerate(candidates):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(
            url, method=method, data=b"" if method == "POST" else None, headers=headers
        )
        try:
            with urllib.request.urlopen(
                request, timeout=timeout_s, context=_tls_context(url)
            ) as response:
                doc: dict[str, Any] = json.loads(response.read())
                return doc
        except urllib.error.HTTPError as exc:
            if exc.code != 401 or index == len(candidates) - 1:
                raise
    raise AssertionError("unreachable: the last candidate returns or raises")


def drain(
    admin_url: str,
    timeout_s: float,
    *,
    token: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    call: Callable[[str, str, float], dict[str, Any]] | None = None,
) -> tuple[bool, dict[str, Any]]:
    """Ask for the drain and wait; (finished, the last report). ``token``: presented to
    the admin port (default: ``default_tokens()``, each in turn)."""
    if call is None:
        call = functools.partial(_call, tokens=None if token is None else (token,))
    url = admin_url.rstrip("/") + "/v1/drain"
    deadline = clock() + timeout_s
    report = call(url, "POST", max(0.5, min(5.0, timeout_s)))
    while not drain_finished(report):
        left = deadline - clock()
        if left <= 0:
            return False, report
        sleep(min(POLL_INTERVAL_S, left))
        report = call(url, "GET", max(0.5, min(5.0, left)))
    return True, report


@click.command("drain")
@click.option(
    "--admin-url",
    envvar="HEADRACE_ADMIN_URL",
    required=True,
    help="The broker's admin HTTP base URL (default $HEADRACE_ADMIN_URL, set in broker pods).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=20.0,
    show_default=True,
    help="Give up waiting after this many seconds (exit 0 anyway).",
)
@click.option("--cancel", is_flag=True, help="Call a drain off: the broker may lead again.")
def drain_command(admin_url: str, timeout_s: float, cancel: bool) -> None:
    """Move a broker's leadership away before it stops (a pod's preStop hook)."""
    url = admin_url.rstrip("/") + "/v1/drain"
    try:
        if cancel:
            report = _call(url, "DELETE", 5.0)
            click.echo(f"broker {report.get('brokerId')}: drain called off")
            return
        finished, report = drain(admin_url, timeout_s)
    except urllib.error.HTTPError as exc:
        # up, but it said no: with auth on, most likely a token it does not (yet) accept
        click.echo(f"drain: broker at {admin_url} refused the drain (HTTP {exc.code}); not drained")
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        # the broker is already gone or not serving: nothing left to drain
        click.echo(f"drain: broker at {admin_url} did not answer ({exc}); nothing to wait for")
        return
    broker = report.get("brokerId")
    if finished:
        kept = report.get("leading") or []
        suffix = f" (still leads {kept}: no in-sync peer to take them)" if kept else ""
        click.echo(f"broker {broker}: drained{suffix}")
    else:
        click.echo(
            f"broker {broker}: drain not finished after {timeout_s:g}s; still leads"
            f" {report.get('movable')} (they fail over when it stops)"
        )
