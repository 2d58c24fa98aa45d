"""kill -9 of a pod's container, on the test bed's stand-in or its real node.

A crash, not a shutdown: SIGKILL, which no handler sees. ``kubectl exec ... kill -9 1``
cannot do it, since a PID namespace's init ignores SIGKILL from inside the namespace, so
it is sent from this host: on the stand-in to the container's host process (its
``containerID`` is ``testbed://<pid>``), on the real node to the containerd task
(``containerd://<id>``, through the node's ``ctr``). Either way the kubelet (or the
runner) then restarts the container as after any crash.
"""

from __future__ import annotations

import os
import signal

import pytest

from e2e.support import Cluster, wait_for


def container_id(cluster: Cluster, namespace: str, pod: str) -> str:
    """The running container's id (``scheme://id``) of ``pod``'s one container."""

    def running() -> str | None:
        (status,) = cluster.get("pod", pod, namespace)["status"]["containerStatuses"]
        return status.get("containerID") if "running" in status.get("state", {}) else None

    return wait_for(f"{pod}'s container running", running, 90)


def kill_9(cluster: Cluster, namespace: str, pod: str) -> str:
    """SIGKILL ``pod``'s running container; the id of the container killed."""
    killed = container_id(cluster, namespace, pod)
    scheme, _, ident = killed.partition("://")
    if scheme == "testbed":
        os.kill(int(ident), signal.SIGKILL)
    elif scheme == "containerd" and cluster.real_node:
        from e2e.testbed.realnode import ctr
        from e2e.testbed.settings import Settings

        ctr(Settings.from_env(), "tasks", "kill", "--signal", "SIGKILL", ident)
    else:
        pytest.skip(f"kill -9 of a container of runtime {scheme!r}: test bed only")
    return killed


def restarted(cluster: Cluster, namespace: str, pod: str, killed: str) -> str:
    """Wait until ``pod`` runs a container other than ``killed``; its id."""

    def other() -> str | None:
        (status,) = cluster.get("pod", pod, namespace)["status"]["containerStatuses"]
        now = status.get("containerID")
        return now if "running" in status.get("state", {}) and now != killed else None

    return wait_for(f"{pod}'s container restarted", other, 90)
