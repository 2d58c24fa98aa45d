"""Peer client workloads, one per fresh interpreter: ``python -m bench.peerworker SPEC_JSON``.

The Python clients a Python team would use against the peers: confluent-kafka
(librdkafka underneath), aiokafka, and nats-py's JetStream. Each is driven the
way its documentation shows for throughput -- one record per call, the client
batching underneath -- so the rows compare the client APIs a user calls
(``bench.worker.hr_produce`` with ``api=send`` is headrace's counterpart).

Prints one JSON line, as ``bench.worker`` does; CPU comes from ``CpuMeter``
over ``server_pids`` (summed as ``server_cores``) and this process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from bench.worker import PROBE, OpenLoop, _probe, _rate
from headrace.testing.procs import CpuMeter

#: librdkafka logs every refused connection at error level; the bench reports its own
QUIET = {"log_level": 0}


def _meter(spec: dict[str, Any]) -> CpuMeter:
    import os

    pids = {f"server{i}": int(p) for i, p in enumerate(spec["server_pids"])}
    return CpuMeter({**pids, "client": os.getpid()})


def _fold(cpu: dict[str, float]) -> dict[str, float]:
    """``server0_cores``, ``server1_cores``... summed into ``server_cores``."""
    out = {k: v for k, v in cpu.items() if not k.startswith("server")}
    out["server_cores"] = round(sum(v for k, v in cpu.items() if k.startswith("server")), 3)
    return out


def _timed(
    spec: dict[str, Any], phase: Callable[[float], int], size: int
) -> tuple[dict[str, Any], int]:
    """Warm up, then measure ``phase(duration_s)``; (result, records sent in all)."""
    sent = phase(float(spec["warmup_s"]))
    meter = _meter(spec)
    meter.start()
    started = time.perf_counter()
    count = phase(float(spec["duration_s"]))
    elapsed = time.perf_counter() - started
    cpu = _fold(meter.stop())
    return {**_rate(count, size, elapsed), "cpu": cpu}, sent + count


# ---------------------------------------------------------------------------- produce


def ck_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """confluent-kafka ``Producer.produce()`` per record with ``poll(0)``, a delivery
    callback counting failures; ``flush()`` ends each phase (all delivered)."""
    from confluent_kafka import KafkaException, Producer

    size: int = spec["value_bytes"]
    topic: str = spec["topic"]
    value = b"x" * size
    p = Producer({"bootstrap.servers": spec["bootstrap"], "acks": spec["acks"], **QUIET})
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    produce, poll = p.produce, p.poll

    def phase(seconds: float) -> int:
        count = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                while True:
                    try:
                        produce(topic, value, on_delivery=on_delivery)
                        break
                    except BufferError:  # the local queue is full: serve callbacks
                        poll(0.01)
                poll(0)
            count += 1000
        if p.flush(60) != 0:
            raise KafkaException(f"{len(p)} records not delivered")
        return count

    result, total = _timed(spec, phase, size)
    if failed:
        raise RuntimeError(f"{len(failed)} deliveries failed: {failed[:3]}")
    return {**result, "total_sent": total}


async def aio_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """aiokafka ``await producer.send()`` per record (a future per record, batched under)."""
    from aiokafka import AIOKafkaProducer

    size: int = spec["value_bytes"]
    topic: str = spec["topic"]
    value = b"x" * size
    acks: Any = spec["acks"] if spec["acks"] == "all" else int(spec["acks"])
    producer = AIOKafkaProducer(bootstrap_servers=spec["bootstrap"], acks=acks)
    await producer.start()
    sent = 0

    async def phase(seconds: float) -> int:
        count = 0
        futures: list[asyncio.Future[Any]] = []
        deadline = time.perf_counter() + seconds
        send = producer.send
        while time.perf_counter() < deadline:
            for _ in range(1000):
                futures.append(await send(topic, value))
            count += 1000
            if len(futures) > 100_000:
                await asyncio.gather(*futures)
                futures.clear()
        await producer.flush()
        await asyncio.gather(*futures)
        return count

    try:
        sent += await phase(float(spec["warmup_s"]))
        meter = _meter(spec)
        meter.start()
        started = time.perf_counter()
        count = await phase(float(spec["duration_s"]))
        elapsed = time.perf_counter() - started
        cpu = _fold(meter.stop())
        sent += count
    finally:
        await producer.stop()
    return {**_rate(count, size, elapsed), "cpu": cpu, "total_sent": sent}


async def nats_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """nats-py JetStream ``publish_async`` per record (the async-ack publish; the plain
    ``publish`` waits for each ack), round-robin over ``partitions`` streams."""
    import nats

    size: int = spec["value_bytes"]
    parts: int = spec["partitions"]
    value = b"x" * size
    nc = await nats.connect(spec["url"])
    js = nc.jetstream(publish_async_max_pending=int(spec.get("max_pending", 4000)))
    subjects = [f"{spec['topic']}.{i}" for i in range(parts)]
    sent = 0

    async def phase(seconds: float) -> int:
        count = 0
        futures: list[asyncio.Future[Any]] = []
        deadline = time.perf_counter() + seconds
        publish = js.publish_async
        while time.perf_counter() < deadline:
            for i in range(1000):
                futures.append(await publish(subjects[i % parts], value))
            count += 1000
            if len(futures) > 100_000:
                await asyncio.gather(*futures)
                futures.clear()
        await js.publish_async_completed()
        await asyncio.gather(*futures)
        return count

    try:
        sent += await phase(float(spec["warmup_s"]))
        meter = _meter(spec)
        meter.start()
        started = time.perf_counter()
        count = await phase(float(spec["duration_s"]))
        elapsed = time.perf_counter() - started
        cpu = _fold(meter.stop())
        sent += count
    finally:
        await nc.close()
    return {**_rate(count, size, elapsed), "cpu": cpu, "total_sent": sent}


# ---------------------------------------------------------------------------- consume


def ck_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """A new confluent-kafka group member reads ``records`` from the earliest offset,
    ``consume(10000)`` at a time, touching each value (auto-commit, the default)."""
    from confluent_kafka import Consumer

    total: int = spec["records"]
    size: int = spec["value_bytes"]
    limit_s = float(spec.get("max_s", 300.0))
    meter = _meter(spec)
    meter.start()
    started = time.perf_counter()
    c = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            **QUIET,
        }
    )
    c.subscribe([spec["topic"]])
    count = 0
    nbytes = 0
    timed_out = False
    while count < total:
        if time.perf_counter() - started > limit_s:
            timed_out = True
            break
        for m in c.consume(10_000, 1.0):
            value = m.value()
            if m.error() is None and value is not None:
                nbytes += len(value)
                count += 1
    elapsed = time.perf_counter() - started
    cpu = _fold(meter.stop())
    c.close()
    return {**_rate(count, size, elapsed), "timed_out": timed_out, "cpu": cpu}


# ---------------------------------------------------------------------------- latency


async def ck_latency(spec: dict[str, Any]) -> dict[str, Any]:
    """The open-loop harness of ``bench.worker.hr_latency``, with confluent-kafka on both
    sides: ``produce()`` (``linger.ms`` as headrace's ``linger_ms``) and a consumer of
    partition 0 from its end, polled without blocking from the same event loop."""
    from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

    topic: str = spec["topic"]
    size: int = spec["value_bytes"]
    loop_ = OpenLoop(int(spec["rate"]), float(spec["warmup_s"]), float(spec["measure_s"]))
    producer = Producer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "acks": spec.get("acks", "1"),
            "linger.ms": float(spec["linger_ms"]),
            **QUIET,
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": f"lat-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": True,
            **QUIET,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
    unpack = PROBE.unpack_from
    perf = time.perf_counter_ns
    ready = asyncio.Event()

    async def consume() -> None:
        # Polled from the event loop, not a thread: one thread, as headrace's client, so
        # no GIL hand-offs between a consumer thread and the open loop's sender.
        poll = consumer.consume
        while True:
            msgs = poll(1000, 0)
            if msgs:
                now = perf()
                ready.set()
                for m in msgs:
                    value = m.value()
                    if m.error() is None and value is not None:
                        j, intended = unpack(value)
                        loop_.on_received(j, intended, now)  # ignores j past the measured
            await asyncio.sleep(0)

    async def send(first: int, last: int, t0: int) -> None:
        interval = loop_.interval_ns
        for j in range(first, last):
            producer.produce(topic, _probe(j, t0 + int(j * interval), size), partition=0)
        producer.poll(0)
        await asyncio.sleep(0)

    consumer_task = asyncio.get_running_loop().create_task(consume())
    # The consumer resolves OFFSET_END and fetches asynchronously: until a record comes
    # back, records would wait for that, not for Kafka. Send markers until one does
    # (indexes past the run's last: the harness ignores them).
    marker = loop_.total + 1
    deadline = time.monotonic() + 60.0
    while not ready.is_set() and time.monotonic() < deadline:
        producer.produce(topic, _probe(marker, perf(), size), partition=0)
        producer.poll(0)
        marker += 1
        await asyncio.sleep(0.05)
    if not ready.is_set():
        raise TimeoutError("the Kafka consumer received nothing within 60 s")
    meter = _meter(spec)
    try:
        meter.start()
        await loop_.run(send)
        producer.flush(30)
        await loop_.drain(float(spec.get("drain_s", 5.0)))
        cpu = _fold(meter.stop())
    finally:
        consumer_task.cancel()
        consumer.close()
    return {**loop_.result(), "cpu": cpu}


# ---------------------------------------------------------------------------- failover


async def hr_failover_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """One record at a time with acks=all for ``duration_s``; (sent, acknowledged) wall-clock
    times of every record (the orchestrator kills the leader meanwhile and reads the gap)."""
    from headrace.client.producer import Producer

    topic: str = spec["topic"]
    value = b"x" * int(spec["value_bytes"])
    producer = await Producer(spec["bootstrap"], acks="all").start()
    acked: list[tuple[float, float]] = []
    errors: list[str] = []
    deadline = time.time() + float(spec["duration_s"])
    try:
        while time.time() < deadline:
            try:
                sent_at = time.time()
                fut = await producer.send(topic, value, partition=0)
                await fut
                acked.append((sent_at, time.time()))
            except Exception as exc:  # a failed send: note it and try the next record
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(0.01)
    finally:
        await producer.close()
    return {"acked_at": acked, "errors": errors[:20], "error_count": len(errors)}


def ck_failover_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """confluent-kafka at its defaults (acks=all, idempotent off, retries on), one record
    at a time: ``produce`` then ``flush`` for its acknowledgement."""
    from confluent_kafka import Producer

    topic: str = spec["topic"]
    value = b"x" * int(spec["value_bytes"])
    p = Producer({"bootstrap.servers": spec["bootstrap"], "acks": "all", **QUIET})
    acked: list[tuple[float, float]] = []
    errors: list[str] = []
    outcome: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        outcome.append(err)

    deadline = time.time() + float(spec["duration_s"])
    while time.time() < deadline:
        outcome.clear()
        sent_at = time.time()
        p.produce(topic, value, partition=0, on_delivery=on_delivery)
        p.flush(max(0.1, deadline - time.time() + 30))
        if outcome and outcome[0] is None:
            acked.append((sent_at, time.time()))
        else:
            errors.append(str(outcome[0] if outcome else "not delivered")[:200])
            time.sleep(0.01)
    return {"acked_at": acked, "errors": errors[:20], "error_count": len(errors)}


# ---------------------------------------------------------------------------- entry

ASYNC_KINDS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "aio_produce": aio_produce,
    "nats_produce": nats_produce,
    "ck_latency": ck_latency,
    "hr_failover_probe": hr_failover_probe,
}
SYNC_KINDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ck_produce": ck_produce,
    "ck_consume": ck_consume,
    "ck_failover_probe": ck_failover_probe,
}


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    kind = spec["kind"]
    if kind in SYNC_KINDS:
        result = SYNC_KINDS[kind](spec)
    else:
        from headrace.aio import run  # uvloop when installed, as the other workers

        result = run(ASYNC_KINDS[kind](spec))  # type: ignore[arg-type]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
