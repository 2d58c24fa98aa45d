"""The campaigns' traffic: keyed acks=all load and a consuming cohort, and what they saw.

Shared by the broker campaign (``campaign``, a local cluster) and the operator campaign
(``operator``, the Kubernetes test bed): whatever the faults, the same records go out and
come back, and ``checking.check`` judges them the same way.

* ``load`` sends ``burst`` records per tick round robin over ``keys`` keys, each value
  ``key:seq`` with a per-key sequence number that carries on across producers (a
  campaign that has to replace its producer, because every broker it knew was replaced,
  keeps the sequence);
* ``consume`` runs one cohort member: it appends every delivered record to its delivery
  log (``partition offset value`` per line) and to one shared order (the event loop's),
  then acks the batch (at-least-once: logged before acked);
* ``outcomes`` resolves every send into acknowledged (with its place) or failed;
* ``fresh_cohort`` reads the whole topic with a cohort that did not exist before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos import checking
from headrace.client import Consumer, Producer
from headrace.client.producer import RecordReceipt
from headrace.errors import HeadraceError

log = logging.getLogger("chaos")


@dataclass(slots=True)
class Member:
    """One cohort member and its delivery log."""

    consumer: Consumer
    name: str
    path: Path
    deliveries: list[checking.Delivery] = field(default_factory=list)


class KeyedTraffic:
    """The load and the cohort of one campaign, and everything they observed."""

    def __init__(self, topic: str, keys: int, burst: int, tick_s: float) -> None:
        self.topic = topic
        self.burst = burst
        self.tick_s = tick_s
        self.stop_load = asyncio.Event()
        self._keys = [f"k{i:03d}".encode() for i in range(keys)]
        self._seqs = dict.fromkeys(self._keys, 0)
        self._sent_count = 0
        self.sent: list[tuple[RecordReceipt, bytes]] = []
        self.delivered: set[tuple[int, int]] = set()
        #: every delivery of every member in the order the one event loop processed them:
        #: a key's records cross partitions at a cutover
        self.delivery_order: list[checking.Delivery] = []
        #: time of every acknowledged batch, in order (produce stalls: the gaps), and per
        #: partition (a partition that takes nothing while the others do is a stall too)
        self.acked_at: list[float] = []
        self.acked_at_by_partition: dict[int, list[float]] = {}
        self.member_errors: list[str] = []

    async def load(self, producer: Producer) -> None:
        """Send until ``stop_load`` is set."""
        while not self.stop_load.is_set():
            for _ in range(self.burst):
                key = self._keys[self._sent_count % len(self._keys)]
                self._sent_count += 1
                value = key + b":" + str(self._seqs[key]).encode()
                self._seqs[key] += 1
                try:
                    receipt = await producer.send(self.topic, value, key=key)
                except HeadraceError as exc:
                    log.warning("send refused: %s", exc)
                    continue
                previous = self.sent[-1][0].batch if self.sent else None
                self.sent.append((receipt, value))
                if receipt.batch is not previous:  # one callback a batch
                    receipt.batch.add_done_callback(self._note_ack)
            await asyncio.sleep(self.tick_s)

    def _note_ack(self, batch: asyncio.Future[Any]) -> None:
        if batch.cancelled() or batch.exception() is not None:
            return
        now = time.monotonic()
        self.acked_at.append(now)
        result = batch.result()
        # a batch re-routed by a repartition resolves with each record's place
        partitions = (
            {result.partition} if result.records is None else {m.partition for m in result.records}
        )
        for p in partitions:
            self.acked_at_by_partition.setdefault(p, []).append(now)

    def first_ack_after(self, since: float) -> float | None:
        """Seconds from ``since`` to the first acknowledgement after it (None: none yet)."""
        later = [t for t in self.acked_at if t >= since]
        return min(later) - since if later else None

    def acked_count(self) -> int:
        """Records acknowledged so far (for progress; ``outcomes`` is the final word)."""
        return sum(
            1
            for receipt, _ in self.sent
            if receipt.batch.done()
            and not receipt.batch.cancelled()
            and receipt.batch.exception() is None
        )

    async def outcomes(self) -> tuple[list[checking.Acked], int]:
        acked: list[checking.Acked] = []
        failed = 0
        for receipt, value in self.sent:
            try:
                meta = await receipt
            except HeadraceError:
                failed += 1
                continue
            acked.append(checking.Acked(value, meta.partition, meta.offset))
        return acked, failed

    async def consume(self, m: Member) -> None:
        """One member's loop, until cancelled."""
        with m.path.open("a") as out:
            while True:
                try:
                    batches = await m.consumer.getmany(timeout_s=0.5)
                except HeadraceError as exc:  # counted and reported; the member carries on
                    self.member_errors.append(f"{m.name}: {exc!r}")
                    await asyncio.sleep(0.5)
                    continue
                for b in batches:
                    for r in b.records():
                        out.write(f"{b.partition} {r.offset} {r.value.decode()}\n")
                        self.delivered.add((b.partition, r.offset))
                        self.delivery_order.append(
                            checking.Delivery(m.name, b.partition, r.offset, r.value)
                        )
                out.flush()  # logged before acked: a crash after this redelivers, never skips
                for b in batches:
                    m.consumer.ack_batch(b)

    async def fresh_cohort(
        self,
        bootstrap: str,
        acked: list[checking.Acked],
        stored: dict[int, list[tuple[int, bytes]]],
        timeout_s: float,
        cohort: str = "chaos-fresh",
    ) -> dict[str, Any]:
        """A cohort that did not exist during the campaign reads the topic from the earliest
        offsets: every acknowledged record, each key in order (its history included)."""
        wanted = {a.value for a in acked}
        seen: set[bytes] = set()
        order: list[checking.Delivery] = []
        consumer = Consumer(bootstrap, self.topic, cohort, start="earliest")
        await consumer.start()
        deadline = time.monotonic() + timeout_s
        try:
            while not wanted <= seen and time.monotonic() < deadline:
                for b in await consumer.getmany(timeout_s=0.5):
                    for r in b.records():
                        seen.add(r.value)
                        order.append(checking.Delivery("fresh", b.partition, r.offset, r.value))
                    consumer.ack_batch(b)
        finally:
            await consumer.close(grace_s=2.0)
        verdict = checking.check(acked, stored, order, in_order=order)
        return {
            "deliveries": len(order),
            "undelivered": verdict["counts"]["undelivered"],
            "key_order": verdict["counts"]["key_order_violations"],
            "examples": {
                k: v
                for k, v in verdict["examples"].items()
                if k in ("undelivered", "key_order_violations")
            },
        }


def read_delivery_log(path: Path, member: str) -> list[checking.Delivery]:
    out: list[checking.Delivery] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        partition, offset, value = line.split(" ", 2)
        out.append(checking.Delivery(member, int(partition), int(offset), value.encode()))
    return out
