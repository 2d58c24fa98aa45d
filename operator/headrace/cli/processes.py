"""The local cluster's process supervisor: start detached processes, tell whether one
lives, wait until one answers as itself, stop process groups.

Ports are shared by every local cluster on the machine, so a process that answers
on an address may be another cluster's: ``wait_until_serving`` waits for the pid it
started, and fails fast when that process exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click


def spawn_headrace(args: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> int:
    """Start `headrace ARGS...` detached (own session), appending its output to ``log_path``.

    ``env``: variables added to this process's environment (secrets go here, never in ARGS).
    """
    return spawn([sys.executable, "-m", "headrace.cli.main", *args], log_path, env)


def spawn(argv: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> int:
    """Start ``argv`` detached; its pid. ``exited`` reaps it (it is our child)."""
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


def exited(pid: int) -> bool:
    """Whether ``pid`` has ended; reaps it if it is our child (a zombie is still ``alive``)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return not alive(pid)
    return done != 0


def stop_processes(pids: list[int], grace: float = 20.0) -> None:
    """SIGTERM each process group, then SIGKILL what is left after ``grace`` seconds."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while not all(exited(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if not exited(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


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


def wait_until_serving(pid: int, url: str, what: str, log_path: Path, timeout: float) -> None:
    """Wait until process ``pid`` itself answers ``/healthz`` and ``/readyz`` at ``url``.

    Fails at once when ``pid`` exits (naming the log's last line, e.g. ``address already
    in use``), or after ``timeout`` seconds, naming another process that answers there."""
    deadline = time.monotonic() + timeout
    other = None
    while True:
        if exited(pid):
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
