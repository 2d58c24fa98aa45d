"""Test bed lifecycle: ``up`` and ``down`` are idempotent and ``down`` leaves no orphans.

Named to run last in the directory: it stops and restarts the shared test bed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.support import Cluster, python_container, wait_for

pytestmark = pytest.mark.usefixtures("testbed_only")

# A container that forks a grandchild in the background, as shells and servers do.
FORKER = r"""
import subprocess, sys, time
child = subprocess.Popen(["sleep", "100000"])
print("pids", child.pid, flush=True)
time.sleep(100000)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_down_stops_everything_and_up_is_idempotent(cluster: Cluster, namespace: str) -> None:
    from headrace.testbed import controlplane, processes
    from headrace.testbed.settings import Settings

    settings = Settings.from_env()
    assert controlplane.up(settings) == 0.0, "a second up should find the test bed up"

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "forker"},
        "spec": {"containers": [python_container(cluster, "main", FORKER)]},
    }
    cluster.apply([pod], namespace)
    line = wait_for(
        "grandchild pid",
        lambda: next(
            (x for x in cluster.logs("forker", namespace).splitlines() if x.startswith("pids")),
            None,
        ),
    )
    grandchild = int(line.split()[1])
    status = cluster.get("pod", "forker", namespace)["status"]
    child = int(status["containerStatuses"][0]["containerID"].split("//")[1])
    daemons = {n: processes.Daemon(n, settings.run_dir).pid() for n in controlplane.DAEMONS}
    assert all(daemons.values()), daemons

    controlplane.down(settings)
    controlplane.down(settings)  # a second down is a no-op
    for pid in [child, grandchild, *daemons.values()]:
        assert pid is not None
        # Gone, or a zombie that init has yet to reap: either way nothing runs.
        wait_for(f"pid {pid} to end", lambda pid=pid: not alive(pid), 10, every_s=0.1)
    assert not controlplane.is_up(settings)

    took = controlplane.up(settings)
    assert 0 < took < 60, took
    # The pod survives in etcd; the runner starts it again after the "node reboot".
    wait_for(
        "forker running again",
        lambda: (
            cluster.get("pod", "forker", namespace)["status"]["containerStatuses"][0]
            .get("state", {})
            .get("running")
        ),
        60,
    )


def test_killed_runner_leaves_no_orphans_and_up_recovers(cluster: Cluster, namespace: str) -> None:
    import os
    import signal

    from headrace.testbed import controlplane, processes
    from headrace.testbed.settings import Settings

    settings = Settings.from_env()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orphan"},
        "spec": {"containers": [python_container(cluster, "main", FORKER)]},
    }
    cluster.apply([pod], namespace)
    line = wait_for(
        "grandchild pid",
        lambda: next(
            (x for x in cluster.logs("orphan", namespace).splitlines() if x.startswith("pids")),
            None,
        ),
    )
    grandchild = int(line.split()[1])
    status = cluster.get("pod", "orphan", namespace)["status"]
    child = int(status["containerStatuses"][0]["containerID"].split("//")[1])

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
