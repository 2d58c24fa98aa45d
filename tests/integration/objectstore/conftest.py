"""One real MinIO server per test session, and the stores the contract runs against.

The MinIO build runs in ``pytest_collection_finish``, not in a fixture, so that
a cold build (minutes) is not counted against the per-test timeout. No S3 mock:
without a server these tests fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.objectstore import directory, interface, minio_store
from headrace.testing.minio import MinioServer
from tests.integration.objectstore import servers

HERE = Path(__file__).resolve().parent


def pytest_collection_finish(session: pytest.Session) -> None:
    servers.build_before_tests_in(HERE, session)


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """The session's MinIO server; tests that stop servers start their own."""
    server = MinioServer(servers.minio_binary(), tmp_path_factory.mktemp("minio") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_minio(tmp_path: Path) -> Iterator[MinioServer]:
    """A server of the test's own, for tests that stop and restart it."""
    server = MinioServer(servers.minio_binary(), tmp_path / "minio")
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["directory", "minio"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[interface.ObjectStore]:
    """Each implementation in turn, on fresh storage (a new directory, a new bucket):
    the contract tests hold both to the same behaviour."""
    if request.param == "directory":
        yield directory.DirectoryStore(tmp_path / "objects")
        return
    server: MinioServer = request.getfixturevalue("minio")
    s = minio_store.MinioStore(server.settings(servers.new_bucket()))
    yield s
    s.close()
