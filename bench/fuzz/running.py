"""One live fuzzing run: a broker process, a producer alongside, the fuzzer, a watchdog.

The broker is a real ``headrace broker --standalone`` process. While the
fuzzer process (``sender``) throws inputs at it, a producer (acks=all) sends
numbered records to a topic whose name no seed knows, and a watchdog pings the
broker on a fresh connection every second: an answer slower than
``hang_after_s`` counts as a hang, the process exiting counts as a crash. At
the end every acknowledged record must be read back at its offset, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from headrace.client import Producer
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.client.producer import RecordReceipt
from headrace.errors import HeadraceError
from headrace.protocol.frames import Op
from headrace.testing import procs
from headrace.testing.procs import BrokerProcess
from headrace.testing.reading import create_topic, read_partition


@dataclass(frozen=True, slots=True)
class Settings:
    seconds: float = 30.0
    engine: str = "auto"
    seed: int = 1
    #: a ping slower than this counts as a hang
    hang_after_s: float = 5.0
    #: records the producer alongside sends per second (roughly)
    load_per_s: int = 200


async def run(directory: Path, settings: Settings) -> dict[str, Any]:
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    broker = BrokerProcess(directory / "data")
    await asyncio.to_thread(broker.start)
    topic = f"load-{secrets.token_hex(4)}"
    stats_path = directory / "fuzz-stats.json"
    crashed = False
    hangs = 0
    slowest_ping = 0.0
    sent: list[tuple[RecordReceipt, bytes]] = []
    try:
        await create_topic(broker.bootstrap, topic, 2)
        sender = procs.spawn(
            [
                sys.executable,
                "-m",
                "bench.fuzz.sender",
                "--bootstrap",
                broker.bootstrap,
                "--seconds",
                str(settings.seconds),
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

        async def load(producer: Producer) -> None:
            n = 0
            while not stop.is_set():
                for _ in range(max(1, settings.load_per_s // 20)):
                    value = b"load-%09d" % n
                    n += 1
                    sent.append((await producer.send(topic, value, partition=n % 2), value))
                await asyncio.sleep(0.05)

        async with Producer(broker.bootstrap, acks="all", delivery_timeout_ms=30_000) as producer:
            loading = asyncio.create_task(load(producer))
            # the fuzzer ends itself at its deadline; allow it start-up time on a busy machine
            give_up = started + settings.seconds + 60
            while sender.poll() is None and time.monotonic() < give_up:
                if not broker.alive:
                    crashed = True
                    break
                took = await ping(broker.bootstrap, settings.hang_after_s)
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
            except HeadraceError:
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
        lost = sum(1 for pos, v in acked.items() if stored.get(pos) != v)
    finally:
        broker.kill9()
    fuzz_stats: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        fuzz_stats = json.loads(stats_path.read_text())
    log_text = broker.log_path.read_text(errors="replace") if broker.log_path.exists() else ""
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
        "ok": not crashed and hangs == 0 and lost == 0 and duplicated == 0,
    }


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
