"""Start and stop a real MinIO server process for the tests and the bench.

The binary comes from ``tools/minio/build.sh`` (built from MinIO's Go module).
``MinioServer`` runs ``minio server <data dir>`` on free loopback ports with
freshly generated root credentials, waits for ``/minio/health/live`` and a
first successful request, and stops it with SIGTERM, then SIGKILL. ``stop`` followed
by ``start`` brings it back on the same ports and data, which is how tests simulate an
outage. (``headrace local up --object-store minio`` starts a MinIO of its own, detached
from the command: ``headrace.cli.local``.)
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from headrace.objectstore.errors import ObjectStoreUnavailable
from headrace.objectstore.minio_store import MinioSettings, MinioStore
from headrace.transports import free_port


class MinioServerError(RuntimeError):
    """The server process would not start or become ready."""


class MinioServer:
    def __init__(
        self,
        binary: Path,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        console_port: int = 0,
        access_key: str | None = None,
        secret_key: str | None = None,
        log_path: Path | None = None,
    ) -> None:
        """Ports 0 mean "pick free ones"; they are kept across restarts."""
        self.binary = Path(binary)
        self.data_dir = Path(data_dir)
        self.host = host
        self._pick_ports = not (port or console_port)
        self.port = port or free_port(host)
        self.console_port = console_port or self._other_free_port()
        self.access_key = access_key or "headrace-" + secrets.token_hex(4)
        self.secret_key = secret_key or secrets.token_urlsafe(24)
        self.log_path = log_path or self.data_dir.with_name(self.data_dir.name + ".log")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``host:port`` of the S3 API."""
        return f"{self.host}:{self.port}"

    def settings(self, bucket: str, **overrides: Any) -> MinioSettings:
        """Client settings for a bucket on this server (created on first use);
        ``overrides`` replace any ``MinioSettings`` field."""
        base = MinioSettings(
            endpoint=self.endpoint,
            bucket=bucket,
            access_key=self.access_key,
            secret_key=self.secret_key,
            create_bucket=True,
        )
        return dataclasses.replace(base, **overrides)

    @property
    def pid(self) -> int | None:
        """The server process while it runs (the bench charges its CPU to MinIO)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _other_free_port(self) -> int:
        while (p := free_port(self.host)) == self.port:
            pass
        return p

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it serves requests.

        Free ports picked by us can be taken by another process before the
        server binds them; on the first start that means new ports and another
        try. On a restart the ports stay (clients know them), so it is an error.
        """
        if self.running:
            return
        for _ in range(3):
            log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start(timeout)
                self._pick_ports = False
                return
            except MinioServerError:
                taken = b"already in use" in self.log_path.read_bytes()[log_from:].lower()
                if not (taken and self._pick_ports):
                    raise
                self.port = free_port(self.host)
                self.console_port = self._other_free_port()
        raise MinioServerError(f"no free ports for minio; see {self.log_path}")

    def _start(self, timeout: float) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            # No update checks or phoning home from a test server.
            "MINIO_UPDATE": "off",
            "MINIO_CALLHOME_ENABLE": "off",
        }
        self._log = self.log_path.open("ab")
        argv = [
            str(self.binary),
            "server",
            str(self.data_dir),
            "--address",
            self.endpoint,
            "--console-address",
            f"{self.host}:{self.console_port}",
            "--quiet",
        ]
        try:
            self._proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
            )
        except OSError as exc:
            self._close_log()
            raise MinioServerError(f"cannot run {self.binary}: {exc}") from exc
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until the process is live and its object layer serves requests.

        ``/minio/health/live`` (and even ``ready``) answer as soon as the HTTP
        listener is up; a request in the moment after that can still meet
        "server not initialized". So after ``live`` an authenticated request
        must succeed too.
        """
        deadline = time.monotonic() + timeout
        url = f"http://{self.endpoint}/minio/health/live"
        client = MinioStore(
            self.settings("readiness-probe", create_bucket=False, connect_timeout=1.0)
        )
        try:
            while not (self._probe(url) and self._ping(client)):
                if self._proc is None or self._proc.poll() is not None:
                    raise MinioServerError(f"minio exited during start-up; see {self.log_path}")
                if time.monotonic() > deadline:
                    raise MinioServerError(
                        f"minio not ready after {timeout} s; see {self.log_path}"
                    )
                time.sleep(0.05)
        finally:
            client.close()

    @staticmethod
    def _probe(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @staticmethod
    def _ping(client: MinioStore) -> bool:
        try:
            client.ping()
        except ObjectStoreUnavailable:
            return False
        return True

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_log()

    def kill(self) -> None:
        """SIGKILL at once: a crash rather than a shutdown."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> MinioServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
