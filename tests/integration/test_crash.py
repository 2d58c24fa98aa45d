"""kill -9 and torn writes: acknowledged data survives, offsets stay contiguous."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from headrace.client import Producer
from headrace.client.producer import RecordMetadata
from headrace.errors import HeadraceError
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition
from headrace.testing.waiting import until_async

PARTITIONS = 4


async def test_kill9_under_load_with_fsync_always_keeps_every_acked_record(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(fsync="always")  # type: ignore[operator]
    await create_topic(broker.bootstrap, "crash", PARTITIONS)
    acked: list[tuple[RecordMetadata, bytes]] = []
    stop = asyncio.Event()
    sent = 0

    async def record(receipt: object, payload: bytes) -> None:
        with contextlib.suppress(HeadraceError):
            acked.append((await receipt, payload))  # type: ignore[misc]

    async def load(producer: Producer) -> None:
        nonlocal sent
        pending: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            for _ in range(200):
                payload = f"record-{sent:09d}".encode()
                sent += 1
                receipt = await producer.send("crash", payload, key=payload)
                task = asyncio.create_task(record(receipt, payload))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(0.002)
        await asyncio.gather(*pending)

    producer = await Producer(
        broker.bootstrap, acks="leader", linger_ms=1, delivery_timeout_ms=60_000
    ).start()
    loading = asyncio.create_task(load(producer))

    await until_async(lambda: len(acked) >= 200, 60, "acks before the crash", poll_s=0.05)
    acked_before_kill = len(acked)
    broker.kill9()
    await asyncio.sleep(1.0)  # the fault: the broker stays down a second under load
    broker.start()
    # the producer retries into the restarted broker and keeps going
    await until_async(
        lambda: len(acked) >= acked_before_kill + 200, 60, "acks after the restart", poll_s=0.05
    )
    stop.set()
    await loading
    await producer.close()

    assert acked_before_kill > 0, "load never got acknowledged before the crash"
    assert len(acked) > acked_before_kill, "nothing acknowledged after the restart"
    stored: dict[int, list[tuple[int, bytes]]] = {}
    for p in range(PARTITIONS):
        records = await read_partition(broker.bootstrap, "crash", p)
        stored[p] = [(r.offset, r.value) for r in records]
        offsets = [o for o, _ in stored[p]]
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not contiguous"
    by_position = {(p, o): v for p, rs in stored.items() for o, v in rs}
    for meta, payload in acked:
        assert by_position.get((meta.partition, meta.offset)) == payload, (
            f"acked {meta} lost or changed"
        )
    values = [v for rs in stored.values() for _, v in rs]
    assert len(values) == len(set(values)), "a record was stored twice"


def _last_segment(data_dir: Path, topic: str, partition: int) -> Path:
    return sorted((data_dir / "topics" / "default" / topic / str(partition)).glob("*.log"))[-1]


async def _produce(bootstrap: str, topic: str, count: int, batch: int) -> None:
    async with Producer(bootstrap, acks="leader", linger_ms=50) as producer:
        for start in range(0, count, batch):
            await producer.send_many(
                topic, [f"v{i}".encode() for i in range(start, start + batch)], partition=0
            )
            await producer.flush()


async def test_truncated_tail_is_cut_at_recovery_and_the_broker_starts(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(fsync="always")  # type: ignore[operator]
    await create_topic(broker.bootstrap, "torn", 1)
    await _produce(broker.bootstrap, "torn", 1000, 100)  # ten batches of 100
    broker.kill9()
    segment = _last_segment(broker.data_dir, "torn", 0)
    size = segment.stat().st_size
    with open(segment, "r+b") as fh:
        fh.truncate(size - 7)  # a torn write of the last batch
    broker.start()
    records = await read_partition(broker.bootstrap, "torn", 0)
    assert [r.offset for r in records] == list(range(900))
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(900)]
    await _produce(broker.bootstrap, "torn", 100, 100)
    records = await read_partition(broker.bootstrap, "torn", 0)
    assert [r.offset for r in records] == list(range(1000)), (
        "appends after recovery continue the offsets"
    )


async def test_corrupted_last_batch_is_cut_and_earlier_data_is_intact(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(fsync="always")  # type: ignore[operator]
    await create_topic(broker.bootstrap, "flip", 1)
    await _produce(broker.bootstrap, "flip", 500, 100)
    broker.kill9()
    segment = _last_segment(broker.data_dir, "flip", 0)
    size = segment.stat().st_size
    with open(segment, "r+b") as fh:
        fh.seek(size - 20)
        byte = fh.read(1)
        fh.seek(size - 20)
        fh.write(bytes([byte[0] ^ 0xFF]))  # bit rot inside the CRC-covered body
    broker.start()
    records = await read_partition(broker.bootstrap, "flip", 0)
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(400)]
