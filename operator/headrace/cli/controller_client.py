"""The CLI's HTTP client of a controller's API (local mode's controller).

``request_json`` sends one request with the command's bearer token and turns the
controller's error document into ``ControllerRefusal`` (its own words).
``resolve_controller_url`` picks the controller and refuses one whose instance
is not the one ``<dir>/local.json`` records: ports are shared by every local
cluster on the machine, so the process answering may be another cluster's.
"""

from __future__ import annotations

import contextvars
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from headrace.cli.local_record import STATE_FILE, dir_option

#: the CLI's token (as ``--auth-token``), presented to the controller's API as a bearer token
AUTH_TOKEN_ENV = "HEADRACE_AUTH_TOKEN"
#: the ``--auth-token`` of a command with the client options (``options.client_options``)
API_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("api_token", default=None)


def request_json(
    method: str,
    url: str,
    body: bytes | None = None,
    content_type: str = "application/json",
    token: str | None = None,
) -> Any:
    """``token``: the bearer token (default: the command's ``--auth-token``, else
    ``$HEADRACE_AUTH_TOKEN``; none if neither)."""
    headers = {"Content-Type": content_type}
    token = token or API_TOKEN.get() or os.environ.get(AUTH_TOKEN_ENV)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        try:
            doc = json.loads(detail)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            raise ControllerRefusal(doc["message"], doc) from exc  # the controller's own words
        first = next((line.strip() for line in detail.splitlines() if line.strip()), exc.reason)
        raise click.ClickException(f"HTTP {exc.code} from {url}: {first}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc


class ControllerRefusal(click.ClickException):
    """The controller answered with an error document: its one-line message (and the rest)."""

    def __init__(self, message: str, doc: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.doc = doc


def resolve_controller_url(explicit: str | None, directory: Path) -> str:
    """The controller to talk to: ``--controller``, ``$HEADRACE_CONTROLLER``, the one
    recorded in ``<dir>/local.json``, or 127.0.0.1:9700.

    When the URL comes from ``local.json``, or ``--dir`` was given, the controller must
    answer ``/healthz`` with the instance ``local.json`` records: another cluster's
    controller may hold the address."""
    state = directory / STATE_FILE
    record = json.loads(state.read_text()) if state.exists() else None
    url = explicit or os.environ.get("HEADRACE_CONTROLLER")
    from_record = not url and record is not None
    if not url:
        url = str(record["controller_url"]) if record is not None else "http://127.0.0.1:9700"
    url = url.rstrip("/")
    if record is not None and record.get("instance") and (from_record or _dir_given()):
        _check_instance(url, str(record["instance"]), state)
    return url


_CHECKED_DIR_HELP = (
    "The local cluster's directory: its local.json names the controller, and a controller"
    " that does not answer with the instance recorded there is refused."
)


#: ``--dir`` of the commands that talk to the recorded controller (status, apply, delete)
checked_dir_option = dir_option(_CHECKED_DIR_HELP)


def _dir_given() -> bool:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    return ctx.get_parameter_source("directory") in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )


def _check_instance(url: str, expected: str, state: Path) -> None:
    doc = request_json("GET", f"{url}/healthz")
    got = doc.get("instance") if isinstance(doc, dict) else None
    if got != expected:
        pid = doc.get("pid") if isinstance(doc, dict) else None
        raise click.ClickException(
            f"the controller at {url} (instance {got}, pid {pid}) is not the one {state}"
            f" records (instance {expected}); refusing to talk to another cluster"
        )
