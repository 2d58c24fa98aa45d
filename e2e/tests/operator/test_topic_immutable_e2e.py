"""The API server refuses an edit of a Topic's ``clusterRef`` or ``replicas`` with the
CRD's CEL message, and stores nothing of it; an edit of ``partitions`` still goes
through. No operator process: the chart's CRDs alone (the ``crds`` fixture)."""

from __future__ import annotations

import json

import pytest

from e2e.support import Cluster
from headrace.resources.topics import CLUSTER_REF_IMMUTABLE, REPLICAS_IMMUTABLE


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"clusterRef": {"name": "other"}}, CLUSTER_REF_IMMUTABLE),
        ({"replicas": 2}, REPLICAS_IMMUTABLE),
    ],
)
def test_cluster_ref_and_replicas_edits_are_refused(
    cluster: Cluster, namespace: str, crds: None, patch: dict[str, object], message: str
) -> None:
    cluster.apply(
        [
            {
                "apiVersion": "headrace.dev/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": "orders"},
                "spec": {"clusterRef": {"name": "demo"}, "partitions": 1, "replicas": 1},
            }
        ],
        namespace,
    )
    before = cluster.get("topic", "orders", namespace)
    refused = cluster.kubectl_run(
        "patch", "topic", "orders", "-n", namespace, "--type", "merge",
        "-p", json.dumps({"spec": patch}), check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert message in refused.stderr, refused.stderr
    after = cluster.get("topic", "orders", namespace)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]

    # the partition count stays editable: that edit is a repartition
    cluster.kubectl_run(
        "patch", "topic", "orders", "-n", namespace, "--type", "merge",
        "-p", json.dumps({"spec": {"partitions": 2}}),
    )  # fmt: skip
    assert cluster.get("topic", "orders", namespace)["spec"]["partitions"] == 2
