"""Long-lived clients across a delete and a re-create of their topic under the same name.

One real standalone broker. The producer and the consumer are made before the delete
and kept open; after the re-create, what they send and what is produced must reach
the new topic and its cohort, as it would for clients made afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import Consumer, Producer
from headrace.testing import procs
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import read_partition
from headrace.testing.waiting import until_async

TOPIC = "default/again"
#: the name the admin API takes (in the default namespace)
NAME = "again"
PARTITIONS = 2
KEYS = [b"key-%d" % k for k in range(8)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        yield b
    finally:
        b.kill9()


async def send_all(producer: Producer, prefix: bytes) -> list[bytes]:
    values = [prefix + b"-%d" % i for i in range(len(KEYS))]
    receipts = [await producer.send(TOPIC, v, key=k) for k, v in zip(KEYS, values, strict=True)]
    for receipt in receipts:
        await receipt
    return values


async def until_delivered(consumer: Consumer, wanted: list[bytes], what: str) -> None:
    """Read and ack until every value of ``wanted`` came, or fail after a deadline."""
    got: set[bytes] = set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not set(wanted) <= got:
        if loop.time() > deadline:
            raise AssertionError(f"{what}: {sorted(set(wanted) - got)} never delivered")
        for batch in await consumer.getmany(timeout_s=0.3):
            got.update(batch.values())
            consumer.ack_batch(batch)


async def until_forgotten(client: Producer | Consumer) -> None:
    """Until the client's topology no longer has the topic (the delete reached it)."""
    await until_async(
        lambda: TOPIC not in (client.cluster.routing.topics or {}),
        20,
        "the client sees the topic deleted",
        poll_s=0.05,
    )


async def test_a_producer_kept_open_stores_its_records_in_the_re_created_topic(
    broker: BrokerProcess,
) -> None:
    broker.create_topic(NAME, PARTITIONS)
    async with Producer(broker.bootstrap, acks="leader") as producer:
        await send_all(producer, b"old")
        broker.delete_topic(NAME)
        await until_forgotten(producer)
        broker.create_topic(NAME, PARTITIONS)
        # Its sequence numbers on each partition went on past 0; the new partitions do not
        # know it, so it goes on under a new producer identity (``sequence gap persists``).
        new = await send_all(producer, b"new")
    stored = [
        r.value for p in range(PARTITIONS) for r in await read_partition(broker.bootstrap, TOPIC, p)
    ]
    assert sorted(stored) == sorted(new), "the re-created topic holds exactly the new records"


@pytest.mark.parametrize("start", ["earliest", "latest"])
async def test_a_consumer_kept_open_receives_the_re_created_topics_records(
    broker: BrokerProcess, start: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker ends the memberships of a deleted topic's cohorts; the consumer sees
    the topic's new creation id, says so, and joins the new topic from its start (with
    ``start="latest"`` too: every record of the new topic is new to it)."""
    broker.create_topic(NAME, PARTITIONS)
    async with (
        Producer(broker.bootstrap, acks="leader") as producer,
        Consumer(broker.bootstrap, TOPIC, "readers", start=start) as consumer,
    ):
        await until_delivered(consumer, await send_all(producer, b"old"), "before the delete")
        broker.delete_topic(NAME)
        await until_forgotten(consumer)
        # Created and written to while this event loop is blocked: the records are there
        # before the consumer can join the new topic, as a slow consumer would find them.
        broker.create_topic(NAME, PARTITIONS)
        new = [b"new-%d" % i for i in range(8)]
        written = procs.run_headrace(
            "produce", TOPIC, "--bootstrap", broker.bootstrap,
            stdin=b"".join(v + b"\n" for v in new),
        )  # fmt: skip
        assert written.returncode == 0, written.stderr.decode()
        await until_delivered(consumer, new, "after the re-create")
    assert "was deleted and created again" in caplog.text
