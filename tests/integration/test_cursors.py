"""Cohort cursors are durable; redelivery after a crash is bounded by the flush interval."""

from __future__ import annotations

import asyncio
import json

from headrace.client import Consumer, Producer
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import cohort_partitions, create_topic
from tests.integration.localcluster import until

COUNT = 2000


async def _first_offsets(bootstrap: str, member: str, want: int) -> list[int]:
    consumer = await Consumer(
        bootstrap, "cur", "readers", member_id=member, start="earliest"
    ).start()
    got: list[int] = []
    try:
        while len(got) < want:
            batches = await consumer.getmany(timeout_s=5)
            assert batches, "no delivery"
            for b in batches:
                got.extend(b.offsets())
    finally:
        await consumer.close(grace_s=0)
    return got


async def _consume_and_ack(bootstrap: str, upto: int) -> None:
    consumer = await Consumer(
        bootstrap, "cur", "readers", member_id="first", start="earliest"
    ).start()
    try:
        acked = -1
        while acked < upto:
            for b in await consumer.getmany(timeout_s=5):
                last = min(b.last_offset, upto)
                if last >= b.start:
                    consumer.ack(0, last)
                    acked = last
        # acks are coalesced and sent a moment later: wait until the broker holds this one
        await until_cursor_is(bootstrap, upto + 1)
    finally:
        await consumer.close(grace_s=0)


async def until_cursor_is(bootstrap: str, offset: int) -> None:
    cursor: int | None = None
    deadline = asyncio.get_running_loop().time() + 30
    while (cursor := (await cohort_partitions(bootstrap, "readers"))[0]["cursor"]) != offset:
        assert asyncio.get_running_loop().time() < deadline, f"cursor {cursor}, not {offset}"
        await asyncio.sleep(0.02)


def _stored_cursor(broker: BrokerProcess) -> int | None:
    """The cohort's cursor as the broker last flushed it to disk."""
    path = broker.data_dir / "topics" / "default" / "cur" / "0" / "cursors.json"
    try:
        return int(json.loads(path.read_text())["readers"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


async def _fill(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "cur", 1)
    async with Producer(broker.bootstrap) as producer:
        await producer.send_many("cur", [f"m{i}".encode() for i in range(COUNT)], partition=0)
        await producer.flush()


async def test_cursor_survives_a_clean_restart(broker: BrokerProcess) -> None:
    await _fill(broker)
    await _consume_and_ack(broker.bootstrap, 1233)
    broker.restart(crash=False)
    offsets = await _first_offsets(broker.bootstrap, "second", 10)
    assert offsets[0] == 1234


async def test_cursor_survives_kill9_after_the_flush_interval(broker: BrokerProcess) -> None:
    await _fill(broker)
    await _consume_and_ack(broker.bootstrap, 1499)
    # the flush loop writes the cursors every cursor_flush_interval_ms; a cursor it wrote
    # survives kill -9
    await until(lambda: _stored_cursor(broker) == 1500, "the cursor flushed to disk")
    broker.restart(crash=True)
    offsets = await _first_offsets(broker.bootstrap, "second", 10)
    assert offsets[0] == 1500, "acks older than the flush interval must not be redelivered"
