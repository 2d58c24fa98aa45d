"""The Kafka API under kill -9: a Kafka producer and a Kafka consumer group against a 3-broker
local cluster while partition leaders are killed, judged by the campaign's checker.

``python -m bench.chaos.kafka_campaign [--rounds N] [--seed S] [--out report.json]``
(``make chaos-kafka``). One run:

1. ``headrace local up`` (3 brokers, each with its Kafka listener, and the controller), a
   topic of ``partitions`` x 3 replicas, minInSync 2, and the offsets topic placed.
2. A confluent-kafka (librdkafka) producer, idempotent with ``acks=all``, sends records
   of ``keys`` keys, each value ``key:seq`` with a per-key sequence number, keyed so that
   librdkafka's partitioner keeps a key on one partition. Its delivery reports are the
   acknowledgements: the partition and offset the leader gave each record.
3. Two confluent-kafka consumers in one group read from the earliest offsets and commit
   what they have recorded (at least once); each keeps a delivery log.
4. Each round kills the leader of a random partition (drawn from ``random.Random(seed)``)
   with SIGKILL, restarts it after a random delay, and ends when every partition is back
   to a full live replica set.
5. At the end the producer flushes, the group drains, every partition is read back from
   offset 0 through the native port (plain FETCHes: nothing of the Kafka path), and
   ``checking.check`` gives the verdict: every acknowledged record stored once at the
   offset it was acknowledged at and delivered to the group, no gaps, each key's records
   in sequence order in its partition.

The clients run on threads of their own (librdkafka's calls block); the event loop only
drives the faults and the read-back.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer

from bench.chaos import checking, runner
from bench.chaos.campaign import distribution
from bench.chaos.runner import RunSettings, cluster_up
from headrace.testing.reading import read_partition
from tests.integration.localcluster import LocalCluster, topic_manifest, until

log = logging.getLogger("chaos.kafka")

TOPIC_NAME = "kchaos"
TOPIC = f"default/{TOPIC_NAME}"
OFFSETS = "default/kafka.group-offsets"
GROUP = "kchaos-readers"
DEFAULT_ROUNDS = 20


@dataclass(frozen=True, slots=True)
class Settings(RunSettings):
    rounds: int = DEFAULT_ROUNDS
    #: the victim stays dead for uniform(min, max) seconds
    restart_delay_s: tuple[float, float] = (0.2, 3.0)
    #: a round fails if the cluster is not back to a full live replica set within this
    recovery_timeout_s: float = 60.0
    #: after the load stops: how long the producer may take to settle what it holds, and
    #: the group to deliver everything acknowledged
    drain_timeout_s: float = 120.0
    members: int = 2
    #: load before the first fault (members joined, producer warmed up)
    warmup_s: float = 2.0


@dataclass(slots=True)
class KafkaTraffic:
    """The producer's side: what was sent, what was acknowledged where, what failed."""

    keys: int
    acked: list[checking.Acked] = field(default_factory=list)
    failed: int = 0
    sent: int = 0
    errors: list[str] = field(default_factory=list)
    _next_seq: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_record(self) -> tuple[bytes, bytes]:
        """(key, value) of the next record, keys round robin."""
        key = self.sent % self.keys
        seq = self._next_seq.get(key, 0)
        self._next_seq[key] = seq + 1
        self.sent += 1
        name = f"k{key}".encode()
        return name, name + b":" + str(seq).encode()

    def delivered(self, err: KafkaError | None, message: Message) -> None:
        """librdkafka's delivery report (on the thread that polls the producer)."""
        with self._lock:
            if err is not None:
                self.failed += 1
                if len(self.errors) < 10:
                    self.errors.append(str(err))
                return
            self.acked.append(checking.Acked(*located(message)))


@dataclass(slots=True)
class KafkaMember:
    """One consumer of the group: its deliveries, in the order it got them."""

    name: str
    deliveries: list[checking.Delivery] = field(default_factory=list)


class KafkaCampaign:
    def __init__(self, directory: Path, settings: Settings) -> None:
        self.settings = settings
        self.cluster = LocalCluster(directory / "local", 3)
        self.rng = random.Random(settings.seed)
        self.traffic = KafkaTraffic(settings.keys)
        self.members = [KafkaMember(f"member-{i}") for i in range(settings.members)]
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.recovery_s: list[float] = []
        self.not_recovered = 0

    async def run(self) -> dict[str, Any]:
        s = self.settings
        started = time.monotonic()
        c = self.cluster
        async with cluster_up(c):
            try:
                manifest = topic_manifest(TOPIC_NAME, s.partitions, replicas=3, min_in_sync=2)
                assert c.apply(manifest).returncode == 0, "the topic was not applied"
                await until(lambda: full_lrs(c, TOPIC, s.partitions), "the topic placed", 120)
                await until(lambda: full_lrs(c, OFFSETS, None), "the offsets topic placed", 120)
                threads = [threading.Thread(target=self._produce, name="producer", daemon=True)]
                threads += [
                    threading.Thread(target=self._consume, args=(m,), name=m.name, daemon=True)
                    for m in self.members
                ]
                for t in threads:
                    t.start()
                await asyncio.sleep(s.warmup_s)  # load before the first fault, not a sync point
                for index in range(s.rounds):
                    await self._round(index)
                self.stop_producing.set()
                await asyncio.to_thread(threads[0].join, s.drain_timeout_s + 10)
                await self._drain()
                self.stop_consuming.set()
                for t in threads[1:]:
                    await asyncio.to_thread(t.join, 60)
                stored = {
                    p: [(r.offset, r.value) for r in await read_partition(c.bootstrap, TOPIC, p)]
                    for p in range(s.partitions)
                }
            finally:
                self.stop_producing.set()
                self.stop_consuming.set()
        verdict = checking.check(
            self.traffic.acked,
            stored,
            [d for m in self.members for d in m.deliveries],
            failed_sends=self.traffic.failed,
        )
        return {
            **verdict,
            "seed": s.seed,
            "rounds": s.rounds,
            "recovery_s": distribution(self.recovery_s),
            "rounds_not_recovered": self.not_recovered,
            "send_errors": self.traffic.errors,
            "elapsed_s": round(time.monotonic() - started, 1),
        }

    async def _round(self, index: int) -> None:
        s = self.settings
        c = self.cluster
        partition = self.rng.randrange(s.partitions)
        delay = self.rng.uniform(*s.restart_delay_s)
        victim = await asyncio.to_thread(leader_of, c, TOPIC, partition)
        if victim is None:
            log.warning("round %d: partition %d has no leader; skipped", index, partition)
            return
        log.info("round %d: kill -9 broker %d (leader of %d)", index, victim, partition)
        c.kill_broker(victim)
        await asyncio.sleep(delay)  # the fault's length, drawn from the seed
        c.restart_broker(victim)
        restarted = time.monotonic()
        try:
            await until(
                lambda: full_lrs(c, TOPIC, s.partitions) and full_lrs(c, OFFSETS, None),
                f"round {index}: full live replica sets",
                s.recovery_timeout_s,
            )
        except AssertionError:
            self.not_recovered += 1
            return
        self.recovery_s.append(time.monotonic() - restarted)

    async def _drain(self) -> None:
        """Wait until the group delivered every acknowledged record (or the deadline)."""
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while time.monotonic() < deadline:
            delivered = {(d.partition, d.offset) for m in self.members for d in m.deliveries}
            if all((a.partition, a.offset) in delivered for a in self.traffic.acked):
                return
            await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ client threads

    def _produce(self) -> None:
        s = self.settings
        producer = Producer(
            {
                "bootstrap.servers": self.cluster.kafka_bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                # never give up on a record inside the run: every one is acknowledged or
                # refused for good, and the flush at the end bounds the wait
                "message.timeout.ms": int(s.drain_timeout_s * 1000),
            }
        )
        try:
            while not self.stop_producing.is_set():
                for _ in range(s.burst):
                    key, value = self.traffic.next_record()
                    produce_when_room(producer, key, value, self.traffic.delivered)
                # pace the load: serve delivery reports until the tick is over
                tick_end = time.monotonic() + s.tick_s
                while (left := tick_end - time.monotonic()) > 0:
                    producer.poll(left)
        finally:
            producer.flush(s.drain_timeout_s)

    def _consume(self, member: KafkaMember) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.cluster.kafka_bootstrap,
                "group.id": GROUP,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10_000,
            }
        )
        consumer.subscribe([TOPIC_NAME])
        try:
            while not self.stop_consuming.is_set():
                messages = consumer.consume(500, 0.5)
                recorded = False
                for m in messages:
                    if m.error() is not None:
                        continue  # an event (end of partition, a transient error), no record
                    value, partition, offset = located(m)
                    member.deliveries.append(
                        checking.Delivery(member.name, partition, offset, value)
                    )
                    recorded = True
                if recorded:
                    try:
                        consumer.commit(asynchronous=False)
                    except Exception as exc:  # a failed commit: the group may redeliver
                        log.warning("%s: commit failed: %s", member.name, exc)
        finally:
            consumer.close()


def located(message: Message) -> tuple[bytes, int, int]:
    """(value, partition, offset) of a delivered or consumed record."""
    value, partition, offset = message.value(), message.partition(), message.offset()
    if value is None or partition is None or offset is None:
        raise ValueError(f"a record without value, partition or offset: {message!r}")
    return value, partition, offset


def produce_when_room(
    producer: Producer,
    key: bytes,
    value: bytes,
    on_delivery: Callable[[KafkaError | None, Message], None],
) -> None:
    """Queue one record, serving delivery reports while librdkafka's queue is full."""
    while True:
        try:
            producer.produce(TOPIC_NAME, value, key, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.1)


def leader_of(c: LocalCluster, topic: str, partition: int) -> int | None:
    found = next((p for p in c.partitions(topic) if p["partition"] == partition), None)
    return None if found is None else found.get("leader")


def full_lrs(c: LocalCluster, topic: str, partitions: int | None) -> bool:
    """Every partition of ``topic`` (``partitions`` of them, if given) Online with all its
    replicas live."""
    parts = c.partitions(topic)
    return (
        bool(parts)
        and (partitions is None or len(parts) == partitions)
        and all(
            p["state"] == "Online"
            and p.get("leader") is not None
            and sorted(p["liveReplicas"]) == sorted(p["replicas"])
            for p in parts
        )
    )


def table(report: dict[str, Any]) -> str:
    c = report["counts"]
    r = report["recovery_s"]
    rows = [
        ("seed", report["seed"]),
        ("rounds (a partition leader kill -9'd)", report["rounds"]),
        ("acknowledged records", c["acknowledged"]),
        ("failed sends (not acknowledged)", c["failed_sends"]),
        ("lost", c["lost"]),
        ("duplicated", c["duplicated"]),
        ("offset gaps", c["gaps"]),
        ("order violations (a key in its partition)", c["order_violations"]),
        ("offsets reused", c["offsets_reused"]),
        ("undelivered to the group", c["undelivered"]),
        ("redeliveries", c["redeliveries"]),
        (
            "full LRS after restart (s)",
            f"median {r['median']}, p90 {r['p90']}, max {r['max']} over {r['count']}",
        ),
        ("rounds not back in time", report["rounds_not_recovered"]),
        ("verdict", "PASS" if report["ok"] else "FAIL"),
        ("elapsed", f"{report['elapsed_s']} s"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> int:
    def settings(args: argparse.Namespace, seed: int) -> Settings:
        print(f"seed {seed}", flush=True)
        return Settings(args.rounds, seed)

    return runner.main(
        argparse.ArgumentParser(prog="python -m bench.chaos.kafka_campaign"),
        rounds=DEFAULT_ROUNDS,
        out="chaos-kafka.json",
        settings=settings,
        run=lambda chosen, directory: asyncio.run(KafkaCampaign(directory, chosen).run()),
        table=table,
    )


if __name__ == "__main__":
    sys.exit(main())
