"""Building, locating and running the Kafka peers of ``test_kafka_peers.py``: Kafka's own
Java client and tools (jars from Maven Central), a franz-go program (Go module proxy) and
kcat (Debian); and of ``test_kafka_spark.py``: Spark's Kafka connector (Maven Central).

``peers/build.sh`` builds them into ``~/.cache/headrace`` (idempotent: the first run on a
machine fetches, later ones find them). A peer that cannot be built fails its tests with the
build's output, unless the registry it comes from cannot be reached at all: then its tests
skip and say which registry. Nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
BUILD = PEERS / "build.sh"

#: where each peer comes from: a registry host, asked only when a build failed
REGISTRY = {
    "java": ("repo.maven.apache.org", 443),
    "franzgo": ("proxy.golang.org", 443),
    "kcat": ("deb.debian.org", 80),
    "spark": ("repo.maven.apache.org", 443),
}

#: a JVM for a command-line tool: quick start, small heap, one GC thread (two shared cores)
JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m", "-Xss1m"]


@dataclass(frozen=True)
class Built:
    """One peer's build: the ``name=path`` lines build.sh printed, or why it failed."""

    paths: dict[str, str]
    error: str | None = None


_built: dict[str, Built] = {}


def _registry_unreachable(peer: str) -> str | None:
    host, port = REGISTRY[peer]
    try:
        with socket.create_connection((host, port), timeout=5):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc}"


def build(peer: str) -> Built:
    """Build ``peer`` (java, franzgo, kcat, spark) once per session; keeps a failure for the tests."""
    if peer in _built:
        return _built[peer]
    start = time.monotonic()
    run = subprocess.run(
        ["bash", str(BUILD), peer],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    took = time.monotonic() - start
    if took > 5:
        print(f"\n[kafka peers] building {peer} took {took:.0f} s\n{run.stderr}", file=sys.stderr)
    if run.returncode != 0:
        built = Built({}, f"building {peer} failed (exit {run.returncode}):\n{run.stderr[-4000:]}")
    else:
        lines = (line.partition("=") for line in run.stdout.splitlines() if "=" in line)
        built = Built({name: path for name, _, path in lines})
    _built[peer] = built
    return built


def require(peer: str) -> dict[str, str]:
    """The peer's paths; fails the test if it could not be built, skips it (with the reason)
    only if the registry it comes from is unreachable."""
    built = build(peer)
    if built.error is None:
        return built.paths
    unreachable = _registry_unreachable(peer)
    if unreachable is not None:
        pytest.skip(f"{peer}: its registry is unreachable ({unreachable}); {built.error}")
    pytest.fail(built.error)


def build_before_tests_in(peers_of: dict[Path, tuple[str, ...]], session: pytest.Session) -> None:
    """The body of a ``pytest_collection_finish`` hook: build the peers of each test file
    (``peers_of``) the session runs tests from, with the output shown, before any per-test
    timeout counts."""
    if session.config.option.collectonly:
        return
    files = {Path(str(item.path)) for item in session.items}
    wanted = [peer for file, peers in peers_of.items() if file in files for peer in peers]
    if not wanted:
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        for peer in dict.fromkeys(wanted):
            build(peer)


def java_command(main: str, *args: str) -> list[str]:
    """``java`` running ``main`` (a class, or a ``.java`` source file) with Kafka's jars."""
    libs = require("java")["kafka_libs"]
    java = shutil.which("java")
    if java is None:
        pytest.fail("java is not installed (.ci/run installs openjdk-17-jre-headless)")
    log_config = PEERS / "java" / "log4j2.properties"
    return [
        java,
        *JVM_FLAGS,
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def run(
    argv: list[str], timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a peer to completion; a failure, with both streams, unless it exits 0."""
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"{Path(argv[0]).name} {' '.join(argv[-6:])} exited {done.returncode}\n"
            f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
        )
    return done
