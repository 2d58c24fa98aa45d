"""``headrace local up --object-store minio``: start a real MinIO server for the cluster.

The binary is ``$HEADRACE_MINIO_BIN`` or the one ``tools/minio/build.sh`` builds. It
listens on a free loopback port with data in ``<dir>/minio`` and fresh root
credentials, which reach the brokers in their environment, never on a command line
(``ps`` shows command lines to every user).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import click

from headrace.cli.processes import alive, spawn, stop_processes

MINIO_BUCKET = "headrace"
#: operator/headrace/cli/minio_launcher.py -> the repository (an editable install) holds tools/
_BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "minio" / "build.sh"


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
    from headrace.objectstore.minio_store import MinioSettings, MinioStore
    from headrace.transports import free_port

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
    pid = spawn(
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
                    stop_processes([pid])
                    raise click.ClickException(
                        f"MinIO not ready after {timeout:.0f}s ({exc}); see {log_path}"
                    ) from exc
                time.sleep(0.1)
    finally:
        store.close()
