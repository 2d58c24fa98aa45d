"""The consumer group protocol of KIP-848 (``group.protocol=consumer``) through librdkafka:
two members share a topic by the broker's assignment, each record is read once, a
member's leave hands its partitions to the other, the AdminClient describes the group,
commits resume, and a classic member
cannot join the group while it has consumer-protocol members; after a broker restart a
member rejoins."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from headrace.testing.reading import create_topic
from tests.integration.kafka.conftest import KafkaBroker

TOPIC = "payments"
PARTITIONS = 4
GROUP = "ledger"
#: a deadline for each wait, never a duration the test expects
WAIT_S = 30


def produce(kafka: KafkaBroker, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    for i in range(start, start + count):
        producer.produce(TOPIC, b"p%d" % i, partition=i % PARTITIONS)
    assert producer.flush(WAIT_S) == 0


def member(kafka: KafkaBroker, protocol: str = "consumer") -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": GROUP,
            "group.protocol": protocol,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    return consumer


def poll_until(
    consumers: list[Consumer], done: Callable[[], bool], got: dict[int, list[bytes]]
) -> None:
    """Poll every consumer in turn, keeping what each reads, until ``done()``."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"no progress: {[len(g) for g in got.values()]}"
        for i, consumer in enumerate(consumers):
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            got.setdefault(i, []).append(msg.value())


def partitions_of(consumer: Consumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def test_two_consumer_protocol_members_share_hand_over_and_resume(kafka: KafkaBroker) -> None:
    asyncio.run(create_topic(kafka.broker.bootstrap, TOPIC, PARTITIONS))
    first, second = member(kafka), member(kafka)
    got: dict[int, list[bytes]] = {}
    try:
        # the broker splits the partitions between them, none held twice
        def shared() -> bool:
            a, b = partitions_of(first), partitions_of(second)
            return bool(a) and bool(b) and not a & b and len(a | b) == PARTITIONS

        poll_until([first, second], shared, got)
        assert not got  # nothing was produced yet
        produce(kafka, 0, 200)
        poll_until([first, second], lambda: sum(map(len, got.values())) >= 200, got)
        assert Counter(got[0] + got[1]) == Counter(b"p%d" % i for i in range(200))
        first.commit(asynchronous=False)
        second.commit(asynchronous=False)
    finally:
        second.close()  # leaves the group: the first takes every partition
    try:
        poll_until([first], lambda: partitions_of(first) == set(range(PARTITIONS)), got)
        # the AdminClient describes the group through ConsumerGroupDescribe
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        described = admin.describe_consumer_groups([GROUP])[GROUP].result(WAIT_S)
        assert (described.type, described.state) == (
            ConsumerGroupType.CONSUMER,
            ConsumerGroupState.STABLE,
        )
        (only,) = described.members
        assert {tp.partition for tp in only.assignment.topic_partitions} == set(range(PARTITIONS))
        produce(kafka, 200, 100)
        after: dict[int, list[bytes]] = {}
        poll_until([first], lambda: len(after.get(0, [])) >= 100, after)
        # the partitions it took over resume at the second's commits: nothing read twice
        assert Counter(after[0]) == Counter(b"p%d" % i for i in range(200, 300))
        first.commit(asynchronous=False)

        # a classic member may not join while the group has consumer-protocol members
        classic = member(kafka, "classic")
        try:
            deadline = time.monotonic() + WAIT_S
            while True:
                assert time.monotonic() < deadline, "the classic member was never refused"
                msg = classic.poll(0.2)
                first.poll(0)
                if msg is not None and msg.error():
                    assert msg.error().code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL
                    break
        finally:
            classic.close()
    finally:
        first.close()

    # a new member of the emptied group resumes where the group stopped
    produce(kafka, 300, 40)
    late = member(kafka)
    try:
        resumed: dict[int, list[bytes]] = {}
        poll_until([late], lambda: len(resumed.get(0, [])) >= 40, resumed)
        assert Counter(resumed[0]) == Counter(b"p%d" % i for i in range(300, 340))
        committed = late.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], WAIT_S)
        assert {tp.partition: tp.offset for tp in committed} == {p: 75 for p in range(PARTITIONS)}
        # memberships are not stored: after a restart the member is unknown, rejoins with
        # its own id and gets its partitions again, from the group's commits (so what it
        # read since them comes again, as from Kafka after a lost membership)
        kafka.broker.stop()
        kafka.broker.start()
        produce(kafka, 340, 20)
        fresh = {b"p%d" % i for i in range(340, 360)}
        poll_until([late], lambda: fresh <= set(resumed[0]), resumed)
        assert set(resumed[0][40:]) <= fresh | {b"p%d" % i for i in range(300, 340)}
    finally:
        late.close()


def test_a_pattern_subscription_is_matched_by_the_broker(kafka: KafkaBroker) -> None:
    """librdkafka sends a ``^`` subscription as the heartbeat's regular expression: the
    broker matches it against the topic names and assigns what it matched."""
    asyncio.run(create_topic(kafka.broker.bootstrap, TOPIC, PARTITIONS))
    asyncio.run(create_topic(kafka.broker.bootstrap, "audit", 1))
    produce(kafka, 0, 20)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "patterns",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe(["^pay.*"])
        got: dict[int, list[bytes]] = {}
        poll_until([consumer], lambda: len(got.get(0, [])) >= 20, got)
        assert Counter(got[0]) == Counter(b"p%d" % i for i in range(20))
        assert {(tp.topic, tp.partition) for tp in consumer.assignment()} == {
            (TOPIC, p) for p in range(PARTITIONS)
        }
    finally:
        consumer.close()
