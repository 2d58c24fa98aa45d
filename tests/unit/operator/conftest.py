"""The ``server`` (kmock's Kubernetes API emulator, ``kube_server.ApiServer``) and ``api``
(the operator's ``ClientApi`` over it) of the handler-level tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import kmock
import pytest
from kube_server import ApiServer, client_of

from headrace.operator.kube import ClientApi


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    async with ApiServer() as handler, kmock.Server(handler):
        yield handler


@pytest.fixture
async def api(server: ApiServer, tmp_path: Path) -> ClientApi:
    return await client_of(server, tmp_path)
