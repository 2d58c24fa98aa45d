"""Topic admin through Kafka's admin clients: create with configs, describe, refuse what
cannot be honoured by name, delete; and the describe calls tools make first."""

from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
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
