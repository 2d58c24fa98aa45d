"""Kafka clients against a BrokerCluster with ``spec.kafka``: the operator creates the
Topic of the groups' committed offsets (none is applied here), confluent-kafka
(librdkafka) produces with ``acks=all``, an aiokafka consumer group reads part of it and
commits, the broker pod coordinating the group is deleted, and the group, read again by
confluent-kafka once the StatefulSet's new pod has rejoined, resumes at exactly its
committed offsets with no acknowledged record missing.

Clients reach the brokers as any client outside the cluster's DNS would on the test bed:
the pod IPs (the chart's ``operator.brokerAdvertise=podIP``, as every e2e test here), on
the listener's port: the test bed's, stand-in or real node, which this host reaches.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import InstalledOperator, pod_ips
from e2e.tests.operator.test_lifecycle_e2e import topic_doc
from e2e.tests.operator.test_operator_e2e import server_side_apply
from e2e.tests.operator.test_pod_delete_e2e import broker_pods

KAFKA_PORT = 9093
OFFSETS_TOPIC = "kafka.group-offsets"
PARTITIONS = 3
GROUP = "billing"
#: records produced before the deletion, and again while its pod is replaced
RECORDS = 300


def cluster_doc(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "BrokerCluster",
        "metadata": {"name": "demo", "namespace": namespace},
        "spec": {"replicas": 3, "storage": {"size": "64Mi"}, "kafka": {"port": KAFKA_PORT}},
    }


def ready(cluster: Cluster, name: str, namespace: str) -> dict[str, Any] | None:
    """The Topic once Ready with every partition's live replica set whole."""
    topic = json.loads(
        cluster.kubectl_run("get", "topic", name, "-n", namespace, "-o", "json", check=False).stdout
        or "null"
    )
    if topic is None:
        return None
    status = topic.get("status") or {}
    is_ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []
    )
    partitions = status.get("partitions") or []
    whole = len(partitions) == PARTITIONS and all(
        len(p.get("liveReplicas") or []) == 3 for p in partitions
    )
    return topic if is_ready and whole else None


def bootstrap(cluster: Cluster, namespace: str) -> str:
    return ",".join(f"{ip}:{KAFKA_PORT}" for ip in pod_ips(cluster, namespace).values())


def produce(servers: str, topic: str, start: int) -> set[str]:
    """``RECORDS`` keyed records through librdkafka, idempotent with ``acks=all``: the values
    whose delivery the cluster acknowledged."""
    acked: set[str] = set()
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked.add(msg.value().decode())
        else:
            failed.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": servers,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": 60_000,
        }
    )
    for i in range(start, start + RECORDS):
        producer.produce(topic, key=f"k{i % 17}", value=f"v{i}", on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(90)
    assert left == 0 and not failed, (left, failed[:5])
    return acked


async def consume_and_commit(servers: str, topic: str, wanted: int) -> dict[int, int]:
    """An aiokafka member of ``GROUP`` reads at least ``wanted`` records, commits where it
    stopped, and leaves: the committed offsets by partition."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=servers,
        group_id=GROUP,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        seen = 0
        deadline = time.monotonic() + 60
        while seen < wanted:
            assert time.monotonic() < deadline, f"only {seen} records read by the group"
            batches = await consumer.getmany(timeout_ms=1000)
            seen += sum(len(records) for records in batches.values())
        positions = {tp: await consumer.position(tp) for tp in consumer.assignment()}
        await consumer.commit(positions)
        committed = {}
        for tp in positions:
            offset = await consumer.committed(tp)
            assert offset == positions[tp], (tp, offset, positions[tp])
            committed[tp.partition] = offset
        return committed
    finally:
        await consumer.stop()


def coordinator(servers: str) -> int:
    """The broker id coordinating ``GROUP`` (``DescribeGroups`` through librdkafka)."""
    admin = AdminClient({"bootstrap.servers": servers})
    description = admin.describe_consumer_groups([GROUP])[GROUP].result(timeout=30)
    return int(description.coordinator.id)


def delete_and_wait_for_rejoin(
    cluster: Cluster, namespace: str, broker: int, topics: Iterable[str]
) -> None:
    """Delete the broker's pod; wait until its new pod is in every partition's live
    replica set of ``topics`` again."""
    name = f"demo-{broker}"
    old_uid = broker_pods(cluster, namespace)[name]["metadata"]["uid"]
    cluster.kubectl_run("delete", "pod", name, "-n", namespace, "--wait=false")

    def rejoined() -> bool:
        pod = broker_pods(cluster, namespace).get(name)
        if pod is None or pod["metadata"]["uid"] == old_uid:
            return False
        for topic in topics:
            status = cluster.get("topic", topic, namespace).get("status") or {}
            if not all(broker in p.get("liveReplicas", []) for p in status["partitions"]):
                return False
        return True

    wait_for(f"{name} to come back and rejoin", rejoined, 120, every_s=0.5)


def resume(servers: str, topic: str, expected: int) -> tuple[dict[int, int], set[str]]:
    """A librdkafka member of ``GROUP`` reads until ``expected`` records: where it started
    in each partition, and the values read."""
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    first: dict[int, int] = {}
    values: set[str] = set()
    deadline = time.monotonic() + 90
    try:
        while len(values) < expected and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            first.setdefault(msg.partition(), msg.offset())
            values.add(msg.value().decode())
        consumer.commit(asynchronous=False)
        stored = consumer.committed(
            [ConfluentPartition(topic, p) for p in range(PARTITIONS)], timeout=30
        )
        assert all(tp.error is None for tp in stored), stored
    finally:
        consumer.close()
    return first, values


def test_kafka_clients_keep_a_groups_offsets_across_a_broker_pod_deletion(
    cluster: Cluster, namespace: str, host_reaches_pods: None, operator: InstalledOperator
) -> None:
    try:
        server_side_apply(cluster, [cluster_doc(namespace)], namespace)
        server_side_apply(cluster, [topic_doc("orders", namespace, PARTITIONS)], namespace)
        offsets = wait_for(
            "the offsets Topic the operator creates, placed and whole",
            lambda: ready(cluster, OFFSETS_TOPIC, namespace),
            180,
        )
        [owner] = offsets["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("BrokerCluster", "demo")
        wait_for("orders placed and whole", lambda: ready(cluster, "orders", namespace), 120)
        wait_for("3 broker pod IPs", lambda: len(pod_ips(cluster, namespace)) == 3, 60)
        servers = bootstrap(cluster, namespace)
        topic = f"{namespace}/orders"  # Kafka's name of a Topic outside `default`

        acked = produce(servers, topic, 0)
        committed = asyncio.run(consume_and_commit(servers, topic, RECORDS // 2))
        assert sum(committed.values()) >= RECORDS // 2, committed

        victim = coordinator(servers)
        delete_and_wait_for_rejoin(cluster, namespace, victim, ("orders", OFFSETS_TOPIC))
        servers = bootstrap(cluster, namespace)  # the new pod's IP
        acked |= produce(servers, topic, RECORDS)

        first, values = resume(servers, topic, len(acked) - sum(committed.values()))
        # every partition with a commit resumes exactly there: nothing before it again
        assert {p: first[p] for p in committed if p in first} == {
            p: o for p, o in committed.items() if p in first
        }, (first, committed)
        # and what the group had not committed, old and new, is all read
        check = asyncio.run(read_all(servers, topic))
        unread_before = {v for v, (p, o) in check.items() if o >= committed.get(p, 0)}
        missing = (acked & unread_before) - values
        assert not missing, (
            f"{len(missing)} acknowledged records not read, e.g. {sorted(missing)[:5]}"
        )
        assert acked <= set(check), "an acknowledged record is not in the log"
        print(
            f"\n[e2e figure] Kafka group over a pod deletion: {len(acked)} records acknowledged,"
            f" committed {committed}, coordinator broker {victim} deleted, resumed at {first}"
        )
    except BaseException:
        print(operator.logs()[-8000:])
        raise


async def read_all(servers: str, topic: str) -> dict[str, tuple[int, int]]:
    """Every record of ``topic`` by value: (partition, offset), read with no group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found: dict[str, tuple[int, int]] = {}
        deadline = time.monotonic() + 60
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, "the topic was not read to its end"
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                for r in records:
                    found[r.value.decode()] = (tp.partition, r.offset)
        return found
    finally:
        await consumer.stop()
