"""Session fixtures for the end-to-end suite: one cluster per session, one namespace per test.

The test bed build runs in ``pytest_collection_finish`` rather than in a fixture so
that a cold build (minutes) is not counted against the per-test timeout.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest

from e2e import support

PROVIDER = os.environ.get("E2E_PROVIDER", "testbed")

#: the e2e files that start a MinIO server (``e2e/tests/operator/storage.py``)
MINIO_TESTS = frozenset(
    {
        "test_unload_e2e.py",
        "test_compaction_e2e.py",
        "test_object_store_e2e.py",
        "test_chaos_operator_e2e.py",
        "test_snapshot_e2e.py",
    }
)

#: the e2e files that run the image of an older commit (built with buildah, on a real node)
RELEASE_IMAGE_TESTS = frozenset({"test_rolling_upgrade_e2e.py"})

#: Why the build failed, if it did: the e2e tests then error, the rest of a
#: `pytest tests e2e` run goes on.
_build_error: str | None = None


def _what_runs_pods() -> str:
    if PROVIDER != "testbed":
        return f"e2e: provider {PROVIDER}"
    from e2e.testbed.settings import Settings

    return f"e2e: provider testbed, {Settings.from_env().node_kind} node (E2E_NODE)"


def pytest_report_header(config: pytest.Config) -> str:
    """Which cluster and which kind of node the run uses; never left to guess."""
    return _what_runs_pods()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The same at the end, where ``-q`` (no header) still shows it."""
    if _ran_e2e:
        terminalreporter.write_line(_what_runs_pods())


#: Whether this session collected e2e tests (the summary then names the node).
_ran_e2e = False


def pytest_collection_finish(session: pytest.Session) -> None:
    global _build_error, _ran_e2e
    wants_e2e = any("/e2e/" in str(item.path) for item in session.items)
    _ran_e2e = wants_e2e and not session.config.option.collectonly
    if wants_e2e and PROVIDER == "testbed" and not session.config.option.collectonly:
        try:
            support.build_testbed()
        except (OSError, subprocess.CalledProcessError) as exc:
            _build_error = f"building the test bed failed ({exc}); see the output above"
    # the upgrade test's previous release as an image (minutes when cold; cached by commit;
    # a failure is kept and reported by that test)
    if (
        PROVIDER == "testbed"
        and not session.config.option.collectonly
        and any(item.path.name in RELEASE_IMAGE_TESTS for item in session.items)
    ):
        from e2e.testbed.settings import Settings
        from tests.integration.upgrading import PREVIOUS_RELEASE

        if Settings.from_env().real_node:
            support.build_release_image(PREVIOUS_RELEASE)
    # the object-store tests start MinIO: build it now (minutes when cold), not in a test
    # (a failure is kept and reported by those tests)
    if not session.config.option.collectonly and any(
        item.path.name in MINIO_TESTS for item in session.items
    ):
        from tests.integration.objectstore import servers

        capture = session.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            servers.build()


@pytest.fixture(scope="session")
def cluster() -> Iterator[support.Cluster]:
    if _build_error is not None:
        pytest.fail(_build_error)
    if PROVIDER == "testbed":
        with support.testbed_cluster() as c:
            # The test bed keeps its etcd between runs, and `helm install` never updates a
            # CRD that exists: without this, the tests before the first that applies them
            # would run against the CRDs of an older checkout (their new fields pruned)
            c.kubectl_run(
                "apply", "--server-side", "--force-conflicts", "-f", str(support.CHART_CRDS),
                timeout=60,
            )  # fmt: skip
            yield c
    elif PROVIDER == "kind":
        with support.kind_cluster() as c:
            yield c
    elif PROVIDER == "current":
        yield support.current_cluster()
    else:
        raise pytest.UsageError(f"E2E_PROVIDER must be testbed, kind or current, not {PROVIDER!r}")


@pytest.fixture
def namespace(cluster: support.Cluster) -> Iterator[str]:
    name = support.new_namespace(cluster)
    yield name
    if os.environ.get("E2E_KEEP") != "1":
        cluster.kubectl_run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def testbed_only(cluster: support.Cluster) -> None:
    if not cluster.is_testbed:
        pytest.skip("inspects the test bed's host processes or directories")


@pytest.fixture
def real_node_only(cluster: support.Cluster) -> None:
    """Skips a test that needs the real node before any fixture after it (a chart install)
    costs anything on the stand-in."""
    if not cluster.real_node:
        pytest.skip("needs the real node (E2E_NODE=real)")


@pytest.fixture
def host_reaches_pods(cluster: support.Cluster) -> None:
    """Skips a test that dials the pods' IPs from this host, or signals their processes,
    where it cannot: the test bed's pods, stand-in or real node, run on this host and it
    routes their IPs; a kind node's do not."""
    if not cluster.host_reaches_pod_ips:
        pytest.skip("dials pod IPs from this host: the test bed only (stand-in or real node)")
