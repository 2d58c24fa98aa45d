"""Per-record ``send()``: its fast path keeps order, receipts, keys, headers and timestamps.

The fast path serves unkeyed records from a cached sticky
accumulator; these tests interleave it with every kind of record that must
leave it, with small batches so that accumulators fill, seal and move on
between records, and read the partition back from a real broker.
"""

from __future__ import annotations

import asyncio
import time

from headrace.client import Producer
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition

#: near now: one batch's timestamps must span less than 2**32 ms
FIXED_MS = int(time.time() * 1000) - 60_000


def _kind(i: int) -> str:
    # mostly plain records (the fast path), sometimes one that must take the slow path
    if i % 17 == 5:
        return "keyed"
    if i % 23 == 7:
        return "headers"
    if i % 29 == 11:
        return "timestamp"
    return "plain"


async def test_mixed_sends_keep_order_offsets_and_fields(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "fast", 1)
    total = 3_000
    async with Producer(broker.bootstrap, batch_bytes=2_000, linger_ms=1.0) as producer:
        receipts = []
        for i in range(total):
            value = b"v%06d" % i
            kind = _kind(i)
            if kind == "keyed":
                receipt = await producer.send("fast", value, key=b"k%d" % i)
            elif kind == "headers":
                receipt = await producer.send("fast", value, headers=[("h", b"%d" % i)])
            elif kind == "timestamp":
                receipt = await producer.send("fast", value, timestamp_ms=FIXED_MS + i)
            else:
                receipt = await producer.send("fast", value)
            receipts.append(receipt)
            if i % 500 == 499:
                # let linger timers seal half-full accumulators under the fast path's feet
                await asyncio.sleep(0.005)
        metadata = [await r for r in receipts]
    assert [m.offset for m in metadata] == list(range(total))
    records = await read_partition(broker.bootstrap, "fast", 0)
    assert [r.value for r in records] == [b"v%06d" % i for i in range(total)]
    for i, record in enumerate(records):
        kind = _kind(i)
        assert record.key == (b"k%d" % i if kind == "keyed" else None)
        assert record.headers == ((("h", b"%d" % i),) if kind == "headers" else ())
        if kind == "timestamp":
            assert record.timestamp_ms == FIXED_MS + i


async def test_fast_path_spreads_unkeyed_records_over_partitions(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "spread", 4)
    async with Producer(broker.bootstrap, batch_bytes=1_000, linger_ms=50.0) as producer:
        receipts = [await producer.send("spread", b"x" * 100) for _ in range(400)]
        metadata = [await r for r in receipts]
    by_partition: dict[int, list[int]] = {}
    for m in metadata:
        by_partition.setdefault(m.partition, []).append(m.offset)
    # batches fill and the sticky partition moves on: every partition got some
    assert sorted(by_partition) == [0, 1, 2, 3]
    for partition, offsets in by_partition.items():
        assert offsets == list(range(len(offsets)))
        records = await read_partition(broker.bootstrap, "spread", partition)
        assert len(records) == len(offsets)


async def test_fast_path_batches_carry_the_codec(broker: BrokerProcess) -> None:
    await create_topic(broker.bootstrap, "zipped", 1)
    async with Producer(broker.bootstrap, compression="zlib", batch_bytes=4_000) as producer:
        receipts = [await producer.send("zipped", b"%05d" % i * 20) for i in range(200)]
        await producer.flush()
        assert [(await r).offset for r in receipts] == list(range(200))
    records = await read_partition(broker.bootstrap, "zipped", 0)
    assert [r.value for r in records] == [b"%05d" % i * 20 for i in range(200)]
