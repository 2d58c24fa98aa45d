"""A producer's pipeline and the broker's sequence check, through a fake link.

The senders pipeline up to ``max_in_flight`` batches per partition; what keeps a later
batch from being stored before an earlier one that the broker refused is the
broker's sequence check (``ProducerStateTable``). These tests run the real sender
against a fake broker that keeps a real ``ProducerStateTable`` per partition and
refuses one chosen batch before appending it, as a leader with too few replicas
does. The chaos campaign found a key's records stored out of order after
``sequence gap persists`` (a new producer identity on one partition).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from headrace.client.producer import Producer, _Batch, _PartitionSender
from headrace.errors import HeadraceError, NotEnoughReplicas, OutOfOrderSequence
from headrace.protocol import messages as msg
from headrace.records import batch as rb
from headrace.storage import bookkeeping as bk

TOPIC = "default/t"


@dataclass
class FakePartition:
    producers: bk.ProducerStateTable = field(default_factory=bk.ProducerStateTable)
    values: list[bytes] = field(default_factory=list)
    #: refuse the next batch before appending it (raised once)
    refuse_next: HeadraceError | None = None
    #: while set, a produce waits here first (the sender's pipeline fills up behind it)
    hold: asyncio.Event | None = None

    def lose_from(self, offset: int) -> None:
        """A crash under fsync=interval: the records from ``offset`` on are gone."""
        del self.values[offset:]
        self.producers.forget_from(offset)


class FakeBroker:
    def __init__(self) -> None:
        self.partitions: dict[int, FakePartition] = {}

    def partition(self, number: int) -> FakePartition:
        return self.partitions.setdefault(number, FakePartition())

    async def produce(self, sender: _PartitionSender, batch: _Batch) -> asyncio.Future[Any]:
        batch.attempts += 1  # as the sender's own ``_send`` counts them
        part = self.partition(sender.partition)
        if part.hold is not None:
            await part.hold.wait()
        if part.refuse_next is not None:
            refused, part.refuse_next = part.refuse_next, None
            raise refused
        header = rb.read_header(batch.data)
        verdict, offset = part.producers.check(
            header.producer_id, header.base_sequence, header.record_count
        )
        if verdict is bk.SequenceVerdict.OUT_OF_ORDER:
            raise OutOfOrderSequence(f"sequence {header.base_sequence}")
        if verdict is bk.SequenceVerdict.APPEND:
            offset = len(part.values)
            part.values.extend(r.value for r in rb.decode(batch.data).records())
            part.producers.record(
                header.producer_id, header.base_sequence, header.record_count, offset, 0
            )
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer.set_result(SimpleNamespace(body=msg.ProduceResponse(offset, 1, offset).encode()))
        return answer


@pytest.fixture
async def wired(monkeypatch: pytest.MonkeyPatch) -> Any:
    producer = Producer("127.0.0.1:1", retry_backoff_ms=1)
    broker = FakeBroker()

    async def no_refresh() -> None:
        return None

    async def send(sender: _PartitionSender, batch: _Batch) -> asyncio.Future[Any]:
        return await broker.produce(sender, batch)

    monkeypatch.setattr(_PartitionSender, "_send", send)
    monkeypatch.setattr(producer.cluster, "refresh", no_refresh)
    yield producer, broker
    for sender in producer._senders.values():
        await sender.close()


def queue(producer: Producer, partition: int, value: bytes) -> asyncio.Future[Any]:
    """One batch of one record for ``partition``, handed to its sender."""
    acc = producer._accumulator(TOPIC, partition)
    producer._append(acc, value, b"k", None, 1)
    future = acc.future
    assert future is not None
    producer._drain(TOPIC, partition)
    return future


async def test_a_refused_first_batch_is_not_overtaken_by_the_one_behind_it(
    wired: tuple[Producer, FakeBroker],
) -> None:
    producer, broker = wired
    part = broker.partition(0)
    part.hold = asyncio.Event()
    part.refuse_next = NotEnoughReplicas("the replicas are catching up")
    futures = [queue(producer, 0, b"k:0"), queue(producer, 0, b"k:1")]
    part.hold.set()
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert part.values == [b"k:0", b"k:1"]


async def test_a_new_identity_on_one_partition_leaves_the_others_pipelines_whole(
    wired: tuple[Producer, FakeBroker],
) -> None:
    producer, broker = wired
    # Partition 1's broker loses an acknowledged batch: its sequence gap never closes, and
    # partition 1 goes on under a new producer identity.
    await queue(producer, 1, b"j:0")
    await queue(producer, 1, b"j:1")
    broker.partition(1).lose_from(1)
    # Meanwhile partition 0 has a batch on its way that its leader will refuse once.
    await queue(producer, 0, b"k:0")
    part = broker.partition(0)
    part.hold = asyncio.Event()
    earlier = queue(producer, 0, b"k:1")
    await asyncio.wait_for(queue(producer, 1, b"j:2"), 10)
    assert broker.partition(1).values == [b"j:0", b"j:2"]
    later = queue(producer, 0, b"k:2")
    part.refuse_next = NotEnoughReplicas("the replicas are catching up")
    part.hold.set()
    await asyncio.wait_for(asyncio.gather(earlier, later), 10)
    assert part.values == [b"k:0", b"k:1", b"k:2"]


async def test_a_new_identity_renumbers_every_unacknowledged_batch_from_zero(
    wired: tuple[Producer, FakeBroker],
) -> None:
    producer, broker = wired
    await queue(producer, 0, b"k:0")
    await queue(producer, 0, b"k:1")
    part = broker.partition(0)
    part.lose_from(1)
    part.hold = asyncio.Event()
    futures = [queue(producer, 0, b"k:%d" % i) for i in range(2, 6)]
    part.hold.set()
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert part.values == [b"k:0", b"k:2", b"k:3", b"k:4", b"k:5"]
    # the new identity's batches were numbered 0, 1, 2, 3: the broker saw no gap in them
    assert producer._sequences[(TOPIC, 0)] == 4


async def test_a_batch_out_of_time_as_it_moves_to_a_new_identity_leaves_the_rest_numbered_from_zero(
    wired: tuple[Producer, FakeBroker],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The gap persists and the batch's time runs out at the same attempt: the partition
    moves to a new identity and the batch fails. It was never sent under the new identity,
    so the broker holds nothing of it: the batches behind it follow from sequence 0 and are
    appended at their next attempt, not refused until a second new identity."""
    producer, broker = wired
    await queue(producer, 0, b"k:0")
    await queue(producer, 0, b"k:1")
    part = broker.partition(0)
    part.lose_from(1)
    produce = broker.produce

    async def out_of_time_at_the_third_attempt(
        sender: _PartitionSender, batch: _Batch
    ) -> asyncio.Future[Any]:
        if rb.decode(batch.data).records()[0].value == b"k:2" and batch.attempts == 2:
            batch.deadline = float("-inf")
        return await produce(sender, batch)

    monkeypatch.setattr(broker, "produce", out_of_time_at_the_third_attempt)
    part.hold = asyncio.Event()
    late, behind = queue(producer, 0, b"k:2"), queue(producer, 0, b"k:3")
    part.hold.set()
    with pytest.raises(OutOfOrderSequence):
        await asyncio.wait_for(late, 10)
    await asyncio.wait_for(behind, 10)
    assert part.values == [b"k:0", b"k:3"]
    assert caplog.text.count("sequence gap persists") == 1


async def test_a_batch_out_of_time_while_it_waits_to_be_resent_fails_with_its_last_error(
    wired: tuple[Producer, FakeBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refresh after a refusal outlasts the batch's delivery time. A resend could not be
    waited for (an answer takes a round trip, and the wait ends at the deadline), so the
    batch fails with the refusal itself, which tells the caller most."""
    producer, _ = wired
    loop = asyncio.get_running_loop()
    sent: list[_Batch] = []

    async def refuse_after_a_round_trip(sender: _PartitionSender, batch: _Batch) -> Any:
        batch.attempts += 1
        sent.append(batch)
        answer: asyncio.Future[Any] = loop.create_future()
        loop.call_later(0.01, answer.set_exception, NotEnoughReplicas("the replicas are gone"))
        return answer

    async def refresh_past_the_deadline() -> None:
        sent[-1].deadline = float("-inf")

    monkeypatch.setattr(_PartitionSender, "_send", refuse_after_a_round_trip)
    monkeypatch.setattr(producer.cluster, "refresh", refresh_past_the_deadline)
    with pytest.raises(NotEnoughReplicas):
        await asyncio.wait_for(queue(producer, 0, b"k:0"), 10)
