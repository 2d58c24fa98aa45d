"""``Consumer.getmany(max_records=N)``: at most N records handed out, a batch cut where it
must be, its rest handed out first next time; what was handed out (so is in flight) is
exactly what the caller got. No sockets: batches are put on the consumer's queue as the
delivery handler would."""

from __future__ import annotations

import pytest

from headrace.client import Consumer
from headrace.client.consumer import ConsumedBatch, _Session
from headrace.errors import InvalidRequest
from headrace.records import batch as rb

EPOCH = 7


def delivered(consumer: Consumer, session: _Session, partition: int, base: int, n: int) -> None:
    data = bytearray(rb.encode([b"v%d" % (base + i) for i in range(n)], timestamp_ms=1))
    rb.stamp(data, base, 0)
    header = rb.read_header(data)
    consumer._queue.put_nowait(
        ConsumedBatch(consumer.topic, partition, EPOCH, base, bytes(data), header, id(session))
    )


def member(partitions: list[int]) -> tuple[Consumer, _Session]:
    consumer = Consumer("127.0.0.1:9", "t", "c")
    session = _Session(conn=None, held=dict.fromkeys(partitions, EPOCH))  # type: ignore[arg-type]
    consumer._sessions[0] = session
    return consumer, session


def values(batches: list[ConsumedBatch]) -> list[bytes]:
    return [v for b in batches for v in b.values()]


async def test_a_batch_is_cut_at_max_records_and_its_rest_comes_first() -> None:
    consumer, session = member([0, 1])
    delivered(consumer, session, 0, 0, 10)
    delivered(consumer, session, 1, 0, 5)
    first = await consumer.getmany(timeout_s=0, max_records=4)
    assert [(b.partition, list(b.offsets())) for b in first] == [(0, [0, 1, 2, 3])]
    assert values(first) == [b"v0", b"v1", b"v2", b"v3"]
    assert [r.offset for r in first[0].records()] == [0, 1, 2, 3]
    assert first[0].last_offset == 3 and first[0].record_count == 4
    assert consumer._handed == {0: 3}, "only what was handed out is in flight"
    second = await consumer.getmany(timeout_s=0, max_records=8)
    assert [(b.partition, list(b.offsets())) for b in second] == [
        (0, [4, 5, 6, 7, 8, 9]),
        (1, [0, 1]),
    ]
    assert values(second) == [b"v4", b"v5", b"v6", b"v7", b"v8", b"v9", b"v0", b"v1"]
    third = await consumer.getmany(timeout_s=0)
    assert [(b.partition, list(b.offsets())) for b in third] == [(1, [2, 3, 4])]
    assert consumer._handed == {0: 9, 1: 4}


async def test_the_rest_of_a_revoked_partition_is_never_handed_out() -> None:
    consumer, session = member([0])
    delivered(consumer, session, 0, 0, 10)
    await consumer.getmany(timeout_s=0, max_records=3)
    session.held = {}  # revoked while the rest waited
    assert await consumer.getmany(timeout_s=0) == []
    assert consumer._handed == {0: 2}


async def test_max_records_below_one_is_refused() -> None:
    consumer, _ = member([0])
    with pytest.raises(InvalidRequest):
        await consumer.getmany(timeout_s=0, max_records=0)
