"""Unload through the operator, end to end, with the object store
the BrokerCluster names.

MinIO on this host; a 2-broker BrokerCluster whose ``objectStore`` names it, with its
credentials in a Secret; a tiered Topic with one partition; records produced with
acks=all; an Unload CR moving the partition to the other broker. Its status shows the
sealed offset and the phase ``Completed``; the sealed state is in the store; and a
consumer from offset 0 through the new owner (which dropped its local copy, so the old
offsets come from the object store through the tiered read path) gets every
acknowledged record exactly once, with the records produced after the move.

Before the Secret exists the broker pods cannot start (the kubelet's
``CreateContainerConfigError``) and the cluster is ``Ready=False`` with reason
``CredentialsSecretMissing`` (and ``Stalled``); once the Secret exists the pods start
and the cluster becomes Ready.

On the test bed, stand-in or real node: MinIO runs on this host (``storage.minio``),
the operator and the brokers as pods, which this host reaches on their pod IPs.
"""

from __future__ import annotations

import collections
from pathlib import Path

from e2e.support import Cluster, wait_for
from e2e.tests.operator import storage
from headrace.jobs.topics import read_sealed
from headrace.tiered import layout


def test_an_unload_seals_through_the_clusters_object_store(
    cluster: Cluster, namespace: str, testbed_provider: None, tmp_path: Path
) -> None:
    with (
        storage.minio(tmp_path, cluster) as server,
        storage.operator(cluster, namespace, tmp_path / "operator.log"),
    ):
        # the cluster before its Secret: its pods cannot start, and the cluster says why
        cluster.apply([storage.tiered_cluster(server.endpoint, "tier", 2)], namespace)
        missing = wait_for(
            "CredentialsSecretMissing on the BrokerCluster",
            lambda: (
                c
                if (c := storage.condition(cluster.get("brokercluster", "tier", namespace))).get(
                    "reason"
                )
                == "CredentialsSecretMissing"
                else None
            ),
            60,
        )
        assert missing["status"] == "False" and storage.SECRET in missing["message"]
        body = cluster.get("brokercluster", "tier", namespace)
        assert storage.condition(body, "Stalled").get("status") == "True"

        # the Secret arrives: the brokers start, the cluster and the Topic become Ready
        cluster.apply([storage.credentials_secret(server)], namespace)
        storage.wait_ready(cluster, "brokercluster", "tier", namespace)
        wait_for(
            "ObjectStoreReachable=True on the BrokerCluster",
            lambda: (
                storage.condition(
                    cluster.get("brokercluster", "tier", namespace), "ObjectStoreReachable"
                ).get("status")
                == "True"
            ),
            30,
        )
        cluster.apply([storage.tiered_topic("moving", "tier")], namespace)
        storage.wait_ready(cluster, "topic", "moving", namespace)

        topic = f"{namespace}/moving"
        servers = storage.bootstrap(cluster, namespace, "tier")
        acked = [f"before-{i}" for i in range(300)]
        storage.produce(servers, topic, acked)
        (placed,) = cluster.get("topic", "moving", namespace)["status"]["partitions"]
        owner = placed["leader"]
        target = 1 - owner

        cluster.apply(
            [
                {
                    "apiVersion": "headrace.dev/v1alpha1",
                    "kind": "Unload",
                    "metadata": {"name": "drain"},
                    "spec": {"topicRef": {"name": "moving"}, "targetBroker": target},
                }
            ],
            namespace,
        )

        def completed() -> dict[str, object] | None:
            status = cluster.get("unload", "drain", namespace).get("status") or {}
            return status if status.get("phase") == "Completed" else None

        status = wait_for("the Unload to complete", completed, 120)
        (move,) = status["moves"]
        assert (move["fromBroker"], move["toBroker"]) == (owner, target)
        assert move["phase"] == "Completed"
        assert move["sealedOffset"] == len(acked) - 1
        assert move["verification"]["result"] == "Passed"
        assert storage.condition(cluster.get("unload", "drain", namespace))["status"] == "True"

        # the object store holds everything up to the sealed offset, and the sealed state
        store = storage.store_client(server)
        try:
            stored = storage.manifest(store, "tier", topic, 0)
            assert stored.checkpoint >= move["sealedOffset"]
            sealed = read_sealed(
                store,
                storage.topic_ref(store, "tier", topic).partition_prefix(0) + layout.SEALED_NAME,
            )
            assert sealed is not None
        finally:
            store.close()

        # the new owner serves the old offsets from the object store, then its own
        wait_for(
            "the partition led by the target broker",
            lambda: (
                cluster.get("topic", "moving", namespace)["status"]["partitions"][0].get("leader")
                == target
            ),
            60,
        )
        after = [f"after-{i}" for i in range(50)]
        storage.produce(servers, topic, after)
        records = storage.consume_all(servers, topic, "check")
        counts = collections.Counter(r["value"] for r in records)
        lost = [v for v in acked + after if counts[v] == 0]
        twice = [v for v, n in counts.items() if n > 1]
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:5]}"
        assert not twice, f"records delivered twice: {twice[:5]}"
        assert [r["offset"] for r in records] == list(range(len(acked) + len(after)))
