"""A million records through one standalone broker to a cohort of three consumers."""

from __future__ import annotations

import asyncio
import struct
from collections import defaultdict

from headrace.client import Consumer, Producer
from tests.integration.brokers import BrokerProcess
from tests.integration.reading import create_topic

PARTITIONS = 8
TOTAL = 1_000_000
PER_PARTITION = TOTAL // PARTITIONS
PAD = b"." * 92


def value(partition: int, index: int) -> bytes:
    return struct.pack("<II", partition, index) + PAD


async def test_million_records_reach_a_cohort_of_three_exactly_once(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "roundtrip", PARTITIONS)
    # member -> list of (partition, offset, value) in delivery order
    delivered: dict[str, list[tuple[int, int, bytes]]] = defaultdict(list)
    total = 0
    done = asyncio.Event()

    async def consume(member: str) -> None:
        nonlocal total
        consumer = await Consumer(
            broker.bootstrap, "roundtrip", "rt", member_id=member, start="earliest"
        ).start()
        log = delivered[member]
        try:
            while not done.is_set():
                for batch in await consumer.getmany(timeout_s=0.2):
                    log.extend(
                        zip(
                            [batch.partition] * batch.record_count,
                            batch.offsets(),
                            batch.values(),
                            strict=True,
                        )
                    )
                    total += batch.record_count
                    consumer.ack_batch(batch)
                if total >= TOTAL:
                    done.set()
        finally:
            await consumer.close()

    async def produce() -> None:
        async with Producer(broker.bootstrap, linger_ms=5) as producer:
            step = 5_000
            for start in range(0, PER_PARTITION, step):
                for p in range(PARTITIONS):
                    await producer.send_many(
                        "roundtrip", [value(p, i) for i in range(start, start + step)], partition=p
                    )
            await producer.flush()

    first = asyncio.create_task(consume("member-a"))
    producing = asyncio.create_task(produce())
    await asyncio.sleep(0.5)
    second = asyncio.create_task(consume("member-b"))  # joins under load: a rebalance
    await asyncio.sleep(0.5)
    third = asyncio.create_task(consume("member-c"))
    await producing
    await asyncio.wait_for(done.wait(), timeout=240)
    await asyncio.gather(first, second, third)

    seen: dict[int, list[int]] = defaultdict(list)
    for member, log in delivered.items():
        last: dict[int, int] = {}
        for partition, offset, raw in log:
            # per-partition order within each member's deliveries
            assert offset > last.get(partition, -1), (
                f"{member} got {partition}:{offset} out of order"
            )
            last[partition] = offset
            # the record is the one produced at that offset
            assert struct.unpack_from("<II", raw) == (partition, offset)
            seen[partition].append(offset)
    assert sum(len(v) for v in seen.values()) == TOTAL, "duplicates or missing records"
    for partition in range(PARTITIONS):
        assert sorted(seen[partition]) == list(range(PER_PARTITION)), (
            f"partition {partition} incomplete"
        )
    # the later members really took part (the rebalance happened)
    print({m: len(log) for m, log in delivered.items()})
    assert sum(1 for log in delivered.values() if log) >= 2
