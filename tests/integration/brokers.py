"""Real broker processes for integration tests: start, kill -9, restart, clean up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class BrokerProcess:
    data_dir: Path
    fsync: str = "interval"
    #: "standalone", or "cluster" (then broker_id matters and a topology must be pushed)
    mode: str = "standalone"
    broker_id: int = 0
    extra_args: list[str] = field(default_factory=list)
    #: extra environment (object-store credentials, say)
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, *, wait: bool = True, timeout: float = 30.0) -> None:
        self.log_path = self.data_dir.parent / f"broker-{self.port}.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        cmd = [
            sys.executable,
            "-m",
            "headrace.cli.main",
            "broker",
            f"--{self.mode}",
            "--broker-id",
            str(self.broker_id),
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            "--fsync",
            self.fsync,
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **self.env} if self.env else None,
        )
        log.close()
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(f"{self.admin_url}/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return dict(json.loads(resp.read()))
            time.sleep(0.05)
        raise TimeoutError(f"broker not ready in {timeout}s: {self.log_tail()}")

    def get_json(self, path: str) -> dict[str, object]:
        with urllib.request.urlopen(f"{self.admin_url}{path}", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def post_json(self, path: str, doc: object) -> dict[str, object]:
        req = urllib.request.Request(
            f"{self.admin_url}{path}",
            data=json.dumps(doc).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def pause(self) -> None:
        """SIGSTOP: the process is alive but silent (a network partition, from outside)."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def restart(self, *, crash: bool) -> None:
        if crash:
            self.kill9()
        else:
            self.stop()
        self.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n:]
