"""A Compaction with Spark's executors as pods, end to end on the test bed.

``spec.spark.master: kubernetes``: the Job's pod runs the driver (``spark-submit
--master k8s://...``, client mode) as the chart's Spark service account; the driver
asks the API server for two executor pods of the Spark image; the scheduler binds
them, the runner starts them as Spark's ``KubernetesExecutorBackend`` (its image
entrypoint stand-in, ``e2e/testbed/images.py``) and they dial the driver at its pod IP.
First a run whose executors can never be scheduled fails at its
``activeDeadlineSeconds`` and leaves no executor pod. Then the test checks that the
executor pods appear, owned by the driver's pod, and run;
that the compaction succeeds with a clean verify report; that every acknowledged
record is read back once through the broker; and that the executor pods are gone when
the job has ended, while the Job's pod is still there (Spark deleted them, not the
garbage collector).

The test bed, on its stand-in (pods are host processes, the executors this checkout's
pyspark jars) or its real node (the driver and the executors are containers of the Spark
image, ``make image-spark``, under Pod Security "restricted").
It waits for a deadline, then starts three JVMs (3-4 min), so it runs with
``HEADRACE_E2E_SPARK_K8S=1`` (``make e2e-spark-k8s``); ``make test`` runs the fast
check of the runner's Spark image mapping (``e2e/tests/testbed/test_image_entrypoints.py``)
and the unit tests of the Job's driver settings.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.support import Cluster, wait_for
from e2e.tests.operator import storage
from e2e.tests.operator.test_compaction_e2e import SEGMENT_BYTES, compaction, phase_of

pytestmark = pytest.mark.skipif(
    os.environ.get("HEADRACE_E2E_SPARK_K8S") != "1",
    reason="a deadline, then three JVMs, 3-4 min: make e2e-spark-k8s (HEADRACE_E2E_SPARK_K8S=1)",
)

RECORDS = 1200
EXECUTORS = 2
#: the stuck run's deadline: its driver's JVM must start and ask for executors first
STUCK_DEADLINE_S = 120


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl_run("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def test_a_compaction_runs_its_executors_as_pods_and_loses_nothing(
    cluster: Cluster, namespace: str, testbed_provider: None, tmp_path: Path
) -> None:
    with (
        storage.minio(tmp_path, cluster) as server,
        storage.operator(cluster, namespace, tmp_path / "operator.log", spark=True),
    ):
        storage.enforce_restricted(cluster, namespace)
        cluster.apply([storage.credentials_secret(server)], namespace)
        cluster.apply(
            [storage.tiered_cluster(server.endpoint, "small", 1, segmentBytes=SEGMENT_BYTES)],
            namespace,
        )
        storage.wait_ready(cluster, "brokercluster", "small", namespace)
        cluster.apply([storage.tiered_topic("small", "small", localRetentionBytes=1)], namespace)
        storage.wait_ready(cluster, "topic", "small", namespace)

        topic = f"{namespace}/small"
        servers = storage.bootstrap(cluster, namespace, "small")
        acked = [f"record-{i:05d}-{'x' * 40}" for i in range(RECORDS)]
        for start in range(0, RECORDS, 300):  # several produce batches: several segments
            storage.produce(servers, topic, acked[start : start + 300])
        store = storage.store_client(server)
        try:
            before = storage.wait_stored(store, "small", topic, 0, RECORDS - 1)
            assert len(before.segments) >= 4, f"expected small objects: {before.segments}"

            # executors that can never be scheduled: Spark would wait for them forever;
            # the run's deadline fails it, and no executor pod is left behind
            stuck = compaction(
                "stuck",
                activeDeadlineSeconds=STUCK_DEADLINE_S,
                spark={"master": "kubernetes", "executors": 1, "executorMemory": "512m"},
                sparkConf={"spark.kubernetes.executor.request.cores": "64"},
            )
            cluster.apply([stuck], namespace)

            def unschedulable() -> list[dict[str, Any]] | None:
                found = [
                    p
                    for p in pods(cluster, namespace, "spark-role=executor")
                    if any(
                        (c["type"], c["status"], c.get("reason"))
                        == ("PodScheduled", "False", "Unschedulable")
                        for c in p["status"].get("conditions") or []
                    )
                ]
                return found or None

            wait_for("an unschedulable executor pod", unschedulable, STUCK_DEADLINE_S, every_s=1)
            failed = wait_for(
                "the stuck Compaction to fail at its deadline",
                lambda: phase_of(cluster, "compaction", "stuck", namespace),
                STUCK_DEADLINE_S + 60,
                every_s=2,
            )
            assert failed["phase"] == "Failed", json.dumps(failed)
            ready = storage.condition(cluster.get("compaction", "stuck", namespace))
            assert "DeadlineExceeded" in ready["message"], ready
            print(f"\n[e2e figure] stuck Compaction: {ready['message']}", file=sys.stderr)
            wait_for(
                "the stuck run's executor pods to be deleted",
                lambda: not pods(cluster, namespace, "spark-role=executor"),
                60,
            )

            body = compaction(
                "spread",
                spark={
                    "master": "kubernetes",
                    "executors": EXECUTORS,
                    "executorCores": 1,
                    "executorMemory": "512m",
                },
                # the test bed's node has the machine's 2 cores: a whole core per
                # executor would leave the pods unschedulable next to the broker
                sparkConf={"spark.kubernetes.executor.request.cores": "100m"},
            )
            cluster.apply([body], namespace)

            # the executor pods: created by the driver, owned by its pod, running
            seen: dict[str, dict[str, Any]] = {}

            def executors_running() -> list[dict[str, Any]] | None:
                found = pods(cluster, namespace, "spark-role=executor")
                seen.update({p["metadata"]["name"]: p for p in found})
                running = [p for p in found if p["status"].get("phase") == "Running"]
                if phase_of(cluster, "compaction", "spread", namespace) is not None:
                    raise AssertionError(
                        f"the Compaction finished before {EXECUTORS} executors ran: "
                        f"{json.dumps(cluster.get('compaction', 'spread', namespace)['status'])}"
                        f"\n{job_log(cluster, namespace)}"
                    )
                return running if len(running) == EXECUTORS else None

            running = wait_for("two running executor pods", executors_running, 240, every_s=1)
            (driver,) = pods(cluster, namespace, "batch.kubernetes.io/job-name=spread")
            driver_name = driver["metadata"]["name"]
            for pod in running:
                (owner,) = pod["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["name"], owner["uid"]) == (
                    "Pod",
                    driver_name,
                    driver["metadata"]["uid"],
                )
                (container,) = pod["spec"]["containers"]
                assert container["args"] == ["executor"]
                # the driver's own image: one Spark version on both sides
                assert container["image"] == driver["spec"]["containers"][0]["image"]
                assert container["image"].rpartition(":")[0].endswith("headrace-spark")
                # no API rights for executors: the namespace's default account
                assert pod["spec"]["serviceAccountName"] == "default"
            assert driver["spec"]["serviceAccountName"].endswith("-spark")  # the chart's

            status = wait_for(
                "the Compaction to finish",
                lambda: phase_of(cluster, "compaction", "spread", namespace),
                300,
                every_s=2,
            )
            assert status["phase"] == "Succeeded", (
                f"{json.dumps(status)}\n{job_log(cluster, namespace)}"
            )
            result = status["result"]
            print(f"\n[e2e figure] Compaction status: {json.dumps(status)}", file=sys.stderr)
            print(f"[e2e figure] executor pods seen: {sorted(seen)}", file=sys.stderr)
            assert result["verified"] is True and result["mismatches"] == 0
            assert result["segmentsAfter"] < result["segmentsBefore"]

            # the tasks ran on the executor pods: the driver's Spark log (in the Job pod's
            # work volume, a host directory on the stand-in) names their addresses. A real
            # kubelet tears a finished pod's emptyDirs down, that log with them: there, a
            # client-mode driver with a k8s master runs no task itself, so the success
            # with its executors Running is what shows it
            if not cluster.real_node:
                executor_ips = {p["status"]["podIP"] for p in running}
                spark_log = driver_spark_log(cluster, driver)
                (tmp_path / "driver-spark.log").write_text(spark_log)  # for a failure's reader
                finished = task_hosts(spark_log)
                print(f"[e2e figure] tasks finished per host: {finished}", file=sys.stderr)
                assert finished, f"no finished task in the driver's log:\n{spark_log[-4000:]}"
                assert set(finished) <= executor_ips, (finished, executor_ips)
                # the Role is enough: the driver was refused nothing by the API server
                refused = [line for line in spark_log.splitlines() if "Forbidden" in line]
                assert not refused, "\n".join(refused[:10])
            else:
                for pod in running:
                    (ran,) = pod["status"]["containerStatuses"]
                    assert ran["containerID"].startswith("containerd://"), ran
                    print(f"[e2e figure] executor {pod['metadata']['name']}: {ran['image']}"
                          f" {ran['imageID']}", file=sys.stderr)  # fmt: skip

            # Spark deleted its executors when the job ended; the Job's pod is still there
            wait_for(
                "the executor pods to be deleted",
                lambda: not pods(cluster, namespace, "spark-role=executor"),
                60,
            )
            assert [p["metadata"]["name"] for p in pods(cluster, namespace, "job-name=spread")]

            after = storage.manifest(store, "small", topic, 0)
            assert len(after.segments) < len(before.segments)
            report = json.loads(store.get(result["report"]))
            assert report["ok"] is True, report
            assert not [f for f in report["findings"] if f["severity"] == "error"]
        finally:
            store.close()

        # every acknowledged record once, through the broker
        records = storage.consume_all(servers, topic, "check")
        counts = collections.Counter(r["value"] for r in records)
        lost = [v for v in acked if counts[v] == 0]
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"
        assert not [v for v, n in counts.items() if n > 1], "a record was delivered twice"


def driver_spark_log(cluster: Cluster, driver: dict[str, Any]) -> str:
    """The driver's Spark log: ``headrace compact`` writes it under its ``--dir``, the Job
    pod's work volume, which on the stand-in is a directory of the pod's on this host."""
    assert cluster.state_dir is not None
    meta = driver["metadata"]
    pod_dir = cluster.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    return "".join(
        path.read_text(errors="replace") for path in pod_dir.glob("volumes/work/jobs/*.log")
    )


def task_hosts(spark_log: str) -> dict[str, int]:
    """Tasks finished per executor address (TaskSetManager's ``Finished task 0.0 in stage
    1.0 (TID 1) in 80 ms on 127.0.3.5 (executor 2)``)."""
    hosts = re.findall(r"Finished task \S+ in stage \S+ \(TID \d+\) in \d+ ms on (\S+)", spark_log)
    return dict(collections.Counter(hosts))


def job_log(cluster: Cluster, namespace: str) -> str:
    return cluster.kubectl_run("logs", "job/spread", "-n", namespace, check=False).stdout[-8000:]
