"""Building and locating the MinIO binary for the integration tests.

``tools/minio/build.sh`` builds it from its Go module (idempotent; minutes only
the first time on a machine). ``HEADRACE_MINIO_BIN`` points at an existing
binary instead. The bench and these tests share the locator, ``headrace.testing.procs.minio_binary``.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrace.testing import procs

_binary: Path | None = None
_build_error: str | None = None


def build() -> None:
    """Build the binary now (from ``pytest_collection_finish``); failures are kept
    and reported by the tests that need the server, so the rest of the run goes on."""
    global _binary, _build_error
    try:
        _binary = _build()
    except (OSError, subprocess.CalledProcessError) as exc:
        _build_error = f"building minio failed ({exc}); see the output above"


def _build() -> Path:
    start = time.monotonic()
    binary = procs.minio_binary()
    took = time.monotonic() - start
    if took > 5:
        print(f"\n[objectstore] minio build took {took:.0f} s", file=sys.stderr)
    return binary


def minio_binary() -> Path:
    """The MinIO server binary; the test fails if it could not be built."""
    global _binary
    if _build_error is not None:
        pytest.fail(_build_error)
    if _binary is None:
        _binary = _build()
    return _binary


def build_before_tests_in(here: Path, session: pytest.Session) -> None:
    """The body of a ``pytest_collection_finish`` hook: build the binary if the session
    runs tests under ``here``, with the build's progress shown (a cold build is silent
    for minutes otherwise), before any per-test timeout starts counting."""
    wants = any(Path(str(item.path)).is_relative_to(here) for item in session.items)
    if not wants or session.config.option.collectonly:
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        build()


def new_bucket() -> str:
    return "test-" + secrets.token_hex(6)
