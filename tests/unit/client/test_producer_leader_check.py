"""``_PartitionSender._answer``: while a produce goes unanswered, the sender asks where the
partition's leader is; it resends at once when the leader moved, and an answer that
arrives meanwhile always wins over the move."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from headrace.client import producer as producing
from headrace.client.producer import Producer, _Batch, _PartitionSender
from headrace.client.retry_policy import LeaderMoved

TOPIC = "default/t"


@pytest.fixture
async def sender(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[_PartitionSender]:
    monkeypatch.setattr(producing, "LEADER_CHECK_S", 0.01)
    s = _PartitionSender(Producer("127.0.0.1:1", request_timeout_ms=5_000), TOPIC, 0)
    try:
        yield s
    finally:
        await s.close()


def sent_to(broker: int) -> _Batch:
    loop = asyncio.get_running_loop()
    batch = _Batch(TOPIC, 0, b"", 1, 0, loop.create_future(), loop.time() + 60)
    batch.sent_to = broker
    return batch


def leaders(monkeypatch: pytest.MonkeyPatch, sender: _PartitionSender) -> Callable[[int], None]:
    """The routing cache's leader of the partition, as the returned setter moves it."""
    now = {"leader": 1}
    monkeypatch.setattr(sender, "_owner_id", lambda: now["leader"])
    return lambda broker: now.update(leader=broker)


async def test_a_leader_that_moved_while_the_answer_is_missing_is_left_at_once(
    sender: _PartitionSender, monkeypatch: pytest.MonkeyPatch
) -> None:
    move_to = leaders(monkeypatch, sender)

    async def refresh() -> None:
        move_to(2)  # the controller elected broker 2; broker 1 never answers

    monkeypatch.setattr(sender.producer.cluster, "refresh", refresh)
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    with pytest.raises(LeaderMoved, match="broker 2 leads now"):
        await asyncio.wait_for(sender._answer(sent_to(1), never), 4)


async def test_an_answer_that_arrives_during_the_refresh_wins_over_the_move(
    sender: _PartitionSender, monkeypatch: pytest.MonkeyPatch
) -> None:
    move_to = leaders(monkeypatch, sender)
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done_refreshing = asyncio.Event()

    async def refresh() -> None:
        answer.set_result("ack")  # broker 1 answers while the topology is being fetched
        move_to(2)  # ... and the refresh then names another leader
        await done_refreshing.wait()

    monkeypatch.setattr(sender.producer.cluster, "refresh", refresh)
    assert await asyncio.wait_for(sender._answer(sent_to(1), answer), 4) == "ack"
    done_refreshing.set()


async def test_a_leader_that_stays_is_waited_for(
    sender: _PartitionSender, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaders(monkeypatch, sender)  # broker 1 leads throughout, only slow
    refreshes = 0

    async def refresh() -> None:
        nonlocal refreshes
        refreshes += 1
        if refreshes == 3:
            answer.set_result("ack")

    monkeypatch.setattr(sender.producer.cluster, "refresh", refresh)
    monkeypatch.setattr(sender.producer, "_may_refresh_for_leaders", lambda now: True)
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    assert await asyncio.wait_for(sender._answer(sent_to(1), answer), 4) == "ack"
    assert refreshes == 3
