"""The chart's MinIO (``minio.enabled``) on a real node: a pod of the MinIO image built
here from its Go module (``tools/minio/image.sh``; nothing is pulled), admitted where Pod
Security "restricted" is enforced, on a volume whose root is ``root:root 0755`` (written
as uid 10001 through ``fsGroup``), serving S3 to a client on the host.

Real node only (``make e2e-node``): the stand-in ignores images and runs commands on the
host, so it would run no MinIO image at all.
"""

from __future__ import annotations

import io
import json

import pytest
from minio import Minio

from e2e.support import Cluster, minio_image
from e2e.tests.operator.fixtures import InstalledOperator

ENFORCE = "pod-security.kubernetes.io/enforce"
USER, PASSWORD = "headrace", "headrace-minio-secret"


@pytest.fixture
def namespace(cluster: Cluster, namespace: str) -> str:
    if not cluster.real_node:
        pytest.skip("runs the chart's MinIO image: needs the real node (E2E_NODE=real)")
    cluster.kubectl_run(
        "label", "namespace", namespace, f"{ENFORCE}=restricted", f"{ENFORCE}-version=latest"
    )
    return namespace


def test_the_charts_minio_runs_as_a_pod_of_its_image(cluster: Cluster, namespace: str) -> None:
    image = minio_image(cluster)
    release = InstalledOperator(cluster, namespace)
    release.install(
        "--set", "minio.enabled=true", "--set", f"minio.image={image}",
        "--set", f"minio.rootUser={USER}", "--set", f"minio.rootPassword={PASSWORD}",
    )  # fmt: skip
    try:
        # the chart's full name is <release>-headrace; its MinIO's, that and -minio
        selector = f"app.kubernetes.io/name={release.release}-headrace-minio"
        out = cluster.kubectl_run("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
        pods = json.loads(out.stdout)["items"]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        (status,) = pods[0]["status"]["containerStatuses"]
        assert status["containerID"].startswith("containerd://"), status
        assert status["image"] == image and status["ready"], status
        # S3 from this host, on the pod's address: a bucket, an object written to the
        # volume and read back
        client = Minio(f"{pods[0]['status']['podIP']}:9000", USER, PASSWORD, secure=False)
        client.make_bucket("e2e")
        body = b"headrace on a real node\n" * 100
        client.put_object("e2e", "probe", io.BytesIO(body), len(body))
        got = client.get_object("e2e", "probe")
        try:
            assert got.read() == body
        finally:
            got.close()
            got.release_conn()
    finally:
        release.uninstall()
