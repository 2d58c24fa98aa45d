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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from headrace import tlsnames

#: how often the broker is asked where the drain stands, in seconds
POLL_INTERVAL_S = 0.25


def drain_finished(report: Mapping[str, Any]) -> bool:
    """The broker leads nothing that another in-sync replica could lead."""
    return bool(report.get("draining")) and not report.get("movable")


#: a broker with credentials on refuses an unauthenticated drain (a state change on its
#: admin port); broker pods of a cluster with auth have the replication token here
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


def _call(url: str, method: str, timeout_s: float, token: str | None = None) -> dict[str, Any]:
    """``token``: the bearer token (default ``$HEADRACE_REPLICATION_TOKEN``)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(
        url, method=method, data=b"" if method == "POST" else None, headers=headers
    )
    with urllib.request.urlopen(request, timeout=timeout_s, context=_tls_context(url)) as response:
        doc: dict[str, Any] = json.loads(response.read())
        return doc


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
    the admin port (default ``$HEADRACE_REPLICATION_TOKEN``)."""
    if call is None:
        call = functools.partial(_call, token=token)
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
