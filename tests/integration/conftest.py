from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.testing.procs import BrokerProcess
from tests.integration.localcluster import LocalCluster, running_cluster


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type[BrokerProcess] | object]:
    started: list[BrokerProcess] = []

    def make(
        fsync: str = "interval", extra_args: list[str] | None = None, start: bool = True
    ) -> BrokerProcess:
        b = BrokerProcess(
            tmp_path / f"data{len(started)}", fsync=fsync, extra_args=extra_args or []
        )
        started.append(b)
        if start:
            b.start()
        return b

    yield make
    for b in started:
        b.kill9()


@pytest.fixture
def broker(broker_factory: object) -> BrokerProcess:
    return broker_factory()  # type: ignore[operator, no-any-return]


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A three-broker local cluster (``headrace local up``) in the test's directory."""
    with running_cluster(tmp_path / "local") as c:
        yield c
