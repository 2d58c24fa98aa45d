"""Keyed load with per-key sequence numbers and a cohort that logs what it is delivered.

Shared by the repartition tests (local: ``tests/integration/test_repartition.py``;
Kubernetes: ``e2e/tests/operator/test_repartition_e2e.py``). ``KeyedLoad`` sends
rounds of one record per key, the value being the key's next sequence number,
with whatever acks the producer has; ``KeyedCohort`` runs members that append
every delivered record to one shared log, in the order they process them (one
event loop, so one global order); ``check_keyed_order`` asserts over that log
that each key's sequence numbers arrive strictly increasing, nothing was
delivered twice, and every acknowledged record was delivered.
"""

from __future__ import annotations

import asyncio

from headrace.client.consumer import Consumer
from headrace.client.producer import Producer, RecordReceipt

#: key, sequence number, partition, offset
Delivery = tuple[str, int, int, int]


class KeyedLoad:
    """Rounds of one record per key (value: the key's next sequence number)."""

    def __init__(self, producer: Producer, topic: str, keys: int) -> None:
        self.producer = producer
        self.topic = topic
        self.keys = keys
        self.acked: dict[str, int] = {}  # key -> highest acked sequence
        #: every acknowledged record: key, sequence number, partition, offset
        self.positions: list[Delivery] = []
        self.rounds = 0
        self.stop = asyncio.Event()
        self.failures: list[BaseException] = []

    async def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            receipts: list[tuple[str, int, RecordReceipt]] = []
            for k in range(self.keys):
                key = f"k{k}"
                receipts.append(
                    (
                        key,
                        seq,
                        await self.producer.send(self.topic, str(seq).encode(), key=key.encode()),
                    )
                )
            for key, s, receipt in receipts:
                try:
                    where = await receipt
                except Exception as exc:  # recorded: the test fails on any
                    self.failures.append(exc)
                    continue
                self.positions.append((key, s, where.partition, where.offset))
                self.acked[key] = max(self.acked.get(key, -1), s)
            seq += 1
            self.rounds += 1

    @property
    def total_acked(self) -> int:
        return sum(top + 1 for top in self.acked.values())


class KeyedCohort:
    """``members`` consumers of one cohort; every delivered record goes to one shared log
    in processing order."""

    def __init__(
        self, bootstrap: str, topic: str, cohort: str = "checker", members: int = 3
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.cohort = cohort
        self.count = members
        self.members: list[Consumer] = []
        self.log: list[Delivery] = []
        self.stop = asyncio.Event()
        #: cleared: the members take nothing (a backlog builds up on both sides of a cutover)
        self.running = asyncio.Event()
        self.running.set()

    async def start(self) -> None:
        for m in range(self.count):
            consumer = Consumer(
                self.bootstrap, self.topic, self.cohort, member_id=f"m{m}", start="earliest"
            )
            self.members.append(await consumer.start())

    async def run(self, consumer: Consumer) -> None:
        while not self.stop.is_set():
            await self.running.wait()
            for batch in await consumer.getmany(timeout_s=0.2):
                for offset, record in zip(batch.offsets(), batch.records(), strict=True):
                    assert record.key is not None
                    self.log.append(
                        (record.key.decode(), int(record.value), batch.partition, offset)
                    )
                consumer.ack_batch(batch)

    async def close(self) -> None:
        for consumer in self.members:
            await consumer.close(grace_s=2)


def check_keyed_order(log: list[Delivery], acked: dict[str, int]) -> None:
    """Each key strictly in sequence, no (partition, offset) twice, every ack delivered."""
    last: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    for key, seq, partition, offset in log:
        assert (partition, offset) not in seen, f"{key}#{seq} at {partition}/{offset} twice"
        seen.add((partition, offset))
        assert seq > last.get(key, -1), (
            f"key {key}: sequence {seq} delivered after {last.get(key)} (partition {partition}"
            f" offset {offset})"
        )
        last[key] = seq
    for key, top in acked.items():
        assert last.get(key, -1) >= top, f"key {key}: acked up to {top}, delivered {last.get(key)}"
