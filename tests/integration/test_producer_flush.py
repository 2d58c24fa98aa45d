"""``flush()`` waits for a batch that is waiting for its connection to open.

A sender takes a batch off its queue, then awaits the partition's connection
before the batch is in flight: in between it was in neither list, and a
``flush()`` then returned at once with the batch unacknowledged. The
connection's opening is held back here by an event (a real broker process
answers once it is released).
"""

from __future__ import annotations

import asyncio

from headrace.client import Producer
from headrace.client.connection import ClientConnection
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition


async def test_flush_waits_for_a_batch_whose_connection_is_still_opening(
    broker: BrokerProcess,
) -> None:
    await create_topic(broker.bootstrap, "flushing", 1)
    producer = await Producer(broker.bootstrap, acks="all", linger_ms=0).start()
    opening = asyncio.Event()
    may_open = asyncio.Event()
    real_connection_for = producer.cluster.connection_for

    async def slow_connection_for(topic: str, partition: int) -> ClientConnection:
        opening.set()
        await may_open.wait()
        return await real_connection_for(topic, partition)

    producer.cluster.connection_for = slow_connection_for  # type: ignore[method-assign]
    try:
        receipt = await producer.send("flushing", b"in between", partition=0)
        await asyncio.wait_for(opening.wait(), 10)  # the sender holds the batch, not yet sent
        flushing = asyncio.create_task(producer.flush())
        for _ in range(20):
            await asyncio.sleep(0)  # let flush run as far as it can without the connection
        assert not flushing.done(), "flush returned while a batch was unacknowledged"
        may_open.set()
        await asyncio.wait_for(flushing, 10)
        assert receipt.done()
        assert (await receipt).offset == 0
    finally:
        may_open.set()
        await producer.close()
    assert [r.value for r in await read_partition(broker.bootstrap, "default/flushing", 0)] == [
        b"in between"
    ]
