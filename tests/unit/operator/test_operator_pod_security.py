"""Every pod the operator makes fits Pod Security "restricted", runs as the image's user
with its volumes owned through ``fsGroup``, writes only to its volumes, and brokers get
default requests and a startup probe long enough to recover a large log.

The chart's pods get the same checker in ``e2e/tests/chart/test_chart_render.py`` (it
needs the test bed's helm); a BrokerCluster Ready in a namespace enforcing "restricted"
is ``e2e/tests/operator/test_pod_security_e2e.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from operator_fakes import CLUSTER

from headrace.operator import compaction_jobs, install, workloads
from headrace.resources.clusters import BrokerCluster
from headrace.resources.compactions import Compaction, CompactionSchedule
from tests.podsecurity import pod_spec_of, violations, writable_roots
from tests.unit.operator.test_operator_compactions import (
    compaction_body,
    run_target,
    schedule_body,
)

REPO = Path(__file__).resolve().parents[3]
SETTINGS = workloads.WorkloadSettings()


def cluster_with(**spec: Any) -> BrokerCluster:
    return BrokerCluster.from_manifest({**CLUSTER, "spec": {**CLUSTER["spec"], **spec}})  # type: ignore[dict-item]


def broker_pod(cluster: BrokerCluster) -> dict[str, Any]:
    pod: dict[str, Any] = workloads.statefulset(cluster, "uid-1", "ns", SETTINGS)["spec"][
        "template"
    ]["spec"]
    return pod


BROKER_CLUSTERS = {
    "plain": cluster_with(),
    "tls": cluster_with(
        tls={
            "enabled": True,
            "secretName": "t",
            "clientAuth": "required",
            "clientCASecretName": "c",
        }
    ),
    "auth": cluster_with(auth={"enabled": True}),
    "store": cluster_with(
        objectStore={
            "endpoint": "http://minio:9000",
            "bucket": "tiers",
            "credentialsSecret": {"name": "s"},
        },
        resources={"limits": {"memory": "2Gi"}},
    ),
}


def operator_workloads() -> dict[str, dict[str, Any]]:
    """Every object with a pod template the operator writes, one per shape."""
    objects = {
        f"statefulset-{name}": workloads.statefulset(cluster, "uid-1", "ns", SETTINGS)
        for name, cluster in BROKER_CLUSTERS.items()
    }
    for master in ("local", "kubernetes"):
        compaction = Compaction.from_manifest(compaction_body(spark={"master": master}))
        objects[f"job-{master}"] = compaction_jobs.job_manifest(
            compaction, "uid-once", run_target(), SETTINGS
        )
    schedule = CompactionSchedule.from_manifest(schedule_body())
    objects["cronjob"] = compaction_jobs.cronjob_manifest(schedule, "uid-s", run_target(), SETTINGS)
    # what Spark's driver makes executor pods from (Spark adds its own container fields)
    objects["spark-executor-template"] = compaction_jobs.executor_pod_template()
    # the operator's own Deployment, as ``python -m headrace.operator.install`` writes it
    (objects["operator-install"],) = [
        d for d in install.manifests("ops") if d["kind"] == "Deployment"
    ]
    return objects


def test_the_checker_names_what_restricted_refuses() -> None:
    # a pod as the operator made them before: no securityContext at all
    bare = {
        "containers": [{"name": "broker", "image": "x"}],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
    }
    assert violations(bare) == [
        "volume host: type ['hostPath']",
        "containers[broker]: allowPrivilegeEscalation is not false",
        "containers[broker]: runAsNonRoot is not true",
        "containers[broker]: seccompProfile is unset",
        "containers[broker]: capabilities.drop lacks ALL",
    ]
    assert writable_roots(bare) == ["containers[broker]"]
    # the pod's settings count for its containers, a container's own override them
    pod = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [
            {
                "name": "init",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
                    "runAsUser": 0,
                    "seccompProfile": {"type": "Unconfined"},
                },
            }
        ],
    }
    assert violations(pod) == [
        "initContainers[init]: runAsUser is 0",
        "initContainers[init]: seccompProfile is Unconfined",
        "initContainers[init]: capabilities.add ['SYS_ADMIN']",
    ]


@pytest.mark.parametrize("shape", sorted(operator_workloads()))
def test_every_pod_the_operator_makes_fits_restricted(shape: str) -> None:
    pod = pod_spec_of(operator_workloads()[shape])
    assert pod is not None
    assert violations(pod) == []
    assert writable_roots(pod) == []
    # a read-only root: scratch goes to an emptyDir at /tmp
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "emptyDir" in volumes[mounts[workloads.SCRATCH_DIR]]


def test_spark_executors_get_their_pod_template_from_the_driver() -> None:
    compaction = Compaction.from_manifest(compaction_body(spark={"master": "kubernetes"}))
    job = compaction_jobs.job_manifest(compaction, "uid-once", run_target(), SETTINGS)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    template = json.loads(args[args.index("--executor-pod-template") + 1])
    assert template == compaction_jobs.executor_pod_template()
    # the Spark image's user, not headrace's
    assert template["spec"]["securityContext"]["runAsUser"] == workloads.SPARK_IMAGE_UID
    conf = [args[i + 1] for i, word in enumerate(args) if word == "--conf"]
    assert "spark.kubernetes.executor.podTemplateContainerName=executor" in conf
    # in local mode there are no executor pods
    local = compaction_jobs.job_manifest(
        Compaction.from_manifest(compaction_body()), "uid-once", run_target(), SETTINGS
    )
    assert (
        "--executor-pod-template" not in local["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_pods_run_as_the_images_user_and_own_their_volumes() -> None:
    user = re.search(r"^USER (\d+):(\d+)$", (REPO / "Containerfile").read_text(), re.MULTILINE)
    assert user is not None
    assert (int(user[1]), int(user[2])) == (workloads.IMAGE_UID, workloads.IMAGE_UID)
    context = broker_pod(BROKER_CLUSTERS["plain"])["securityContext"]
    # a fresh disk's root is root:root 0755: fsGroup makes it the broker's group, once
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (10001,) * 3
    assert context["fsGroupChangePolicy"] == "OnRootMismatch"


def test_the_images_user_has_a_passwd_entry() -> None:
    # kopf names the operator's peer after getpass.getuser(), which raises for a uid
    # without one: the operator's pod exited at start on a real node
    uid = workloads.IMAGE_UID
    text = (REPO / "Containerfile").read_text()
    assert re.search(rf"'\w+:x:{uid}:{uid}:[^']*' >>/etc/passwd", text)


def test_brokers_get_default_requests_unless_the_spec_names_the_resource() -> None:
    (plain,) = broker_pod(BROKER_CLUSTERS["plain"])["containers"]
    assert plain["resources"] == {"requests": dict(workloads.DEFAULT_REQUESTS)}
    # a limit alone is the request too (Kubernetes defaults it): no default under it
    (limited,) = broker_pod(BROKER_CLUSTERS["store"])["containers"]
    assert limited["resources"] == {
        "requests": {"cpu": workloads.DEFAULT_REQUESTS["cpu"]},
        "limits": {"memory": "2Gi"},
    }
    (named,) = broker_pod(cluster_with(resources={"requests": {"cpu": "2"}}))["containers"]
    assert named["resources"]["requests"] == {
        "cpu": "2",
        "memory": workloads.DEFAULT_REQUESTS["memory"],
    }


def test_a_startup_probe_covers_recovery_of_a_large_log() -> None:
    (broker,) = broker_pod(BROKER_CLUSTERS["plain"])["containers"]
    startup = broker["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    # liveness starts after it: no delay of its own that recovery could outlast
    assert "initialDelaySeconds" not in broker["livenessProbe"]
    (tls,) = broker_pod(BROKER_CLUSTERS["tls"])["containers"]
    assert tls["startupProbe"]["httpGet"]["scheme"] == "HTTPS"
