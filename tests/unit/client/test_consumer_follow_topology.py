"""A topology change pushed while the consumer re-syncs its sessions is not lost.

Found by the fault campaign: a member re-syncing after a failover (awaiting a
connect to a dead broker) missed the push that named the new leaders, cleared
the change flag, and waited forever: it never joined the new owner and the
cohort stopped receiving those partitions. No sockets here: the sync is a stub.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from headrace.client import Consumer
from headrace.client import consumer as consumer_module
from headrace.errors import ConnectionClosed, ConsumeDenied, UnknownTopic
from headrace.protocol import messages as msg
from headrace.protocol.endpoints import BrokerEndpoint


async def test_a_change_during_a_sync_triggers_another_sync() -> None:
    consumer = Consumer("127.0.0.1:9", "t", "c")
    syncs = 0

    async def sync_sessions() -> None:
        nonlocal syncs
        syncs += 1
        if syncs == 1:
            consumer._topology_changed.set()  # a push lands while this sync runs
        await asyncio.sleep(0)

    consumer._sync_sessions = sync_sessions  # type: ignore[method-assign]
    following = asyncio.create_task(consumer._follow_topology())
    try:
        for _ in range(10):
            await asyncio.sleep(0)  # the loop is waiting for a change now
        consumer._topology_changed.set()
        for _ in range(200):  # bounded poll, not a timed assertion
            if syncs >= 2:
                break
            await asyncio.sleep(0.01)
        assert syncs >= 2, "the change that arrived during the first sync was lost"
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_failed_sync_is_retried_without_a_further_change() -> None:
    """Found by the campaign too: a rejoin that failed (the new owner still starting) was
    retried only on the next topology change, which may never come."""
    consumer = Consumer("127.0.0.1:9", "t", "c")
    syncs = 0

    async def sync_sessions() -> None:
        nonlocal syncs
        syncs += 1
        if syncs == 1:
            raise ConnectionClosed("cannot connect: the owner is still starting")

    async def refresh() -> None:
        raise ConnectionClosed("no broker reachable")

    consumer._sync_sessions = sync_sessions  # type: ignore[method-assign]
    consumer.cluster.refresh = refresh  # type: ignore[method-assign]
    following = asyncio.create_task(consumer._follow_topology())
    try:
        consumer._topology_changed.set()
        for _ in range(300):  # bounded poll (the retry backs off 0.1 s)
            if syncs >= 2:
                break
            await asyncio.sleep(0.01)
        assert syncs >= 2, "the failed rejoin was never retried"
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_refusal_no_rejoin_can_pass_ends_the_consumer_and_getmany_raises_it() -> None:
    """A topic re-created meanwhile (``UnknownTopic``) is retried; a principal that may no
    longer consume (``ConsumeDenied``) is not: getmany raises it instead of returning
    nothing for ever."""
    consumer = Consumer("127.0.0.1:9", "t", "c")
    refusals = [UnknownTopic("t is being re-created"), ConsumeDenied("no consume grant on t")]
    syncs = 0

    async def sync_sessions() -> None:
        nonlocal syncs
        syncs += 1
        raise refusals[min(syncs, len(refusals)) - 1]

    async def refresh() -> None:
        return None

    consumer._sync_sessions = sync_sessions  # type: ignore[method-assign]
    consumer.cluster.refresh = refresh  # type: ignore[method-assign]
    following = asyncio.create_task(consumer._follow_topology())
    try:
        consumer._topology_changed.set()
        with pytest.raises(ConsumeDenied, match="no consume grant"):
            await _get_until_raised(consumer)
        assert syncs == 2  # retried once after UnknownTopic, never after the denial
        await asyncio.wait_for(following, 5)  # the rejoin loop is over
        with pytest.raises(ConsumeDenied):
            await consumer.getmany(timeout_s=0)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def _get_until_raised(consumer: Consumer) -> None:
    """``getmany`` until it raises; bounded (the retry after UnknownTopic backs off 0.1 s)."""
    for _ in range(100):
        assert await consumer.getmany(timeout_s=0.05) == []


async def test_a_join_that_keeps_failing_is_warned_once_naming_the_partitions(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A member that cannot join a leader gets nothing of its partitions: once that has
    lasted through the backoff, say which partitions and which broker (at INFO, as every
    retry is, it went unnoticed), and do not repeat it every retry."""
    monkeypatch.setattr(consumer_module, "MAX_REJOIN_BACKOFF_S", 0.2)
    consumer = Consumer("127.0.0.1:9", "t", "c")
    consumer.cluster.routing.apply(
        msg.TopologySnapshot(
            7,
            "local",
            [BrokerEndpoint(0, "127.0.0.1", 9), BrokerEndpoint(1, "127.0.0.1", 10)],
            [msg.TopicRouting("default/t", 3, 1, [0, 1, 0], [1, 1, 1])],
        )
    )
    assert consumer.unjoined_partitions == {0: [0, 2], 1: [1]}
    syncs = 0

    async def sync_sessions() -> None:
        nonlocal syncs
        syncs += 1
        raise ConnectionClosed("cannot connect to 127.0.0.1:9")

    async def refresh() -> None:
        return None

    consumer._sync_sessions = sync_sessions  # type: ignore[method-assign]
    consumer.cluster.refresh = refresh  # type: ignore[method-assign]
    following = asyncio.create_task(consumer._follow_topology())
    try:
        with caplog.at_level(logging.INFO, logger="headrace.client.consumer"):
            consumer._topology_changed.set()
            for _ in range(300):  # bounded poll (the retries back off 0.1 s, then 0.2 s)
                if syncs >= 5:
                    break
                await asyncio.sleep(0.01)
        assert syncs >= 5
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "{0: [0, 2], 1: [1]}" in warnings[0] and "cannot connect" in warnings[0]
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


def _routed(consumer: Consumer, generation: int, topics: list[msg.TopicRouting]) -> None:
    consumer.cluster.routing.apply(
        msg.TopologySnapshot(generation, "local", [BrokerEndpoint(0, "127.0.0.1", 9)], topics)
    )


class ScriptedJoins:
    """A consumer of ``default/t`` whose joins fail with ``failures`` in turn, then succeed;
    it counts the joins and the topology refreshes (``on_refresh`` runs at each)."""

    def __init__(
        self,
        failures: list[Exception],
        on_refresh: Callable[[Consumer], None] | None = None,
    ) -> None:
        self.consumer = Consumer("127.0.0.1:9", "t", "c")
        _routed(self.consumer, 3, [msg.TopicRouting("default/t", 1, 1, [0], [1])])
        self.failures = failures
        self.on_refresh = on_refresh
        self.syncs = self.refreshes = 0
        self.consumer._sync_sessions = self._sync_sessions  # type: ignore[method-assign]
        self.consumer.cluster.refresh = self._refresh  # type: ignore[method-assign]

    async def _sync_sessions(self) -> None:
        self.syncs += 1
        if self.failures:
            raise self.failures.pop(0)

    async def _refresh(self) -> None:
        self.refreshes += 1
        if self.on_refresh is not None:
            self.on_refresh(self.consumer)


async def test_start_asks_a_leader_that_does_not_know_the_topic_yet_again() -> None:
    """Found in CI: the controller publishes a new topic to the brokers one by one, so a
    consumer started as soon as the topic was reported online met a leader that had not
    applied it and ``start`` raised ``UnknownTopic``. While the routing names the topic,
    the join is asked again with the topology refreshed."""
    joins = ScriptedJoins([UnknownTopic("unknown topic 'default/t'")] * 2)  # a leader behind
    await asyncio.wait_for(joins.consumer._first_sync(), 10)
    assert (joins.syncs, joins.refreshes) == (3, 2)


async def test_start_raises_unknown_topic_once_the_routing_no_longer_names_it() -> None:
    """A topic deleted meanwhile: the refreshed routing does not name it, so ``start``
    raises at once rather than after the whole wait."""

    def deleted(consumer: Consumer) -> None:
        _routed(consumer, 4, [])

    joins = ScriptedJoins([UnknownTopic("unknown topic 'default/t'")] * 100, deleted)
    with pytest.raises(UnknownTopic):
        await asyncio.wait_for(joins.consumer._first_sync(), 5)
    assert joins.syncs == 1


async def test_start_asks_again_when_a_leader_that_just_died_refuses_connections() -> None:
    """A consumer started during a failover: the dead leader refuses connections until
    its partitions move, so ``start`` asks again (found by the clients-across-faults test:
    a ``headrace consume`` started then exited 1 with ``ConnectionClosed``)."""
    refused = ConnectionClosed("cannot connect to 127.0.0.1:9: Connection refused")
    joins = ScriptedJoins([refused] * 2)
    await asyncio.wait_for(joins.consumer._first_sync(), 10)
    assert joins.syncs == 3


async def test_start_raises_at_once_what_no_rejoin_can_get_past() -> None:
    joins = ScriptedJoins([ConsumeDenied("no consume grant on t")] * 100)
    with pytest.raises(ConsumeDenied):
        await asyncio.wait_for(joins.consumer._first_sync(), 5)
    assert (joins.syncs, joins.refreshes) == (1, 0)
