"""Kafka consumer groups through real clients: aiokafka and librdkafka subscribe, share the
partitions, rebalance when a member leaves, commit offsets, and find them again after
the broker restarts."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import Consumer, KafkaError, KafkaException

from headrace.client.consumer import Consumer as HeadraceConsumer
from headrace.testing import waiting
from headrace.testing.reading import cohort_partitions, create_topic
from tests.integration.kafka.conftest import KafkaBroker

TOPIC = "events"
PARTITIONS = 4


async def produce(kafka: KafkaBroker, start: int, count: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap, acks="all", enable_idempotence=False
    )
    await producer.start()
    try:
        for i in range(start, start + count):
            await producer.send(TOPIC, b"e%d" % i, partition=i % PARTITIONS)
        await producer.flush()
    finally:
        await producer.stop()


def member(kafka: KafkaBroker, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=kafka.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6_000,
        heartbeat_interval_ms=300,
    )


async def take(consumer: AIOKafkaConsumer, got: list[bytes], until: int) -> None:
    async with asyncio.timeout(60):
        while len(got) < until:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got.extend(r.value for r in records)


async def test_two_aiokafka_members_share_rebalance_and_resume_from_commits(
    kafka: KafkaBroker,
) -> None:
    await create_topic(kafka.broker.bootstrap, TOPIC, PARTITIONS)
    await produce(kafka, 0, 400)
    first, second = member(kafka, "billing"), member(kafka, "billing")
    await first.start()
    await second.start()
    got_first: list[bytes] = []
    got_second: list[bytes] = []
    try:
        # both members hold partitions of one generation, and between them read all 400
        async with asyncio.timeout(60):
            while not (first.assignment() and second.assignment()):
                await asyncio.gather(first.getmany(timeout_ms=100), second.getmany(timeout_ms=100))
        assert not (first.assignment() & second.assignment())
        assert len(first.assignment() | second.assignment()) == PARTITIONS
        for consumer in (first, second):
            for tp in consumer.assignment():
                consumer.seek(tp, 0)
        async with asyncio.timeout(60):
            while len(got_first) + len(got_second) < 400:
                a, b = await asyncio.gather(
                    first.getmany(timeout_ms=100), second.getmany(timeout_ms=100)
                )
                got_first.extend(r.value for rs in a.values() for r in rs)
                got_second.extend(r.value for rs in b.values() for r in rs)
        assert Counter(got_first + got_second) == Counter(b"e%d" % i for i in range(400))
        await first.commit()
        await second.commit()
    finally:
        await second.stop()  # leaves the group: the first takes every partition
    try:
        async with asyncio.timeout(60):
            while len(first.assignment()) < PARTITIONS:
                await first.getmany(timeout_ms=100)
        await produce(kafka, 400, 100)
        after: list[bytes] = []
        await take(first, after, 100)
        assert sorted(after) == sorted(b"e%d" % i for i in range(400, 500))
        await first.commit()
    finally:
        await first.stop()

    # the offsets outlive the broker: a new member resumes where the group stopped
    kafka.broker.stop()
    kafka.broker.start()
    await produce(kafka, 500, 40)
    late = member(kafka, "billing")
    await late.start()
    try:
        resumed: list[bytes] = []
        await take(late, resumed, 40)
        assert sorted(resumed) == sorted(b"e%d" % i for i in range(500, 540))
        committed = {tp: await late.committed(tp) for tp in late.assignment()}
        assert committed == {TopicPartition(TOPIC, p): 125 for p in range(PARTITIONS)}
    finally:
        await late.stop()

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        assert ("billing", "consumer") in [(g[0], g[1]) for g in await admin.list_consumer_groups()]
        (described,) = await admin.describe_consumer_groups(["billing"])
        assert described.groups[0][2] == "Empty"  # no members left
    finally:
        await admin.close()


def test_librdkafka_subscribes_commits_and_a_second_group_starts_over(
    kafka: KafkaBroker,
) -> None:
    asyncio.run(create_topic(kafka.broker.bootstrap, TOPIC, PARTITIONS))
    asyncio.run(produce(kafka, 0, 200))

    def consume(group: str, count: int) -> list[bytes]:
        consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
            }
        )
        got: list[bytes] = []
        try:
            consumer.subscribe([TOPIC])
            while len(got) < count:
                msg = consumer.poll(15)
                assert msg is not None, f"{group}: nothing after {len(got)} records"
                if msg.error():
                    raise KafkaException(msg.error())
                got.append(msg.value())
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        return got

    assert sorted(consume("audit", 200)) == sorted(b"e%d" % i for i in range(200))
    asyncio.run(produce(kafka, 200, 20))
    # the group resumes from its commits; another group reads from the beginning
    assert sorted(consume("audit", 20)) == sorted(b"e%d" % i for i in range(200, 220))
    assert len(consume("replay", 220)) == 220


def test_a_static_librdkafka_member_restarts_within_its_session_with_no_rebalance(
    kafka: KafkaBroker,
) -> None:
    """Static membership (``group.instance.id``, KIP-345): a static member closed and
    reopened within its session timeout gets its partitions back, and the other member is
    not rebalanced (no assignment callback); every record is read once. A second consumer
    with the same instance id then fences the first (FENCED_INSTANCE_ID: fatal in
    librdkafka) and takes its partitions, still without a rebalance."""
    asyncio.run(create_topic(kafka.broker.bootstrap, TOPIC, PARTITIONS))
    callbacks: list[tuple[str, list[int]]] = []

    def consumer(instance: str | None) -> Consumer:
        config: dict[str, str | int | bool] = {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "static",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 500,
        }
        if instance is not None:
            config["group.instance.id"] = instance
        return Consumer(config)

    def partitions(c: Consumer) -> list[int]:
        return sorted(p.partition for p in c.assignment())

    read: dict[str, list[bytes]] = {"other": [], "static": []}

    def poll_until(members: dict[str, Consumer], done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 60
        while not done():
            assert time.monotonic() < deadline, f"{what}: not within 60 s; read {read}"
            for name, c in members.items():
                msg = c.poll(0.1)
                if msg is None:
                    continue
                if msg.error():
                    raise KafkaException(msg.error())
                read[name].append(msg.value())

    other = consumer(None)
    static = consumer("s1")
    try:
        other.subscribe(
            [TOPIC],
            on_assign=lambda _, ps: callbacks.append(("assign", [p.partition for p in ps])),
            on_revoke=lambda _, ps: callbacks.append(("revoke", [p.partition for p in ps])),
        )
        static.subscribe([TOPIC])
        both = {"other": other, "static": static}
        poll_until(both, lambda: len(partitions(other)) == len(partitions(static)) == 2, "join")
        held = partitions(static)
        asyncio.run(produce(kafka, 0, 40))
        poll_until(both, lambda: len(read["other"]) + len(read["static"]) == 40, "first reads")
        static.commit(asynchronous=False)
        before = list(callbacks)

        static.close()  # a static member does not leave: its place waits for its session
        static = consumer("s1")
        static.subscribe([TOPIC])
        both = {"other": other, "static": static}
        poll_until(both, lambda: partitions(static) == held, "the static member's return")
        asyncio.run(produce(kafka, 40, 40))
        poll_until(both, lambda: len(read["other"]) + len(read["static"]) == 80, "second reads")
        assert callbacks == before, "the other member was rebalanced"

        # a second consumer with the same instance id fences the first, which is told so
        twin = consumer("s1")
        try:
            twin.subscribe([TOPIC])
            fenced: list[KafkaError] = []
            deadline = time.monotonic() + 60
            while not fenced or partitions(twin) != held:
                assert time.monotonic() < deadline, f"no fencing within 60 s: {fenced}"
                for c in (twin, other, *(() if fenced else (static,))):
                    msg = c.poll(0.1)
                    if msg is not None and msg.error():
                        assert c is static, msg.error()
                        fenced.append(msg.error())
            assert fenced[0].code() == KafkaError._FATAL, fenced
            assert "fenced by other consumer with same group.instance.id" in fenced[0].str()
            assert callbacks == before, "the other member was rebalanced"
        finally:
            twin.close()
    finally:
        static.close()
        other.close()
    everything = read["other"] + read["static"]
    assert sorted(everything) == sorted(b"e%d" % i for i in range(80))
    # produce() sends record i to partition i % PARTITIONS
    assert sorted(read["static"]) == sorted(b"e%d" % i for i in range(80) if i % PARTITIONS in held)


async def test_a_kafka_group_and_a_cohort_of_the_same_name_are_two_groups(
    kafka: KafkaBroker,
) -> None:
    """The Kafka group ``billing`` commits its offsets, and the cohort ``billing``
    acknowledges its records: neither moves the other (docs/kafka.md §3, Groups)."""
    await create_topic(kafka.broker.bootstrap, TOPIC, PARTITIONS)
    await produce(kafka, 0, 40)  # 10 per partition
    group = member(kafka, "billing")
    await group.start()
    try:
        await take(group, [], 40)
        await group.commit({TopicPartition(TOPIC, p): 5 for p in range(PARTITIONS)})
    finally:
        await group.stop()

    # the cohort starts at the beginning, not at the group's commits, and acknowledges all
    cohort = HeadraceConsumer(kafka.broker.bootstrap, TOPIC, "billing", start="earliest")
    await cohort.start()
    read: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            while len(read) < 40:
                for batch in await cohort.getmany(timeout_s=1.0):
                    read.extend(r.value for r in batch.records())
                    cohort.ack_batch(batch)

            async def every_cursor_at_the_end() -> bool:
                cursors = {p: v["cursor"] for p, v in (await cohorts_of(kafka)).items()}
                return cursors == {p: 10 for p in range(PARTITIONS)}

            await waiting.until_async(
                every_cursor_at_the_end, 30, "the cohort's cursors at every partition's end"
            )
    finally:
        await cohort.close()
    assert sorted(read) == sorted(b"e%d" % i for i in range(40))

    # the group resumes at its own commits, the cohort's acknowledgements notwithstanding
    late = member(kafka, "billing")
    await late.start()
    try:
        resumed: list[bytes] = []
        await take(late, resumed, 20)
        assert sorted(resumed) == sorted(b"e%d" % i for i in range(40) if i // PARTITIONS >= 5)
    finally:
        await late.stop()


async def cohorts_of(kafka: KafkaBroker) -> dict[int, dict[str, Any]]:
    return await cohort_partitions(kafka.broker.bootstrap, "billing")
