"""Clients outside the cluster reach the brokers through LoadBalancer listeners
(``spec.listeners.external.type: LoadBalancer``) over TLS with a certificate of the
listener's own (``listeners.external.tls``).

The test plays the load-balancer controller (as MetalLB would): each broker's Service
gets an ingress IP in its status. Until then the cluster is Ready on its internal
listener (the Topic's acks=all replication runs through it), says
``ExternalAddressesAssigned=False`` (``ExternalAddressPending``), and advertises no
external address. Once the addresses are in, kube-proxy routes them to the pods (it
programs LoadBalancer ingress IPs into the host's iptables; the host's default route
carries a connection to them into its OUTPUT chain, where they are rewritten), the
brokers advertise them, and a client on the host, verifying the certificate against the
IP it dials, produces and consumes acks=all records through them, never dialling
anything else.

Only on the real node (``E2E_NODE=real``): Services are kube-proxy's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from e2e.support import Cluster, wait_for
from e2e.testbed import pki
from e2e.tests.operator.fixtures import (
    InstalledOperator,
    cluster_manifests,
    condition,
    figure,
    tls_secret,
    wait_ready,
)
from headrace import tlsnames
from headrace.client import Consumer, Producer
from headrace.client.connection import ConnectOptions

BROKERS = 3
PARTITIONS = 3
RECORDS = 1_000
PORT = 9443
#: broker i's load balancer IP (TEST-NET-3: routed nowhere but by kube-proxy's rules)
LB_IPS = tuple(f"203.0.113.{10 + broker}" for broker in range(BROKERS))


def manifests(namespace: str, ca: pki.CA) -> list[dict[str, Any]]:
    """The two Secrets (in-cluster names for the data port, the load balancers' IPs for
    the external listener), the cluster and its Topic."""
    ca_pem = ca.cert.public_bytes(serialization.Encoding.PEM)
    inside = ca.issue(
        "demo",
        server=True,
        client=True,
        dns=(f"demo.{namespace}.svc", f"*.demo-brokers.{namespace}.svc"),
    )
    outside = ca.issue("demo-outside", server=True, ips=LB_IPS)
    docs = cluster_manifests(
        namespace, replicas=BROKERS, topic="outside", partitions=PARTITIONS, min_in_sync=2
    )
    docs[0]["spec"]["tls"] = {"enabled": True, "secretName": "demo-tls"}
    docs[0]["spec"]["listeners"] = {
        "external": {
            "type": "LoadBalancer",
            "port": PORT,
            "annotations": {"metallb.universe.tf/address-pool": "test"},
            "tls": {"secretName": "demo-outside-tls"},
        }
    }
    return [
        tls_secret("demo-tls", *inside, ca_pem),
        tls_secret("demo-outside-tls", *outside, ca_pem),
        *docs,
    ]


def external_listeners(cluster: Cluster, namespace: str) -> dict[int, dict[str, Any]]:
    """Each broker's external listener as the BrokerCluster's status records it."""
    brokers = cluster.get("brokercluster", "demo", namespace)["status"].get("brokers", [])
    return {
        b["id"]: next(n for n in b.get("listeners", []) if n["name"] == "external")
        for b in brokers
        if any(n["name"] == "external" for n in b.get("listeners", []))
    }


def test_a_client_outside_the_cluster_produces_and_consumes_through_load_balancers(
    real_node_only: None,
    cluster: Cluster,
    namespace: str,
    operator: InstalledOperator,
    tmp_path: Path,
) -> None:
    ca = pki.new_ca()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    started = time.monotonic()
    cluster.apply(manifests(namespace, ca), namespace)
    wait_ready(cluster, "brokercluster", "demo", namespace, timeout=300)
    # acks=all through the internal listener: the Topic is Ready with its replicas in sync
    wait_ready(cluster, "topic", "outside", namespace, timeout=180)
    figure("LoadBalancer cluster: apply to Topic Ready", time.monotonic() - started)

    services = [cluster.get("service", f"demo-external-{b}", namespace) for b in range(BROKERS)]
    for broker, service in enumerate(services):
        assert service["spec"]["type"] == "LoadBalancer"
        assert service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == f"demo-{broker}"
        assert service["spec"]["ports"][0]["port"] == PORT
        assert service["metadata"]["annotations"]["metallb.universe.tf/address-pool"] == "test"

    # no load balancer has an address: the cluster says so and advertises none
    pending = wait_for(
        "ExternalAddressesAssigned=False",
        lambda: condition(
            cluster.get("brokercluster", "demo", namespace), "ExternalAddressesAssigned"
        ),
    )
    assert (pending["status"], pending["reason"]) == ("False", "ExternalAddressPending")
    assert wait_for(
        "every broker's external listener recorded as pending",
        lambda: len(external_listeners(cluster, namespace)) == BROKERS or None,
    )
    assert all("host" not in n for n in external_listeners(cluster, namespace).values())

    # the load-balancer controller's part: an ingress IP in each Service's status
    for broker, ip in enumerate(LB_IPS):
        status = {"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}}
        cluster.kubectl_run(
            "patch", "service", f"demo-external-{broker}", "-n", namespace,
            "--subresource=status", "--type=merge", "-p", json.dumps(status),
        )  # fmt: skip
    assigned_at = time.monotonic()

    def assigned() -> bool | None:
        body = cluster.get("brokercluster", "demo", namespace)
        judged = condition(body, "ExternalAddressesAssigned")
        listeners = external_listeners(cluster, namespace)
        told = {b: (n.get("host"), n.get("port")) for b, n in listeners.items()}
        want = {b: (ip, PORT) for b, ip in enumerate(LB_IPS)}
        return (judged is not None and judged["status"] == "True" and told == want) or None

    wait_for("the brokers advertise their load balancers' addresses", assigned, timeout_s=60)
    figure("ingress IPs written to brokers advertising them", time.monotonic() - assigned_at)

    outside = {(ip, PORT) for ip in LB_IPS}
    bootstrap = ",".join(f"{ip}:{PORT}" for ip in LB_IPS)
    # the certificate names the load balancers' IPs: verified against the address dialled
    options = ConnectOptions(ssl=tlsnames.client_context(ca_file))
    topic = f"{namespace}/outside"
    values = [f"lb-{i:05d}".encode() for i in range(RECORDS)]

    async def produce() -> set[tuple[str, int]]:
        async with Producer(bootstrap, acks="all", linger_ms=5, options=options) as producer:
            sent = [await producer.send(topic, value, key=value) for value in values]
            await asyncio.gather(*sent)
            return set(producer.cluster._pool)

    async def consume() -> tuple[set[bytes], set[tuple[str, int]]]:
        seen: set[bytes] = set()
        async with Consumer(
            bootstrap, topic, "readers", start="earliest", options=options
        ) as consumer:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(60):
                    while not set(values) <= seen:
                        for batch in await consumer.getmany(timeout_s=0.5):
                            seen.update(batch.values())
                            consumer.ack_batch(batch)
            return seen, set(consumer.cluster._pool)

    round_trip = time.monotonic()
    dialled = asyncio.run(produce())
    seen, consumer_dialled = asyncio.run(consume())
    figure(f"{RECORDS} acks=all records through the load balancers", time.monotonic() - round_trip)
    assert not set(values) - seen, f"{len(set(values) - seen)} records not read back"
    assert dialled <= outside, f"the producer dialled {dialled - outside}"
    assert consumer_dialled <= outside, f"the consumer dialled {consumer_dialled - outside}"
