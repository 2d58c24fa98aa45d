"""The status store against a real API server: a stale resourceVersion gets a real 409,
which the store re-reads and retries; the spec is never written; an equal status is not
sent. No operator process: the store alone, over
the chart's CRDs (the ``crds`` fixture)."""

from __future__ import annotations

from typing import Any

from e2e.support import Cluster
from headrace.operator.kube import ClientApi, ObjectRef
from headrace.operator.statuses import KubeStatusStore


class CountingApi(ClientApi):
    """The real client, counting status PUTs and their outcome."""

    def __init__(self, kubeconfig: str) -> None:
        super().__init__(kubeconfig)
        self.puts: list[str] = []

    async def replace_status(self, ref: ObjectRef, resource_version: str, status: Any) -> Any:
        try:
            stored = await super().replace_status(ref, resource_version, status)
        except Exception as exc:
            self.puts.append(type(exc).__name__)
            raise
        self.puts.append("ok")
        return stored


async def test_a_stale_resource_version_is_reread_and_retried(
    cluster: Cluster, namespace: str, crds: None
) -> None:
    cluster.apply(
        [
            {
                "apiVersion": "headrace.dev/v1alpha1",
                "kind": "BrokerCluster",
                "metadata": {"name": "demo"},
                "spec": {"replicas": 1},
            },
            {
                "apiVersion": "headrace.dev/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": "orders"},
                "spec": {"clusterRef": {"name": "demo"}, "partitions": 1, "replicas": 1},
            },
        ],
        namespace,
    )
    api = CountingApi(str(cluster.kubeconfig))
    store = KubeStatusStore(
        api,
        cluster.get("brokercluster", "demo", namespace),
        [cluster.get("topic", "orders", namespace)],
    )
    # someone else changes the Topic after the store read it: its resourceVersion is stale
    cluster.kubectl_run("label", "topic/orders", "-n", namespace, "team=payments")
    status = {
        "observedGeneration": 1,
        "topologyGeneration": 1,
        "partitioningVersion": 1,
        "partitions": [
            {"partition": 0, "leader": 0, "replicas": [0], "liveReplicas": [0], "leaderEpoch": 1}
        ],
    }
    await store.write_topic_status(f"{namespace}/orders", status)
    assert api.puts == ["StaleResourceVersion", "ok"]
    stored = cluster.get("topic", "orders", namespace)
    assert stored["status"]["partitions"][0]["leader"] == 0
    assert stored["metadata"]["labels"] == {"team": "payments"}
    assert stored["metadata"]["generation"] == 1  # the spec was not written
    assert stored["spec"]["partitions"] == 1

    await store.write_topic_status(f"{namespace}/orders", dict(status))
    assert api.puts == ["StaleResourceVersion", "ok"], "an equal status must not be sent"
