"""A BrokerCluster's external listener behind load balancers (``type: LoadBalancer``):
every broker gets a LoadBalancer Service of its own; its address is what the Service's
status says once a load-balancer controller filled it, and the operator puts it in the
broker's heartbeat (the broker cannot know it); until then the broker is pending, left
out of that listener's topology, and a condition says so. The listener may serve a
certificate of its own."""

from __future__ import annotations

import copy
from typing import Any

import pydantic
import pytest
from operator_fakes import CLUSTER

from headrace.control.documents import cluster_status, restore
from headrace.control.model import ClusterState
from headrace.operator import conditions, tlssecrets, workloads
from headrace.protocol.coordination import ClusterTopology
from headrace.protocol.endpoints import BrokerEndpoint, ListenerAddress
from headrace.resources.clusters import BrokerCluster

SETTINGS = workloads.WorkloadSettings()
LOAD_BALANCER = {
    "external": {
        "type": "LoadBalancer",
        "port": 9443,
        "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
    }
}
TLS = {"enabled": True, "secretName": "demo-tls"}


def cluster(
    listeners: dict[str, Any] | None = None, tls: dict[str, Any] | None = None
) -> BrokerCluster:
    body = copy.deepcopy(CLUSTER)
    body["spec"]["listeners"] = LOAD_BALANCER if listeners is None else listeners
    if tls is not None:
        body["spec"]["tls"] = tls
    return BrokerCluster.from_manifest(body)


def container(c: BrokerCluster) -> dict[str, Any]:
    sts = workloads.statefulset(c, "uid-1", "ns", SETTINGS)
    found: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return found


def lb_services(c: BrokerCluster) -> list[dict[str, Any]]:
    return [
        m
        for m in workloads.manifests(c, "uid-1", "ns", SETTINGS)
        if m["kind"] == "Service" and m["spec"].get("type") == "LoadBalancer"
    ]


def with_ingress(service: dict[str, Any], **ingress: str) -> dict[str, Any]:
    return {**service, "status": {"loadBalancer": {"ingress": [ingress]}}}


def test_each_broker_gets_a_load_balancer_service_selecting_its_pod_alone() -> None:
    services = lb_services(cluster())
    assert [s["metadata"]["name"] for s in services] == [f"demo-external-{i}" for i in range(3)]
    for broker, service in enumerate(services):
        spec = service["spec"]
        assert spec["selector"][workloads.POD_NAME_LABEL] == f"demo-{broker}"
        # the load balancer's port is the listener's; no node port is asked for
        assert spec["ports"] == [{"name": "external", "port": 9443, "targetPort": "external"}]
        assert service["metadata"]["annotations"] == {
            "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"
        }
        assert service["metadata"]["labels"][workloads.EXTERNAL_SERVICE_LABEL] == str(broker)


def test_a_broker_behind_a_load_balancer_binds_the_listener_but_names_no_address() -> None:
    c = container(cluster())
    args = c["args"]
    assert args[args.index("--listener") + 1] == "external=$(POD_IP):9443"
    assert "--advertised-listener" not in args  # the operator hands the address over
    assert all(e["name"] != "NODE_IP" for e in c["env"])
    assert {"name": "external", "containerPort": 9443} in c["ports"]


@pytest.mark.parametrize(
    ("listeners", "tls"),
    [
        ({"external": {"type": "LoadBalancer", "nodePortBase": 31000}}, None),
        ({"external": {"type": "NodePort"}}, None),
        ({"external": {"type": "Ingress"}}, None),
        # a certificate of its own, but the cluster serves no TLS
        ({"external": {"type": "LoadBalancer", "tls": {"secretName": "outside"}}}, None),
        ({"external": {"type": "LoadBalancer", "tls": {}}}, TLS),
    ],
)
def test_a_bad_external_listener_is_refused(
    listeners: dict[str, Any], tls: dict[str, Any] | None
) -> None:
    with pytest.raises(pydantic.ValidationError):
        cluster(listeners, tls)


def test_the_load_balancers_addresses_come_from_the_services_status() -> None:
    c = cluster()
    zero, one, two = lb_services(c)
    found = workloads.load_balancer_addresses(
        c, [with_ingress(zero, ip="203.0.113.10"), with_ingress(one, hostname="b1.lb.example"), two]
    )
    assert found == {
        0: ListenerAddress("external", "203.0.113.10", 9443),
        1: ListenerAddress("external", "b1.lb.example", 9443),
    }
    assert workloads.pending_external_brokers(c, found, 3) == [2]
    # a NodePort listener's addresses are the brokers' own flags: nothing is read
    node_ports = cluster({"external": {"type": "NodePort", "nodePortBase": 31000}})
    assert workloads.load_balancer_addresses(node_ports, [zero]) is None
    assert workloads.pending_external_brokers(node_ports, None, 3) == []


def test_the_heartbeat_carries_the_load_balancer_address_or_a_pending_one() -> None:
    bound = ListenerAddress("external", "10.244.0.7", 9443)  # the pod IP the broker bound
    endpoint = BrokerEndpoint(1, "demo-1.demo-brokers.ns.svc", 9092, 9644, None, (bound,))
    assigned = ListenerAddress("external", "203.0.113.11", 9443)
    assert workloads.advertise_external(endpoint, {1: assigned}).listeners == (assigned,)
    pending = workloads.advertise_external(endpoint, {0: assigned})
    assert pending.listeners == (ListenerAddress.pending("external"),)
    # never the pod address: external clients are not told of the broker at all
    assert pending.on("external") is None
    assert pending.on("internal") == BrokerEndpoint(1, "demo-1.demo-brokers.ns.svc", 9092)
    # a broker not restarted with the listener yet is left as it is
    bare = BrokerEndpoint(2, "demo-2.demo-brokers.ns.svc", 9092, 9644)
    assert workloads.advertise_external(bare, {2: assigned}) == bare


def test_a_pending_broker_is_left_out_of_that_listeners_topology_only() -> None:
    assigned = ListenerAddress("external", "203.0.113.10", 9443)
    brokers = [
        BrokerEndpoint(0, "demo-0", 9092, 9644, None, (assigned,)),
        BrokerEndpoint(1, "demo-1", 9092, 9644, None, (ListenerAddress.pending("external"),)),
    ]
    topology = ClusterTopology(4, "demo", brokers, [])
    outside = topology.client_snapshot("external").brokers
    assert outside == [BrokerEndpoint(0, "203.0.113.10", 9443)]
    inside = topology.client_snapshot().brokers
    assert inside == [BrokerEndpoint(0, "demo-0", 9092), BrokerEndpoint(1, "demo-1", 9092)]
    assert ClusterTopology.from_json(topology.to_json()).brokers == brokers


def test_a_pending_address_round_trips_through_the_cluster_status() -> None:
    pending = BrokerEndpoint(1, "demo-1", 9092, 9644, None, (ListenerAddress.pending("external"),))
    state = ClusterState(generation=3, brokers={1: pending})
    status = cluster_status(state)
    assert status["brokers"][0]["listeners"] == [{"name": "external"}]
    assert restore(status, {}).state.brokers == {1: pending}


def test_the_condition_names_the_brokers_waiting_for_an_address() -> None:
    now = "2026-01-01T00:00:00Z"
    waiting = conditions.external_addresses_condition([2, 0], 4, None, now)
    assert (waiting["type"], waiting["status"], waiting["reason"]) == (
        "ExternalAddressesAssigned",
        "False",
        "ExternalAddressPending",
    )
    assert "[0, 2]" in waiting["message"]
    assert waiting["observedGeneration"] == 4
    done = conditions.external_addresses_condition([], 4, waiting, now)
    assert (done["status"], done["reason"]) == ("True", "AllAddressesAssigned")


def test_the_external_listener_serves_its_own_certificate() -> None:
    c = cluster(
        {"external": {"type": "LoadBalancer", "tls": {"secretName": "demo-outside"}}}, tls=TLS
    )
    args = container(c)["args"]
    outside = workloads.EXTERNAL_TLS_DIR
    assert args[args.index("--listener-tls-cert") + 1] == f"external={outside}/tls.crt"
    assert args[args.index("--listener-tls-key") + 1] == f"external={outside}/tls.key"
    assert args[args.index("--tls-cert") + 1] == f"{workloads.TLS_DIR}/tls.crt"  # data port's
    assert {"name": "external-tls", "mountPath": outside, "readOnly": True} in container(c)[
        "volumeMounts"
    ]
    assert "demo-outside" in workloads.tls_secrets(c)
    # the operator checks that Secret like the others: a missing one keeps Ready False
    health = tlssecrets.check(c, {"demo-tls": None, "demo-outside": None})
    assert health.problem is not None
