"""Test bed lifecycle: ``up`` and ``down`` are idempotent and leave no orphans.

These tests start, stop and kill a test bed of their own (its own state directory,
ports and pod address block), so the shared one the rest of the suite uses, and anyone
else's, is left alone.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.support import Cluster, client_of_testbed, new_namespace, python_container, wait_for
from e2e.testbed.settings import Settings

pytestmark = pytest.mark.usefixtures("testbed_only")

# A container that forks a grandchild in the background, as shells and servers do.
FORKER = r"""
import subprocess, sys, time
child = subprocess.Popen(["sleep", "100000"])
print("pids", child.pid, flush=True)
time.sleep(100000)
"""


def alive(pid: int) -> bool:
    """Running (a zombie that init has yet to reap counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Cluster]]:
    from e2e.testbed import controlplane

    base = Settings.from_env()
    # the stand-in's lifecycle, also under E2E_NODE=real: one real node per machine
    settings = dataclasses.replace(
        base, state_dir=tmp_path_factory.mktemp("own-testbed"), real_node=False
    )
    took = controlplane.up(settings)
    assert 0 < took < 60, f"start to ready took {took:.1f} s"
    cluster = client_of_testbed(settings)
    try:
        yield settings, cluster
    finally:
        controlplane.down(settings, purge=True)


def forker_pids(cluster: Cluster, namespace: str, name: str) -> tuple[int, int]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [python_container(cluster, "main", FORKER)]},
    }
    cluster.apply([pod], namespace)
    line = wait_for(
        "grandchild pid",
        lambda: next(
            (x for x in cluster.logs(name, namespace).splitlines() if x.startswith("pids")), None
        ),
    )
    status = cluster.get("pod", name, namespace)["status"]
    child = int(status["containerStatuses"][0]["containerID"].split("//")[1])
    return child, int(line.split()[1])


def test_down_stops_everything_and_up_is_idempotent(own: tuple[Settings, Cluster]) -> None:
    from e2e.testbed import controlplane, processes

    settings, cluster = own
    assert controlplane.up(settings) == 0.0, "a second up should find the test bed up"
    namespace = new_namespace(cluster)
    child, grandchild = forker_pids(cluster, namespace, "forker")
    daemons = {n: processes.Daemon(n, settings.run_dir).pid() for n in controlplane.DAEMONS}
    assert all(daemons.values()), daemons

    controlplane.down(settings)
    controlplane.down(settings)  # a second down is a no-op
    for pid in [child, grandchild, *daemons.values()]:
        assert pid is not None
        wait_for(f"pid {pid} to end", lambda pid=pid: not alive(pid), 10, every_s=0.1)
    assert not controlplane.is_up(settings)

    took = controlplane.up(settings)
    assert 0 < took < 60, took
    # The pod survives in etcd; the runner starts it again, as after a node reboot.
    wait_for(
        "forker running again",
        lambda: (
            cluster.get("pod", "forker", namespace)["status"]["containerStatuses"][0]
            .get("state", {})
            .get("running")
        ),
        60,
    )


def test_killed_runner_leaves_no_orphans_and_up_recovers(own: tuple[Settings, Cluster]) -> None:
    from e2e.testbed import controlplane, processes

    settings, cluster = own
    namespace = new_namespace(cluster)
    child, grandchild = forker_pids(cluster, namespace, "orphan")
    runner = processes.Daemon("runner", settings.run_dir).pid()
    assert runner is not None
    os.kill(runner, signal.SIGKILL)
    # The container dies with its parent (pdeathsig); its background child does not...
    wait_for("container to die with the runner", lambda: not alive(child), 10, every_s=0.1)
    # ...until the next up (or down) sweeps the recorded process groups.
    took = controlplane.up(settings)
    assert took > 0
    wait_for("grandchild swept", lambda: not alive(grandchild), 10, every_s=0.1)
    assert controlplane.is_up(settings)
