"""Fixtures of the operator e2e suites (what they do: ``fixtures.py``).

def test_something(cluster: Cluster, namespace: str, operator: InstalledOperator):
    cluster.apply(cluster_manifests(namespace), namespace)
    wait_ready(cluster, "topic", "orders", namespace)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.support import Cluster
from e2e.tests.operator.fixtures import CHART, InstalledOperator, remove_release


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the test item, so a fixture can tell a failed test."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def crds(cluster: Cluster) -> None:
    """The chart's CRDs, applied server-side (no operator)."""
    cluster.kubectl_run(
        "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"), timeout=60
    )


@pytest.fixture
def operator(
    request: pytest.FixtureRequest, cluster: Cluster, namespace: str
) -> Iterator[InstalledOperator]:
    """``helm install`` of the chart in the test's namespace, watching only it (with the
    helm flags a test gives it by indirect parametrization, if any)."""
    installed = InstalledOperator(cluster, namespace)
    installed.install(*getattr(request, "param", ()))
    try:
        yield installed
    finally:
        failed = getattr(request.node, "report_call", None)
        remove_release(installed, failed=failed is not None and failed.failed)


@pytest.fixture
def testbed_provider(cluster: Cluster) -> None:
    """The test bed, on its stand-in or its real node: the object-store suites start
    MinIO on this host (loopback, or the real node's pod bridge: ``storage.minio``)."""
    if cluster.provider != "testbed":
        pytest.skip("MinIO runs on this host: the test bed's stand-in or real node only")
