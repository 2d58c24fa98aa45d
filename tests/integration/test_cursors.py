"""Cohort cursors are durable; redelivery after a crash is bounded by the flush interval."""

from __future__ import annotations

import asyncio

from bench.procs import BrokerProcess
from headrace.client import Consumer, Producer
from tests.integration.reading import create_topic

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
        await asyncio.sleep(0.05)  # let the coalesced ack go out
    finally:
        await consumer.close(grace_s=0)


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
    await asyncio.sleep(0.6)  # > cursor_flush_interval_ms (200 ms): the documented bound
    broker.restart(crash=True)
    offsets = await _first_offsets(broker.bootstrap, "second", 10)
    assert offsets[0] == 1500, "acks older than the flush interval must not be redelivered"
