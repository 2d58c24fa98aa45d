"""A Kafka consumer reads a tiered topic from its first offset: the records retention has
moved off the broker's disk come from the object store (real MinIO), the rest from the
local log, each once and in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from headrace.client import Producer
from headrace.testing import waiting
from headrace.testing.minio import MinioServer
from headrace.testing.procs import BrokerProcess, free_port
from headrace.testing.reading import create_topic
from tests.integration.objectstore import servers

TOPIC = "history"
RECORDS = 3_000


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[tuple[BrokerProcess, int]]:
    minio = MinioServer(servers.minio_binary(), tmp_path / "minio")
    minio.start()
    port = free_port()
    broker = BrokerProcess(
        tmp_path / "data",
        extra_args=[
            "--object-store", f"s3://{minio.endpoint}/kafka?create_bucket=1",
            "--cluster-id", "k",
            "--segment-bytes", str(64 * 1024),
            "--retention-check-interval-ms", "200",
            "--kafka-port", str(port),
        ],
        env={
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": minio.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": minio.secret_key,
        },
    )  # fmt: skip
    broker.start()
    yield broker, port
    broker.stop()
    minio.stop()


async def test_a_kafka_consumer_reads_from_the_object_store_then_the_disk(
    tiered: tuple[BrokerProcess, int],
) -> None:
    broker, port = tiered
    await create_topic(
        broker.bootstrap,
        TOPIC,
        1,
        {"local_retention_bytes": 128 * 1024, "upload_interval_ms": 300},
    )
    async with Producer(broker.bootstrap, acks="leader", linger_ms=1) as producer:
        for first in range(0, RECORDS, 100):
            values = [b"r%07d" % n * 10 for n in range(first, first + 100)]
            await producer.send_many(TOPIC, values, partition=0)
            await producer.flush()

    def local_start() -> int:
        doc = broker.get_json(f"/v1/topics/default/{TOPIC}")
        return int(doc["partition_details"][0]["log_start_offset"])  # type: ignore[index]

    waiting.until(lambda: local_start() > 0, 30, "retention after upload", poll_s=0.1)

    consumer = AIOKafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        assert await consumer.beginning_offsets([tp]) == {tp: 0}  # the store's first offset
        consumer.seek(tp, 0)
        got: list[tuple[int, bytes]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while len(got) < RECORDS:
            assert loop.time() < deadline, (
                f"{len(got)} of {RECORDS} read; last {got[-1][0] if got else None},"
                f" position {await consumer.position(tp)}, local start {local_start()}"
            )
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                got.extend((r.offset, r.value) for r in records)
    finally:
        await consumer.stop()
    assert [o for o, _ in got] == list(range(RECORDS))
    assert [v for _, v in got] == [b"r%07d" % n * 10 for n in range(RECORDS)]
