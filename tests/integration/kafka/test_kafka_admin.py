"""Topic admin through Kafka's admin clients: create with configs, describe, refuse what
cannot be honoured by name, delete; the describe calls tools make first; and
CreatePartitions' checks and refusal; ListOffsets by max timestamp."""

from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin import NewPartitions as AioNewPartitions
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidPartitionsError, PolicyViolationError
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, OffsetSpec
from confluent_kafka.admin import NewTopic as CNewTopic

from tests.integration.kafka.conftest import KafkaBroker


async def test_aiokafka_admin_creates_describes_and_deletes_topics(kafka: KafkaBroker) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    "audit",
                    num_partitions=3,
                    replication_factor=1,
                    topic_configs={"retention.ms": "3600000", "cleanup.policy": "delete"},
                )
            ]
        )
        assert "audit" in await admin.list_topics()
        (described,) = await admin.describe_topics(["audit"])
        assert len(described["partitions"]) == 3

        response = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "audit")])
        # (name, value, read only, source: 1 = the topic's own, 5 = a default, ...)
        configs = {c[0]: (c[1], c[3]) for c in response[0].resources[0][4]}
        assert configs["retention.ms"] == ("3600000", 1)
        assert configs["segment.bytes"][1] == 5
        assert configs["cleanup.policy"] == ("delete", 5)

        cluster = await admin.describe_cluster()
        assert [b["port"] for b in cluster["brokers"]] == [kafka.kafka_port]

        await admin.delete_topics(["audit"])
        assert "audit" not in await admin.list_topics()
    finally:
        await admin.close()


def test_librdkafka_admin_refuses_what_it_cannot_honour_by_name(kafka: KafkaBroker) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})

    def create(topic: CNewTopic) -> KafkaError | None:
        future = admin.create_topics([topic], operation_timeout=10)[topic.topic]
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            return exc.args[0]  # type: ignore[no-any-return]
        return None

    assert create(CNewTopic("ledger", 2, 1)) is None
    taken = create(CNewTopic("ledger", 2, 1))
    assert taken is not None and taken.code() == KafkaError.TOPIC_ALREADY_EXISTS
    compacted = create(CNewTopic("state", 1, 1, config={"cleanup.policy": "compact"}))
    assert compacted is not None and compacted.code() == KafkaError.INVALID_CONFIG
    assert "cleanup.policy=compact" in compacted.str()
    replicated = create(CNewTopic("wide", 1, 3))
    assert replicated is not None and replicated.code() == KafkaError.INVALID_REPLICATION_FACTOR
    unknown = create(CNewTopic("odd", 1, 1, config={"min.insync.replicas": "2"}))
    assert unknown is not None and unknown.code() == KafkaError.INVALID_CONFIG
    assert set(admin.list_topics(timeout=10).topics) == {"ledger"}  # nothing else was made

    deleted = admin.delete_topics(["ledger", "never"], operation_timeout=10)
    deleted["ledger"].result(timeout=30)
    with pytest.raises(KafkaException) as refused:
        deleted["never"].result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_create_partitions_checks_as_kafka_and_says_why_a_grow_is_refused(
    kafka: KafkaBroker,
) -> None:
    """Kafka's checks (no shrink, no same count, unknown topic), then a valid grow: refused
    with POLICY_VIOLATION and the reason, validate_only alike, and nothing changes."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([CNewTopic("orders", 3, 1)])["orders"].result(timeout=30)

    def grow(topic: str, count: int, validate_only: bool = False) -> KafkaError | None:
        futures = admin.create_partitions(
            [NewPartitions(topic, count)], operation_timeout=10, validate_only=validate_only
        )
        try:
            futures[topic].result(timeout=30)
        except KafkaException as exc:
            return exc.args[0]  # type: ignore[no-any-return]
        return None

    fewer = grow("orders", 2)
    assert fewer is not None and fewer.code() == KafkaError.INVALID_PARTITIONS
    assert "3 partition(s); 2 would not be an increase" in fewer.str()
    same = grow("orders", 3)
    assert same is not None and same.code() == KafkaError.INVALID_PARTITIONS
    unknown = grow("never", 4)
    assert unknown is not None and unknown.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    for validate_only in (True, False):
        more = grow("orders", 5, validate_only)
        assert more is not None and more.code() == KafkaError.POLICY_VIOLATION
        assert "standalone broker's partition count is fixed at creation" in more.str()
    described = admin.list_topics("orders", timeout=10).topics["orders"]
    assert len(described.partitions) == 3


async def test_aiokafka_create_partitions_raises_kafkas_error_classes(kafka: KafkaBroker) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("audit", num_partitions=2, replication_factor=1)])
        with pytest.raises(InvalidPartitionsError, match="would not be an increase"):
            await admin.create_partitions({"audit": AioNewPartitions(1)})
        with pytest.raises(PolicyViolationError, match="fixed at creation"):
            await admin.create_partitions({"audit": AioNewPartitions(4)}, validate_only=True)
        (described,) = await admin.describe_topics(["audit"])
        assert len(described["partitions"]) == 2
    finally:
        await admin.close()


def test_list_offsets_by_max_timestamp_names_the_newest_record(kafka: KafkaBroker) -> None:
    """ListOffsets v7 (librdkafka's OffsetSpec.max_timestamp): the first record with the
    largest timestamp, exactly, however the producer batched it; earliest and latest as
    before."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([CNewTopic("clock", 1, 1)])["clock"].result(timeout=30)
    empty = TopicPartition("clock", 0)
    nothing = admin.list_offsets({empty: OffsetSpec.max_timestamp()})[empty].result(timeout=30)
    assert nothing.offset == -1
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 50})
    stamps = [1_000, 5_000, 9_000, 2_000, 9_000, 3_000]  # the first 9,000 is offset 2
    for ts in stamps:
        producer.produce("clock", value=b"v", timestamp=1_700_000_000_000 + ts)
    assert producer.flush(30) == 0

    def offset(spec: OffsetSpec) -> tuple[int, int]:
        found = admin.list_offsets({empty: spec})[empty].result(timeout=30)
        return found.offset, found.timestamp

    assert offset(OffsetSpec.max_timestamp()) == (2, 1_700_000_009_000)
    assert offset(OffsetSpec.earliest())[0] == 0
    assert offset(OffsetSpec.latest())[0] == len(stamps)
