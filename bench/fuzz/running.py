"""One live fuzzing run: a broker process, a producer alongside, the fuzzer, a watchdog.

The broker is a real ``headrace broker --standalone`` process, with its Kafka
listener on when the run fuzzes ``protocol="kafka"``. While the fuzzer process
(``sender``) throws inputs at it, a producer of the same protocol (ours, or
aiokafka for Kafka; acks=all) sends numbered records to a topic whose name no
seed knows, and a watchdog probes the fuzzed listener on a fresh connection
every second (a PING, or a Kafka ApiVersions): an answer slower than
``hang_after_s`` counts as a hang, the process exiting counts as a crash. At
the end every acknowledged record must be read back at its offset, once.

A Kafka run also counts every record stored outside the producer's topic: each
must be a seed's record, intact (only the seeds' Produce requests carry valid
batches), and there may be no more of them than the well-formed Produce
requests the fuzzer sent. A record of a malformed Produce that was stored
fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from bench.fuzz import kafka_inputs
from headrace.client import Producer
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.errors import HeadraceError
from headrace.kafka.offsets_log import DEFAULT_OFFSETS_TOPIC
from headrace.protocol.frames import Op
from headrace.testing import procs
from headrace.testing.procs import LOOPBACK, BrokerProcess, free_port
from headrace.testing.reading import create_topic, read_partition


@dataclass(frozen=True, slots=True)
class Settings:
    seconds: float = 30.0
    #: the listener fuzzed
    protocol: Literal["native", "kafka"] = "native"
    #: stop after this many inputs (None: at ``seconds``, which always bounds the run)
    count: int | None = None
    engine: str = "auto"
    seed: int = 1
    #: a ping slower than this counts as a hang
    hang_after_s: float = 5.0
    #: records the producer alongside sends per second (roughly)
    load_per_s: int = 200


async def run(directory: Path, settings: Settings) -> dict[str, Any]:
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    kafka = settings.protocol == "kafka"
    kafka_port = free_port()
    broker = BrokerProcess(
        directory / "data", extra_args=["--kafka-port", str(kafka_port)] if kafka else []
    )
    await asyncio.to_thread(broker.start)
    target = f"{LOOPBACK}:{kafka_port}" if kafka else broker.bootstrap
    topic = f"load-{secrets.token_hex(4)}"
    stats_path = directory / "fuzz-stats.json"
    crashed = False
    hangs = 0
    slowest_ping = 0.0
    sent: list[tuple[Any, bytes]] = []
    audit: dict[str, Any] = {}
    try:
        await create_topic(broker.bootstrap, topic, 2)
        if kafka:
            await create_topic(broker.bootstrap, kafka_inputs.SEED_TOPIC, 2)
        sender = procs.spawn(
            [
                sys.executable,
                "-m",
                "bench.fuzz.sender",
                "--bootstrap",
                target,
                "--protocol",
                settings.protocol,
                "--seconds",
                str(settings.seconds),
                *(["--count", str(settings.count)] if settings.count is not None else []),
                "--stats",
                str(stats_path),
                "--engine",
                settings.engine,
                "--seed",
                str(settings.seed),
                "--corpus",
                str(directory / "corpus"),
            ],
            directory / "fuzzer.log",
        )
        started = time.monotonic()
        stop = asyncio.Event()

        async def load(producer: LoadProducer) -> None:
            n = 0
            while not stop.is_set():
                for _ in range(max(1, settings.load_per_s // 20)):
                    value = b"load-%09d" % n
                    n += 1
                    sent.append((await producer.send(topic, value, n % 2), value))
                await asyncio.sleep(0.05)

        async with load_producer(settings.protocol, target) as producer:
            loading = asyncio.create_task(load(producer))
            # the fuzzer ends itself at its deadline; allow it start-up time on a busy machine
            give_up = started + settings.seconds + 60
            while sender.poll() is None and time.monotonic() < give_up:
                if not broker.alive:
                    crashed = True
                    break
                took = await (kafka_ping if kafka else ping)(target, settings.hang_after_s)
                if took is None:
                    hangs += 1
                else:
                    slowest_ping = max(slowest_ping, took)
                await asyncio.sleep(1.0)
            procs.reap(sender)
            stop.set()
            await loading
            await producer.flush()
        crashed = crashed or not broker.alive
        acked: dict[tuple[int, int], bytes] = {}
        failed = 0
        for receipt, value in sent:
            try:
                meta = await receipt
            except producer.errors:
                failed += 1
                continue
            acked[(meta.partition, meta.offset)] = value
        stored: dict[tuple[int, int], bytes] = {}
        duplicated = 0
        if not crashed:
            seen: set[bytes] = set()
            for p in range(2):
                for r in await read_partition(broker.bootstrap, f"default/{topic}", p):
                    stored[(p, r.offset)] = r.value
                    duplicated += r.value in seen
                    seen.add(r.value)
            if kafka:
                audit = await audit_other_topics(broker, f"default/{topic}")
        lost = sum(1 for pos, v in acked.items() if stored.get(pos) != v)
    finally:
        broker.kill9()
    fuzz_stats: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        fuzz_stats = json.loads(stats_path.read_text())
    log_text = broker.log_path.read_text(errors="replace") if broker.log_path.exists() else ""
    stored_bad = audit.get("stored_bad_records", 0)
    over_stored = audit.get("stored_seed_records", 0) > fuzz_stats.get(
        "well_formed_produce_records", 0
    )
    return {
        "settings": asdict(settings),
        **fuzz_stats,
        "crashes": int(crashed),
        "hangs": hangs,
        "slowest_ping_s": round(slowest_ping, 3),
        "tracebacks_in_broker_log": log_text.count("Traceback"),
        "acknowledged": len(acked),
        "failed_sends": failed,
        "lost": lost,
        "duplicated": duplicated,
        **audit,
        **({"errors_answered": sum(fuzz_stats.get("error_codes", {}).values())} if kafka else {}),
        "ok": not crashed
        and hangs == 0
        and lost == 0
        and duplicated == 0
        and stored_bad == 0
        and not over_stored,
    }


class LoadProducer:
    """The producer alongside, either protocol's: ``send`` queues a record and gives an
    awaitable of its (partition, offset) metadata."""

    def __init__(self, send: Any, flush: Any, errors: tuple[type[BaseException], ...]) -> None:
        self._send = send
        self._flush = flush
        #: what awaiting a failed send raises
        self.errors = errors

    async def send(self, topic: str, value: bytes, partition: int) -> Any:
        return await self._send(topic, value, partition=partition)

    async def flush(self) -> None:
        await self._flush()


@contextlib.asynccontextmanager
async def load_producer(protocol: str, bootstrap: str) -> AsyncIterator[LoadProducer]:
    """Our producer, or aiokafka's for a Kafka run (acks=all, as a careful application)."""
    if protocol != "kafka":
        async with Producer(bootstrap, acks="all", delivery_timeout_ms=30_000) as ours:
            yield LoadProducer(ours.send, ours.flush, (HeadraceError,))
        return
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    theirs = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, request_timeout_ms=30_000
    )
    await theirs.start()
    try:
        yield LoadProducer(theirs.send, theirs.flush, (KafkaError,))
    finally:
        await theirs.stop()


async def audit_other_topics(broker: BrokerProcess, load_topic: str) -> dict[str, Any]:
    """Every record stored outside the producer's topic (and the Kafka groups' offsets):
    how many, and how many are not a seed's record intact (or could not be read)."""
    listed = await asyncio.to_thread(broker.get_json, "/v1/topics")
    topics = listed.get("topics")
    assert isinstance(topics, list)
    seed_records = 0
    bad = 0
    for doc in topics:
        name = doc["name"]
        if name == load_topic or name.endswith(DEFAULT_OFFSETS_TOPIC):
            continue
        for p in range(int(doc["partitions"])):
            try:
                records = await read_partition(broker.bootstrap, name, p)
            except (HeadraceError, AssertionError):
                bad += 1  # a partition that cannot be read back whole
                continue
            for r in records:
                if r.value in kafka_inputs.SEED_VALUES:
                    seed_records += 1
                else:
                    bad += 1
    return {"stored_seed_records": seed_records, "stored_bad_records": bad}


async def kafka_ping(bootstrap: str, timeout_s: float) -> float | None:
    """Seconds a Kafka ApiVersions on a fresh connection took, or None if no answer came
    within ``timeout_s``."""
    host, _, port = bootstrap.rpartition(":")
    began = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(kafka_inputs.fence())
                size = int.from_bytes(await reader.readexactly(4), "big")
                await reader.readexactly(size)
            finally:
                writer.close()
    except (TimeoutError, OSError, asyncio.IncompleteReadError):
        return None
    return time.monotonic() - began


async def ping(bootstrap: str, timeout_s: float) -> float | None:
    """Seconds a PING on a fresh connection took, or None if none came within ``timeout_s``."""
    host, _, port = bootstrap.rpartition(":")
    began = time.monotonic()
    try:
        conn = await asyncio.wait_for(
            ClientConnection.open(host, int(port), ConnectOptions(connect_timeout_s=timeout_s)),
            timeout_s,
        )
        try:
            await asyncio.wait_for(conn.request(Op.PING), timeout_s)
        finally:
            await conn.close()
    except (TimeoutError, HeadraceError):
        return None
    return time.monotonic() - began
