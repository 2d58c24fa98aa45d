"""Running the jobs on the tests' shared Spark session."""

from __future__ import annotations

from typing import Any

from headrace.jobs import run


def run_job(
    spark: Any, job: str, store_url: str, cluster_id: str, topic: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    args = run.parse_args(
        [job, "--store", store_url, "--cluster", cluster_id, "--topic", topic, *extra]
    )
    return run.run_job(args, spark)
