"""Cohort rebalances on one broker: unmoved partitions keep flowing; leavers get a grace period."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from headrace.client import Consumer, Producer
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import cohort_partitions, create_topic


async def until(
    condition: Callable[[], bool], step: Callable[[], Awaitable[object]], timeout: float = 10.0
) -> None:
    """Run ``step`` repeatedly until ``condition`` holds; fail after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await step()


class Recorder:
    """Drains a consumer, recording offsets per partition; acks only the partitions it is told to."""

    def __init__(self, consumer: Consumer, ack: set[int] | None = None) -> None:
        self.consumer = consumer
        self.ack = ack  # None: ack everything
        self.offsets: dict[int, list[int]] = {}

    async def drain(self) -> None:
        for batch in await self.consumer.getmany(timeout_s=0.1):
            self.offsets.setdefault(batch.partition, []).extend(batch.offsets())
            if self.ack is None or batch.partition in self.ack:
                self.consumer.ack_batch(batch)

    def count(self, partition: int) -> int:
        return len(self.offsets.get(partition, []))


async def produce(bootstrap: str, topic: str, partition: int, n: int, producer: Producer) -> None:
    await producer.send_many(topic, [b"r"] * n, partition=partition)
    await producer.flush()


async def test_unmoved_partitions_keep_flowing_while_moved_ones_are_revoked(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(extra_args=["--cohort-grace-ms", "30000"])  # type: ignore[operator]
    await create_topic(broker.bootstrap, "flow", 4)
    producer = await Producer(broker.bootstrap, linger_ms=1).start()
    a = Recorder(
        await Consumer(broker.bootstrap, "flow", "g", member_id="a", start="earliest").start(),
        ack=set(),
    )
    assert set(a.consumer.assignment) == {0, 1, 2, 3}
    for p in range(4):
        await produce(broker.bootstrap, "flow", p, 10, producer)
    await until(lambda: all(a.count(p) == 10 for p in range(4)), a.drain)
    # a holds everything and acked nothing. b joins: two partitions must move to b, but a
    # still has unacked records of them, so they stay revoking (not b's) within the grace.
    b = Recorder(
        await Consumer(broker.bootstrap, "flow", "g", member_id="b", start="earliest").start()
    )
    await until(lambda: len(a.consumer.assignment) == 2, a.drain)
    kept = set(a.consumer.assignment)
    moved = {0, 1, 2, 3} - kept
    a.ack = set(kept)
    assert b.consumer.assignment == {}, "b must not hold a partition a has not released"
    for p in kept:  # a's unmoved partitions keep flowing during the rebalance
        await produce(broker.bootstrap, "flow", p, 5, producer)
    await until(lambda: all(a.count(p) == 15 for p in kept), a.drain)
    await b.drain()
    assert b.consumer.assignment == {} and not b.offsets
    # a acks the moved partitions: they are released; b starts at the cursor, no duplicates
    for p in moved:
        a.consumer.ack(p, 9)
        await produce(broker.bootstrap, "flow", p, 3, producer)
    await until(lambda: all(b.count(p) == 3 for p in moved), b.drain)
    assert set(b.consumer.assignment) == moved
    for p in moved:
        assert b.offsets[p] == [10, 11, 12], f"partition {p}: b must start after a's acked cursor"
    await a.consumer.close(grace_s=1)
    await b.consumer.close(grace_s=1)
    await producer.close()


async def test_a_leaving_member_finishes_in_flight_records_within_grace(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(extra_args=["--cohort-grace-ms", "5000"])  # type: ignore[operator]
    await create_topic(broker.bootstrap, "leave", 2)
    producer = await Producer(broker.bootstrap).start()
    a = Recorder(
        await Consumer(broker.bootstrap, "leave", "g", member_id="a", start="earliest").start(),
        ack=set(),
    )
    b = Recorder(
        await Consumer(broker.bootstrap, "leave", "g", member_id="b", start="earliest").start()
    )
    await until(
        lambda: len(a.consumer.assignment) == 1 and len(b.consumer.assignment) == 1, a.drain
    )
    (mine,) = a.consumer.assignment
    await produce(broker.bootstrap, "leave", mine, 100, producer)
    await until(lambda: a.count(mine) == 100, a.drain)
    # a leaves with 100 records handed out and unacked, and acks them within the grace period
    closing = asyncio.create_task(a.consumer.close(grace_s=10))

    async def revoking() -> bool:
        gate = (await cohort_partitions(broker.bootstrap, "g"))[mine]
        return gate["gate_state"] == "revoking" and gate["holder"] == "a"

    deadline = asyncio.get_running_loop().time() + 10
    while not await revoking():
        assert asyncio.get_running_loop().time() < deadline, "a's leave never began"
        await asyncio.sleep(0.02)
    # the broker is revoking the partition from a: b has not got it, and must not before a acks
    assert mine not in b.consumer.assignment, "the partition must wait for a within the grace"
    a.consumer.ack(mine, 99)
    await closing
    await until(lambda: mine in b.consumer.assignment, b.drain)
    await produce(broker.bootstrap, "leave", mine, 1, producer)
    await until(lambda: b.count(mine) >= 1, b.drain)
    assert b.offsets[mine] == [100], "acked records must not be redelivered"
    await b.consumer.close(grace_s=0)
    await producer.close()


async def test_grace_expiry_moves_the_partition_and_redelivers_unacked(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(extra_args=["--cohort-grace-ms", "500"])  # type: ignore[operator]
    await create_topic(broker.bootstrap, "expire", 2)
    producer = await Producer(broker.bootstrap).start()
    a = Recorder(
        await Consumer(broker.bootstrap, "expire", "g", member_id="a", start="earliest").start(),
        ack=set(),
    )
    for p in (0, 1):
        await produce(broker.bootstrap, "expire", p, 50, producer)
    await until(lambda: a.count(0) == 50 and a.count(1) == 50, a.drain)
    a.consumer.ack(0, 19)
    a.consumer.ack(1, 19)
    await a.drain()
    b = Recorder(
        await Consumer(broker.bootstrap, "expire", "g", member_id="b", start="earliest").start()
    )
    # a never acks the rest nor releases: after the grace the moved gate goes to b anyway,
    # and b is redelivered everything after the last acked offset.

    async def both() -> None:
        await a.drain()
        await b.drain()

    await until(
        lambda: len(b.consumer.assignment) == 1 and sum(b.count(p) for p in (0, 1)) >= 30, both
    )
    (moved,) = b.consumer.assignment
    assert b.offsets[moved] == list(range(20, 50))
    assert moved not in a.consumer.assignment
    await a.consumer.close(grace_s=0)
    await b.consumer.close(grace_s=0)
    await producer.close()


async def test_an_expired_member_rejoins_and_keeps_consuming(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "expiry", 2)
    producer = await Producer(broker.bootstrap).start()
    # Heartbeats every 3 s against a 1 s session: the broker expires the member between beats.
    consumer = await Consumer(
        broker.bootstrap,
        "expiry",
        "g",
        member_id="sleepy",
        start="earliest",
        session_timeout_ms=1000,
        heartbeat_interval_ms=3000,
    ).start()
    r = Recorder(consumer)
    await produce(broker.bootstrap, "expiry", 0, 10, producer)
    await until(lambda: r.count(0) == 10, r.drain)
    await until(
        lambda: not broker.get_json("/v1/status")["cohorts"], r.drain, timeout=10
    )  # expired
    await produce(broker.bootstrap, "expiry", 0, 5, producer)
    await until(lambda: r.count(0) == 15, r.drain, timeout=20)
    assert r.offsets[0] == list(range(15)), (
        "after rejoining it continues at its cursor, no gap, no repeat"
    )
    await consumer.close(grace_s=1)
    await producer.close()


async def test_a_member_closing_with_nothing_in_flight_hands_its_partitions_over_at_once(
    broker_factory: object,
) -> None:
    # A grace far longer than the waits below: waiting it out cannot pass this test.
    broker: BrokerProcess = broker_factory(extra_args=["--cohort-grace-ms", "60000"])  # type: ignore[operator]
    await create_topic(broker.bootstrap, "handover", 4)
    producer = await Producer(broker.bootstrap).start()
    for p in range(4):
        await produce(broker.bootstrap, "handover", p, 100, producer)  # one batch each
    a = await Consumer(broker.bootstrap, "handover", "g", member_id="a", start="earliest").start()
    b = Recorder(
        await Consumer(broker.bootstrap, "handover", "g", member_id="b", start="earliest").start()
    )
    await until(lambda: len(a.assignment) == 2 and len(b.consumer.assignment) == 2, b.drain)
    mine = set(a.assignment)
    # a takes 30 records, less than a batch, and acks every one it took
    taken: list[tuple[int, int]] = []

    async def take() -> None:
        for batch in await a.getmany(timeout_s=0.1, max_records=30 - len(taken)):
            taken.extend((batch.partition, offset) for offset in batch.offsets())
            a.ack_batch(batch)

    await until(lambda: len(taken) == 30, take)
    (cut,) = {p for p, _ in taken}
    assert [offset for _, offset in taken] == list(range(30))
    # Nothing in flight: close returns without waiting for the grace, and by then the
    # broker has let a go and given its partitions to b.
    await asyncio.wait_for(a.close(grace_s=60), 20)
    (cohort,) = broker.get_json("/v1/status")["cohorts"]  # type: ignore[misc]
    assert cohort["members"] == ["b"]
    assert set(cohort["holders"].values()) == {"b"}
    await until(lambda: set(b.consumer.assignment) == {0, 1, 2, 3}, b.drain, timeout=20)
    await until(lambda: sum(b.count(p) for p in range(4)) == 400 - 30, b.drain, timeout=20)
    assert b.offsets[cut] == list(range(30, 100)), "b starts after a's acked records, none lost"
    for p in mine - {cut}:
        assert b.offsets[p] == list(range(100))
    await b.consumer.close(grace_s=0)
    await producer.close()
