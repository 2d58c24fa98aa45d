"""The runner's image table (``e2e/testbed/images.py``) in a running test bed: a pod of
the Spark image with Spark's executor contract runs pyspark's ``KubernetesExecutorBackend``
on the host, and a pod of an unknown image without ``command`` is refused, naming the
images the runner knows. The whole path (a driver creating such pods) is
``e2e/tests/operator/test_compaction_executors_e2e.py``; this is its fast check."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from e2e.support import Cluster, wait_for

pytestmark = pytest.mark.usefixtures("testbed_only")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def executor_pod(name: str, driver_url: str) -> dict[str, Any]:
    """An executor pod as Spark's driver writes one (``BasicExecutorFeatureStep``): no
    command, ``args: [executor]``, the contract in the environment."""
    env = {
        "SPARK_DRIVER_URL": driver_url,
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_APPLICATION_ID": "spark-e2e",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_JAVA_OPT_0": "-Dspark.rpc.numRetries=1",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "spark-kubernetes-executor",
                    "image": "apache/spark:4.3.0-python3",
                    "args": ["executor"],
                    "env": [
                        *({"name": k, "value": v} for k, v in env.items()),
                        {
                            "name": "SPARK_EXECUTOR_POD_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                        {
                            "name": "SPARK_EXECUTOR_POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        },
                    ],
                }
            ],
        },
    }


def container_state(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    statuses = cluster.get("pod", name, namespace).get("status", {}).get("containerStatuses")
    return (statuses or [{}])[0].get("state", {})  # type: ignore[no-any-return]


def test_a_spark_executor_pod_runs_pysparks_executor_backend(
    cluster: Cluster, namespace: str
) -> None:
    # a driver that is not there: the backend starts, fails to reach it and exits, which
    # is all this test needs to see (the full run has a real driver)
    url = f"spark://CoarseGrainedScheduler@127.0.0.1:{closed_port()}"
    cluster.apply([executor_pod("exec-1", url)], namespace)
    terminated = wait_for(
        "the executor to exit",
        lambda: container_state(cluster, "exec-1", namespace).get("terminated"),
        120,
    )
    log = cluster.logs("exec-1", namespace)
    assert terminated["exitCode"] != 0, log[-3000:]
    assert "KubernetesExecutorBackend" in log, log[-3000:]
    assert url.split("@")[1] in log, log[-3000:]


def test_an_unknown_image_without_command_is_refused_naming_the_known_ones(
    cluster: Cluster, namespace: str
) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "imageonly"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "web", "image": "nginx:1"}]},
    }
    cluster.apply([body], namespace)
    waiting = wait_for(
        "CreateContainerConfigError",
        lambda: (
            w
            if (w := container_state(cluster, "imageonly", namespace).get("waiting", {})).get(
                "reason"
            )
            == "CreateContainerConfigError"
            else None
        ),
        30,
    )
    assert "apache/spark" in waiting["message"] and "nginx:1" in waiting["message"]
