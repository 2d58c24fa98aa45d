"""A million records through one standalone broker to a cohort of three consumers."""

from __future__ import annotations

import asyncio
import struct
import time
from collections import defaultdict

from headrace.client import Consumer, Producer
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic

PARTITIONS = 8
TOTAL = 1_000_000
PER_PARTITION = TOTAL // PARTITIONS
PAD = b"." * 92


def value(partition: int, index: int) -> bytes:
    return struct.pack("<II", partition, index) + PAD


async def test_million_records_reach_a_cohort_of_three_exactly_once(broker: BrokerProcess) -> None:
    body = asyncio.ensure_future(_round_trip(broker))
    done, _ = await asyncio.wait([body], timeout=100)
    if not done:
        import io

        out = io.StringIO()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.print_stack(limit=12, file=out)
        body.cancel()
        raise AssertionError("round trip hung; task stacks:\n" + out.getvalue())
    body.result()


async def _round_trip(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "roundtrip", PARTITIONS)
    # member -> list of (partition, offset, value) in delivery order
    delivered: dict[str, list[tuple[int, int, bytes]]] = defaultdict(list)
    total = 0
    done = asyncio.Event()
    consumers: dict[str, Consumer] = {}

    async def consume(member: str) -> None:
        nonlocal total
        consumer = await Consumer(
            broker.bootstrap, "roundtrip", "rt", member_id=member, start="earliest"
        ).start()
        consumers[member] = consumer
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

    producers: list[Producer] = []

    async def produce() -> None:
        async with Producer(broker.bootstrap, linger_ms=5) as producer:
            producers.append(producer)
            step = 5_000
            for start in range(0, PER_PARTITION, step):
                for p in range(PARTITIONS):
                    await producer.send_many(
                        "roundtrip", [value(p, i) for i in range(start, start + step)], partition=p
                    )
                # Pace the load over ~2.5 s so the later members join while it flows.
                await asyncio.sleep(0.1)
            await producer.flush()

    first = asyncio.create_task(consume("member-a"))
    producing = asyncio.create_task(produce())
    await asyncio.sleep(0.5)
    second = asyncio.create_task(consume("member-b"))  # joins under load: a rebalance
    await asyncio.sleep(0.5)
    third = asyncio.create_task(consume("member-c"))
    try:
        await asyncio.wait_for(asyncio.shield(producing), 60)
    except TimeoutError:
        import io

        out = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(file=out)
        p = producers[0]
        senders = {k: (len(v.queue), len(v.inflight), v.task.done()) for k, v in p._senders.items()}
        raise AssertionError(
            f"producer stuck: buffered {p._buffered} accumulators {len(p._accumulators)} senders {senders}\n{out.getvalue()}"
        ) from None
    # Wait for the cohort; if progress stops, fail with the state that explains why.
    last, stalled_since = -1, time.monotonic()
    while not done.is_set():
        await asyncio.sleep(1)
        if total != last:
            last, stalled_since = total, time.monotonic()
        elif time.monotonic() - stalled_since > 30:
            views = {
                m: {k: (s.held, sorted(s.revoking)) for k, s in c._sessions.items()}
                for m, c in consumers.items()
            }
            status = broker.get_json("/v1/status")
            topic = broker.get_json("/v1/topics/default/roundtrip")
            ends = [
                (p["partition"], p["log_end_offset"], p["cursors"])
                for p in topic["partition_details"]
            ]  # type: ignore[union-attr, index]
            raise AssertionError(
                f"delivery stalled at {total}: members {views}; handed {[c._handed for c in consumers.values()]};"
                f" broker cohorts {status['cohorts']}; partitions {ends}"
            )
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
