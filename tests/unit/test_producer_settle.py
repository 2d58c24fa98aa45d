"""``Producer._settle``: before routing under a new partitioning version, every batch of the
old one must be finished, including one waiting for its connection to open (in neither
the sender's queue nor its in-flight list). The chaos campaign's cutover target found a
key's old-version batch overtaken by its new-version records when it was missed."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from headrace.client.producer import Producer, _Batch, _PartitionSender
from headrace.protocol import messages as msg


async def test_settle_waits_for_a_batch_whose_connection_is_opening() -> None:
    producer = Producer("127.0.0.1:1")
    loop = asyncio.get_running_loop()
    connecting = asyncio.Event()
    connected = asyncio.Event()

    async def send_after_connecting(batch: _Batch) -> asyncio.Future[Any]:
        connecting.set()
        await connected.wait()  # the leader's connection is opening
        answer: asyncio.Future[Any] = loop.create_future()
        answer.set_result(SimpleNamespace(body=msg.ProduceResponse(0, 1, 1).encode()))
        return answer

    sender = _PartitionSender(producer, "default/t", 0)
    sender._send = send_after_connecting  # type: ignore[method-assign]
    producer._senders[("default/t", 0)] = sender
    batch = _Batch("default/t", 0, b"", 1, 0, loop.create_future(), time.monotonic() + 60)
    sender.submit(batch)
    try:
        await connecting.wait()
        settled = asyncio.create_task(producer._settle("default/t"))
        for _ in range(5):
            await asyncio.sleep(0)  # let it run: it must be waiting for the batch
        assert not settled.done(), "settled while a batch of the old version was unanswered"
        connected.set()
        await asyncio.wait_for(settled, 5)
        assert batch.future.done() and batch.future.result().base_offset == 0
    finally:
        await sender.close()
