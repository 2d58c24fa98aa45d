"""Client workloads, each run in a fresh interpreter: ``python -m bench.worker SPEC_JSON``.

The orchestrator (``bench.scenarios``) starts the servers and one worker per
measurement; the worker prints one JSON line with its result. A fresh process
per measurement means no heap, tasks or connections carry over from the
previous one, and its CPU time is its own.

On the 2-core bench machine this gives each system one server process and one
client process: the server gets one core, the client the other.

Spec keys shared by all kinds: ``kind``, ``server_pid`` (for CPU accounting).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import struct
import sys
import time
import uuid
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

from headrace.testing.procs import CpuMeter

#: record index u64, intended send time (perf_counter_ns) u64: the latency probe
PROBE = struct.Struct("<QQ")
LOOPBACK = "127.0.0.1"


def _meter(spec: dict[str, Any]) -> CpuMeter:
    """The server (``server_pid``), or several (``server_pids``: ``server0_cores``...), and us."""
    if "server_pids" in spec:
        servers = {f"server{i}": int(pid) for i, pid in enumerate(spec["server_pids"])}
        return CpuMeter({**servers, "client": os.getpid()})
    return CpuMeter({"server": int(spec["server_pid"]), "client": os.getpid()})


def _rate(records: int, nbytes: int, elapsed: float) -> dict[str, Any]:
    return {
        "records": records,
        "elapsed_s": round(elapsed, 4),
        "records_per_s": round(records / elapsed, 1),
        "mb_per_s": round(records * nbytes / elapsed / 1e6, 2),
    }


def percentiles(samples_ns: list[int] | array[int], missing: int = 0) -> dict[str, Any]:
    """Nearest-rank percentiles in milliseconds; ``missing`` samples count as +infinity."""
    ordered = sorted(samples_ns)
    n = len(ordered) + missing
    out: dict[str, Any] = {"samples": len(ordered), "missing": missing}
    for name, q in (("p50", 50.0), ("p99", 99.0), ("p99_9", 99.9), ("max", 100.0)):
        rank = min(n, max(1, math.ceil(q * n / 100 - 1e-9)))
        out[name] = None if rank > len(ordered) else round(ordered[rank - 1] / 1e6, 3)
    out["mean"] = round(sum(ordered) / len(ordered) / 1e6, 3) if ordered else None
    return out


# ---------------------------------------------------------------------------- headrace


async def hr_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """Produce for ``duration_s`` after a ``warmup_s`` warm-up; batch API or per-record API."""
    from headrace.client.producer import Producer

    topic: str = spec["topic"]
    size: int = spec["value_bytes"]
    value = b"x" * size
    chunk = [value] * int(spec.get("chunk", 10_000))
    per_record = spec["api"] == "send"
    tuning = {k: spec[k] for k in ("max_in_flight", "batch_bytes", "linger_ms") if k in spec}
    producer = await Producer(spec["bootstrap"], acks=spec.get("acks", "leader"), **tuning).start()
    sent = 0

    async def phase(seconds: float) -> int:
        nonlocal sent
        futures: list[asyncio.Future[Any]] = []
        count = 0
        deadline = time.perf_counter() + seconds
        if per_record:
            send = producer.send
            while time.perf_counter() < deadline:
                for _ in range(1000):
                    await send(topic, value)
                count += 1000
        else:
            while time.perf_counter() < deadline:
                futures += await producer.send_many(topic, chunk)
                count += len(chunk)
        await producer.flush()
        for fut in futures:
            fut.result()  # raises if a batch failed
        sent += count
        return count

    try:
        await phase(float(spec["warmup_s"]))
        meter = _meter(spec)
        meter.start()
        started = time.perf_counter()
        count = await phase(float(spec["duration_s"]))
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        await producer.close()
    return {**_rate(count, size, elapsed), "cpu": cpu, "total_sent": sent}


async def hr_preload(spec: dict[str, Any]) -> dict[str, Any]:
    """Write ``records`` values as fast as the batch API allows."""
    from headrace.client.producer import Producer

    topic: str = spec["topic"]
    size: int = spec["value_bytes"]
    total: int = spec["records"]
    chunk = [b"x" * size] * 10_000
    producer = await Producer(spec["bootstrap"]).start()
    started = time.perf_counter()
    try:
        futures: list[asyncio.Future[Any]] = []
        sent = 0
        while sent < total:
            n = min(len(chunk), total - sent)
            futures += await producer.send_many(topic, chunk if n == len(chunk) else chunk[:n])
            sent += n
        await producer.flush()
        for fut in futures:
            fut.result()
    finally:
        await producer.close()
    return _rate(total, size, time.perf_counter() - started)


async def hr_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """A fresh cohort member reads ``records`` from the earliest offset, acking each batch."""
    from headrace.client.consumer import Consumer

    total: int = spec["records"]
    size: int = spec["value_bytes"]
    limit_s = float(spec.get("max_s", 300.0))
    meter = _meter(spec)
    meter.start()
    started = time.perf_counter()
    consumer = Consumer(
        spec["bootstrap"], spec["topic"], f"bench-{uuid.uuid4().hex[:8]}", start="earliest"
    )
    await consumer.start()
    joined = time.perf_counter()
    count = 0
    batches = 0
    first_at = 0.0
    timed_out = False
    try:
        async with asyncio.timeout(limit_s):
            async for batch in consumer.batches():
                if not batches:
                    first_at = time.perf_counter()
                values = batch.values()
                count += len(values)
                batches += 1
                consumer.ack_batch(batch)
                if count >= total:
                    break
    except TimeoutError:
        timed_out = True
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    await consumer.close(grace_s=2.0)
    return {
        **_rate(count, size, elapsed),
        "join_s": round(joined - started, 4),
        "first_batch_s": round(first_at - started, 4) if batches else None,
        "batches": batches,
        "timed_out": timed_out,
        "cpu": cpu,
    }


class OpenLoop:
    """Schedules ``rate`` records/s by the wall clock and never slows down when behind.

    Record ``j`` is *intended* at ``t0 + j / rate``; its latency is measured from
    that instant, so time the sender spends behind schedule counts against the
    system (no coordinated omission). The actual send time is kept as well.
    Waits shorter than 2 ms spin on ``sleep(0)`` (asyncio timers have 1 ms
    granularity, which would otherwise be charged to the system under test).
    """

    def __init__(self, rate: int, warmup_s: float, measure_s: float) -> None:
        self.rate = rate
        self.interval_ns = 1e9 / rate
        self.warm = int(warmup_s * rate)
        self.total = self.warm + int(measure_s * rate)
        self.sent_at = array("q", bytes(8 * self.total))
        self.received_at = array("q", bytes(8 * self.total))
        self.latency = array("q")
        self.service = array("q")
        self.duplicates = 0
        self.t0 = 0
        self.max_behind_ns = 0

    def intended(self, j: int) -> int:
        return self.t0 + int(j * self.interval_ns)

    def on_received(self, j: int, intended: int, now: int) -> None:
        if j >= self.total:
            return
        if self.received_at[j]:
            self.duplicates += 1
            return
        self.received_at[j] = now
        if j >= self.warm:
            self.latency.append(now - intended)
            self.service.append(now - self.sent_at[j])

    async def run(self, send: Callable[[int, int, int], Awaitable[None]]) -> None:
        """``await send(first, last_exclusive, t0)`` sends records first..last-1."""
        perf = time.perf_counter_ns
        self.t0 = perf() + 20_000_000
        i = 0
        total = self.total
        while i < total:
            now = perf()
            due = min(total, int((now - self.t0) / self.interval_ns) + 1) if now >= self.t0 else 0
            if due > i:
                self.max_behind_ns = max(self.max_behind_ns, now - self.intended(i))
                for j in range(i, due):
                    self.sent_at[j] = now
                await send(i, due, self.t0)
                i = due
                continue
            gap = self.intended(i) - now
            if gap > 2_000_000:
                await asyncio.sleep((gap - 1_000_000) / 1e9)
            else:
                await asyncio.sleep(0)

    async def drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.latency) < self.total - self.warm and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def result(self) -> dict[str, Any]:
        measured = self.total - self.warm
        missing = measured - len(self.latency)
        return {
            "rate": self.rate,
            "measured_records": measured,
            "latency_ms": percentiles(self.latency, missing),
            "service_latency_ms": percentiles(self.service, missing),
            "duplicates": self.duplicates,
            "max_sender_behind_ms": round(self.max_behind_ns / 1e6, 3),
        }


def _probe(j: int, intended: int, size: int) -> bytes:
    return PROBE.pack(j, intended).ljust(size, b".")


async def hr_latency(spec: dict[str, Any]) -> dict[str, Any]:
    from headrace.client.consumer import Consumer
    from headrace.client.producer import Producer

    topic: str = spec["topic"]
    size: int = spec["value_bytes"]
    loop_ = OpenLoop(int(spec["rate"]), float(spec["warmup_s"]), float(spec["measure_s"]))
    consumer = Consumer(spec["bootstrap"], topic, f"lat-{uuid.uuid4().hex[:8]}", start="latest")
    await consumer.start()
    producer = await Producer(spec["bootstrap"], linger_ms=float(spec["linger_ms"])).start()
    unpack = PROBE.unpack_from
    perf = time.perf_counter_ns

    async def consume() -> None:
        async for batch in consumer.batches():
            now = perf()
            for v in batch.values():
                j, intended = unpack(v)
                loop_.on_received(j, intended, now)
            consumer.ack_batch(batch)

    async def send(first: int, last: int, t0: int) -> None:
        interval = loop_.interval_ns
        for j in range(first, last):
            await producer.send(topic, _probe(j, t0 + int(j * interval), size), partition=0)
        # let the consumer and the sender tasks run between bursts
        await asyncio.sleep(0)

    consumer_task = asyncio.get_running_loop().create_task(consume())
    meter = _meter(spec)
    try:
        meter.start()
        await loop_.run(send)
        await producer.flush()
        await loop_.drain(float(spec.get("drain_s", 5.0)))
        cpu = meter.stop()
    finally:
        consumer_task.cancel()
        await producer.close()
        await consumer.close(grace_s=1.0)
    return {**loop_.result(), "cpu": cpu}


# ---------------------------------------------------------------------------- tiered storage


def _tier_objects(
    count: int, object_bytes: int, value_bytes: int, batch_records: int
) -> list[bytes]:
    """``count`` segment objects of about ``object_bytes`` each, contiguous from offset 0.

    Whole stamped batches as the broker stores them; one batch of random values
    restamped at each offset (stamping is outside the CRC), so building 512 MiB
    takes a second, not a minute.
    """
    from headrace.records import batch as rb

    template = rb.encode(
        [os.urandom(value_bytes) for _ in range(batch_records)], timestamp_ms=1_700_000_000_000
    )
    per_object = max(1, object_bytes // len(template))
    out: list[bytes] = []
    offset = 0
    for _ in range(count):
        parts = []
        for _ in range(per_object):
            raw = bytearray(template)
            rb.stamp(raw, offset, 1)
            parts.append(raw)
            offset += batch_records
        out.append(b"".join(parts))
    return out


def tier_upload(spec: dict[str, Any]) -> dict[str, Any]:
    """``PartitionTier.upload`` of ``total_mb`` in ``object_mb`` objects to ``partitions``
    partitions, one uploader thread each (each uploads its objects in offset order, as
    the broker's uploader does), after uploading ``warmup_objects`` elsewhere."""
    import threading

    from headrace import tuning
    from headrace.objectstore import urls
    from headrace.tiered import layout
    from headrace.tiered.tier import PartitionTier

    tuning.tune_allocator()  # the uploader runs in the broker, which sets this at start-up
    store = urls.open_store(spec["url"])
    parts: int = spec["partitions"]
    object_bytes = int(spec["object_mb"]) << 20
    per_partition = max(1, (int(spec["total_mb"]) << 20) // object_bytes // parts)
    objects = [
        _tier_objects(per_partition, object_bytes, spec["value_bytes"], spec["batch_records"])
        for _ in range(parts)
    ]
    warm = PartitionTier(store, layout.partition_prefix("bench", spec["topic"] + "-warmup", 0))
    for data in objects[0][: int(spec["warmup_objects"])]:
        warm.upload(data, epoch=1)
    tiers = [
        PartitionTier(store, layout.partition_prefix("bench", spec["topic"], p))
        for p in range(parts)
    ]
    errors: list[BaseException] = []

    def uploader(p: int) -> None:
        try:
            for data in objects[p]:
                tiers[p].upload(data, epoch=1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=uploader, args=(p,)) for p in range(parts)]
    meter = _meter(spec)
    meter.start()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    if errors:
        raise errors[0]
    nbytes = sum(len(d) for per in objects for d in per)
    records = 0
    for tier, per in zip(tiers, objects, strict=True):
        manifest = tier.manifest(refresh=True)
        if len(manifest.segments) != len(per) or manifest.gaps():
            raise RuntimeError(f"{tier.prefix}: manifest does not list every upload")
        records += manifest.checkpoint + 1
    return {
        "records": records,
        "records_per_s": round(records / elapsed, 1),
        "bytes": nbytes,
        "objects": sum(len(per) for per in objects),
        "object_bytes": len(objects[0][0]),
        "batch_bytes": nbytes // max(1, records // int(spec["batch_records"])),
        "elapsed_s": round(elapsed, 4),
        "mb_per_s": round(nbytes / elapsed / 1e6, 2),
        "cpu": cpu,
    }


def tier_read(spec: dict[str, Any]) -> dict[str, Any]:
    """A sequential catch-up reader: ``PartitionTier.read(offset, read_bytes)`` from the
    first offset of a partition's tier to its last, with ``prefetch`` chunks of
    readahead (0: none). A fresh tier (cold caches) after a warm-up read of the first
    ``warmup_mb`` through another tier."""
    from headrace.objectstore import urls
    from headrace.records import batch as rb
    from headrace.tiered import layout
    from headrace.tiered.tier import PartitionTier

    store = urls.open_store(spec["url"])
    prefix = layout.partition_prefix("bench", spec["topic"], 0)
    read_bytes = int(spec["read_bytes"])
    prefetch = int(spec["prefetch"])

    def read_all(tier: PartitionTier, limit: int | None) -> tuple[int, int]:
        manifest = tier.manifest(refresh=True)
        offset = manifest.start_offset or 0
        nbytes = 0
        while offset <= manifest.checkpoint and (limit is None or nbytes < limit):
            data = tier.read(offset, read_bytes)
            nbytes += len(data)
            for _, header in rb.scan(data):
                offset = header.next_offset
        return nbytes, offset - (manifest.start_offset or 0)

    warm = PartitionTier(store, prefix)
    read_all(warm, int(spec["warmup_mb"]) << 20)
    warm.close()
    tier = PartitionTier(store, prefix, prefetch_chunks=prefetch, cache_chunks=max(4, prefetch + 2))
    stored = sum(s.size for s in tier.manifest(refresh=True).segments)
    meter = _meter(spec)
    meter.start()
    started = time.perf_counter()
    nbytes, records = read_all(tier, None)
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    tier.close()
    if nbytes != stored:
        raise RuntimeError(f"read {nbytes} bytes, the tier holds {stored}")
    return {
        "records": records,
        "records_per_s": round(records / elapsed, 1),
        "bytes": nbytes,
        "readahead_bytes": tier.readahead_bytes,
        "elapsed_s": round(elapsed, 4),
        "mb_per_s": round(nbytes / elapsed / 1e6, 2),
        "cpu": cpu,
    }


# ---------------------------------------------------------------------------- redis


def redis_py_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """Pipelined XADD through redis-py (one connection, ``pipeline`` commands per round trip)."""
    import redis

    r = redis.Redis(host=LOOPBACK, port=int(spec["port"]))
    stream: str = spec["stream"]
    size: int = spec["value_bytes"]
    depth: int = spec["pipeline"]
    value = b"x" * size

    def phase(seconds: float) -> int:
        count = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pipe = r.pipeline(transaction=False)
            for _ in range(depth):
                pipe.xadd(stream, {"v": value})
            pipe.execute()
            count += depth
        return count

    phase(float(spec["warmup_s"]))
    meter = _meter(spec)
    meter.start()
    started = time.perf_counter()
    count = phase(float(spec["duration_s"]))
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    r.close()
    return {**_rate(count, size, elapsed), "cpu": cpu}


def redis_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """XREADGROUP ``count`` entries at a time from a new group at 0, XACK each read."""
    import redis

    r = redis.Redis(host=LOOPBACK, port=int(spec["port"]))
    stream: str = spec["stream"]
    total: int = spec["records"]
    size: int = spec["value_bytes"]
    count_per_read: int = spec["count"]
    limit_s = float(spec.get("max_s", 300.0))
    group = f"g-{uuid.uuid4().hex[:8]}"
    meter = _meter(spec)
    meter.start()
    started = time.perf_counter()
    r.xgroup_create(stream, group, id="0")
    n = 0
    reads = 0
    timed_out = False
    deadline = started + limit_s
    while n < total:
        if time.perf_counter() > deadline:
            timed_out = True
            break
        resp: Any = r.xreadgroup(group, "c1", {stream: ">"}, count=count_per_read)
        if not resp:
            break
        entries = resp[0][1]
        values = [fields[b"v"] for _, fields in entries]
        n += len(values)
        reads += 1
        r.xack(stream, group, *[entry_id for entry_id, _ in entries])
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    r.close()
    return {**_rate(n, size, elapsed), "reads": reads, "timed_out": timed_out, "cpu": cpu}


def _resp(*args: bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"".join([b"*%d\r\n" % len(args), *(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)])


def _hex_probe(j: int, intended: int, size: int) -> bytes:
    """The latency probe for Redis in ASCII, so replies can be scanned with a regex."""
    return (b"%016x%016x" % (j, intended)).ljust(size, b".")


#: XREADGROUP reply head (RESP2): one stream, its name, then the entry count
_XREAD_HEAD = re.compile(rb"\*1\r\n\*2\r\n\$\d+\r\n[^\r]*\r\n\*(\d+)\r\n")
#: one entry: [id, [b"v", probe]] -> (id, record index hex, intended time hex)
_XREAD_ENTRY = re.compile(
    rb"\*2\r\n\$\d+\r\n(\d+-\d+)\r\n\*2\r\n\$1\r\nv\r\n\$\d+\r\n"
    rb"([0-9a-f]{16})([0-9a-f]{16})\.*\r\n"
)


async def redis_latency(spec: dict[str, Any]) -> dict[str, Any]:
    """XADD at a fixed rate and a blocking XREADGROUP consumer, in the same process.

    Both sides speak RESP on raw sockets instead of going through redis-py:
    with redis-py the Python client (a dict per entry, its pure-Python parser)
    saturated the client core at 50k/s and latency grew without bound, which
    measured the client, not Redis. Replies are scanned with a C-speed regex,
    so the client's per-record cost is below headrace's real client: this
    setup favours Redis. XACKs go out on a third connection after every read.
    """
    import redis.asyncio as aioredis

    port = int(spec["port"])
    key: bytes = spec["stream"].encode()
    size: int = spec["value_bytes"]
    group = b"lat"
    loop_ = OpenLoop(int(spec["rate"]), float(spec["warmup_s"]), float(spec["measure_s"]))
    setup: Any = aioredis.Redis(host=LOOPBACK, port=port)
    await setup.xgroup_create(key, group, id="$", mkstream=True)
    await setup.aclose()
    xadd_r, xadd_w = await asyncio.open_connection(LOOPBACK, port)
    read_r, read_w = await asyncio.open_connection(LOOPBACK, port)
    ack_r, ack_w = await asyncio.open_connection(LOOPBACK, port)
    errors: list[bytes] = []
    counts = {"xadd": 0, "xack": 0}
    perf = time.perf_counter_ns

    async def drain(reader: asyncio.StreamReader, marker: bytes, name: str) -> None:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            counts[name] += data.count(marker)
            if data.startswith(b"-") or b"\n-" in data:
                errors.append(data[:200])

    read_cmd = _resp(
        b"XREADGROUP", b"GROUP", group, b"c1", b"COUNT", b"1000", b"BLOCK", b"200",
        b"STREAMS", key, b">",
    )  # fmt: skip

    async def consume() -> None:
        buf = bytearray()
        while True:
            read_w.write(read_cmd)
            buf.clear()
            entries: list[tuple[bytes, bytes, bytes]] = []
            while True:
                chunk = await read_r.read(1 << 18)
                if not chunk:
                    return
                buf += chunk
                if buf.startswith(b"*-1\r\n"):  # BLOCK timed out: nothing new
                    break
                if buf.startswith(b"-"):
                    errors.append(bytes(buf[:200]))
                    return
                head = _XREAD_HEAD.match(buf)
                if head is None:
                    continue
                entries = _XREAD_ENTRY.findall(buf, head.end())
                if len(entries) >= int(head.group(1)):
                    break
            if not entries:
                continue
            now = perf()
            for _, j, intended in entries:
                loop_.on_received(int(j, 16), int(intended, 16), now)
            ack_w.write(_resp(b"XACK", key, group, *[e[0] for e in entries]))

    async def send(first: int, last: int, t0: int) -> None:
        interval = loop_.interval_ns
        xadd_w.write(
            b"".join(
                _resp(b"XADD", key, b"*", b"v", _hex_probe(j, t0 + int(j * interval), size))
                for j in range(first, last)
            )
        )
        await asyncio.sleep(0)

    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(consume()),
        loop.create_task(drain(xadd_r, b"$", "xadd")),
        loop.create_task(drain(ack_r, b":", "xack")),
    ]
    meter = _meter(spec)
    try:
        meter.start()
        await loop_.run(send)
        await xadd_w.drain()
        await loop_.drain(float(spec.get("drain_s", 5.0)))
        cpu = meter.stop()
    finally:
        for task in tasks:
            task.cancel()
        for writer in (xadd_w, read_w, ack_w):
            writer.close()
    if errors:
        raise RuntimeError(f"Redis errors: {errors[:3]}")
    return {**loop_.result(), "cpu": cpu, "xadd_replies": counts["xadd"]}


# ---------------------------------------------------------------------------- entry

ASYNC_KINDS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "hr_produce": hr_produce,
    "hr_preload": hr_preload,
    "hr_consume": hr_consume,
    "hr_latency": hr_latency,
    "redis_latency": redis_latency,
}
SYNC_KINDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "redis_py_produce": redis_py_produce,
    "redis_consume": redis_consume,
    "tier_upload": tier_upload,
    "tier_read": tier_read,
}


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    kind = spec["kind"]
    if kind in SYNC_KINDS:
        result = SYNC_KINDS[kind](spec)
    else:
        from headrace.aio import run  # uvloop when installed, as the CLI uses

        result = run(ASYNC_KINDS[kind](spec))  # type: ignore[arg-type]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
