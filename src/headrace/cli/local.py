"""Local mode: ``headrace controller``, ``local up|status|down``, ``apply|delete -f``.

``local up`` starts one controller and N cluster-mode brokers as processes,
broker i on its own loopback address 127.0.0.(2+i) with the same ports, as
pods would have. Their pids, addresses and log files are recorded in
``<dir>/local.json`` so ``status`` and ``down`` find them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from headrace.cli.running import run

DEFAULT_DIR = Path("var/local")
STATE_FILE = "local.json"


def _http(
    method: str, url: str, body: bytes | None = None, content_type: str = "application/json"
) -> Any:
    req = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        try:
            message = json.loads(detail).get("message", detail)
        except (ValueError, AttributeError):
            message = detail
        raise click.ClickException(f"{exc.code} from {url}: {message}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc


def _controller_url(explicit: str | None, directory: Path) -> str:
    if explicit:
        return explicit.rstrip("/")
    env = os.environ.get("HEADRACE_CONTROLLER")
    if env:
        return env.rstrip("/")
    state = directory / STATE_FILE
    if state.exists():
        return str(json.loads(state.read_text())["controller_url"])
    return "http://127.0.0.1:9700"


# ---------------------------------------------------------------------------- controller


@click.command()
@click.option("--state-dir", type=click.Path(path_type=Path), required=True)
@click.option(
    "--broker", "brokers", multiple=True, required=True, help="ID=HOST:ADMIN_PORT (repeatable)."
)
@click.option("--admin-host", default="127.0.0.1", show_default=True)
@click.option("--admin-port", type=int, default=9700, show_default=True)
@click.option("--poll-interval-ms", type=int, default=1000, show_default=True)
@click.option("--cluster-id", default="local", show_default=True)
def controller(
    state_dir: Path,
    brokers: tuple[str, ...],
    admin_host: str,
    admin_port: int,
    poll_interval_ms: int,
    cluster_id: str,
) -> None:
    """Run the local-mode controller."""
    import logging

    from headrace.controller.admin import ControllerAdmin
    from headrace.controller.controlling import BrokerEndpoint, Controller, ControllerSettings

    endpoints = []
    for item in brokers:
        ident, sep, address = item.partition("=")
        host, sep2, port = address.rpartition(":")
        if not (sep and sep2 and ident.isdigit() and port.isdigit()):
            raise click.BadParameter(
                f"{item!r}: expected ID=HOST:ADMIN_PORT", param_hint="--broker"
            )
        endpoints.append(BrokerEndpoint(int(ident), host, int(port)))
    settings = ControllerSettings(
        state_dir=state_dir,
        brokers=tuple(endpoints),
        cluster_id=cluster_id,
        poll_interval_ms=poll_interval_ms,
        admin_host=admin_host,
        admin_port=admin_port,
    )
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
        await stop.wait()
        await c.stop()
        await admin.stop()

    run(serve())


# ---------------------------------------------------------------------------- local up / status / down


@click.group()
def local() -> None:
    """A local cluster of processes: one controller, N brokers on 127.0.0.x."""


def spawn_headrace(args: list[str], log_path: Path) -> int:
    """Start `headrace ARGS...` detached (own session), appending its output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "headrace.cli.main", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


def _wait_http(url: str, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise click.ClickException(f"{what} did not become ready in {timeout:.0f}s ({url})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@local.command("up")
@click.option("--brokers", "count", type=int, default=3, show_default=True)
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
@click.option(
    "--port", type=int, default=9092, show_default=True, help="Data port of every broker."
)
@click.option(
    "--admin-port", type=int, default=9644, show_default=True, help="Admin port of every broker."
)
@click.option("--controller-port", type=int, default=9700, show_default=True)
@click.option(
    "--fsync",
    type=click.Choice(["none", "interval", "always"]),
    default="interval",
    show_default=True,
)
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C brings the cluster down.")
def local_up(
    count: int,
    directory: Path,
    port: int,
    admin_port: int,
    controller_port: int,
    fsync: str,
    foreground: bool,
) -> None:
    """Start the controller and COUNT brokers."""
    if not 1 <= count <= 9:
        raise click.BadParameter("between 1 and 9 brokers", param_hint="--brokers")
    state_file = directory / STATE_FILE
    if state_file.exists():
        existing = json.loads(state_file.read_text())
        if any(_alive(b["pid"]) for b in existing["brokers"]) or _alive(existing["controller_pid"]):
            raise click.ClickException(
                f"a local cluster is already running from {directory}; `headrace local down` first"
            )
    brokers = []
    for i in range(count):
        host = f"127.0.0.{2 + i}"
        pid = spawn_headrace(
            [
                "broker",
                "--cluster",
                "--broker-id",
                str(i),
                "--host",
                host,
                "--port",
                str(port),
                "--admin-host",
                host,
                "--admin-port",
                str(admin_port),
                "--data-dir",
                str(directory / f"broker-{i}"),
                "--fsync",
                fsync,
            ],
            directory / "logs" / f"broker-{i}.log",
        )
        brokers.append({"id": i, "host": host, "port": port, "admin_port": admin_port, "pid": pid})
    controller_pid = spawn_headrace(
        [
            "controller",
            "--state-dir",
            str(directory / "controller"),
            "--admin-port",
            str(controller_port),
            *[
                arg
                for b in brokers
                for arg in ("--broker", f"{b['id']}={b['host']}:{b['admin_port']}")
            ],
        ],
        directory / "logs" / "controller.log",
    )
    controller_url = f"http://127.0.0.1:{controller_port}"
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(
        json.dumps(
            {
                "controller_url": controller_url,
                "controller_pid": controller_pid,
                "brokers": brokers,
            },
            indent=2,
        )
    )
    for b in brokers:
        _wait_http(f"http://{b['host']}:{b['admin_port']}/readyz", 30, f"broker {b['id']}")
    _wait_http(f"{controller_url}/healthz", 30, "controller")
    bootstrap = ",".join(f"{b['host']}:{b['port']}" for b in brokers)
    click.echo(
        f"local cluster up: {count} brokers, controller {controller_url} (status page: {controller_url}/)\n"
        f"  bootstrap   {bootstrap}\n  logs        {directory / 'logs'}\n",
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
    pids = [doc["controller_pid"], *(b["pid"] for b in doc["brokers"])]
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    state_file.unlink()
    click.echo("local cluster stopped", err=True)


@local.command("down")
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
def local_down(directory: Path) -> None:
    """Stop the local cluster (SIGTERM, then SIGKILL after 20 s)."""
    _down(directory)


@local.command("status")
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
@click.option("--controller", "controller_url", default=None)
@click.option("--json", "as_json", is_flag=True)
def local_status(directory: Path, controller_url: str | None, as_json: bool) -> None:
    """Brokers, topics, leaders, epochs and live replica sets as the controller sees them."""
    doc = _http("GET", f"{_controller_url(controller_url, directory)}/v1/state")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    cluster = doc["cluster"]
    click.echo(
        f"generation {cluster['generation']}  live brokers {doc['live']}  adoption floor {doc['adoptionFloor']}"
    )
    for topic in cluster.get("topics", []):
        click.echo(f"topic {topic['name']}  version {topic['partitioningVersion']}")
        for p in topic["partitions"]:
            click.echo(
                f"  {p['partition']:>3}  leader {p.get('leader')}  epoch {p['leaderEpoch']}"
                f"  replicas {p['replicas']}  lrs {p['liveReplicas']}  {p['state']}"
            )
    for problem in doc.get("problems", []):
        click.echo(f"problem {problem['topic']}: {problem['reason']}: {problem['message']}")


# ---------------------------------------------------------------------------- apply / delete


@click.command()
@click.option(
    "-f", "--filename", "paths", multiple=True, required=True, help="File, directory or - (stdin)."
)
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
@click.option(
    "--controller", "controller_url", default=None, help="Controller URL (default from local up)."
)
def apply(paths: tuple[str, ...], directory: Path, controller_url: str | None) -> None:
    """Apply Topic manifests (the same YAML that goes to kubectl apply)."""
    from headrace.cli.manifests import manifests_to_apply, read_manifests
    from headrace.resources import ManifestError

    try:
        manifests_to_apply(paths, stdin=sys.stdin)  # field-level errors before anything is sent
    except ManifestError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from exc
    text = (
        "\n---\n".join(t for _, t in read_manifests(paths, stdin=sys.stdin))
        if "-" not in paths
        else None
    )
    if text is None:
        raise click.ClickException("apply -f - is read once; pass a file")
    result = _http(
        "POST",
        f"{_controller_url(controller_url, directory)}/v1/apply",
        text.encode(),
        "application/yaml",
    )
    for name in result["applied"]:
        click.echo(f"topic {name} applied")


@click.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True)
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
@click.option("--controller", "controller_url", default=None)
def delete(paths: tuple[str, ...], directory: Path, controller_url: str | None) -> None:
    """Delete the Topics the manifests name."""
    from headrace.cli.manifests import manifests_to_delete
    from headrace.resources import ManifestError

    try:
        keys = manifests_to_delete(paths, stdin=sys.stdin)
    except ManifestError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from exc
    names = [f"{k.namespace}/{k.name}" for k in keys if k.kind == "Topic"]
    result = _http(
        "POST",
        f"{_controller_url(controller_url, directory)}/v1/delete",
        json.dumps({"topics": names}).encode(),
    )
    for name in result["deleted"]:
        click.echo(f"topic {name} deleted")
