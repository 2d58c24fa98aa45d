"""A BrokerCluster's external listener (``spec.listeners.external``): every broker gets a
NodePort Service of its own and an external listener advertised as its node's address
and node port ``nodePortBase + id``; the Services of brokers a scale down removed go,
and all of them once the listener is removed. Without it nothing changes."""

from __future__ import annotations

import copy
from typing import Any

import pydantic
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER, memo_over

from headrace.operator import handlers, workloads
from headrace.operator.bodies import Meta
from headrace.operator.kube import ClientApi
from headrace.resources.clusters import BrokerCluster

SETTINGS = workloads.WorkloadSettings()
EXTERNAL = {"external": {"type": "NodePort", "nodePortBase": 31000}}


def manifest(listeners: dict[str, Any] | None, replicas: int = 3) -> dict[str, Any]:
    body = copy.deepcopy(CLUSTER)
    body["spec"]["replicas"] = replicas
    if listeners is not None:
        body["spec"]["listeners"] = listeners
    return body


def cluster(listeners: dict[str, Any] | None, replicas: int = 3) -> BrokerCluster:
    return BrokerCluster.from_manifest(manifest(listeners, replicas))


def container(c: BrokerCluster) -> dict[str, Any]:
    sts = workloads.statefulset(c, "uid-1", "ns", SETTINGS)
    found: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return found


def external_services(c: BrokerCluster, replicas: int | None = None) -> list[dict[str, Any]]:
    return [
        m
        for m in workloads.manifests(c, "uid-1", "ns", SETTINGS, replicas)
        if m["kind"] == "Service" and m["spec"].get("type") == "NodePort"
    ]


def test_each_broker_advertises_its_node_and_its_own_node_port() -> None:
    c = cluster(EXTERNAL)
    args = container(c)["args"]
    assert args[args.index("--listener") + 1] == "external=$(POD_IP):9094"
    assert args[args.index("--advertised-listener") + 1] == "external=$(NODE_IP):31000+id"
    env = {e["name"]: e for e in container(c)["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert {"name": "external", "containerPort": 9094} in container(c)["ports"]
    # the internal listener is the data port, advertised as before
    assert args[args.index("--port") + 1] == str(workloads.DATA_PORT)


def test_each_broker_gets_a_node_port_service_selecting_its_pod_alone() -> None:
    services = external_services(cluster(EXTERNAL))
    assert [s["metadata"]["name"] for s in services] == [
        "demo-external-0",
        "demo-external-1",
        "demo-external-2",
    ]
    for broker, service in enumerate(services):
        spec = service["spec"]
        assert spec["selector"][workloads.POD_NAME_LABEL] == f"demo-{broker}"
        assert spec["selector"][workloads.CLUSTER_LABEL] == "demo"
        assert spec["ports"] == [
            {"name": "external", "port": 9094, "targetPort": "external", "nodePort": 31000 + broker}
        ]
        assert service["metadata"]["labels"][workloads.EXTERNAL_SERVICE_LABEL] == str(broker)
        assert service["metadata"]["ownerReferences"][0]["kind"] == "BrokerCluster"
    # a scale down kept back by brokers that still hold replicas keeps their Services
    assert len(external_services(cluster(EXTERNAL, replicas=2), replicas=4)) == 4


def test_without_an_external_listener_nothing_changes() -> None:
    c = cluster(None)
    assert external_services(c) == []
    assert "--listener" not in container(c)["args"]
    assert all(e["name"] != "NODE_IP" for e in container(c)["env"])
    assert c.spec.listeners.external is None


@pytest.mark.parametrize(
    "listeners",
    [
        {"external": {"type": "LoadBalancer", "nodePortBase": 31000}},
        {"external": {"nodePortBase": 29999}},
        {"external": {}},
        {"external": {"nodePortBase": 32766}},  # 3 brokers: 32768 is beyond the range
        {"internal": {}},
    ],
)
def test_a_bad_listeners_section_is_refused(listeners: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        cluster(listeners)


def test_the_services_no_broker_needs_are_stale() -> None:
    existing = [
        Meta(f"demo-external-{i}", "ns", labels={"x": "y", **label})
        for i, label in enumerate(
            [{workloads.EXTERNAL_SERVICE_LABEL: str(i)} for i in range(4)] + [{}]
        )
    ]
    assert workloads.stale_external_services(cluster(EXTERNAL), 3, existing) == ["demo-external-3"]
    assert workloads.stale_external_services(cluster(None), 3, existing) == [
        f"demo-external-{i}" for i in range(4)
    ]


def services(server: ApiServer) -> set[str]:
    """The Services the emulator holds and has not deleted."""
    return {
        key[2]
        for key in server.objects
        if key[0] == "v1/services" and not server.objects[key].deleted
    }


async def test_a_scale_down_and_a_removed_listener_delete_the_services_left(
    server: ApiServer, api: ClientApi
) -> None:
    memo = memo_over(api)
    await handlers.cluster_workload(body=manifest(EXTERNAL), namespace="ns", name="demo", memo=memo)
    assert services(server) == {
        "demo",
        "demo-brokers",
        "demo-external-0",
        "demo-external-1",
        "demo-external-2",
    }
    await handlers.cluster_workload(
        body=manifest(EXTERNAL, replicas=2), namespace="ns", name="demo", memo=memo
    )
    assert services(server) == {"demo", "demo-brokers", "demo-external-0", "demo-external-1"}
    await handlers.cluster_workload(body=manifest(None), namespace="ns", name="demo", memo=memo)
    assert services(server) == {"demo", "demo-brokers"}
