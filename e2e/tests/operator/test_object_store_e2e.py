"""A BrokerCluster whose brokers cannot upload (the object store
failing): MinIO answers, but the Secret's secret key is wrong. The brokers keep serving
(acks=all works, the records stay readable), and their heartbeats' ``uploadError``
becomes the cluster's ``ObjectStoreReachable=False``, reason ``UploadsFailing``.

On the test bed, stand-in or real node: MinIO runs on this host (``storage.minio``),
the operator and the brokers as pods, which this host reaches on their pod IPs.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from e2e.support import Cluster, wait_for
from e2e.tests.operator import storage


def test_failing_uploads_show_on_the_cluster_and_lose_nothing(
    cluster: Cluster, namespace: str, testbed_provider: None, tmp_path: Path
) -> None:
    with (
        storage.minio(tmp_path, cluster) as server,
        storage.operator(cluster, namespace, tmp_path / "operator.log"),
    ):
        secret = storage.credentials_secret(server)
        secret["data"]["secretKey"] = base64.b64encode(b"not-the-secret-key").decode()
        cluster.apply([secret, storage.tiered_cluster(server.endpoint, "bad", 1)], namespace)
        storage.wait_ready(cluster, "brokercluster", "bad", namespace)
        cluster.apply([storage.tiered_topic("events", "bad")], namespace)
        storage.wait_ready(cluster, "topic", "events", namespace)

        topic = f"{namespace}/events"
        servers = storage.bootstrap(cluster, namespace, "bad")
        acked = [f"e-{i}" for i in range(100)]
        storage.produce(servers, topic, acked)

        def failing() -> dict[str, Any] | None:
            body = cluster.get("brokercluster", "bad", namespace)
            found = storage.condition(body, "ObjectStoreReachable")
            return found if found.get("reason") == "UploadsFailing" else None

        reachable = wait_for("UploadsFailing on the BrokerCluster", failing, 90)
        assert reachable["status"] == "False"
        assert f"{topic}/0" in reachable["message"], reachable["message"]
        body = cluster.get("brokercluster", "bad", namespace)
        assert storage.condition(body)["status"] == "True"  # the brokers serve all the same

        records = storage.consume_all(servers, topic, "check")
        assert sorted(r["value"] for r in records) == sorted(acked)
