"""Real MinIO for the tiered tests: the object store tests' servers and build.

The fixtures are the ones of ``tests/integration/objectstore`` (imported, not
copied); the build hook is declared here too (its body is shared) because a
conftest's hooks only see the tests of their own directory, and a run of just
this directory must build the binary before the per-test timeout starts counting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.objectstore import servers
from tests.integration.objectstore.conftest import minio, private_minio

__all__ = ["minio", "private_minio"]

HERE = Path(__file__).resolve().parent


def pytest_collection_finish(session: pytest.Session) -> None:
    servers.build_before_tests_in(HERE, session)
