"""What the object-store e2e tests share: MinIO on loopback, the operator (installed with the
chart, as the other operator suites do), a tiered BrokerCluster with its credentials Secret, produce and consume through pod IPs.

The test bed's runner runs pods' commands as host processes, so a MinIO server this
test starts on 127.0.0.1 is reachable from the broker pods and from Job pods alike.
On the stand-in the pods are host processes running this checkout's Python; on a real
node (``E2E_NODE=real``) they are containers of the images, MinIO listens on the pod
bridge's gateway and this host reaches the brokers on their pod IPs.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from e2e.support import Cluster, ensure_spark_image, wait_for
from e2e.tests.operator.fixtures import InstalledOperator, release_stuck_topics
from headrace.jobs.topics import TopicRef, read_manifest
from headrace.objectstore.interface import ObjectStore
from headrace.objectstore.minio_store import MinioStore
from headrace.testing import procs
from headrace.testing.minio import MinioServer
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest
from tests.integration.objectstore import servers

SECRET = "store-credentials"
BUCKET = "tiers"


@contextmanager
def minio(tmp_path: Path, cluster: Cluster | None = None) -> Iterator[MinioServer]:
    """MinIO on this host: on loopback, which the stand-in's pods (host processes) share;
    on a real node, on the pod bridge's gateway address, which its pods route to and this
    host has (from the test bed's start: its CoreDNS pods run on the bridge)."""
    host = "127.0.0.1"
    if cluster is not None and cluster.real_node:
        from e2e.testbed.realnode import PodNetwork
        from e2e.testbed.settings import Settings

        host = PodNetwork.of(Settings.from_env()).gateway
    server = MinioServer(servers.minio_binary(), tmp_path / "minio" / "data", host=host)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def store_client(server: MinioServer) -> ObjectStore:
    return MinioStore(server.settings(BUCKET))


@contextmanager
def operator(cluster: Cluster, namespace: str, log: Path, *, spark: bool = False) -> Iterator[Path]:
    """The operator installed with the chart, watching ``namespace`` (``fixtures``;
    ``spark``: the test runs Compactions, so a real node gets the Spark image too); on
    exit the Topics, then the BrokerClusters are deleted while it runs (it removes their
    finalizers: a Topic's data finalizer needs the brokers), then it is uninstalled. Its
    log is written to ``log`` then (and printed if the block failed)."""
    if spark:
        ensure_spark_image(cluster)
    installed = InstalledOperator(cluster, namespace)
    installed.install()
    try:
        yield log
    except BaseException:
        print(installed.logs()[-8000:], file=sys.stderr)
        raise
    finally:
        log.write_text(installed.logs())
        cluster.kubectl_run(
            "delete", "topic", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=90
        )
        release_stuck_topics(cluster, namespace)
        cluster.kubectl_run(
            "delete", "brokercluster", "--all", "-n", namespace, "--timeout=60s",
            check=False, timeout=90,
        )  # fmt: skip
        installed.uninstall()


def enforce_restricted(cluster: Cluster, namespace: str) -> None:
    """Have ``namespace`` enforce Pod Security "restricted": the API server (admission, so
    on the stand-in too) then refuses any pod of the test (brokers, a Compaction's driver,
    the executor pods Spark's driver creates) that does not fit it."""
    enforce = "pod-security.kubernetes.io/enforce"
    cluster.kubectl_run(
        "label", "namespace", namespace, f"{enforce}=restricted", f"{enforce}-version=latest"
    )


def job_container(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    """The status of the one container of ``job``'s one pod: which image ran it, and on a
    real node its containerd id."""
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={job}", "-o", "json"
    ).stdout
    (pod,) = json.loads(out)["items"]
    (ran,) = pod["status"]["containerStatuses"]
    return dict(ran)


def credentials_secret(server: MinioServer) -> dict[str, Any]:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "data": {"accessKey": b64(server.access_key), "secretKey": b64(server.secret_key)},
    }


def tiered_cluster(endpoint: str, name: str, replicas: int, **broker_config: Any) -> dict[str, Any]:
    """A BrokerCluster tiering to ``endpoint`` (``host:port``) with the test's Secret."""
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "storage": {"size": "64Mi"},
            "objectStore": {
                "endpoint": f"http://{endpoint}",
                "bucket": BUCKET,
                "createBucket": True,
                "credentialsSecret": {"name": SECRET},
            },
            "brokerConfig": broker_config,
        },
    }


def tiered_topic(
    name: str, cluster_name: str, partitions: int = 1, **tiered: Any
) -> dict[str, Any]:
    """A one-replica tiered Topic uploading every second; ``tiered``: more of its
    ``tieredStorage`` (``localRetentionBytes=1`` leaves only the tier to read old
    offsets from)."""
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name},
        "spec": {
            "clusterRef": {"name": cluster_name},
            "partitions": partitions,
            "replicas": 1,
            "minInSync": 1,
            "tieredStorage": {"enabled": True, "uploadIntervalSeconds": 1, **tiered},
        },
    }


def condition(body: dict[str, Any], kind: str = "Ready") -> dict[str, Any]:
    found = [c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def wait_ready(cluster: Cluster, kind: str, name: str, namespace: str) -> None:
    cluster.kubectl_run(
        "wait", "--for=condition=Ready", f"{kind}/{name}", "-n", namespace,
        "--timeout=120s", timeout=150,
    )  # fmt: skip


def bootstrap(cluster: Cluster, namespace: str, cluster_name: str) -> str:
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", f"headrace.dev/cluster={cluster_name}", "-o", "json"
    )
    ips = [
        p["status"]["podIP"] for p in json.loads(out.stdout)["items"] if p["status"].get("podIP")
    ]
    return ",".join(f"{ip}:9092" for ip in ips)


def produce(servers: str, topic: str, values: list[str]) -> None:
    """acks=all; fails the test unless every record is acknowledged."""
    done = procs.run_headrace(
        "produce", topic, "--acks", "all", "--bootstrap", servers,
        stdin="".join(f"{v}\n" for v in values).encode(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()


def consume_all(servers: str, topic: str, cohort: str) -> list[dict[str, Any]]:
    """Every record from the earliest offset, as ``--format json`` objects (the consumer
    stops after 10 s without records: generous, as a loaded machine can pause it)."""
    done = procs.run_headrace(
        "consume", topic, "--cohort", cohort, "--from-beginning", "--format", "json",
        "--idle-timeout", "10", "--bootstrap", servers, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]


def topic_ref(store: ObjectStore, cluster_name: str, topic: str) -> TopicRef:
    """The topic's objects as stored: under the one creation id (its Topic's uid) found
    below its name (each test creates its topics once), else the legacy layout."""
    legacy = TopicRef(cluster_name, topic)
    heads = {o.key[len(legacy.prefix) :].partition("/")[0] for o in store.list(legacy.prefix)}
    ids = sorted(h for h in heads if not h.isdigit())
    assert len(ids) <= 1, f"{topic}: objects of {len(ids)} incarnations: {ids}"
    return TopicRef(cluster_name, topic, ids[0]) if ids else legacy


def manifest(store: ObjectStore, cluster_name: str, topic: str, partition: int) -> Manifest:
    """The partition's manifest as stored now (empty if none yet)."""
    ref = topic_ref(store, cluster_name, topic)
    return read_manifest(store, ref.partition_prefix(partition) + layout.MANIFEST_NAME)


def wait_stored(
    store: ObjectStore, cluster_name: str, topic: str, partition: int, last_offset: int
) -> Manifest:
    """The partition's manifest once its checkpoint covers ``last_offset``."""

    def covered() -> Manifest | None:
        found = manifest(store, cluster_name, topic, partition)
        return found if found.checkpoint >= last_offset else None

    return wait_for(f"{topic}/{partition} stored through offset {last_offset}", covered, 90)
