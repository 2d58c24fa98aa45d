"""Local mode: ``headrace controller``, ``local up|status|stop|start|restart|down``,
``apply|delete -f``.

``local up`` starts one controller and N cluster-mode brokers as processes,
broker i on its own loopback address 127.0.0.(2+i) with the same ports, as
pods would have. Their pids, addresses and log files are recorded in
``<dir>/local.json`` so ``status`` and ``down`` find them.

Every broker tiers to one object store shared by the cluster:
``--object-store dir`` (the default) is a directory, ``<dir>/objects``;
``--object-store minio`` starts a real MinIO server (the binary
``tools/minio/build.sh`` builds, or ``$HEADRACE_MINIO_BIN``) on a free
loopback port with data in ``<dir>/minio`` and fresh root credentials, and
gives them to the brokers in their environment, never on a command line
(``ps`` shows command lines to every user). Its pid, port and credentials are
recorded in ``local.json`` (mode 0600), so ``down`` stops it and tests can
read the bucket.

Which processes answer. Ports are shared by every local cluster on
the machine, so a process that answers on an address may be another cluster's.
Each ``local up`` draws an instance token (``local-<hex>``), records it in
``local.json`` and gives it to its controller; ``/healthz`` of the controller
reports its pid and instance, a broker's its pid. ``local up`` waits until the
pid it started answers on each address, fails fast when one of its processes
exits, and then stops what it started and removes its ``local.json``.
``apply``, ``delete`` and ``local status`` refuse a controller whose instance is
not the one recorded in ``--dir``. The cluster id ("local", the object-store key
prefix and the Topic ``clusterRef`` name) stays the same for every local cluster.

One broker at a time. ``local stop|start|restart BROKER`` stop and start broker
processes of a running cluster with their data directories and addresses; a
stopped broker is recorded in ``local.json`` with no pid, so ``local down``
never signals a pid that may have been reused, and ``local status`` shows it.

Apply tells the truth. ``apply`` skips kinds local mode does not run, with a
note, and the controller refuses (HTTP 422 with one line per problem) a Topic
the cluster cannot honour (``headrace.control.admission``) unless
``--allow-problems`` turns the lines into warnings. ``delete`` names what did
not exist and then exits ``EXIT_NOT_FOUND``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import click
from click.core import ParameterSource

from headrace import files
from headrace.aio import run
from headrace.control.settings import ControlSettings

DEFAULT_DIR = Path("var/local")
STATE_FILE = "local.json"
#: the cluster id brokers and controller share; it prefixes every object-store key and is
#: the Topic manifests' ``clusterRef`` name, so it is the same for every local cluster
CLUSTER_ID = "local"
#: ports when neither --port-base nor the port options are given
DEFAULT_PORT, DEFAULT_ADMIN_PORT, DEFAULT_CONTROLLER_PORT = 9092, 9644, 9700
#: every broker's Kafka listener when neither --port-base nor --kafka-port is given
DEFAULT_KAFKA_PORT = 9093
#: the Topic keeping Kafka groups' committed offsets (the brokers' default
#: ``--kafka-offsets-topic``); ``local up`` applies it with the Kafka listener on
KAFKA_OFFSETS_TOPIC = "kafka.group-offsets"
KAFKA_OFFSETS_PARTITIONS = 3
MINIO_BUCKET = "headrace"
ACCESS_KEY_ENV = "HEADRACE_OBJECT_STORE_ACCESS_KEY"
SECRET_KEY_ENV = "HEADRACE_OBJECT_STORE_SECRET_KEY"
#: operator/headrace/cli/local.py -> the repository (an editable install) holds tools/
_BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "minio" / "build.sh"


#: the CLI's token (as ``--auth-token``), presented to the controller's API as a bearer token
AUTH_TOKEN_ENV = "HEADRACE_AUTH_TOKEN"
#: the ``--auth-token`` of a command with the client options (``options.client_options``)
API_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar("api_token", default=None)


def _http(
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


def _controller_url(explicit: str | None, directory: Path) -> str:
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
checked_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help=_CHECKED_DIR_HELP,
)


def _dir_given() -> bool:
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    return ctx.get_parameter_source("directory") in (
        ParameterSource.COMMANDLINE,
        ParameterSource.ENVIRONMENT,
    )


def _check_instance(url: str, expected: str, state: Path) -> None:
    doc = _http("GET", f"{url}/healthz")
    got = doc.get("instance") if isinstance(doc, dict) else None
    if got != expected:
        pid = doc.get("pid") if isinstance(doc, dict) else None
        raise click.ClickException(
            f"the controller at {url} (instance {got}, pid {pid}) is not the one {state}"
            f" records (instance {expected}); refusing to talk to another cluster"
        )


# ---------------------------------------------------------------------------- controller


@click.command()
@click.option("--state-dir", type=click.Path(path_type=Path), required=True)
@click.option(
    "--broker", "brokers", multiple=True, required=True, help="ID=HOST:ADMIN_PORT (repeatable)."
)
@click.option("--admin-host", default="127.0.0.1", show_default=True)
@click.option("--admin-port", type=int, default=9700, show_default=True)
@click.option("--poll-interval-ms", type=int, default=1000, show_default=True)
@click.option(
    "--transition-poll-interval-ms",
    type=int,
    default=100,
    show_default=True,
    help="Poll interval while an unload is unfinished or a partition is sealed.",
)
@click.option(
    "--unload-recovery-timeout-ms",
    type=int,
    default=ControlSettings().unload_recovery_timeout_ms,
    show_default=True,
    help="How long a move waits for a live replica to seal before reopening the partition"
    " from the object store (losing what was acknowledged but not uploaded).",
)
@click.option(
    "--preferred-leader-quiet-ms",
    type=click.IntRange(min=1),
    default=ControlSettings().preferred_leader_quiet_ms,
    show_default=True,
    help="How long a returning preferred replica must stay in sync before leadership moves"
    " back to it.",
)
@click.option(
    "--preferred-leader-rebalance/--no-preferred-leader-rebalance",
    default=ControlSettings().preferred_leader_rebalance,
    show_default=True,
    help="Give leadership back to each partition's preferred (first) replica once it is back"
    " in sync.",
)
@click.option("--cluster-id", default=CLUSTER_ID, show_default=True)
@click.option(
    "--instance",
    default=None,
    help="A token /healthz reports so `headrace local` can tell this controller from another"
    " cluster's (local up passes a fresh local-<hex>).",
)
@click.option(
    "--acl-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The brokers' ACL file: /v1/apply and /v1/delete then take a bearer token whose"
    " principal holds admin on every topic they touch. Reloaded on SIGHUP and on change.",
)
@click.option(
    "--auth-token",
    "auth_tokens",
    multiple=True,
    help="Accepted API token (repeatable); any may apply and delete. Not with --acl-file.",
)
@click.option(
    "--auth-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Accepted API tokens, one per line, re-read on SIGHUP and on change.",
)
@click.option(
    "--admin-read-access",
    type=click.Choice(["open", "authenticated"]),
    default="open",
    show_default=True,
    help="Who may read the API and the dashboard (/healthz, /readyz stay open).",
)
@click.option("--admin-tls-cert", type=click.Path(path_type=Path), default=None)
@click.option("--admin-tls-key", type=click.Path(path_type=Path), default=None)
@click.option(
    "--broker-token",
    envvar="HEADRACE_REPLICATION_TOKEN",
    default=None,
    help="Token presented to the brokers' admin ports (heartbeat polls, topology pushes):"
    " the brokers' replication token, or another with the cluster grant."
    " Default: $HEADRACE_REPLICATION_TOKEN.",
)
@click.option(
    "--broker-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="--broker-token from a file re-read on SIGHUP and on change: its first line is"
    " presented (rotation: docs/security.md §9). Replaces --broker-token.",
)
@click.option(
    "--broker-admin-ca",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Speak HTTPS to the brokers' admin ports, verifying them with this CA.",
)
def controller(
    state_dir: Path,
    brokers: tuple[str, ...],
    admin_host: str,
    admin_port: int,
    poll_interval_ms: int,
    transition_poll_interval_ms: int,
    unload_recovery_timeout_ms: int,
    preferred_leader_quiet_ms: int,
    preferred_leader_rebalance: bool,
    cluster_id: str,
    instance: str | None,
    acl_file: Path | None,
    auth_tokens: tuple[str, ...],
    auth_token_file: Path | None,
    admin_read_access: str,
    admin_tls_cert: Path | None,
    admin_tls_key: Path | None,
    broker_token: str | None,
    broker_token_file: Path | None,
    broker_admin_ca: Path | None,
) -> None:
    """Run the local-mode controller."""
    import logging

    from headrace.broker.config import AdminReadAccess, TlsSettings
    from headrace.controller.admin import ControllerAdmin
    from headrace.controller.controlling import Controller, ControllerSettings
    from headrace.errors import InvalidRequest
    from headrace.protocol.endpoints import BrokerEndpoint

    endpoints = []
    for item in brokers:
        ident, sep, address = item.partition("=")
        host, sep2, port = address.rpartition(":")
        if not (sep and sep2 and ident.isdigit() and port.isdigit()):
            raise click.BadParameter(
                f"{item!r}: expected ID=HOST:ADMIN_PORT", param_hint="--broker"
            )
        endpoints.append(BrokerEndpoint(int(ident), host, admin_port=int(port)))
    for flag, value in (
        ("--poll-interval-ms", poll_interval_ms),
        ("--transition-poll-interval-ms", transition_poll_interval_ms),
    ):
        if value <= 0:
            raise click.BadParameter("must be positive", param_hint=flag)
    try:
        control = ControlSettings(
            unload_recovery_timeout_ms=unload_recovery_timeout_ms,
            preferred_leader_rebalance=preferred_leader_rebalance,
            preferred_leader_quiet_ms=preferred_leader_quiet_ms,
        )
    except InvalidRequest as exc:
        raise click.BadParameter(exc.message, param_hint="--unload-recovery-timeout-ms") from exc
    settings = ControllerSettings(
        state_dir=state_dir,
        brokers=tuple(endpoints),
        cluster_id=cluster_id,
        poll_interval_ms=poll_interval_ms,
        transition_poll_interval_ms=transition_poll_interval_ms,
        control=control,
        admin_host=admin_host,
        admin_port=admin_port,
        instance=instance,
        acl_file=acl_file,
        auth_tokens=frozenset(auth_tokens),
        auth_token_file=auth_token_file,
        admin_read_access=AdminReadAccess(admin_read_access),
        admin_tls=TlsSettings(admin_tls_cert, admin_tls_key)
        if admin_tls_cert and admin_tls_key
        else None,
        broker_token=None if broker_token_file else broker_token,
        broker_token_file=broker_token_file,
        broker_admin_ca=broker_admin_ca,
    )
    if (admin_tls_cert is None) != (admin_tls_key is None):
        raise click.UsageError("--admin-tls-cert and --admin-tls-key go together")
    if acl_file is not None and (auth_tokens or auth_token_file):
        raise click.UsageError("--auth-token (or --auth-token-file) and --acl-file do not mix")
    if not logging.getLogger().isEnabledFor(logging.INFO):
        logging.getLogger("headrace").setLevel(logging.INFO)

    async def serve() -> None:
        c = Controller(settings)
        admin = ControllerAdmin(c)
        await admin.start()
        await c.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, admin.access.reload)
        await stop.wait()
        await c.stop()
        await admin.stop()

    run(serve())


# ---------------------------------------------------------------------------- local up / status / down


@click.group()
def local() -> None:
    """A local cluster of processes: one controller, N brokers on 127.0.0.x."""


def spawn_headrace(args: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> int:
    """Start `headrace ARGS...` detached (own session), appending its output to ``log_path``.

    ``env``: variables added to this process's environment (secrets go here, never in ARGS).
    """
    return _spawn([sys.executable, "-m", "headrace.cli.main", *args], log_path, env)


def _spawn(argv: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> int:
    """Start ``argv`` detached; its pid. ``_exited`` reaps it (it is our child)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
    return proc.pid


# ---------------------------------------------------------------------------- object store


def minio_binary() -> Path:
    """``$HEADRACE_MINIO_BIN``, or the binary ``tools/minio/build.sh`` builds (minutes, once)."""
    override = os.environ.get("HEADRACE_MINIO_BIN")
    if override:
        return Path(override)
    if not _BUILD_SCRIPT.exists():
        raise click.ClickException(
            "no MinIO binary: set HEADRACE_MINIO_BIN (tools/minio/build.sh builds one from a"
            " source checkout)"
        )
    click.echo(
        "locating the MinIO binary (tools/minio/build.sh; a first build takes minutes)", err=True
    )
    try:
        out = subprocess.run(
            ["bash", str(_BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise click.ClickException(f"building MinIO failed: {exc}") from exc
    return Path(out.stdout.strip().splitlines()[-1])


def start_minio(directory: Path, timeout: float = 60.0) -> dict[str, Any]:
    """Start MinIO detached, wait until it serves, create the bucket; its record for local.json."""
    from headrace.objectstore.errors import ObjectStoreError
    from headrace.objectstore.minio_server import free_port
    from headrace.objectstore.minio_store import MinioSettings, MinioStore

    binary = minio_binary()
    host = "127.0.0.1"
    port = free_port(host)
    console = free_port(host)
    while console == port:
        console = free_port(host)
    access_key = "headrace-" + secrets.token_hex(4)
    secret_key = secrets.token_urlsafe(24)
    data = directory / "minio"
    data.mkdir(parents=True, exist_ok=True)
    log_path = directory / "logs" / "minio.log"
    pid = _spawn(
        [
            str(binary),
            "server",
            str(data),
            "--address",
            f"{host}:{port}",
            "--console-address",
            f"{host}:{console}",
            "--quiet",
        ],
        log_path,
        {
            "MINIO_ROOT_USER": access_key,
            "MINIO_ROOT_PASSWORD": secret_key,
            "MINIO_UPDATE": "off",
            "MINIO_CALLHOME_ENABLE": "off",
        },
    )
    record = {
        "pid": pid,
        "host": host,
        "port": port,
        "bucket": MINIO_BUCKET,
        "access_key": access_key,
        "secret_key": secret_key,
        "data_dir": str(data),
        "log": str(log_path),
    }
    store = MinioStore(
        MinioSettings(
            endpoint=f"{host}:{port}",
            bucket=MINIO_BUCKET,
            access_key=access_key,
            secret_key=secret_key,
            create_bucket=True,
            connect_timeout=1.0,
        )
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                store.ensure_bucket()
                return record
            except ObjectStoreError as exc:
                if not alive(pid):
                    raise click.ClickException(
                        f"MinIO exited during start-up; see {log_path}"
                    ) from exc
                if time.monotonic() > deadline:
                    _stop([pid])
                    raise click.ClickException(
                        f"MinIO not ready after {timeout:.0f}s ({exc}); see {log_path}"
                    ) from exc
                time.sleep(0.1)
    finally:
        store.close()


def object_store_args(
    record: Mapping[str, Any], directory: Path
) -> tuple[list[str], dict[str, str]]:
    """(broker arguments, broker environment) for the cluster's object store."""
    minio = record.get("minio")
    if minio is None:
        objects = (directory / "objects").resolve()
        objects.mkdir(parents=True, exist_ok=True)
        return ["--object-store", f"file://{objects}", "--cluster-id", CLUSTER_ID], {}
    url = f"s3://{minio['host']}:{minio['port']}/{minio['bucket']}?create_bucket=1"
    env = {ACCESS_KEY_ENV: minio["access_key"], SECRET_KEY_ENV: minio["secret_key"]}
    return ["--object-store", url, "--cluster-id", CLUSTER_ID], env


#: the cluster key of a local cluster with ACLs: ``<dir>/cluster.key``, mode 0600
CLUSTER_KEY_FILE = "cluster.key"
#: the brokers' replication token (the controller presents it too): ``<dir>/replication.token``,
#: mode 0600; one token a line, the first in use, so it rotates (docs/security.md §9)
REPLICATION_TOKEN_FILE = "replication.token"
REPLICATION_TOKEN_ENV = "HEADRACE_REPLICATION_TOKEN"


def prepare_access(record: dict[str, Any], directory: Path, acl_file: Path) -> None:
    """Check the ACL file now (one line, before anything starts), make the cluster key and
    draw the brokers' replication token into ``<dir>/replication.token`` (mode 0600; it
    is also kept in ``record``, as local.json is 0600 too)."""
    from headrace.broker.access import load_acl_file, load_cluster_key, load_token_file
    from headrace.errors import HeadraceError

    token_file = (directory / REPLICATION_TOKEN_FILE).resolve()
    try:
        load_acl_file(acl_file)
        load_cluster_key(directory / CLUSTER_KEY_FILE, create=True)
        if not token_file.exists():
            token_file.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(token_file, f"{secrets.token_urlsafe(24)}\n".encode(), mode=0o600)
        # a cluster brought up again keeps its token (and the key), rotated or not
        token = load_token_file(token_file)[0]
    except HeadraceError as exc:
        raise click.ClickException(exc.message) from exc
    record["acl_file"] = str(acl_file.resolve())
    record["replication_token"] = token
    record["replication_token_file"] = str(token_file)


def access_args(record: Mapping[str, Any], directory: Path) -> tuple[list[str], dict[str, str]]:
    """(broker arguments, broker environment) for the cluster's ACLs: none without them.

    The replication token comes from its file (re-read on change, so it rotates), never
    on a command line; a cluster recorded before the file existed passes it by
    environment."""
    acl_file = record.get("acl_file")
    if acl_file is None:
        return [], {}
    key = (directory / CLUSTER_KEY_FILE).resolve()
    args = ["--acl-file", acl_file, "--cluster-key-file", str(key)]
    token_file = record.get("replication_token_file")
    if token_file is not None:
        return [*args, "--replication-token-file", str(token_file)], {}
    return args, {REPLICATION_TOKEN_ENV: record["replication_token"]}


def _replication_token(record: Mapping[str, Any]) -> str | None:
    """The token the brokers present now (a drain is a change on their admin port): the
    first line of its file, read now, as it may have rotated (None: no ACLs)."""
    from headrace.broker.access import load_token_file
    from headrace.errors import HeadraceError

    path = record.get("replication_token_file")
    if path is not None:
        with contextlib.suppress(HeadraceError):
            return load_token_file(Path(path))[0]
    token = record.get("replication_token")
    return None if token is None else str(token)


def controller_access_args(record: Mapping[str, Any]) -> list[str]:
    """The controller's API takes the brokers' ACL file, and it presents the brokers'
    replication token from its file (or, by environment: ``access_args``)."""
    acl_file = record.get("acl_file")
    if acl_file is None:
        return []
    token_file = record.get("replication_token_file")
    token_args = [] if token_file is None else ["--broker-token-file", str(token_file)]
    return ["--acl-file", str(acl_file), *token_args]


def broker_args(b: Mapping[str, Any], directory: Path, fsync: str | None = None) -> list[str]:
    """The command line of broker ``b`` of a local cluster (without the object store)."""
    args = [
        "broker",
        "--cluster",
        "--broker-id",
        str(b["id"]),
        "--host",
        b["host"],
        "--port",
        str(b["port"]),
        "--admin-host",
        b["host"],
        "--admin-port",
        str(b["admin_port"]),
        "--data-dir",
        str(directory / f"broker-{b['id']}"),
    ]
    if fsync is not None:
        args += ["--fsync", fsync]
    if b.get("kafka_port") is not None:
        args += ["--kafka-port", str(b["kafka_port"])]
    if b.get("rack"):
        args += ["--rack", str(b["rack"])]
    return args


def rack_for(broker_id: int, racks: Sequence[str]) -> str | None:
    """The rack of broker ``broker_id`` in a local cluster with ``racks``: round the list,
    so consecutive brokers land in different racks; None without racks."""
    return racks[broker_id % len(racks)] if racks else None


def parse_racks(text: str | None) -> list[str]:
    """``--racks a,b,c`` as a list; refuses an empty name or one twice."""
    if not text:
        return []
    racks = [r.strip() for r in text.split(",")]
    if any(not r for r in racks) or len(set(racks)) != len(racks):
        raise click.BadParameter(
            f"{text!r}: expected distinct, non-empty names separated by commas",
            param_hint="--racks",
        )
    return racks


def _write_state(state_file: Path, record: Mapping[str, Any]) -> None:
    """local.json, readable by its owner only (it may hold object-store credentials)."""
    state_file.parent.mkdir(parents=True, exist_ok=True)
    files.write_json_atomic(state_file, record, sync=False, mode=0o600, indent=2)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is ours to signal (not a reused id of another user's).

    A zombie (exited, not yet reaped by a parent that is not us) is not alive."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: the signal test is all there is
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _exited(pid: int) -> bool:
    """Whether ``pid`` has ended; reaps it if it is our child (a zombie is still ``alive``)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return not alive(pid)
    return done != 0


def _last_line(log_path: Path) -> str:
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    return next((line for line in reversed(lines) if line), "empty log")


def _healthz(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
            doc = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_own(pid: int, url: str, what: str, log_path: Path, timeout: float) -> None:
    """Wait until process ``pid`` itself answers ``/healthz`` and ``/readyz`` at ``url``.

    Fails at once when ``pid`` exits (naming the log's last line, e.g. ``address already
    in use``), or after ``timeout`` seconds, naming another process that answers there."""
    deadline = time.monotonic() + timeout
    other = None
    while True:
        if _exited(pid):
            raise click.ClickException(
                f"{what} at {url} exited during start-up: {_last_line(log_path)}"
            )
        doc = _healthz(url)
        if doc is not None and doc.get("pid") == pid:
            if _ready(url):
                return
        elif doc is not None:
            other = doc.get("pid")
        if time.monotonic() > deadline:
            answering = f"; pid {other} answers there, not the process started" if other else ""
            raise click.ClickException(
                f"{what} at {url} (pid {pid}) not ready in {timeout:.0f}s{answering}; see {log_path}"
            )
        time.sleep(0.1)


@local.command("up")
@click.option("--brokers", "count", type=int, default=3, show_default=True)
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
@click.option(
    "--port-base",
    type=int,
    default=None,
    help="Ports from N: brokers' data port N, their admin port N+1, the controller N+2,"
    " the brokers' Kafka listeners N+3 (so clusters with other --dir and --port-base run"
    " side by side).",
)
@click.option(
    "--port",
    type=int,
    default=None,
    help=f"Data port of every broker [default: {DEFAULT_PORT}, or the port base].",
)
@click.option(
    "--admin-port",
    type=int,
    default=None,
    help=f"Admin port of every broker [default: {DEFAULT_ADMIN_PORT}, or port base + 1].",
)
@click.option(
    "--controller-port",
    type=int,
    default=None,
    help=f"Controller port on 127.0.0.1 [default: {DEFAULT_CONTROLLER_PORT}, or port base + 2].",
)
@click.option(
    "--fsync",
    type=click.Choice(["none", "interval", "always"]),
    default="interval",
    show_default=True,
)
@click.option(
    "--object-store",
    "object_store",
    type=click.Choice(["dir", "minio"]),
    default="dir",
    show_default=True,
    help="Where tiered topics upload: a shared directory (DIR/objects) or a MinIO server"
    " started for the cluster (data in DIR/minio).",
)
@click.option(
    "--preferred-leader-quiet-ms",
    type=click.IntRange(min=1),
    default=None,
    help="The controller's quiet period before leadership returns to a preferred replica"
    f" [default: {ControlSettings().preferred_leader_quiet_ms}].",
)
@click.option(
    "--acl-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="Principals and grants (docs/security.md): every broker checks them, and cohort"
    " members need signed identities (the key is DIR/cluster.key).",
)
@click.option(
    "--racks",
    default=None,
    metavar="RACK,RACK,...",
    help="Put broker i in the (i mod N)-th of these racks (each broker's --rack): the"
    " controller spreads every partition's replicas over the racks.",
)
@click.option(
    "--kafka-port",
    type=int,
    default=None,
    help=f"Every broker's Kafka listener (docs/kafka.md) [default: {DEFAULT_KAFKA_PORT}, or"
    " port base + 3]; -1 turns it off.",
)
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C brings the cluster down.")
def local_up(
    count: int,
    directory: Path,
    port_base: int | None,
    port: int | None,
    admin_port: int | None,
    controller_port: int | None,
    fsync: str,
    object_store: str,
    preferred_leader_quiet_ms: int | None,
    acl_file: Path | None,
    racks: str | None,
    kafka_port: int | None,
    foreground: bool,
) -> None:
    """Start the controller and COUNT brokers (and MinIO with --object-store minio).

    Each broker serves Kafka's protocol too (--kafka-port), and the Topic keeping Kafka
    groups' committed offsets is applied (kafka.group-offsets: 3 partitions, replicated
    on up to 3 brokers, minInSync 2 of 3, no retention).

    Waits until each process it started answers on its address; if one exits (say, its
    address is in use by another cluster) or another process answers there, it fails
    with one line, stops what it started and removes DIR/local.json."""
    if not 1 <= count <= 9:
        raise click.BadParameter("between 1 and 9 brokers", param_hint="--brokers")
    rack_names = parse_racks(racks)
    if port_base is not None and not 1 <= port_base <= 65533:
        raise click.BadParameter("between 1 and 65533", param_hint="--port-base")
    if port is None:
        port = DEFAULT_PORT if port_base is None else port_base
    if admin_port is None:
        admin_port = DEFAULT_ADMIN_PORT if port_base is None else port_base + 1
    if controller_port is None:
        controller_port = DEFAULT_CONTROLLER_PORT if port_base is None else port_base + 2
    if kafka_port is None:
        kafka_port = DEFAULT_KAFKA_PORT if port_base is None else port_base + 3
    if not -1 <= kafka_port <= 65535:
        raise click.BadParameter("a port, or -1 for none", param_hint="--kafka-port")
    state_file = directory / STATE_FILE
    if state_file.exists():
        existing = json.loads(state_file.read_text())
        if any(alive(pid) for pid in _pids(existing)):
            raise click.ClickException(
                f"a local cluster is already running from {directory}; `headrace local down` first"
            )
    instance = "local-" + secrets.token_hex(8)
    record: dict[str, Any] = {
        "object_store": object_store,
        "instance": instance,
        "fsync": fsync,
        "brokers": [],
    }
    if rack_names:
        record["racks"] = rack_names
    if acl_file is not None:
        prepare_access(record, directory, acl_file)
    if kafka_port >= 0:
        record["kafka_port"] = kafka_port
    if preferred_leader_quiet_ms is not None:
        record["controller_args"] = ["--preferred-leader-quiet-ms", str(preferred_leader_quiet_ms)]
    if object_store == "minio":
        record["minio"] = start_minio(directory)
        _write_state(state_file, record)  # so `local down` finds MinIO if a later step fails
    try:
        _start(record, directory, count, port, admin_port, controller_port, fsync)
        if kafka_port >= 0:
            _apply_offsets_topic(record["controller_url"], count)
    except BaseException:
        _stop([pid for pid in _pids(record) if pid != record.get("minio", {}).get("pid")])
        if "minio" in record:
            _stop([record["minio"]["pid"]])
        state_file.unlink(missing_ok=True)
        raise
    _report(record, directory, count, record["controller_url"], foreground)


def _start(
    record: dict[str, Any],
    directory: Path,
    count: int,
    port: int,
    admin_port: int,
    controller_port: int,
    fsync: str,
) -> None:
    """Spawn the brokers and the controller into ``record`` (and local.json) and wait until
    each answers as itself; the caller stops them if this raises."""
    state_file = directory / STATE_FILE
    store_args, store_env = object_store_args(record, directory)
    acl_args, acl_env = access_args(record, directory)
    store_args, store_env = [*store_args, *acl_args], {**store_env, **acl_env}
    brokers: list[dict[str, Any]] = []
    for i in range(count):
        host = f"127.0.0.{2 + i}"
        b: dict[str, Any] = {"id": i, "host": host, "port": port, "admin_port": admin_port}
        if record.get("kafka_port") is not None:
            b["kafka_port"] = record["kafka_port"]
        if rack := rack_for(i, record.get("racks", [])):
            b["rack"] = rack
        b["pid"] = spawn_headrace(
            [*broker_args(b, directory, fsync), *store_args],
            directory / "logs" / f"broker-{i}.log",
            store_env,
        )
        brokers.append(b)
        record["brokers"] = brokers  # so a failure below stops what was started
    controller_log = directory / "logs" / "controller.log"
    controller_pid = spawn_headrace(
        [
            "controller",
            "--state-dir",
            str(directory / "controller"),
            "--admin-port",
            str(controller_port),
            "--cluster-id",
            CLUSTER_ID,
            "--instance",
            record["instance"],
            *record.get("controller_args", []),
            *controller_access_args(record),
            *[
                arg
                for b in brokers
                for arg in ("--broker", f"{b['id']}={b['host']}:{b['admin_port']}")
            ],
        ],
        controller_log,
        acl_env,  # the replication token: the brokers' admin ports take it (cluster grant)
    )
    controller_url = f"http://127.0.0.1:{controller_port}"
    record.update({"controller_url": controller_url, "controller_pid": controller_pid})
    _write_state(state_file, record)
    for b in brokers:
        _wait_own(
            b["pid"],
            f"http://{b['host']}:{b['admin_port']}",
            f"broker {b['id']}",
            directory / "logs" / f"broker-{b['id']}.log",
            30,
        )
    _wait_own(controller_pid, controller_url, "controller", controller_log, 30)


def offsets_topic_manifest(brokers: int) -> dict[str, Any]:
    """The Topic of Kafka groups' committed offsets for a local cluster of ``brokers``:
    replicated as widely as the cluster allows (up to 3, minInSync 2 of them), and never
    trimmed (a coordinator rebuilds its groups from the whole log)."""
    replicas = min(3, brokers)
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": KAFKA_OFFSETS_TOPIC, "namespace": "default"},
        "spec": {
            "clusterRef": {"name": CLUSTER_ID},
            "partitions": KAFKA_OFFSETS_PARTITIONS,
            "replicas": replicas,
            "minInSync": min(2, replicas),
            "retention": {"ms": -1, "bytes": -1},
            "tieredStorage": {"enabled": False},
        },
    }


def _apply_offsets_topic(controller_url: str, brokers: int) -> None:
    """Apply it, or say how to: without it Kafka groups have no coordinator (the cluster
    is still up; an ACL-protected controller may refuse this command's credentials)."""
    manifest = json.dumps(offsets_topic_manifest(brokers))
    try:
        _http("POST", f"{controller_url}/v1/apply", manifest.encode(), "application/yaml")
    except (ControllerRefusal, click.ClickException) as exc:
        click.echo(
            f"warning: the Topic {KAFKA_OFFSETS_TOPIC} was not applied ({exc.message}); Kafka"
            f" groups have no coordinator until it is: headrace apply -f <(echo '{manifest}')",
            err=True,
        )


def _report(
    record: Mapping[str, Any], directory: Path, count: int, controller_url: str, foreground: bool
) -> None:
    brokers = record["brokers"]
    bootstrap = ",".join(f"{b['host']}:{b['port']}" for b in brokers)
    kafka = ",".join(f"{b['host']}:{b['kafka_port']}" for b in brokers if "kafka_port" in b)
    store = (
        f"MinIO at {record['minio']['host']}:{record['minio']['port']}, bucket {MINIO_BUCKET}"
        if "minio" in record
        else str(directory / "objects")
    )
    click.echo(
        f"local cluster up: {count} brokers, controller {controller_url} (dashboard: {controller_url}/)\n"
        f"  bootstrap   {bootstrap}\n"
        + (f"  kafka       {kafka}\n" if kafka else "")
        + f"  objects     {store}\n  logs        {directory / 'logs'}\n",
        err=True,
    )
    click.echo(bootstrap)
    if foreground:
        click.echo("Ctrl-C to stop the cluster.", err=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            _down(directory)


def _down(directory: Path) -> None:
    state_file = directory / STATE_FILE
    if not state_file.exists():
        click.echo(f"no local cluster recorded in {directory}", err=True)
        return
    doc = json.loads(state_file.read_text())
    _stop([pid for pid in _pids(doc) if pid != doc.get("minio", {}).get("pid")])
    if "minio" in doc:  # last: brokers may be uploading on their way out
        _stop([doc["minio"]["pid"]])
    state_file.unlink()
    stopped = [str(b["id"]) for b in doc.get("brokers", []) if b.get("pid") is None]
    note = f" (broker {', '.join(stopped)} was already stopped)" if stopped else ""
    click.echo(f"local cluster stopped{note}", err=True)


def _pids(doc: Mapping[str, Any]) -> list[int]:
    """Every process a local.json records (controller, running brokers, MinIO).

    A broker that ``local stop`` stopped has no pid: its old one may belong to
    another process by now."""
    pids = [int(b["pid"]) for b in doc.get("brokers", []) if b.get("pid") is not None]
    if doc.get("controller_pid") is not None:
        pids.append(int(doc["controller_pid"]))
    if "minio" in doc:
        pids.append(int(doc["minio"]["pid"]))
    return pids


def _stop(pids: list[int], grace: float = 20.0) -> None:
    """SIGTERM each process group, then SIGKILL what is left after ``grace`` seconds."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while not all(_exited(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if not _exited(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


@local.command("down")
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
def local_down(directory: Path) -> None:
    """Stop the local cluster (SIGTERM, then SIGKILL after 20 s)."""
    _down(directory)


# ---------------------------------------------------------------------------- one broker


broker_dir_option = click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
kill_option = click.option(
    "--kill",
    is_flag=True,
    help="SIGKILL at once, as a crash would (default: drain, so the controller hands its"
    " leaderships over, then SIGTERM, then SIGKILL after 20 s).",
)


def _broker_record(directory: Path, broker_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(local.json, the entry of broker ``broker_id`` in it); one-line errors otherwise."""
    state_file = directory / STATE_FILE
    if not state_file.exists():
        raise click.ClickException(f"no local cluster recorded in {directory}")
    record = json.loads(state_file.read_text())
    for b in record.get("brokers", []):
        if b["id"] == broker_id:
            return record, b
    ids = ", ".join(str(b["id"]) for b in record.get("brokers", []))
    raise click.ClickException(f"no broker {broker_id} in the local cluster in {directory} ({ids})")


#: how long ``local stop`` waits for a broker's leadership to move away before it stops it
DRAIN_TIMEOUT_S = 15.0


def _stop_broker(directory: Path, broker_id: int, kill: bool) -> None:
    record, b = _broker_record(directory, broker_id)
    pid = b.get("pid")
    if pid is None:
        click.echo(f"broker {broker_id} is already stopped", err=True)
        return
    if alive(int(pid)):
        if kill:
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except OSError:
                pass
        else:
            # controlled shutdown: the controller moves its leadership away first
            from headrace.cli.drain import drain

            admin = f"http://{b['host']}:{b['admin_port']}"
            try:
                finished, _ = drain(admin, DRAIN_TIMEOUT_S, token=_replication_token(record))
            except (OSError, ValueError):
                finished = False  # not answering: stop it anyway
            if not finished:
                click.echo(f"broker {broker_id}: leadership not all moved away", err=True)
        _stop([int(pid)])
        how = "killed" if kill else "stopped"
        click.echo(f"broker {broker_id} {how} (pid {pid})", err=True)
    else:
        click.echo(f"broker {broker_id} had already exited (pid {pid})", err=True)
    b["pid"] = None
    _write_state(directory / STATE_FILE, record)


def _start_broker(directory: Path, broker_id: int, timeout: float = 30.0) -> None:
    record, b = _broker_record(directory, broker_id)
    pid = b.get("pid")
    if pid is not None and alive(int(pid)):
        raise click.ClickException(
            f"broker {broker_id} is running (pid {pid}); `headrace local restart {broker_id}`"
            " to restart it"
        )
    store_args, store_env = object_store_args(record, directory)
    acl_args, acl_env = access_args(record, directory)
    store_args, store_env = [*store_args, *acl_args], {**store_env, **acl_env}
    log_path = directory / "logs" / f"broker-{broker_id}.log"
    b["pid"] = spawn_headrace(
        [*broker_args(b, directory, record.get("fsync")), *store_args], log_path, store_env
    )
    _write_state(directory / STATE_FILE, record)  # so `local down` finds it from now on
    try:
        _wait_own(
            b["pid"],
            f"http://{b['host']}:{b['admin_port']}",
            f"broker {broker_id}",
            log_path,
            timeout,
        )
    except click.ClickException:
        _stop([b["pid"]])
        b["pid"] = None
        _write_state(directory / STATE_FILE, record)
        raise
    click.echo(f"broker {broker_id} started (pid {b['pid']})", err=True)


@local.command("stop")
@click.argument("broker_id", metavar="BROKER", type=int)
@broker_dir_option
@kill_option
def local_stop(broker_id: int, directory: Path, kill: bool) -> None:
    """Stop one broker of the local cluster; `local start` brings it back with its data.

    Without --kill the broker is drained first: the controller moves every partition it
    leads to another in-sync replica (at most 15 s), then it gets SIGTERM.

    `local status` then shows it as stopped, and `local down` knows it is."""
    _stop_broker(directory, broker_id, kill)


@local.command("start")
@click.argument("broker_id", metavar="BROKER", type=int)
@broker_dir_option
def local_start(broker_id: int, directory: Path) -> None:
    """Start a stopped (or crashed) broker again, with its data directory and addresses.

    Waits until it answers as itself; the controller then lets it catch up, and once it is
    back in sync leadership returns to it after the quiet period (preferred-leader
    rebalance)."""
    _start_broker(directory, broker_id)


@local.command("restart")
@click.argument("broker_id", metavar="BROKER", type=int)
@broker_dir_option
@kill_option
def local_restart(broker_id: int, directory: Path, kill: bool) -> None:
    """Stop one broker (if it runs) and start it again."""
    _stop_broker(directory, broker_id, kill)
    _start_broker(directory, broker_id)


@local.command("status")
@checked_dir_option
@click.option("--controller", "controller_url", default=None)
@click.option("--json", "as_json", is_flag=True)
def local_status(directory: Path, controller_url: str | None, as_json: bool) -> None:
    """Brokers, topics, leaders, epochs and live replica sets as the controller sees them."""
    doc = _http("GET", f"{_controller_url(controller_url, directory)}/v1/state")
    if as_json:
        doc["localBrokers"] = local_brokers(directory, doc.get("live", []))
        click.echo(json.dumps(doc, indent=2))
        return
    cluster = doc["cluster"]
    click.echo(
        f"generation {cluster['generation']}  live brokers {doc['live']}  adoption floor {doc['adoptionFloor']}"
    )
    for line in broker_lines(directory, doc.get("live", [])):
        click.echo(line)
    for topic in cluster.get("topics", []):
        click.echo(f"topic {topic['name']}  version {topic['partitioningVersion']}")
        for p in topic["partitions"]:
            moved = f"  moves {p['moves']} from {p.get('startOffset')}" if p.get("moves") else ""
            click.echo(
                f"  {p['partition']:>3}  leader {p.get('leader')}  epoch {p['leaderEpoch']}"
                f"  replicas {p['replicas']}  lrs {p['liveReplicas']}  {p['state']}"
                + moved
                + ("  SEALED" if p.get("seal") else "")
                + (f"  MOVING to {p['targetReplicas']}" if p.get("targetReplicas") else "")
            )
    for problem in doc.get("problems", []):
        click.echo(f"problem {problem['topic']}: {problem['reason']}: {problem['message']}")
    moving = doc.get("reassignment") or {}
    if doc.get("members") is not None or moving.get("moving") or moving.get("blocked"):
        click.echo(
            f"members {doc.get('members')}  moving {moving.get('moving', 0)}"
            f"  waiting {moving.get('waiting', 0)}"
            + (f"  leaving {moving['evacuating']}" if moving.get("evacuating") else "")
        )
        for why in moving.get("blocked", []):
            click.echo(f"  blocked: {why}")
    for line in unload_lines(doc.get("unloads", [])):
        click.echo(line)
    for line in transition_lines(doc.get("transitions", []), doc.get("repartitions", [])):
        click.echo(line)


def transition_lines(
    transitions: list[dict[str, Any]], repartitions: list[dict[str, Any]]
) -> list[str]:
    """``local status`` lines of the repartitions: each transition in flight with its
    phase, then each Repartition's phase (Finalized ones say how)."""
    lines = []
    for t in transitions:
        released = {r["cohort"]: len(r["partitions"]) for r in t.get("released", [])}
        held = ", ".join(f"{c} {n}/{t['toPartitions']}" for c, n in sorted(released.items()))
        lines.append(
            f"transition {t['topic']}  {t['fromPartitions']} -> {t['toPartitions']} partitions"
            f"  version {t['fromVersion']} -> {t['toVersion']}  {t['phase']}"
            f"  adoption generation {_or_dash(t.get('adoptionGeneration'))}"
            f"  cutover offsets {len(t.get('cutoverOffsets', []))}/{t['fromPartitions']}"
            + (f"  released {held}" if held else "")
            + f"  ({t['request']})"
        )
    for r in repartitions:
        meta, spec, status = r["metadata"], r["spec"], r.get("status") or {}
        ready = next(
            (c for c in status.get("conditions", []) if c.get("type") == "Ready"), {"message": ""}
        )
        by = f"  by {status['finalizedBy']}" if status.get("finalizedBy") else ""
        lines.append(
            f"repartition {meta.get('namespace', 'default')}/{meta['name']}  topic"
            f" {spec['topicRef']['name']}  -> {spec['partitions']}"
            f"  {status.get('phase', 'Pending')}{by}"
            + (f"  {ready['message']}" if ready.get("message") else "")
        )
    return lines


def local_brokers(directory: Path, live: list[int]) -> list[dict[str, Any]]:
    """The brokers ``local.json`` records: id, address, process and liveness.

    ``process`` is ``running``, ``stopped`` (by ``local stop``) or ``exited`` (gone
    without it: killed, crashed); ``local start`` brings back either of the last two."""
    state = directory / STATE_FILE
    if not state.exists():
        return []
    brokers = []
    for b in json.loads(state.read_text()).get("brokers", []):
        pid = b.get("pid")
        process = "stopped" if pid is None else "running" if alive(int(pid)) else "exited"
        brokers.append(
            {
                "id": b["id"],
                "address": f"{b['host']}:{b['port']}",
                "kafka": f"{b['host']}:{b['kafka_port']}" if "kafka_port" in b else None,
                "process": process,
                "pid": pid,
                "live": b["id"] in live,
            }
        )
    return brokers


def broker_lines(directory: Path, live: list[int]) -> list[str]:
    """``local status`` lines of the brokers (``local_brokers``)."""
    lines = []
    brokers = local_brokers(directory, live)
    for b in brokers:
        process = b["process"] if b["pid"] is None else f"{b['process']} (pid {b['pid']})"
        seen = "live" if b["live"] else "not live"
        kafka = f"  kafka {b['kafka']}" if b["kafka"] else ""
        lines.append(f"broker {b['id']}  {b['address']}{kafka}  {process}  {seen}")
    kafka_bootstrap = ",".join(b["kafka"] for b in brokers if b["kafka"])
    if kafka_bootstrap:
        lines.append(f"kafka bootstrap {kafka_bootstrap}")
    return lines


def unload_lines(unloads: list[dict[str, Any]]) -> list[str]:
    """``local status`` lines of the Unloads: phase, then each move's phase, from -> to,
    sealed offset and recovery."""
    lines = []
    for u in unloads:
        meta, spec, status = u["metadata"], u["spec"], u.get("status") or {}
        ready = next(
            (c for c in status.get("conditions", []) if c.get("type") == "Ready"), {"message": ""}
        )
        target = spec.get("targetBroker")
        head = (
            f"unload {meta.get('namespace', 'default')}/{meta['name']}  topic"
            f" {spec['topicRef']['name']}  {status.get('phase', 'Pending')}"
            + (f"  target {target}" if target is not None else "")
            + ("  (deleting)" if meta.get("deletionTimestamp") else "")
        )
        lines.append(head + (f"  {ready['message']}" if ready.get("message") else ""))
        for m in status.get("moves", []):
            arrow = f"{_or_dash(m.get('fromBroker'))} -> {_or_dash(m.get('toBroker'))}"
            line = (
                f"  {m['partition']:>3}  {m.get('phase', 'Pending'):<9}  {arrow}"
                f"  sealed {_or_dash(m.get('sealedOffset'))}"
            )
            verification = m.get("verification")
            if verification:
                line += f"  verified {verification['result']}"
            recovery = m.get("recovery")
            if recovery:
                line += f"  recovery {recovery['source']}: {recovery.get('message', '')}"
            elif m.get("message"):
                line += f"  ({m['message']})"
            lines.append(line)
    return lines


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------------- apply / delete


#: ``delete -f`` exit status when something it names did not exist (all that did is deleted)
EXIT_NOT_FOUND = 3

#: what ``headrace local`` runs; ``apply -f`` skips other kinds with a note
LOCAL_KINDS = ("Topic", "Unload", "Repartition")
#: run by ``apply`` itself, against the local cluster's object store (``cli.snapshots``)
SNAPSHOT_KINDS = ("TopicSnapshot", "TopicRestore")


class SnapshotKinds(Protocol):
    """What ``apply -f`` and ``delete -f`` do with ``SNAPSHOT_KINDS``."""

    def apply(self, resources: list[Any], directory: Path) -> None: ...

    def delete(self, directory: Path, namespace: str, name: str) -> None: ...


#: set by ``cli.snapshots.register``: those handlers use the jobs' object-store helpers,
#: which use this module, so this module cannot import them
snapshot_kinds: SnapshotKinds | None = None


def _snapshot_kinds() -> SnapshotKinds:
    if snapshot_kinds is None:
        raise click.ClickException("TopicSnapshot and TopicRestore are not available here")
    return snapshot_kinds


@click.command()
@click.option(
    "-f",
    "--filename",
    "paths",
    multiple=True,
    required=True,
    help="File, directory (its *.yaml, *.yml and *.json files, sorted, not recursive) or -"
    " (stdin). Repeatable.",
)
@checked_dir_option
@click.option(
    "--controller", "controller_url", default=None, help="Controller URL (default from local up)."
)
@click.option(
    "--allow-problems",
    is_flag=True,
    help="Apply a spec the cluster cannot honour (replicas above the broker count, another"
    " clusterRef, a partition-count change, cleanupPolicy compact) with a warning, instead of"
    " refusing it.",
)
def apply(
    paths: tuple[str, ...], directory: Path, controller_url: str | None, allow_problems: bool
) -> None:
    """Apply Topic, Unload and Repartition manifests (the same YAML as for kubectl apply).

    All or nothing: every manifest is validated, and checked against the cluster (its
    name, its broker count, the topics it has), before any is applied. A problem is
    printed as one line and the exit status is 1, unless --allow-problems makes it a
    warning. A Repartition of a missing topic, to the count it has, or of a topic
    mid-Unload is refused. TopicSnapshots and TopicRestores run in this process, after
    the rest is applied (their status is printed, not kept). Kinds local mode does not
    run (BrokerCluster, Compaction, ...) are skipped with a note."""
    from headrace.cli.manifests import manifests_to_apply
    from headrace.resources import ManifestError

    try:
        # field-level errors before anything is sent; stdin is read here, once
        resources = manifests_to_apply(paths, stdin=sys.stdin)
    except ManifestError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from exc
    kept = []
    snapshots = []
    for resource in resources:
        if resource.kind in LOCAL_KINDS:
            kept.append(resource)
        elif resource.kind in SNAPSHOT_KINDS:
            snapshots.append(resource)  # run here, after the Topics they name are applied
        else:
            click.echo(
                f"skipping {resource.kind} {resource.key.namespace}/{resource.key.name}:"
                f" local mode runs {', '.join(k + 's' for k in LOCAL_KINDS + SNAPSHOT_KINDS)}"
                " only",
                err=True,
            )
    url = _controller_url(controller_url, directory)  # refuses another cluster's controller
    if not kept:
        if snapshots:
            _snapshot_kinds().apply(snapshots, directory)
        else:
            click.echo("nothing to apply", err=True)
        return
    text = "\n---\n".join(json.dumps(_sendable(r)) for r in kept)
    query = "?allowProblems=true" if allow_problems else ""
    try:
        result = _http(
            "POST",
            f"{url}/v1/apply{query}",
            text.encode(),
            "application/yaml",
        )
    except ControllerRefusal as exc:
        for line in exc.doc.get("problems") or [exc.message]:
            click.echo(f"error: {line}", err=True)
        if exc.doc.get("problems"):
            click.echo("nothing applied (--allow-problems applies it anyway)", err=True)
        raise SystemExit(1) from exc
    for line in result.get("warnings", []):
        click.echo(f"warning: {line}", err=True)
    for item in result["applied"]:
        click.echo(f"{item['kind'].lower()} {item['name']} {item['result']}")
    _snapshot_kinds().apply(snapshots, directory)


def _sendable(resource: Any) -> dict[str, Any]:
    doc = dict(resource.to_manifest())
    doc.pop("status", None)
    return doc


@click.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True)
@checked_dir_option
@click.option("--controller", "controller_url", default=None)
@click.option(
    "--ignore-not-found",
    is_flag=True,
    help=f"Exit 0 when something named does not exist (default: exit {EXIT_NOT_FOUND}).",
)
def delete(
    paths: tuple[str, ...], directory: Path, controller_url: str | None, ignore_not_found: bool
) -> None:
    """Delete the Topics, Unloads and Repartitions the manifests name.

    A Repartition deleted after its cutover rolls forward: the transition finishes
    (the topic's status carries it) and only the record of it goes.
    An Unload whose moves are in flight is deleted once they finish; its moves
    that have not started are cancelled. What does not exist is named on stderr
    and, after everything that does exist is deleted, the exit status is 3
    (0 with --ignore-not-found)."""
    from headrace.cli.manifests import manifests_to_delete
    from headrace.resources import ManifestError

    try:
        keys = manifests_to_delete(paths, stdin=sys.stdin)
    except ManifestError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from exc
    for key in keys:
        if key.kind == "TopicSnapshot":
            _snapshot_kinds().delete(directory, key.namespace, key.name)
        elif key.kind == "TopicRestore":
            click.echo(f"topicrestore {key.namespace}/{key.name} deleted (its topic stays)")
        elif key.kind not in LOCAL_KINDS:
            click.echo(
                f"skipping {key.kind} {key.namespace}/{key.name}: local mode runs Topics,"
                " Unloads, Repartitions, TopicSnapshots and TopicRestores only",
                err=True,
            )
    topics = [f"{k.namespace}/{k.name}" for k in keys if k.kind == "Topic"]
    unloads = [f"{k.namespace}/{k.name}" for k in keys if k.kind == "Unload"]
    repartitions = [f"{k.namespace}/{k.name}" for k in keys if k.kind == "Repartition"]
    result = _http(
        "POST",
        f"{_controller_url(controller_url, directory)}/v1/delete",
        json.dumps({"topics": topics, "unloads": unloads, "repartitions": repartitions}).encode(),
    )
    for name in result.get("repartitions", []):
        click.echo(f"repartition {name} deleted")
    for name in result["unloads"]["deleted"]:
        click.echo(f"unload {name} deleted")
    for name in result["unloads"]["deferred"]:
        click.echo(f"unload {name} will be deleted when its moves in flight finish")
    for name in result["deleted"]:
        click.echo(f"topic {name} deleted")
    missing = [f"topic {n}" for n in topics if n not in result["deleted"]]
    found = set(result["unloads"]["deleted"]) | set(result["unloads"]["deferred"])
    missing += [f"unload {n}" for n in unloads if n not in found]
    missing += [f"repartition {n}" for n in repartitions if n not in result.get("repartitions", [])]
    for what in missing:
        click.echo(f"{what} not found", err=True)
    if missing and not ignore_not_found:
        raise SystemExit(EXIT_NOT_FOUND)
