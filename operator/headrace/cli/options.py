"""Options every client command shares: where the cluster is and how to reach it.

``client_options`` adds them to a command in one place, so ``topics``, ``cohorts``,
``cluster``, ``produce``, ``consume`` and ``bench`` accept the same flags and
environment variables, and hands the command one ``ClientTarget``:

- ``--bootstrap`` / ``$HEADRACE_BOOTSTRAP``; without either, the brokers of the local
  cluster recorded in ``--dir`` (``var/local/local.json`` by default); without that,
  ``127.0.0.1:9092``.
- ``--auth-token`` / ``$HEADRACE_AUTH_TOKEN``, or ``--auth-token-file`` /
  ``$HEADRACE_AUTH_TOKEN_FILE``: a file in the brokers' token-file format whose first
  token is presented, re-read at each new connection (``client.tokens.TokenFile``), so
  a long-running ``consume`` or ``produce`` follows a rotation (docs/security.md §9).
  One of the two: a flag on the command line wins over the other's variable.
- ``--tls``, ``--tls-ca`` / ``$HEADRACE_TLS_CA``, ``--tls-cert`` / ``$HEADRACE_TLS_CERT``,
  ``--tls-key`` / ``$HEADRACE_TLS_KEY``: any of them turns TLS on. The broker's
  certificate is checked against ``--tls-ca`` (the system's CAs without it) and the host
  dialled (or ``--tls-server-name`` / ``$HEADRACE_TLS_SERVER_NAME``: one name for every
  broker, as on Kubernetes, where brokers advertise pod IPs and certificates name the
  cluster's Service); ``--tls-cert`` with ``--tls-key`` is the client certificate for
  mutual TLS.

``controller_option`` adds ``--controller`` (``$HEADRACE_CONTROLLER``) for commands that
talk to the local-mode controller; ``controller_known`` decides whether they do.
An explicit ``--bootstrap`` (or ``$HEADRACE_BOOTSTRAP``) without ``--dir`` means those
brokers and no recorded local cluster, so a standalone broker is reachable from a
checkout whose ``var/local`` holds a local cluster.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from headrace import tlsnames
from headrace.cli import controller_client, local_record

if TYPE_CHECKING:
    from headrace.client.connection import ConnectOptions

R = TypeVar("R")

#: where a client goes when nothing names a cluster
FALLBACK_BOOTSTRAP = "127.0.0.1:9092"

ENVIRONMENT_HELP = (
    "Defaults come from HEADRACE_BOOTSTRAP, HEADRACE_AUTH_TOKEN, HEADRACE_AUTH_TOKEN_FILE,"
    " HEADRACE_TLS_CA,"
    " HEADRACE_TLS_CERT, HEADRACE_TLS_KEY and HEADRACE_CONTROLLER, then from the local"
    " cluster recorded in --dir (var/local)."
)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of a TLS client: the CA to trust (None: the system's) and a client
    certificate and key for mutual TLS (both or neither); ``server_name``: the name every
    broker's certificate must carry (None: the host dialled; on Kubernetes the cluster's
    Service name, as the brokers advertise pod IPs)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def context(self) -> ssl.SSLContext:
        return tlsnames.client_context(self.ca, self.server_name, self.cert, self.key)


@dataclass(frozen=True, slots=True)
class ClientTarget:
    """A cluster as a client command reaches it."""

    bootstrap: str
    auth_token: str | None
    tls: TlsFiles | None
    #: the local cluster directory (``--dir``); its ``local.json`` may name the controller
    directory: Path
    #: ``--bootstrap`` or ``$HEADRACE_BOOTSTRAP`` named the brokers (not ``local.json``)
    bootstrap_given: bool = False
    #: ``--dir`` was on the command line
    dir_given: bool = False
    #: ``--auth-token-file``: read again at each new connection (``auth_token`` holds what
    #: it held when the command started, for the controller's API)
    auth_token_file: Path | None = None

    def connect_options(self) -> ConnectOptions:
        from headrace.client.connection import ConnectOptions
        from headrace.client.tokens import TokenFile

        return ConnectOptions(
            client_id="headrace-cli",
            auth_token=TokenFile(self.auth_token_file) if self.auth_token_file else self.auth_token,
            ssl=self.tls.context() if self.tls is not None else None,
        )


def default_bootstrap(directory: Path) -> str:
    """The brokers ``<directory>/local.json`` records, else ``FALLBACK_BOOTSTRAP``."""
    state = directory / local_record.STATE_FILE
    try:
        record = json.loads(state.read_text())
        brokers = record["brokers"]
        found = ",".join(f"{b['host']}:{b['port']}" for b in brokers)
    except (OSError, ValueError, KeyError, TypeError):
        return FALLBACK_BOOTSTRAP
    return found or FALLBACK_BOOTSTRAP


def resolve_target(
    bootstrap: str | None,
    auth_token: str | None,
    tls: bool,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    directory: Path,
    tls_server_name: str | None = None,
    auth_token_file: Path | None = None,
) -> ClientTarget:
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    files = None
    if tls or tls_ca or tls_cert or tls_server_name:
        files = TlsFiles(tls_ca, tls_cert, tls_key, tls_server_name or None)
    ctx = click.get_current_context(silent=True)
    dir_given = ctx is not None and ctx.get_parameter_source("directory") in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )
    auth_token, auth_token_file = _one_token(ctx, auth_token or None, auth_token_file)
    if auth_token_file is not None:
        auth_token = _read_token_file(auth_token_file)
    return ClientTarget(
        bootstrap or default_bootstrap(directory),
        auth_token,
        files,
        directory,
        bootstrap_given=bool(bootstrap),
        dir_given=dir_given,
        auth_token_file=auth_token_file,
    )


def _one_token(
    ctx: click.Context | None, token: str | None, token_file: Path | None
) -> tuple[str | None, Path | None]:
    """``--auth-token`` or ``--auth-token-file``: a flag on the command line wins over the
    other's environment variable; both on the command line (or both in the environment)
    is a usage error."""
    if token is None or token_file is None:
        return token, token_file
    on_line = (
        {
            name
            for name in ("auth_token", "auth_token_file")
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
        }
        if ctx is not None
        else set()
    )
    if on_line == {"auth_token"}:
        return token, None
    if on_line == {"auth_token_file"}:
        return None, token_file
    raise click.UsageError(
        "give --auth-token ($HEADRACE_AUTH_TOKEN) or --auth-token-file"
        " ($HEADRACE_AUTH_TOKEN_FILE), not both"
    )


def _read_token_file(path: Path) -> str:
    """The token ``path`` holds now; a bad file stops the command before it connects."""
    from headrace.client.tokens import TokenFile
    from headrace.errors import InvalidRequest

    try:
        return TokenFile(path)()
    except InvalidRequest as exc:
        raise click.BadParameter(exc.message, param_hint="--auth-token-file") from exc


_PATH = click.Path(path_type=Path, dir_okay=False, exists=True)

_CLIENT_OPTIONS = (
    click.option(
        "--bootstrap",
        envvar="HEADRACE_BOOTSTRAP",
        default=None,
        help="HOST:PORT of any broker, comma-separated list allowed [default:"
        " $HEADRACE_BOOTSTRAP, else the brokers in DIR/local.json, else 127.0.0.1:9092].",
    ),
    click.option(
        "--auth-token",
        envvar="HEADRACE_AUTH_TOKEN",
        default=None,
        help="Client token the brokers accept [default: $HEADRACE_AUTH_TOKEN].",
    ),
    click.option(
        "--auth-token-file",
        envvar="HEADRACE_AUTH_TOKEN_FILE",
        type=_PATH,
        default=None,
        help="File whose first token line is the client token (the brokers' token-file"
        " format), read again at each new connection: a long-running command follows a"
        " rotation [default: $HEADRACE_AUTH_TOKEN_FILE].",
    ),
    click.option("--tls", is_flag=True, help="Speak TLS, trusting the system's CAs (or --tls-ca)."),
    click.option(
        "--tls-ca",
        envvar="HEADRACE_TLS_CA",
        type=_PATH,
        default=None,
        help="PEM CA that signed the brokers' certificates (implies --tls).",
    ),
    click.option(
        "--tls-cert",
        envvar="HEADRACE_TLS_CERT",
        type=_PATH,
        default=None,
        help="PEM client certificate for mutual TLS (with --tls-key; implies --tls).",
    ),
    click.option(
        "--tls-key",
        envvar="HEADRACE_TLS_KEY",
        type=_PATH,
        default=None,
        help="PEM key of --tls-cert.",
    ),
    click.option(
        "--tls-server-name",
        envvar="HEADRACE_TLS_SERVER_NAME",
        default=None,
        help="Name every broker's certificate must carry, whatever address is dialled"
        " (implies --tls); on Kubernetes the cluster's Service, NAME.NAMESPACE.svc.",
    ),
    local_record.dir_option(
        "A local cluster's directory: its local.json names the brokers (the default"
        " bootstrap) and the controller; a controller that does not answer with the instance"
        " recorded there is refused."
    ),
)


def client_options(command: Callable[..., R]) -> Callable[..., R]:
    """Add the shared connection options; the command gets ``client: ClientTarget``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        bootstrap: str | None,
        auth_token: str | None,
        auth_token_file: Path | None,
        tls: bool,
        tls_ca: Path | None,
        tls_cert: Path | None,
        tls_key: Path | None,
        tls_server_name: str | None,
        directory: Path,
        **kwargs: Any,
    ) -> R:
        target = resolve_target(
            bootstrap,
            auth_token,
            tls,
            tls_ca,
            tls_cert,
            tls_key,
            directory,
            tls_server_name,
            auth_token_file,
        )
        controller_client.API_TOKEN.set(target.auth_token)  # the controller's API takes it too
        return command(*args, client=target, **kwargs)

    decorated: Callable[..., R] = wrapper
    for option in reversed(_CLIENT_OPTIONS):
        decorated = option(decorated)
    return decorated


controller_option = click.option(
    "--controller",
    "controller_url",
    default=None,
    help="Local-mode controller URL [default: $HEADRACE_CONTROLLER, else the one in"
    " DIR/local.json].",
)


def controller_known(explicit: str | None, client: ClientTarget) -> bool:
    """Whether to go through a controller: ``--controller`` or ``$HEADRACE_CONTROLLER``
    names one, or a local cluster is recorded in ``--dir`` and the command did not name
    other brokers (an explicit ``--bootstrap`` without ``--dir`` means those brokers,
    say a standalone one, even when ``var/local`` holds a local cluster)."""
    if explicit or os.environ.get("HEADRACE_CONTROLLER"):
        return True
    if not (client.directory / local_record.STATE_FILE).exists():
        return False
    return client.dir_given or not client.bootstrap_given


def controller_url(explicit: str | None, directory: Path) -> str:
    """The controller's URL, refusing one that is not the cluster ``directory`` records."""
    return controller_client.resolve_controller_url(explicit, directory)


def controller_http(method: str, url: str, body: Any | None = None) -> Any:
    """A JSON request to the controller; HTTP errors become one-line ClickExceptions."""
    data = None if body is None else json.dumps(body).encode()
    return controller_client.request_json(method, url, data)
