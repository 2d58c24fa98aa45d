"""Compaction and CompactionSchedule through the operator, end to end on
Kubernetes: real Job and CronJob controllers, the job's pod running
``headrace compact`` (pyspark's ``spark-submit``, ``local[*]`` in the pod) against MinIO.

* A tiered topic with a small segment size has many small objects uploaded; a
  ``Compaction`` becomes a Job; the Compaction reaches ``Succeeded`` with its result
  from the job's summary (the pod's termination message); the manifest now lists
  fewer, larger objects; the verification the job ran afterwards (its report object
  in the store) is clean; and a consumer from offset 0 through the broker gets every
  acknowledged record exactly once, with the records produced after the compaction.
* A ``CompactionSchedule`` becomes a CronJob with the schedule, ``Forbid`` and the
  history limits, owned by the schedule. With ``HEADRACE_E2E_CRON=1`` (``make
  e2e-cron``) the test also waits for the CronJob's first run (up to 130 s: the
  schedule fires on the minute) and for its result in the schedule's status; that
  wait is too long for ``make test``.

The test bed, on its stand-in or its real node (``E2E_NODE=real``): MinIO runs on this
host, the operator is installed with the chart. On the stand-in, pods run this checkout's
Python; on the real node the Job's pod is a container of the Spark image (``make
image-spark``: Java 17, pyspark, pyarrow), under Pod Security "restricted" with a
read-only root, and the brokers' of the headrace image.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

from e2e.support import Cluster, spark_image, wait_for
from e2e.tests.operator import storage
from headrace.testing.procs import free_port

SEGMENT_BYTES = 2048
RECORDS = 1500


def compaction(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Compaction",
        "metadata": {"name": name},
        "spec": {
            "topicRef": {"name": "small"},
            "targetSegmentBytes": 1 << 20,
            "graceSeconds": 1,
            "backoffLimit": 0,
            **spec,
        },
    }


def schedule(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "CompactionSchedule",
        "metadata": {"name": name},
        "spec": {
            "topicRef": {"name": "small"},
            "schedule": "*/1 * * * *",
            "targetSegmentBytes": 1 << 20,
            "graceSeconds": 1,
            "backoffLimit": 0,
            "successfulJobsHistoryLimit": 2,
            "failedJobsHistoryLimit": 1,
        },
    }


def phase_of(cluster: Cluster, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    status = cluster.get(kind, name, namespace).get("status") or {}
    return status if status.get("phase") in ("Succeeded", "Failed") else None


def job_pod_log(cluster: Cluster, namespace: str, job: str) -> str:
    return cluster.kubectl_run("logs", f"job/{job}", "-n", namespace, check=False).stdout[-6000:]


def test_a_compaction_job_merges_small_segments_and_loses_nothing(
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

            cluster.apply([compaction("merge")], namespace)
            status = wait_for(
                "the Compaction to finish",
                lambda: phase_of(cluster, "compaction", "merge", namespace),
                240,
                every_s=2,
            )
            assert status["phase"] == "Succeeded", (
                f"{json.dumps(status)}\n{job_pod_log(cluster, namespace, 'merge')}"
            )
            assert status["jobName"] == "merge" and status["attempts"] == 1
            assert status["startTime"] and status["completionTime"]
            result = status["result"]
            print(f"\n[e2e figure] Compaction status: {json.dumps(status)}", file=sys.stderr)
            assert result["verified"] is True and result["mismatches"] == 0
            assert result["segmentsAfter"] < result["segmentsBefore"]
            ready = storage.condition(cluster.get("compaction", "merge", namespace))
            assert (ready["status"], ready["observedGeneration"]) == ("True", 1)

            # the phase changes are Events on the Compaction
            def events() -> list[str]:
                out = cluster.kubectl_run(
                    "get", "events", "-n", namespace, "-o", "json", "--field-selector",
                    "involvedObject.kind=Compaction,involvedObject.name=merge",
                ).stdout  # fmt: skip
                reasons = [e["reason"] for e in json.loads(out)["items"]]
                return reasons if "CompactionSucceeded" in reasons else []

            wait_for("a CompactionSucceeded Event", events, 30)

            # the Job is the Compaction's
            job = cluster.get("job", "merge", namespace)
            (owner,) = job["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == ("Compaction", "merge")
            if cluster.real_node:
                # its pod ran as a container of the Spark image, not the brokers' image
                ran = storage.job_container(cluster, namespace, "merge")
                assert ran["containerID"].startswith("containerd://"), ran
                assert ran["image"] == spark_image(), ran
                print(f"\n[e2e figure] Compaction pod: {ran['image']} {ran['imageID']}",
                      file=sys.stderr)  # fmt: skip

            # fewer, larger objects, and the job's verification report is clean
            after = storage.manifest(store, "small", topic, 0)
            assert len(after.segments) < len(before.segments)
            assert after.checkpoint >= before.checkpoint
            report = json.loads(store.get(result["report"]))
            assert report["ok"] is True, report
            assert not [f for f in report["findings"] if f["severity"] == "error"]
        finally:
            store.close()

        # every acknowledged record once, through the broker, with more produced after
        more = [f"after-{i}" for i in range(100)]
        storage.produce(servers, topic, more)
        records = storage.consume_all(servers, topic, "check")
        counts = collections.Counter(r["value"] for r in records)
        lost = [v for v in acked + more if counts[v] == 0]
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"
        assert not [v for v, n in counts.items() if n > 1], "a record was delivered twice"

        # a schedule becomes a CronJob owned by it
        cluster.apply([schedule("every-minute")], namespace)
        cron = wait_for(
            "the CronJob",
            lambda: cluster.get("cronjob", "every-minute", namespace),
            30,
        )
        spec = cron["spec"]
        assert (spec["schedule"], spec["concurrencyPolicy"]) == ("*/1 * * * *", "Forbid")
        assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (2, 1)
        (owner,) = cron["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("CompactionSchedule", "every-minute")
        args = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:2] == ["compact", topic]
        storage.wait_ready(cluster, "compactionschedule", "every-minute", namespace)
        if os.environ.get("HEADRACE_E2E_CRON") != "1":
            return

        # its first run: the CronJob creates a Job on the minute, the status shows it
        def scheduled() -> dict[str, Any] | None:
            status = cluster.get("compactionschedule", "every-minute", namespace).get("status")
            return status if status and status.get("lastScheduleTime") else None

        wait_for("the CronJob's first run", scheduled, 130, every_s=2)

        def last_result() -> dict[str, Any] | None:
            status = cluster.get("compactionschedule", "every-minute", namespace).get("status")
            return status if status and status.get("lastJob") else None

        status = wait_for("the run's result in the schedule's status", last_result, 180, every_s=2)
        assert "lastFailure" not in status, status
        assert status["lastResult"]["verified"] is True
        assert status["lastSuccessfulTime"]
        print(f"\n[e2e figure] CompactionSchedule status: {json.dumps(status)}", file=sys.stderr)


def test_an_object_store_that_is_down_shows_on_the_cluster_and_fails_the_compaction(
    cluster: Cluster, namespace: str, testbed_provider: None, tmp_path: Path
) -> None:
    """Bad input: the object store's endpoint down. The brokers serve (Ready), the
    cluster's ``ObjectStoreReachable`` is False, and a Compaction's job fails with the
    store's error in the Compaction's status."""
    dead = free_port()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": storage.SECRET},
        "stringData": {"accessKey": "nobody", "secretKey": "nothing-here"},
    }
    with storage.operator(cluster, namespace, tmp_path / "operator.log", spark=True):
        body = storage.tiered_cluster(f"127.0.0.1:{dead}", "down", 1)
        cluster.apply([secret, body], namespace)
        storage.wait_ready(cluster, "brokercluster", "down", namespace)
        unreachable = wait_for(
            "ObjectStoreReachable=False on the BrokerCluster",
            lambda: (
                c
                if (
                    c := storage.condition(
                        cluster.get("brokercluster", "down", namespace), "ObjectStoreReachable"
                    )
                ).get("status")
                == "False"
                else None
            ),
            30,
        )
        assert unreachable["reason"] == "EndpointUnreachable"
        cluster.apply([storage.tiered_topic("small", "down")], namespace)
        storage.wait_ready(cluster, "topic", "small", namespace)

        cluster.apply([compaction("doomed")], namespace)
        status = wait_for(
            "the Compaction to fail",
            lambda: phase_of(cluster, "compaction", "doomed", namespace),
            240,
            every_s=2,
        )
        print(f"\n[e2e figure] failed Compaction status: {json.dumps(status)}", file=sys.stderr)
        assert status["phase"] == "Failed", json.dumps(status)
        ready = storage.condition(cluster.get("compaction", "doomed", namespace))
        assert (ready["status"], ready["reason"]) == ("False", "Failed")
        assert "ObjectStoreUnavailable" in ready["message"], ready["message"]
