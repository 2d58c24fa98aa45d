"""``Producer._settle``: before routing under a new partitioning version, every batch of the
old one must be finished, wherever it is: waiting for its connection to open, or set aside
while its sender handles a failure (a topology refresh, a backoff), in neither the sender's
queue nor its in-flight list. The chaos campaign's cutover target found a key's old-version
batch overtaken by its new-version records when such a batch was missed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from headrace.client.producer import Producer, _Batch, _PartitionSender
from headrace.errors import ConnectionClosed
from headrace.protocol import messages as msg

TOPIC = "default/t"


def ok() -> asyncio.Future[Any]:
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    answer.set_result(SimpleNamespace(body=msg.ProduceResponse(0, 1, 1).encode()))
    return answer


async def settles_only_after(producer: Producer, release: asyncio.Event) -> None:
    settled = asyncio.create_task(producer._settle(TOPIC))
    for _ in range(10):
        await asyncio.sleep(0)  # a yield, not a wait: let it run up to its first await
    assert not settled.done(), "settled while a batch of the old version was unanswered"
    release.set()
    await asyncio.wait_for(settled, 5)


def submit_one(producer: Producer) -> asyncio.Future[Any]:
    acc = producer._accumulator(TOPIC, 0)
    producer._append(acc, b"old version", b"k", None, 1)
    future = acc.future
    assert future is not None
    producer._drain(TOPIC, 0)
    return future


async def test_settle_waits_for_a_batch_whose_connection_is_opening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = Producer("127.0.0.1:1")
    connecting, connected = asyncio.Event(), asyncio.Event()

    async def send_after_connecting(self: _PartitionSender, batch: _Batch) -> asyncio.Future[Any]:
        connecting.set()
        await connected.wait()  # the new leader's connection is opening
        return ok()

    monkeypatch.setattr(_PartitionSender, "_send", send_after_connecting)
    future = submit_one(producer)
    try:
        await connecting.wait()
        await settles_only_after(producer, connected)
        assert future.done() and future.result().base_offset == 0
    finally:
        for sender in producer._senders.values():
            await sender.close()


async def test_settle_waits_for_a_batch_set_aside_while_a_failure_is_handled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = Producer("127.0.0.1:1", retry_backoff_ms=1)
    refreshing, refreshed = asyncio.Event(), asyncio.Event()
    attempts: list[int] = []

    async def send_failing_once(self: _PartitionSender, batch: _Batch) -> asyncio.Future[Any]:
        attempts.append(batch.attempts)
        if len(attempts) == 1:
            raise ConnectionClosed("the old leader was killed")
        return ok()

    async def slow_refresh() -> None:
        refreshing.set()
        await refreshed.wait()  # the topology refresh after the failure is in progress

    monkeypatch.setattr(_PartitionSender, "_send", send_failing_once)
    monkeypatch.setattr(producer.cluster, "refresh", slow_refresh)
    future = submit_one(producer)
    try:
        await refreshing.wait()
        await settles_only_after(producer, refreshed)
        assert future.done() and future.result().base_offset == 0
        assert len(attempts) == 2
    finally:
        for sender in producer._senders.values():
            await sender.close()
