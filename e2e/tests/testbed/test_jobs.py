"""Jobs and CronJobs driven by the real controllers, with exit codes from host processes."""

from __future__ import annotations

import json
from typing import Any

from e2e.support import Cluster, python_container, wait_for


def job(cluster: Cluster, name: str, script: str, backoff_limit: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [python_container(cluster, "main", script)],
                }
            },
        },
    }


def condition(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


def job_pods(cluster: Cluster, namespace: str, job_name: str) -> list[dict[str, Any]]:
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", f"job-name={job_name}", "-o", "json"
    )
    return json.loads(out.stdout)["items"]  # type: ignore[no-any-return]


def test_job_runs_to_completion(cluster: Cluster, namespace: str) -> None:
    cluster.apply([job(cluster, "ok", "print('work done')")], namespace)
    done = wait_for(
        "Job Complete",
        lambda: (j := cluster.get("job", "ok", namespace)) and condition(j, "Complete") and j,
    )
    assert done["status"]["succeeded"] == 1
    [pod] = job_pods(cluster, namespace, "ok")
    assert pod["status"]["phase"] == "Succeeded"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0
    assert "work done" in cluster.logs(pod["metadata"]["name"], namespace)


def test_failing_job_reports_exit_code_and_fails(cluster: Cluster, namespace: str) -> None:
    cluster.apply([job(cluster, "bad", "import sys; print('giving up'); sys.exit(3)")], namespace)
    failed = wait_for(
        "Job Failed",
        lambda: (j := cluster.get("job", "bad", namespace)) and condition(j, "Failed") and j,
    )
    assert not condition(failed, "Complete")
    [pod] = job_pods(cluster, namespace, "bad")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_cronjob_creates_a_job_that_completes(cluster: Cluster, namespace: str) -> None:
    template = job(cluster, "unused", "print('tick')")["spec"]
    cronjob = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "tick"},
        "spec": {"schedule": "*/1 * * * *", "jobTemplate": {"spec": template}},
    }
    cluster.apply([cronjob], namespace)

    def completed_job() -> dict[str, Any] | None:
        out = cluster.kubectl_run("get", "jobs", "-n", namespace, "-o", "json")
        for j in json.loads(out.stdout)["items"]:
            owners = j["metadata"].get("ownerReferences", [])
            if any(o["kind"] == "CronJob" and o["name"] == "tick" for o in owners) and condition(
                j, "Complete"
            ):
                return j  # type: ignore[no-any-return]
        return None

    # The schedule fires at the next minute boundary: at most 60 s plus the run.
    j = wait_for("a Job created by the CronJob to complete", completed_job, 150, every_s=2)
    assert j["status"]["succeeded"] == 1
    wait_for(
        "CronJob lastSuccessfulTime",
        lambda: cluster.get("cronjob", "tick", namespace)["status"].get("lastSuccessfulTime"),
        60,
    )
