"""The Kafka API on a 3-broker local cluster, with real clients (aiokafka).

Metadata names every broker's Kafka listener and each partition's real leader; a
keyed ``acks=all`` producer and a consumer group run while the partition leader,
then the group's coordinator, are killed with SIGKILL. Every acknowledged record
is read; committed offsets survive the coordinator's loss (a redelivery never
starts below the last acknowledged commit); a fresh consumer of the group starts
where the group committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka import Consumer, Producer

from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from tests.integration.localcluster import LocalCluster, topic_manifest, until

TOPIC = "orders"
OFFSETS = "default/kafka.group-offsets"
OFFSETS_PARTITIONS = 3
RECORDS = 3000
#: how long a window of records may take to settle at the producer, and the consumer to
#: read what is left once the producer is done: generous, for a loaded machine
SETTLE_S = 120.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster", brokers=3)
    c.up()
    try:
        assert c.apply(topic_manifest(TOPIC, 3, replicas=3, min_in_sync=2)).returncode == 0
        c.wait(lambda: all_led(c, f"default/{TOPIC}", 3), 60, "orders placed")
        c.wait(lambda: all_led(c, OFFSETS, OFFSETS_PARTITIONS), 60, "the offsets topic placed")
        yield c
    finally:
        c.down()


def all_led(c: LocalCluster, topic: str, count: int) -> bool:
    parts = c.partitions(topic)
    return len(parts) == count and all(
        p.get("leader") is not None and len(p["liveReplicas"]) == 3 for p in parts
    )


def leader(c: LocalCluster, topic: str, partition: int) -> int | None:
    found = next((p for p in c.partitions(topic) if p["partition"] == partition), None)
    return None if found is None else found.get("leader")


def in_sync(c: LocalCluster, topic: str, broker: int) -> bool:
    return all(broker in p["liveReplicas"] for p in c.partitions(topic))


def cluster_leaders(c: LocalCluster) -> dict[int, int | None]:
    return {p["partition"]: p.get("leader") for p in c.partitions(f"default/{TOPIC}")}


def producer_leaders(producer: AIOKafkaProducer) -> dict[int, int | None]:
    md = producer.client.cluster
    return {p: md.leader_for_partition(TopicPartition(TOPIC, p)) for p in range(3)}


def read_ends(read: dict[tuple[int, int], bytes]) -> dict[int, int]:
    """Partition -> one past the highest offset read."""
    ends: dict[int, int] = {}
    for partition, offset in read:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


async def test_metadata_names_every_broker_and_each_partitions_leader(
    cluster: LocalCluster,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    await producer.start()
    try:
        await producer.client.force_metadata_update()
        md = producer.client.cluster
        brokers = {b.nodeId: (b.host, b.port) for b in md.brokers()}
        assert brokers == {b["id"]: (b["host"], b["kafka_port"]) for b in cluster.record["brokers"]}
        for partition in range(3):
            expected = leader(cluster, f"default/{TOPIC}", partition)
            assert md.leader_for_partition(TopicPartition(TOPIC, partition)) == expected
    finally:
        await producer.stop()


async def test_a_group_survives_the_loss_of_a_leader_and_of_its_coordinator(
    cluster: LocalCluster,
) -> None:
    first_victim = leader(cluster, f"default/{TOPIC}", 0)
    assert first_victim is not None
    # a group whose coordinator is another broker: the two kills hit different brokers
    group = next(
        g
        for g in (f"billing-{i}" for i in range(100))
        if leader(cluster, OFFSETS, zlib.crc32(g.encode()) % OFFSETS_PARTITIONS) != first_victim
    )
    coordinator = leader(cluster, OFFSETS, zlib.crc32(group.encode()) % OFFSETS_PARTITIONS)
    assert coordinator is not None

    acknowledged: set[bytes] = set()
    read: dict[tuple[int, int], bytes] = {}
    #: partition -> the offset of the last commit the coordinator acknowledged
    committed: dict[int, int] = {}
    below_commit: list[tuple[int, int, int]] = []
    producing_done = asyncio.Event()

    async def produce() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=30_000,
        )
        await producer.start()
        try:
            for start in range(0, RECORDS, 50):
                window = []
                for i in range(start, start + 50):
                    value = f"v{i}".encode()
                    fut = await producer.send(TOPIC, value, key=f"k{i % 97}".encode())
                    window.append((value, fut))
                # An idempotent aiokafka producer never expires a batch: it retries until
                # the partition's leader takes it. One still unsettled after the deadline
                # is a failure to report, with where the producer was sending it.
                await asyncio.wait([f for _, f in window], timeout=SETTLE_S)
                unsettled = [v for v, f in window if not f.done()]
                assert not unsettled, (
                    f"{len(unsettled)} records neither acknowledged nor failed in {SETTLE_S}s;"
                    f" the producer's leaders: {producer_leaders(producer)},"
                    f" the controller's: {cluster_leaders(cluster)}"
                )
                for value, fut in window:
                    if fut.exception() is None:
                        acknowledged.add(value)
                    # else not acknowledged: nothing is promised for it
        finally:
            producing_done.set()
            # stop() flushes: a batch left unsettled above would hold it for ever
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(producer.stop(), SETTLE_S)

    async def consume() -> None:
        consumer = AIOKafkaConsumer(
            TOPIC,
            bootstrap_servers=cluster.kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
        )
        await consumer.start()
        loop = asyncio.get_running_loop()
        #: once the producer is done, how long the consumer may take to read the rest
        read_deadline: float | None = None
        try:
            while not (producing_done.is_set() and acknowledged <= set(read.values())):
                if producing_done.is_set():
                    read_deadline = read_deadline or loop.time() + SETTLE_S
                    if loop.time() > read_deadline:
                        return  # the verdict below names what was never read
                batches = await consumer.getmany(timeout_ms=500)
                positions: dict[TopicPartition, int] = {}
                for tp, records in batches.items():
                    for r in records:
                        key = (tp.partition, r.offset)
                        if key in read:
                            assert read[key] == r.value, f"two values at {key}"
                            if r.offset < committed.get(tp.partition, 0):
                                below_commit.append(
                                    (tp.partition, r.offset, committed[tp.partition])
                                )
                        read[key] = r.value
                        positions[tp] = r.offset + 1
                if not positions:
                    continue
                try:
                    await consumer.commit(positions)
                except KafkaError:
                    continue  # not acknowledged: the group may redeliver from the last one
                for tp, offset in positions.items():
                    committed[tp.partition] = offset
        finally:
            await consumer.stop()

    async def kill_and_restart(victim: int, topic: str, partition: int) -> None:
        cluster.kill_broker(victim)
        await until(
            lambda: leader(cluster, topic, partition) not in (None, victim),
            f"a new leader of {topic}/{partition}",
        )
        cluster.restart_broker(victim)
        await until(lambda: in_sync(cluster, f"default/{TOPIC}", victim), f"{victim} back in sync")
        await until(lambda: in_sync(cluster, OFFSETS, victim), f"{victim} back in sync (offsets)")

    async def chaos() -> None:
        await until(lambda: len(read) >= RECORDS // 5, "a fifth of the records read", 120)
        await kill_and_restart(first_victim, f"default/{TOPIC}", 0)
        await until(lambda: len(read) >= RECORDS // 2, "half the records read", 120)
        offsets_partition = zlib.crc32(group.encode()) % OFFSETS_PARTITIONS
        await kill_and_restart(coordinator, OFFSETS, offsets_partition)

    # Each part waits on its conditions with deadlines of its own and says which one
    # failed; the first failure cancels the others.
    async with asyncio.TaskGroup() as parts:
        for part in (produce(), consume(), chaos()):
            parts.create_task(part)

    assert len(acknowledged) > RECORDS // 2, "the producer got through"
    missing = acknowledged - set(read.values())
    assert not missing, (
        f"{len(missing)} acknowledged records never read (e.g. {sorted(missing)[:5]});"
        f" read up to: {read_ends(read)}"
    )
    assert not below_commit, f"redelivered below an acknowledged commit: {below_commit[:5]}"

    # A fresh member of the group starts where the group committed, on whichever broker
    # coordinates it now.
    fresh = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await fresh.start()
    try:
        for partition, offset in committed.items():
            stored = await fresh.committed(TopicPartition(TOPIC, partition))
            # a commit whose answer was lost may have been stored: never below the last
            # acknowledged one, never past what was read
            read_end = max(o for p, o in read if p == partition) + 1
            assert stored is not None and offset <= stored <= read_end
    finally:
        await fresh.stop()


def raw_metadata(address: tuple[str, int]) -> km.MetadataResponse:
    """Metadata (v1) for every topic from one broker's Kafka listener."""
    api = km.SUPPORTED[km.ApiKey.METADATA]
    with socket.create_connection(address, timeout=15) as sock:
        sock.sendall(km.encode_request(api, 1, 1, "t", km.MetadataRequest(None)))
        size = struct.unpack(">i", read_exactly(sock, 4))[0]
        _, body = km.decode_response(api, 1, read_exactly(sock, size))
    assert isinstance(body, km.MetadataResponse)
    return body


def test_a_restarted_broker_answers_kafka_clients_only_with_the_whole_cluster(
    cluster: LocalCluster,
) -> None:
    """Until its first topology push a restarted broker knows only itself. Were it to
    answer Metadata then, a Kafka client would replace its broker list with that one
    broker; a Kafka broker serves no client before it has caught up with the cluster."""
    victim = leader(cluster, f"default/{TOPIC}", 0)
    assert victim is not None
    address = next(
        (b["host"], b["kafka_port"]) for b in cluster.record["brokers"] if b["id"] == victim
    )
    cluster.kill_broker(victim)
    cluster.wait(
        lambda: leader(cluster, f"default/{TOPIC}", 0) not in (None, victim), 60, "a new leader"
    )
    cluster.restart_broker(victim)
    answers: list[tuple[list[int], list[str]]] = []

    def whole() -> bool:
        try:
            body = raw_metadata(address)
        except (ConnectionError, AssertionError):
            return False  # not accepting yet, or closed: what a client sees from a down broker
        answers.append(
            (sorted(b.node_id for b in body.brokers), [t.name or "" for t in body.topics])
        )
        return len(answers[-1][0]) == 3

    cluster.wait(whole, 60, "the restarted broker answers Kafka clients")
    assert all(brokers == [0, 1, 2] and TOPIC in names for brokers, names in answers), answers


def raw_produce(address: tuple[str, int], topic: str, partition: int) -> int:
    """One Kafka Produce (v7, acks=all) of a 2-record batch; its error code."""
    api = km.SUPPORTED[km.ApiKey.PRODUCE]
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(2):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"x%d" % i, headers=[])
    data = km.PartitionProduceData(partition, memoryview(bytes(builder.build())))
    request = km.ProduceRequest(None, -1, 10_000, [km.TopicProduceData(topic, [data])])
    with socket.create_connection(address, timeout=15) as sock:
        sock.sendall(km.encode_request(api, 7, 1, "t", request))
        size = struct.unpack(">i", read_exactly(sock, 4))[0]
        _, body = km.decode_response(api, 7, read_exactly(sock, size))
    return int(body.responses[0].partition_responses[0].error_code)


def raw_latest_offset(address: tuple[str, int], topic: str, partition: int) -> int:
    """ListOffsets (v5) latest: the partition's high watermark at its leader."""
    api = km.SUPPORTED[km.ApiKey.LIST_OFFSETS]
    asked = km.ListOffsetsPartition(partition, -1, km.LATEST_TIMESTAMP)
    request = km.ListOffsetsRequest(-1, 0, [km.ListOffsetsTopic(topic, [asked])])
    with socket.create_connection(address, timeout=15) as sock:
        sock.sendall(km.encode_request(api, 5, 1, "t", request))
        size = struct.unpack(">i", read_exactly(sock, 4))[0]
        _, body = km.decode_response(api, 5, read_exactly(sock, size))
    answer = body.topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return int(answer.offset)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "the broker closed the connection instead of answering"
        out += chunk
    return out


async def test_after_a_shrink_metadata_lists_the_active_partitions_and_retired_take_nothing(
    cluster: LocalCluster,
) -> None:
    topic = "shrinking"
    assert cluster.apply(topic_manifest(topic, 4, replicas=3, min_in_sync=2)).returncode == 0
    cluster.wait(lambda: all_led(cluster, f"default/{topic}", 4), 60, "4 partitions placed")
    kafka_of = {b["id"]: (b["host"], b["kafka_port"]) for b in cluster.record["brokers"]}
    retired_leader = leader(cluster, f"default/{topic}", 3)
    assert retired_leader is not None
    assert raw_produce(kafka_of[retired_leader], topic, 3) == ErrorCode.NONE

    shrink = f"""apiVersion: headrace.dev/v1alpha1
kind: Repartition
metadata: {{name: {topic}-to-2}}
spec: {{topicRef: {{name: {topic}}}, partitions: 2, adoptionTimeoutSeconds: 5}}
"""
    assert cluster.apply(shrink).returncode == 0

    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, metadata_max_age_ms=500)
    await producer.start()
    try:

        async def partitions() -> set[int]:
            await producer.client.force_metadata_update()
            return producer.client.cluster.partitions_for_topic(topic) or set()

        deadline = asyncio.get_running_loop().time() + 60
        while await partitions() != {0, 1}:
            assert asyncio.get_running_loop().time() < deadline, "Metadata still lists 4"
            await asyncio.sleep(0.2)
        # a producer routing by the new count writes as before
        sent = await producer.send_and_wait(topic, b"after", key=b"k")
        assert sent.partition in (0, 1)
    finally:
        await producer.stop()
    # one still routing by the old count is refused, and nothing is written
    retired_leader = leader(cluster, f"default/{topic}", 3)
    assert retired_leader is not None
    assert raw_produce(kafka_of[retired_leader], topic, 3) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # nothing was written: the retired partition's log still ends after the two records
    # it took before the shrink (a ListOffsets by index, which it still answers)
    assert raw_latest_offset(kafka_of[retired_leader], topic, 3) == 2


def test_a_consumer_protocol_group_is_assigned_and_commits_through_its_coordinator(
    cluster: LocalCluster,
) -> None:
    """librdkafka's ``group.protocol=consumer`` in a cluster: the group's coordinator is the
    leader of its offsets partition, assigns from the topology, and the group's commits
    (replicated in the offsets topic) are where a later member starts."""
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})

    def member() -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "group.id": "kip848",
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([TOPIC])
        return consumer

    def take(consumers: list[Consumer], count: int) -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + SETTLE_S
        while len(got) < count:
            assert time.monotonic() < deadline, f"read {len(got)} of {count}"
            for consumer in consumers:
                msg = consumer.poll(0.1)
                if msg is not None:
                    assert not msg.error(), msg.error()
                    got.append(msg.value())
        return got

    first, second = member(), member()
    try:
        # the partitions are shared before anything is produced: no record is read by a
        # member that then hands its partition over uncommitted
        deadline = time.monotonic() + SETTLE_S
        while not (first.assignment() and second.assignment()) or (
            len(first.assignment()) + len(second.assignment()) != 3
        ):
            assert time.monotonic() < deadline, "the partitions were never shared"
            assert first.poll(0.1) is None and second.poll(0.1) is None
        for i in range(60):
            producer.produce(TOPIC, b"c%d" % i, partition=i % 3)
        assert producer.flush(60) == 0
        assert sorted(take([first, second], 60)) == sorted(b"c%d" % i for i in range(60))
        first.commit(asynchronous=False)
        second.commit(asynchronous=False)
    finally:
        first.close()
        second.close()
    for i in range(60, 75):
        producer.produce(TOPIC, b"c%d" % i, partition=i % 3)
    assert producer.flush(60) == 0
    late = member()
    try:
        assert sorted(take([late], 15)) == sorted(b"c%d" % i for i in range(60, 75))
    finally:
        late.close()
