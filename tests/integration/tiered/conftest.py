"""Real MinIO for the tiered tests: the object store tests' servers and build.

The fixtures are the ones of ``tests/integration/objectstore`` (imported, not
copied); the build hook is repeated here because a conftest's hooks only see
the tests of their own directory, and a run of just this directory must build
the binary before the per-test timeout starts counting.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tests.integration.objectstore import servers
from tests.integration.objectstore.conftest import minio, private_minio

__all__ = ["minio", "private_minio"]

HERE = Path(__file__).resolve().parent


def pytest_collection_finish(session: pytest.Session) -> None:
    wants = any(Path(str(item.path)).is_relative_to(HERE) for item in session.items)
    if not wants or session.config.option.collectonly:
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        servers.build()
