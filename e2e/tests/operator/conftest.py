"""Fixtures of the operator e2e suites (what they do: ``fixtures.py``).

def test_something(cluster: Cluster, namespace: str, operator: InstalledOperator):
    cluster.apply(cluster_manifests(namespace), namespace)
    wait_ready(cluster, "topic", "orders", namespace)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.support import Cluster
from e2e.tests.operator.fixtures import CHART, InstalledOperator, release_stuck_topics


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
        if failed is not None and failed.failed:
            print(f"--- operator log\n{installed.logs()[-8000:]}", file=sys.stderr)
        # While the operator runs, so that it removes its finalizers: the Topics' first
        # (their data finalizer needs the brokers), then the Users', then the clusters' (the garbage
        # collector then deletes the StatefulSets and the brokers go now, not with the
        # namespace).
        cluster.kubectl_run(
            "delete", "topic", "--all", "-n", namespace, "--timeout=60s",
            check=False, timeout=90,
        )  # fmt: skip
        release_stuck_topics(cluster, namespace)
        # Users carry kopf's finalizer (it takes them out of the ACL file first)
        cluster.kubectl_run(
            "delete", "user", "--all", "-n", namespace, "--timeout=60s",
            check=False, timeout=90,
        )  # fmt: skip
        cluster.kubectl_run(
            "delete", "brokercluster", "--all", "-n", namespace, "--timeout=60s",
            check=False, timeout=90,
        )  # fmt: skip
        installed.uninstall()
