"""Topic configs altered through Kafka's admin clients: checked whole, visible in
DescribeConfigs, and in force (a smaller retention deletes segments)."""

from __future__ import annotations

import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from headrace.testing.procs import free_port
from tests.integration.kafka.conftest import KafkaBroker


@pytest.fixture
def kafka(broker_factory: object) -> KafkaBroker:
    """A standalone broker whose retention runs every 100 ms, so that a change shows soon."""
    port = free_port()
    broker = broker_factory(  # type: ignore[operator]
        extra_args=["--kafka-port", str(port), "--retention-check-interval-ms", "100"]
    )
    return KafkaBroker(broker, port)


def _entry(name: str, value: str | None, op: AlterConfigOpType) -> ConfigEntry:
    return ConfigEntry(name, value, incremental_operation=op)


def _alter(
    admin: AdminClient, name: str, entries: list[ConfigEntry], validate_only: bool = False
) -> KafkaError | None:
    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
    future = admin.incremental_alter_configs([resource], validate_only=validate_only)[resource]
    try:
        future.result(timeout=30)
    except KafkaException as exc:
        return exc.args[0]  # type: ignore[no-any-return]
    return None


def _described(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    return admin.describe_configs([resource])[resource].result(timeout=30)  # type: ignore[no-any-return]


def test_a_smaller_retention_set_through_kafka_deletes_segments(kafka: KafkaBroker) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([NewTopic("events", 1, 1, config={"segment.bytes": "1024"})])[
        "events"
    ].result(timeout=30)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    for i in range(40):
        producer.produce("events", value=b"v" * 200, key=str(i).encode())
        producer.flush(30)  # one batch each: several segments
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "watermarks"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("events", 0), timeout=10) == (0, 40)

        # validate_only: the same checks, nothing changes
        assert (
            _alter(admin, "events", [_entry("retention.bytes", "1", AlterConfigOpType.SET)], True)
            is None
        )
        assert (
            _described(admin, "events")["retention.bytes"].source
            == ConfigSource.DEFAULT_CONFIG.value
        )

        assert (
            _alter(admin, "events", [_entry("retention.bytes", "1", AlterConfigOpType.SET)]) is None
        )
        described = _described(admin, "events")
        assert described["retention.bytes"].value == "1"
        assert described["retention.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        assert not described["retention.bytes"].is_read_only
        assert described["segment.bytes"].value == "1024"  # untouched by the change

        deadline = time.monotonic() + 30
        low = 0
        while low == 0 and time.monotonic() < deadline:
            low, high = consumer.get_watermark_offsets(TopicPartition("events", 0), timeout=10)
        assert 0 < low < 40 and high == 40, "retention never deleted a segment"
    finally:
        consumer.close()

    # DELETE: back to the broker's default
    assert (
        _alter(admin, "events", [_entry("retention.bytes", None, AlterConfigOpType.DELETE)]) is None
    )
    assert (
        _described(admin, "events")["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    )


def test_what_cannot_be_honoured_refuses_every_change_of_the_resource(kafka: KafkaBroker) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([NewTopic("ledger", 1, 1)])["ledger"].result(timeout=30)
    retention = _entry("retention.ms", "60000", AlterConfigOpType.SET)
    for bad, named in [
        (_entry("min.insync.replicas", "2", AlterConfigOpType.SET), "min.insync.replicas"),
        (_entry("cleanup.policy", "compact", AlterConfigOpType.APPEND), "compact,delete"),
        (_entry("retention.ms", "5", AlterConfigOpType.APPEND), "not a list"),
        (_entry("segment.bytes", "0", AlterConfigOpType.SET), "segment_bytes"),
    ]:
        refused = _alter(admin, "ledger", [retention, bad] if bad.name != "retention.ms" else [bad])
        assert refused is not None and refused.code() == KafkaError.INVALID_CONFIG, refused
        assert named in refused.str()
    assert _described(admin, "ledger")["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    unknown = _alter(admin, "never", [retention])
    assert unknown is not None and unknown.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


async def test_aiokafka_alter_configs_replaces_the_topics_configs(kafka: KafkaBroker) -> None:
    """The legacy AlterConfigs: the configs named are set, every other goes back to its
    default."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        from aiokafka.admin import NewTopic as AioNewTopic

        await admin.create_topics(
            [AioNewTopic("audit", 1, 1, topic_configs={"segment.ms": "60000"})]
        )
        (answer,) = await admin.alter_configs(
            [AioConfigResource(ConfigResourceType.TOPIC, "audit", {"retention.ms": "3600000"})]
        )
        assert [tuple(r)[:2] for r in answer.resources] == [(0, None)]
        (described,) = await admin.describe_configs(
            [AioConfigResource(ConfigResourceType.TOPIC, "audit")]
        )
        # (name, value, read only, source: 1 = the topic's own, 5 = a default, ...)
        configs = {c[0]: (c[1], c[3]) for c in described.resources[0][4]}
        assert configs["retention.ms"] == ("3600000", 1)
        assert configs["segment.ms"][1] == 5
        (refused,) = await admin.alter_configs(
            [AioConfigResource(ConfigResourceType.TOPIC, "audit", {"compression.type": "zstd"})]
        )
        assert refused.resources[0][0] == KafkaError.INVALID_CONFIG
    finally:
        await admin.close()
