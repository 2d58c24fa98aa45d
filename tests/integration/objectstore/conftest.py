"""One real MinIO server per test session, and the stores the contract runs against.

The MinIO binary is built from its Go module by ``tools/minio/build.sh``
(idempotent; minutes only the first time on a machine). The build runs in
``pytest_collection_finish``, not in a fixture, so that a cold build is not
counted against the per-test timeout. ``HEADRACE_MINIO_BIN`` points at an
existing binary instead. No S3 mock: without a server these tests error.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.objectstore import directory, interface, minio_server, minio_store

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BUILD_SCRIPT = REPO / "tools" / "minio" / "build.sh"

_binary: Path | None = None
_build_error: str | None = None


def build_minio() -> Path:
    """The MinIO server binary, built if missing (idempotent)."""
    override = os.environ.get("HEADRACE_MINIO_BIN")
    if override:
        return Path(override)
    start = time.monotonic()
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    took = time.monotonic() - start
    if took > 5:
        print(f"\n[objectstore] minio build took {took:.0f} s", file=sys.stderr)
    return Path(out.stdout.strip().splitlines()[-1])


def pytest_collection_finish(session: pytest.Session) -> None:
    global _binary, _build_error
    wants = any(Path(str(item.path)).is_relative_to(HERE) for item in session.items)
    if not wants or session.config.option.collectonly:
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    try:
        # Let the build's progress through: a cold build is silent for minutes otherwise.
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            _binary = build_minio()
    except (OSError, subprocess.CalledProcessError) as exc:
        _build_error = f"building minio failed ({exc}); see the output above"


def minio_binary() -> Path:
    if _build_error is not None:
        pytest.fail(_build_error)
    return _binary or build_minio()


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[minio_server.MinioServer]:
    """The session's MinIO server; tests that stop servers start their own."""
    server = minio_server.MinioServer(minio_binary(), tmp_path_factory.mktemp("minio") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_minio(tmp_path: Path) -> Iterator[minio_server.MinioServer]:
    """A server of the test's own, for tests that stop and restart it."""
    server = minio_server.MinioServer(minio_binary(), tmp_path / "minio")
    server.start()
    yield server
    server.stop()


def new_bucket() -> str:
    return "test-" + secrets.token_hex(6)


@pytest.fixture
def minio_store_(minio: minio_server.MinioServer) -> Iterator[minio_store.MinioStore]:
    """A MinioStore on a fresh bucket of the session server."""
    store = minio_store.MinioStore(minio.settings(new_bucket()))
    yield store
    store.close()


@pytest.fixture(params=["directory", "minio"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[interface.ObjectStore]:
    """Each implementation in turn: the contract tests hold both to the same behaviour."""
    if request.param == "directory":
        yield directory.DirectoryStore(tmp_path / "objects")
        return
    server: minio_server.MinioServer = request.getfixturevalue("minio")
    s = minio_store.MinioStore(server.settings(new_bucket()))
    yield s
    s.close()
