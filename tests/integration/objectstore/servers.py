"""Building and locating the MinIO binary for the integration tests.

``tools/minio/build.sh`` builds it from its Go module (idempotent; minutes only
the first time on a machine). ``HEADRACE_MINIO_BIN`` points at an existing
binary instead.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "tools" / "minio" / "build.sh"

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
    override = os.environ.get("HEADRACE_MINIO_BIN")
    if override:
        return Path(override)
    start = time.monotonic()
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    took = time.monotonic() - start
    if took > 5:
        print(f"\n[objectstore] minio build took {took:.0f} s", file=sys.stderr)
    return Path(out.stdout.strip().splitlines()[-1])


def minio_binary() -> Path:
    """The MinIO server binary; the test fails if it could not be built."""
    global _binary
    if _build_error is not None:
        pytest.fail(_build_error)
    if _binary is None:
        _binary = _build()
    return _binary


def new_bucket() -> str:
    return "test-" + secrets.token_hex(6)
