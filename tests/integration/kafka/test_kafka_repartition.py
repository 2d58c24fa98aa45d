"""Live repartition and unload under real Kafka clients (confluent-kafka, librdkafka) on a
3-broker local cluster with MinIO (an Unload needs a tiered topic).

A keyed ``acks=all`` idempotent producer, partitioning as Kafka's Java client does
(``murmur2_random``), and a consumer group (through the shrink, one of each protocol)
run through a grow, a shrink and an unload.
Every acknowledged record is read; each key's records are where ``murmur2(key) % N``
put them, the count ``N`` of the producer's metadata at the time, in the producer's order
per partition (docs/kafka.md §3, Live repartition and Unload).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import TopicMetadata

from headrace.testing import waiting
from headrace.testing.reading import read_all
from tests.integration.localcluster import LocalCluster, minio_cluster, topic_manifest

#: how long the producer may take to settle, and the group to read what is left
SETTLE_S = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with minio_cluster(tmp_path_factory.mktemp("kafka-repartition") / "local") as c:
        yield c


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``Utils.murmur2``), the hash of the Java client's and of
    librdkafka's ``murmur2_random`` partitioner; positive, as they take it."""
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    whole = len(data) & ~3
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[whole:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h & 0x7FFFFFFF


def key_of(i: int) -> bytes:
    return b"k%d" % (i % 40)


@dataclass
class Produced:
    """What the producer was told, per record number."""

    acknowledged: dict[int, tuple[int, int]] = field(default_factory=dict)
    """record number -> (partition, offset)"""
    failed: dict[int, KafkaError] = field(default_factory=dict)
    switched_at: int = 0
    """the first record sent after the producer's metadata had the new count"""
    sent: int = 0


@dataclass
class Read:
    """What the group read: (partition, offset) -> record number."""

    at: dict[tuple[int, int], int] = field(default_factory=dict)
    twice: list[tuple[int, int]] = field(default_factory=list)
    errors: list[KafkaError] = field(default_factory=list)


def produce_through(
    cluster: LocalCluster,
    topic: str,
    change: Callable[[], None],
    seen: Callable[[TopicMetadata], bool],
    before: int = 300,
    after: int = 300,
) -> Produced:
    """Keyed records, ``before`` of them acknowledged before ``change`` runs, then on until
    the producer's metadata of the topic is ``seen`` and ``after`` more were sent."""
    produced = Produced()
    producer = Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "topic.metadata.refresh.interval.ms": 500,
            # a record refused for ever (a retired partition) fails within the test's time
            "message.timeout.ms": 15_000,
        }
    )

    def report(number: int) -> Callable[[KafkaError | None, Any], None]:
        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                produced.acknowledged[number] = (msg.partition(), msg.offset())
            else:
                produced.failed[number] = err

        return delivered

    def metadata() -> TopicMetadata:
        return producer.list_topics(topic, timeout=10).topics[topic]

    number = 0
    deadline = time.monotonic() + SETTLE_S

    def send_one() -> None:
        nonlocal number
        producer.produce(topic, b"%d" % number, key_of(number), on_delivery=report(number))
        number += 1
        # serves the delivery reports, waiting at most 2 ms: a steady stream
        producer.poll(0.002)
        assert time.monotonic() < deadline, f"stuck at record {number}"

    while len(produced.acknowledged) < before:
        send_one()
    change()
    while not seen(metadata()):
        for _ in range(20):
            send_one()
    produced.switched_at = number
    for _ in range(after):
        send_one()
    produced.sent = number
    assert producer.flush(SETTLE_S) == 0, "records neither acknowledged nor failed"
    return produced


class GroupReader:
    """A consumer group member reading ``topic`` in a thread until told to stop."""

    def __init__(
        self, cluster: LocalCluster, topic: str, group: str, protocol: str = "classic"
    ) -> None:
        self.read = Read()
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 500,
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 200,
                "group.protocol": protocol,
            }
        )
        self._consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                self.read.errors.append(msg.error())
                continue
            at = (msg.partition(), msg.offset())
            if at in self.read.at:
                self.read.twice.append(at)
            self.read.at[at] = int(msg.value())
        self._consumer.close()

    def wait_for(self, numbers: set[int]) -> None:
        try:
            waiting.until(
                lambda: numbers <= set(self.read.at.values()),
                SETTLE_S,
                "every acknowledged record read by the group",
            )
        except waiting.NotReached:
            missing = numbers - set(self.read.at.values())
            raise AssertionError(
                f"{len(missing)} acknowledged records never read, e.g. {sorted(missing)[:5]};"
                f" errors: {self.read.errors[:5]}"
            ) from None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def partitions(count: int) -> Callable[[TopicMetadata], bool]:
    return lambda topic: len(topic.partitions) == count


def repartition(name: str, topic: str, partitions: int) -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Repartition
metadata: {{name: {name}}}
spec: {{topicRef: {{name: {topic}}}, partitions: {partitions}, adoptionTimeoutSeconds: 5}}
"""


def placed(c: LocalCluster, topic: str, count: int) -> bool:
    parts = c.partitions(topic)
    return len(parts) == count and all(
        p.get("leader") is not None and len(p["liveReplicas"]) == 3 for p in parts
    )


def topic_status(c: LocalCluster, topic: str) -> dict[str, Any]:
    """The controller's document of ``default/<topic>``."""
    for t in c.state()["cluster"].get("topics", []):
        if t["name"] == f"default/{topic}":
            return dict(t)
    return {}


def per_key(produced: Produced) -> dict[bytes, list[tuple[int, int, int]]]:
    """key -> its acknowledged records in the producer's order: (number, partition, offset)."""
    keys: dict[bytes, list[tuple[int, int, int]]] = {}
    for number in sorted(produced.acknowledged):
        partition, offset = produced.acknowledged[number]
        keys.setdefault(key_of(number), []).append((number, partition, offset))
    return keys


def assert_routed_old_then_new(produced: Produced, old: int, new: int) -> None:
    """Each key: a first run of its records in ``murmur2 % old``, the rest in ``murmur2 %
    new``, each partition's offsets in the producer's order."""
    for key, records in per_key(produced).items():
        h = murmur2(key)
        partitions = [p for _, p, _ in records]
        switch = next((i for i, p in enumerate(partitions) if p != h % old), len(partitions))
        assert set(partitions[:switch]) <= {h % old}, (key, partitions)
        assert set(partitions[switch:]) <= {h % new}, (key, partitions)
        for partition in set(partitions):
            offsets = [o for _, p, o in records if p == partition]
            assert offsets == sorted(offsets), (key, partition, offsets)


def test_a_grow_under_a_keyed_idempotent_producer_and_a_group(cluster: LocalCluster) -> None:
    topic = "growing"
    assert cluster.apply(topic_manifest(topic, 3, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(lambda: placed(cluster, f"default/{topic}", 3), 60, "3 partitions placed")
    reader = GroupReader(cluster, topic, "grow-group")
    try:
        produced = produce_through(
            cluster,
            topic,
            lambda: assert_applied(cluster.apply(repartition(f"{topic}-to-6", topic, 6))),
            seen=partitions(6),
        )
        assert not produced.failed, f"a grow fails no record: {list(produced.failed.items())[:5]}"
        reader.wait_for(set(produced.acknowledged))
    finally:
        reader.stop()
    # read as stored: the same record at every (partition, offset) it was read at
    for at, number in reader.read.at.items():
        assert produced.acknowledged.get(number) == at, (at, number)
    assert_routed_old_then_new(produced, 3, 6)
    # the grow was seen: some key moved to a partition the grow added
    assert {p for p, _ in produced.acknowledged.values()} & {3, 4, 5}


def assert_applied(proc: Any) -> None:
    assert proc.returncode == 0, proc.stderr


def test_a_shrink_under_a_keyed_idempotent_producer_and_a_group(cluster: LocalCluster) -> None:
    """librdkafka (as Kafka's Java client) takes a lower partition count only for a new
    topic id: a shrink gives the topic one, so the producer routes keys over the active
    partitions from its next metadata on. Before, it kept hashing over the old count, and
    every later record of a key of a retired partition was refused until it timed out."""
    topic = "shrinking"
    assert cluster.apply(topic_manifest(topic, 4, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(lambda: placed(cluster, f"default/{topic}", 4), 60, "4 partitions placed")
    reader = GroupReader(cluster, topic, "shrink-group")
    kip848 = GroupReader(cluster, topic, "shrink-kip848", protocol="consumer")
    try:
        produced = produce_through(
            cluster,
            topic,
            lambda: assert_applied(cluster.apply(repartition(f"{topic}-to-2", topic, 2))),
            seen=partitions(2),
        )
        # records sent once the producer's metadata had 2 partitions: each taken, on them
        late = range(produced.switched_at, produced.sent)
        refused = {n: produced.failed[n] for n in late if n in produced.failed}
        assert not refused, f"{len(refused)} late records refused: {list(refused.items())[:3]}"
        assert {produced.acknowledged[n][0] for n in late} <= {0, 1}
        # what failed was on its way to a retired partition at the cutover
        stranded = {n for n in produced.failed if murmur2(key_of(n)) % 4 >= 2}
        assert stranded == set(produced.failed), produced.failed
        active = {n for n, (p, _) in produced.acknowledged.items() if p < 2}
        reader.wait_for(active)
        kip848.wait_for(active)
    finally:
        reader.stop()
        kip848.stop()
    assert_routed_old_then_new(produced, 4, 2)
    cluster.wait(lambda: shrink_finalized(cluster, topic), 60, "the shrink finalized")
    cutover = cutover_offsets(cluster, topic)
    for partition in (2, 3):
        # nothing stored in a retired partition from its cutover on, and each acknowledged
        # record there readable (through our protocol: Kafka's Metadata no longer lists it)
        stored = asyncio.run(read_all(cluster.bootstrap, f"default/{topic}", partition))
        assert len(stored) == cutover[partition]
        acknowledged = {o: n for n, (p, o) in produced.acknowledged.items() if p == partition}
        assert {r.offset: int(r.value) for r in stored} == acknowledged


def shrink_finalized(c: LocalCluster, topic: str) -> bool:
    status = topic_status(c, topic)
    return status.get("activePartitions") == 2 and status.get("transition") is None


def cutover_offsets(c: LocalCluster, topic: str) -> dict[int, int]:
    (last,) = topic_status(c, topic)["history"]["transitions"][-1:]
    return {o["partition"]: o["offset"] for o in last["cutoverOffsets"]}


def unload(name: str, topic: str, partition: int, target: int) -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Unload
metadata: {{name: {name}}}
spec: {{topicRef: {{name: {topic}}}, partitions: [{partition}], targetBroker: {target}}}
"""


def unload_phase(c: LocalCluster, name: str) -> str | None:
    for u in c.state().get("unloads", []):
        if u["metadata"]["name"] == name:
            return (u.get("status") or {}).get("phase")
    return None


def test_an_unload_is_a_leader_change_for_a_kafka_producer_and_group(
    cluster: LocalCluster,
) -> None:
    """An Unload seals partition 0 at its owner and reopens it at another broker, its
    offsets continuing: librdkafka sees NOT_LEADER_OR_FOLLOWER, then the new leader in
    Metadata, and goes on where it was; the group reads each acknowledged record once."""
    topic = "unloading"
    manifest = topic_manifest(topic, 2, replicas=1, min_in_sync=1, upload_interval_s=1)
    assert cluster.apply(manifest).returncode == 0
    cluster.wait(lambda: online(cluster, f"default/{topic}", 2), 60, "2 partitions online")
    owner = leader_of(cluster, topic, 0)
    target = next(b["id"] for b in cluster.record["brokers"] if b["id"] != owner)
    reader = GroupReader(cluster, topic, "unload-group")
    try:
        produced = produce_through(
            cluster,
            topic,
            lambda: assert_applied(cluster.apply(unload(f"{topic}-0", topic, 0, target))),
            seen=lambda md: md.partitions[0].leader == target,
        )
        assert not produced.failed, f"an unload fails no record: {produced.failed}"
        reader.wait_for(set(produced.acknowledged))
    finally:
        reader.stop()
    cluster.wait(lambda: unload_phase(cluster, f"{topic}-0") == "Completed", 60, "unloaded")
    assert leader_of(cluster, topic, 0) == target
    for at, number in reader.read.at.items():
        assert produced.acknowledged.get(number) == at, (at, number)
    # one offset space: partition 0's offsets run on across the move, each read once
    offsets = sorted(o for p, o in produced.acknowledged.values() if p == 0)
    assert offsets == list(range(len(offsets)))
    assert not reader.read.twice, reader.read.twice[:5]
    assert_routed_old_then_new(produced, 2, 2)


def online(c: LocalCluster, topic: str, count: int) -> bool:
    parts = c.partitions(topic)
    return len(parts) == count and all(p["state"] == "Online" for p in parts)


def leader_of(c: LocalCluster, topic: str, partition: int) -> int | None:
    found = next((p for p in c.partitions(f"default/{topic}") if p["partition"] == partition), None)
    return None if found is None else found.get("leader")
