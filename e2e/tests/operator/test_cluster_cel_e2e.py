"""The API server refuses a BrokerCluster spec that the operator's model refuses, with
the CRD's CEL message (the model's cross-field rules have CEL twins): a cpu request above
its limit on create, and a ``storage.size`` that shrinks on update. No operator process:
the chart's CRDs alone (the ``crds`` fixture)."""

from __future__ import annotations

import json
from typing import Any

from e2e.support import Cluster
from headrace.resources.clusters import REQUEST_ABOVE_LIMIT, STORAGE_SHRINK_REFUSED


def broker_cluster(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "demo"},
        "spec": {"replicas": 1, **spec},
    }


def test_a_cpu_request_above_its_limit_is_refused(
    cluster: Cluster, namespace: str, crds: None
) -> None:
    refused = cluster.kubectl_run(
        "apply", "-n", namespace, "-f", "-",
        input=json.dumps(
            broker_cluster({"resources": {"requests": {"cpu": 2}, "limits": {"cpu": "1"}}})
        ),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert REQUEST_ABOVE_LIMIT in refused.stderr, refused.stderr
    assert cluster.kubectl_run(
        "get", "brokercluster", "demo", "-n", namespace, check=False
    ).returncode != 0  # fmt: skip

    # within the limit (another resource's request may be above nothing: no limit)
    cluster.apply(
        [
            broker_cluster(
                {
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"cpu": 1},
                    }
                }
            )
        ],
        namespace,
    )
    assert cluster.get("brokercluster", "demo", namespace)["spec"]["resources"]["limits"] == {
        "cpu": 1
    }


def test_a_smaller_storage_size_is_refused_and_a_larger_one_accepted(
    cluster: Cluster, namespace: str, crds: None
) -> None:
    cluster.apply([broker_cluster({"storage": {"size": "2Gi"}})], namespace)
    refused = cluster.kubectl_run(
        "patch", "brokercluster", "demo", "-n", namespace, "--type", "merge",
        "-p", json.dumps({"spec": {"storage": {"size": "1Gi"}}}), check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert STORAGE_SHRINK_REFUSED in refused.stderr, refused.stderr
    cluster.kubectl_run(
        "patch", "brokercluster", "demo", "-n", namespace, "--type", "merge",
        "-p", json.dumps({"spec": {"storage": {"size": "3Gi"}}}),
    )  # fmt: skip
    assert cluster.get("brokercluster", "demo", namespace)["spec"]["storage"]["size"] == "3Gi"


def test_an_external_listener_takes_a_node_port_base_with_node_port_alone(
    cluster: Cluster, namespace: str, crds: None
) -> None:
    refusals = {
        "nodePortBase is required": {"type": "LoadBalancer", "nodePortBase": 31000},
        "nodePortBase is required ": {"type": "NodePort"},
        "needs tls.enabled": {"type": "LoadBalancer", "tls": {"secretName": "outside"}},
    }
    for message, external in refusals.items():
        refused = cluster.kubectl_run(
            "apply", "-n", namespace, "-f", "-",
            input=json.dumps(broker_cluster({"listeners": {"external": external}})),
            check=False,
        )  # fmt: skip
        assert refused.returncode != 0, external
        assert message.strip() in refused.stderr, refused.stderr
    cluster.apply(
        [broker_cluster({"listeners": {"external": {"type": "LoadBalancer"}}})], namespace
    )
    external = cluster.get("brokercluster", "demo", namespace)["spec"]["listeners"]["external"]
    assert (external["type"], external["port"]) == ("LoadBalancer", 9094)
