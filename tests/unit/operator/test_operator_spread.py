"""Broker pods spread across nodes and zones unless the cluster says where they go."""

from __future__ import annotations

import copy

from operator_fakes import CLUSTER

from headrace.operator import workloads
from headrace.resources import BrokerCluster


def pod_spec(manifest: dict) -> dict:  # type: ignore[type-arg]
    sts = workloads.statefulset(
        BrokerCluster.from_manifest(manifest), "uid-1", "ns", workloads.WorkloadSettings()
    )
    return sts["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_brokers_spread_across_nodes_and_zones_by_default() -> None:
    spec = pod_spec(CLUSTER)
    constraints = spec["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    selector = spec.get("nodeSelector")  # untouched
    assert selector is None
    labels = workloads.statefulset(
        BrokerCluster.from_manifest(CLUSTER), "uid-1", "ns", workloads.WorkloadSettings()
    )["spec"]["selector"]["matchLabels"]
    for c in constraints:
        # a preference: a cluster with fewer nodes than brokers still schedules
        assert (c["maxSkew"], c["whenUnsatisfiable"]) == (1, "ScheduleAnyway")
        assert c["labelSelector"]["matchLabels"] == labels  # this cluster's brokers only


def test_a_cluster_that_gives_its_own_affinity_gets_no_added_spread() -> None:
    manifest = copy.deepcopy(CLUSTER)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    manifest["spec"]["scheduling"] = {"affinity": affinity}  # type: ignore[index]
    spec = pod_spec(manifest)
    assert spec["affinity"] == affinity
    assert "topologySpreadConstraints" not in spec
