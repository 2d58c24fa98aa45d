"""A Compaction with ``spec.spark.master: kubernetes``: the Job's pod runs Spark's driver in
client mode against the API server, as the Spark service account, with executors as
pods of the operator's Spark image (pure builders; the run itself is in
``e2e/tests/operator/test_compaction_executors_e2e.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic
import pytest

from headrace.operator import compaction_jobs, workloads
from headrace.resources.compactions import Compaction, CompactionSchedule, SparkMaster
from tests.unit.operator.test_operator_compactions import (
    compaction_body,
    run_target,
    schedule_body,
)

SETTINGS = workloads.WorkloadSettings(
    broker_command=("headrace",),
    default_image="registry.example/headrace:1.0",
    spark_image="registry.example/headrace-spark:1.0",
    spark_image_pull_policy="Always",
    spark_service_account="drivers",
)


def confs(args: list[str]) -> dict[str, str]:
    pairs = [args[i + 1].partition("=") for i, word in enumerate(args) if word == "--conf"]
    return {key: value for key, _, value in pairs}


def pod_of(**spec: Any) -> dict[str, Any]:
    compaction = Compaction.from_manifest(compaction_body(**spec))
    job = compaction_jobs.job_manifest(compaction, "uid-once", run_target(), SETTINGS)
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def test_the_default_runs_spark_inside_the_job_pod() -> None:
    compaction = Compaction.from_manifest(compaction_body())
    assert compaction.spec.spark.master == SparkMaster.LOCAL
    pod = pod_of()
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--master") + 1] == "local[*]"
    assert not [k for k in confs(args) if k.startswith("spark.kubernetes.")]
    assert "serviceAccountName" not in pod


def test_executors_as_pods_make_the_job_pod_a_client_mode_driver() -> None:
    pod = pod_of(
        spark={"master": "kubernetes", "executors": 3, "executorCores": 2, "executorMemory": "2g"},
        sparkConf={"spark.kubernetes.executor.request.cores": "250m", "spark.master": "ignored"},
    )
    assert pod["serviceAccountName"] == "drivers"
    (container,) = pod["containers"]
    args = container["args"]
    assert args[args.index("--master") + 1] == compaction_jobs.KUBERNETES_MASTER
    conf = confs(args)
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.kubernetes.namespace"] == "ns"
    assert conf["spark.kubernetes.container.image"] == "registry.example/headrace-spark:1.0"
    assert conf["spark.kubernetes.container.image.pullPolicy"] == "Always"
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "drivers"
    assert conf["spark.kubernetes.authenticate.executor.serviceAccountName"] == "default"
    # the pod's own name (the executors' owner) and IP (theirs to dial), expanded by the
    # kubelet from the downward-API variables the container defines
    env = {e["name"]: e for e in container["env"]}
    name = conf["spark.kubernetes.driver.pod.name"]
    assert name == f"$({compaction_jobs.POD_NAME_ENV})"
    assert (
        env[compaction_jobs.POD_NAME_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    )
    assert conf["spark.driver.host"] == f"$({compaction_jobs.POD_IP_ENV})"
    assert env[compaction_jobs.POD_IP_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # the mounted service-account credentials
    assert conf["spark.kubernetes.authenticate.oauthTokenFile"].startswith(
        compaction_jobs.SERVICE_ACCOUNT_DIR
    )
    assert (conf["spark.executor.instances"], conf["spark.executor.cores"]) == ("3", "2")
    assert conf["spark.executor.memory"] == "2g"
    # no claims for executors, so the driver's Role needs no rights on them
    assert conf["spark.kubernetes.driver.ownPersistentVolumeClaim"] == "false"
    # the executors read the store with the Secret's keys, never a copy of them
    key = f"spark.kubernetes.executor.secretKeyRef.{workloads.ACCESS_KEY_ENV}"
    assert conf[key] == "creds:accessKey"
    # the user's sparkConf comes after ours (spark-submit keeps the last), spark.master never
    assert conf["spark.kubernetes.executor.request.cores"] == "250m"
    assert "spark.master" not in conf


@pytest.mark.parametrize("master", ["local", "kubernetes"])
def test_the_driver_runs_the_spark_image_whatever_image_the_brokers_run(master: str) -> None:
    """The driver needs Java and pyspark (the brokers' image has neither), and its Spark
    must be the executors': the Job's pod runs the operator's Spark image, not the
    cluster's ``spec.image`` nor the operator's default image."""
    compaction = Compaction.from_manifest(compaction_body(spark={"master": master}))
    target = run_target()
    brokers_own = target.cluster.model_copy(
        update={"spec": target.cluster.spec.model_copy(update={"image": "brokers:custom"})}
    )
    for run in (target, dataclasses.replace(target, cluster=brokers_own)):
        job = compaction_jobs.job_manifest(compaction, "uid-once", run, SETTINGS)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example/headrace-spark:1.0"
        assert container["imagePullPolicy"] == "Always"


def test_the_spark_image_runs_as_the_headrace_user() -> None:
    template = compaction_jobs.executor_pod_template()
    security = template["spec"]["securityContext"]
    assert security["runAsUser"] == security["runAsGroup"] == workloads.IMAGE_UID
    assert security["runAsNonRoot"] is True


@pytest.mark.parametrize(
    "spark",
    [
        {"master": "yarn"},
        {"executors": 0},
        {"executorCores": 0},
        {"executorMemory": "lots"},
        {"executorMemory": "1.5g"},
    ],
)
def test_bad_spark_settings_are_refused(spark: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        Compaction.from_manifest(compaction_body(spark=spark))


def test_a_schedule_runs_its_executors_as_pods_too() -> None:
    schedule = CompactionSchedule.from_manifest(
        schedule_body(spark={"master": "kubernetes", "executors": 2})
    )
    cron = compaction_jobs.cronjob_manifest(schedule, "uid-s", run_target(), SETTINGS)
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "drivers"
    args = pod["containers"][0]["args"]
    assert args[args.index("--master") + 1] == compaction_jobs.KUBERNETES_MASTER
    assert confs(args)["spark.executor.instances"] == "2"


def test_a_deadline_bounds_the_job() -> None:
    compaction = Compaction.from_manifest(compaction_body(activeDeadlineSeconds=600))
    job = compaction_jobs.job_manifest(compaction, "uid-once", run_target(), SETTINGS)
    assert job["spec"]["activeDeadlineSeconds"] == 600
    unbounded = compaction_jobs.job_manifest(
        Compaction.from_manifest(compaction_body()), "uid-once", run_target(), SETTINGS
    )
    assert "activeDeadlineSeconds" not in unbounded["spec"]
