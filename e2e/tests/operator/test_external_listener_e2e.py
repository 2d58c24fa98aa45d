"""Clients outside the cluster reach the brokers through NodePort listeners
(``spec.listeners.external``): a client on the host, outside the pod network, bootstraps
with node address and node port, is told every broker's node port, produces 10,000
acks=all records and reads them back, while one broker pod is deleted half-way; every
acknowledged record is read back, and the client never dialled anything but the node
ports (not the pods' IPs, which the host could reach here, but a real outside client
could not).

Only on the real node (``E2E_NODE=real``): node ports are kube-proxy's, which the
stand-in runner does not run."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from e2e.support import Cluster
from e2e.tests.operator.fixtures import InstalledOperator, cluster_manifests, wait_ready
from headrace.client import Consumer, Producer
from headrace.errors import HeadraceError

BROKERS = 3
PARTITIONS = 3
RECORDS = 10_000
#: broker i's node port is NODE_PORT_BASE + i
NODE_PORT_BASE = 31790


def external_cluster(namespace: str) -> list[dict[str, Any]]:
    docs = cluster_manifests(
        namespace, replicas=BROKERS, topic="outside", partitions=PARTITIONS, min_in_sync=2
    )
    docs[0]["spec"]["listeners"] = {
        "external": {"type": "NodePort", "nodePortBase": NODE_PORT_BASE}
    }
    return docs


def node_address(cluster: Cluster, namespace: str) -> str:
    """The address the brokers' node advertises (its InternalIP: the pods' hostIP)."""
    pod = cluster.get("pod", "demo-0", namespace)
    return str(pod["status"]["hostIP"])


def leader_of(cluster: Cluster, namespace: str, partition: int) -> int:
    partitions = cluster.get("topic", "outside", namespace)["status"]["partitions"]
    return int(next(p["leader"] for p in partitions if p["partition"] == partition))


def test_a_client_outside_the_cluster_produces_and_consumes_through_node_ports(
    real_node_only: None, cluster: Cluster, namespace: str, operator: InstalledOperator
) -> None:
    cluster.apply(external_cluster(namespace), namespace)
    wait_ready(cluster, "brokercluster", "demo", namespace, timeout=300)
    wait_ready(cluster, "topic", "outside", namespace, timeout=180)
    topic = f"{namespace}/outside"
    node = node_address(cluster, namespace)
    outside = {(node, NODE_PORT_BASE + broker) for broker in range(BROKERS)}
    bootstrap = ",".join(f"{host}:{port}" for host, port in sorted(outside))
    services = [
        cluster.get("service", f"demo-external-{broker}", namespace) for broker in range(BROKERS)
    ]
    assert [s["spec"]["ports"][0]["nodePort"] for s in services] == [
        NODE_PORT_BASE + broker for broker in range(BROKERS)
    ]

    acked: set[bytes] = set()
    failed: list[BaseException] = []
    deleted: list[str] = []
    #: how many records were sent when the deleted pod's replacement was Ready
    replaced: list[int] = []
    #: partition 0's leaders seen while the pod was gone
    leaders: set[int] = set()

    def back(pod: str, old_uid: str) -> bool:
        """Whether ``pod`` was replaced (another uid) and the replacement is Ready."""
        done = cluster.kubectl_run("get", "pod", pod, "-n", namespace, "-o", "json", check=False)
        if done.returncode != 0:  # between the old pod's removal and the new one's creation
            return False
        body = json.loads(done.stdout)
        conditions = body.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        return bool(body["metadata"]["uid"] != old_uid and ready)

    async def produce() -> set[tuple[str, int]]:
        async with Producer(
            bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=120_000
        ) as producer:

            async def send(i: int) -> None:
                value = f"outside-{i:05d}".encode()
                try:
                    await (await producer.send(topic, value, key=value))
                    acked.add(value)
                except HeadraceError as exc:
                    failed.append(exc)

            first = [asyncio.create_task(send(i)) for i in range(RECORDS // 2)]
            await asyncio.gather(*first)
            # half acknowledged: take the leader of partition 0 away, as `kubectl delete
            # pod` does (its preStop drain, then SIGTERM), and keep sending, at a steady
            # pace, until its replacement is Ready: the producer follows the leaders
            # through the node ports the whole time
            victim_id = leader_of(cluster, namespace, 0)
            victim = f"demo-{victim_id}"
            old_uid = cluster.get("pod", victim, namespace)["metadata"]["uid"]
            cluster.kubectl_run("delete", "pod", victim, "-n", namespace, "--wait=false")
            deleted.append(victim)
            sending: list[asyncio.Task[None]] = []
            sent = RECORDS // 2
            loop = asyncio.get_running_loop()
            checked_at = 0.0
            while sent < RECORDS and not replaced:
                sending += [asyncio.create_task(send(i)) for i in range(sent, sent + 10)]
                sent += 10
                await asyncio.sleep(0.05)  # the load's pace (about 200 records a second)
                if loop.time() - checked_at >= 1:
                    checked_at = loop.time()
                    leaders.add(await asyncio.to_thread(leader_of, cluster, namespace, 0))
                    if await asyncio.to_thread(back, victim, old_uid):
                        replaced.append(sent)
            sending += [asyncio.create_task(send(i)) for i in range(sent, RECORDS)]
            await asyncio.gather(*sending)
            return set(producer.cluster._pool)

    dialled = asyncio.run(produce())
    assert failed == [], failed[:3]
    assert len(acked) == RECORDS
    assert replaced, f"{deleted[0]} was not replaced while the load ran"
    assert leaders - {int(deleted[0].rsplit("-", 1)[1])}, "partition 0's leadership never moved"
    assert dialled <= outside, f"the producer dialled {dialled - outside}"

    async def consume() -> tuple[set[bytes], set[tuple[str, int]]]:
        seen: set[bytes] = set()
        async with Consumer(bootstrap, topic, "readers", start="earliest") as consumer:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(180):
                    while not acked <= seen:
                        for batch in await consumer.getmany(timeout_s=0.5):
                            seen.update(batch.values())
                            consumer.ack_batch(batch)
            return seen, set(consumer.cluster._pool)

    seen, consumer_dialled = asyncio.run(consume())
    lost = acked - seen
    assert not lost, f"{len(lost)} acknowledged records not read back, e.g. {sorted(lost)[:3]}"
    assert consumer_dialled <= outside, f"the consumer dialled {consumer_dialled - outside}"
    print(
        f"\n[e2e] {len(acked)} acks=all records through node ports {sorted(outside)},"
        f" {deleted[0]} deleted after {RECORDS // 2} and Ready again after {replaced[0]}"
        f" (partition 0 led by {sorted(leaders)} meanwhile): 0 lost",
    )
