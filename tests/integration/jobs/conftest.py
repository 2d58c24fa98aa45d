"""Real MinIO and real Spark (local[2]) for the jobs' tests: one of each per session.

The Spark JVM takes seconds to start on a busy machine, so every test shares one
session; each test writes its topic under a fresh cluster id in one bucket.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.objectstore.interface import ObjectStore
from headrace.objectstore.urls import ACCESS_KEY_ENV, SECRET_KEY_ENV, open_store
from headrace.testing.minio import MinioServer
from tests.integration.objectstore import servers

HERE = Path(__file__).resolve().parent


def pytest_collection_finish(session: pytest.Session) -> None:
    servers.build_before_tests_in(HERE, session)


@pytest.fixture(scope="session")
def jobs_minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    server = MinioServer(servers.minio_binary(), tmp_path_factory.mktemp("jobs-minio") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def store_url(jobs_minio: MinioServer) -> Iterator[str]:
    """The bucket's URL; the credentials go into the environment (inherited by Spark's
    Python workers and by spark-submit), as in production."""
    saved = {k: os.environ.get(k) for k in (ACCESS_KEY_ENV, SECRET_KEY_ENV)}
    os.environ[ACCESS_KEY_ENV] = jobs_minio.access_key
    os.environ[SECRET_KEY_ENV] = jobs_minio.secret_key
    yield f"s3://{jobs_minio.host}:{jobs_minio.port}/{servers.new_bucket()}?create_bucket=1"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def store(store_url: str) -> Iterator[ObjectStore]:
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def cluster_id() -> str:
    """A cluster id of the test's own: its topics do not meet other tests' objects."""
    return "c" + secrets.token_hex(4)


@pytest.fixture(scope="session")
def spark(store_url: str) -> Iterator[Any]:
    from headrace.jobs.source import session

    s = session("headrace-tests", "local[2]")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()
