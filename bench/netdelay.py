"""Throughput of acks=all writes while one broker's network is slow and lossy.

    .venv/bin/python -m bench.netdelay [--phase-s 8] [--out bench/results/netdelay.json]

The scenario "200 ms delay and 5% loss on one broker", as figures. For
each victim role (the partition's leader, then a follower) it starts a fresh
``NetnsCluster`` (3 brokers, each in its own network namespace; topic with 1
partition, RF=3, minInSync=2), runs one acks=all producer from the root
namespace with a bounded number of records outstanding, and counts the
acknowledgements in consecutive phases of ``--phase-s`` seconds:

    healthy -> 5% loss -> 200 ms delay -> 200 ms delay + 5% loss -> healed

The loss is nft (``NetnsCluster.lossy``, both directions); the delay holds every
packet the victim receives (``NetnsCluster.delay``, ``bench/delayline.py``; the
kernel here has no netem). Each phase also records the fastest of three TCP
connects to the victim, the round trip the faults lengthen, and the partition's
live replica set as the phase ends. At the end the
producer stops, the replicas converge, and the partition is read back: every
acknowledged record must be there exactly once (``lost`` and ``duplicated`` in
the report). Needs root (``netns.delay_unavailable()`` says why not).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import netns
from headrace.client import Producer
from headrace.errors import HeadraceError
from headrace.testing.reading import read_partition
from tests.integration.localcluster import topic_manifest

TOPIC = "default/netdelay"
DELAY_MS = 200
LOSS_PERCENT = 5


@dataclass
class Load:
    """One acks=all producer, at most ``outstanding`` records unacknowledged at a time."""

    bootstrap: str
    outstanding: int = 1_000
    value_size: int = 100
    acked: list[tuple[int, bytes]] = field(default_factory=list)
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        producer = await Producer(
            self.bootstrap,
            acks="all",
            linger_ms=5,
            request_timeout_ms=5_000,
            delivery_timeout_ms=120_000,
        ).start()
        slots = asyncio.Semaphore(self.outstanding)
        pending: set[asyncio.Task[None]] = set()
        pad = b"x" * max(0, self.value_size - 10)

        async def note(receipt: Any, value: bytes) -> None:
            try:
                meta = await receipt
                self.acked.append((meta.offset, value))
            except HeadraceError:
                self.failed += 1
            finally:
                slots.release()

        sent = 0
        try:
            while not self.stop.is_set():
                await slots.acquire()
                value = b"%010d" % sent + pad
                sent += 1
                task = asyncio.create_task(note(await producer.send(TOPIC, value), value))
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            await producer.close()
            await asyncio.gather(*pending)


async def _round_trip_ms(c: netns.NetnsCluster, broker: int) -> float:
    samples = [await asyncio.to_thread(c.connect_s, broker) for _ in range(3)]
    return round(min(samples) * 1000, 2)


def _full_lrs(c: netns.NetnsCluster) -> bool:
    p = c.partition(TOPIC, 0)
    return p.get("state") == "Online" and set(p.get("liveReplicas") or []) == set(c.broker_ids)


async def run_case(root: Path, role: str, phase_s: float) -> dict[str, Any]:
    """One cluster, the victim in ``role`` ("leader" or "follower"), every phase."""
    with netns.NetnsCluster(root, controller_options=("--no-preferred-leader-rebalance",)) as c:
        c.apply(topic_manifest("netdelay", 1, replicas=3, min_in_sync=2))
        c.wait(lambda: _full_lrs(c), 30, "netdelay/0 online with a full LRS")
        leader = c.partition(TOPIC, 0)["leader"]
        victim = leader if role == "leader" else next(b for b in c.broker_ids if b != leader)

        def delay_and_loss() -> None:
            c.delay(victim, DELAY_MS)
            c.lossy(victim, LOSS_PERCENT)

        phases: list[tuple[str, Callable[[], None]]] = [
            ("healthy", lambda: None),
            (f"{LOSS_PERCENT}% loss", lambda: c.lossy(victim, LOSS_PERCENT)),
            (f"{DELAY_MS} ms delay", lambda: c.delay(victim, DELAY_MS)),
            (f"{DELAY_MS} ms delay + {LOSS_PERCENT}% loss", delay_and_loss),
            ("healed", lambda: None),
        ]
        load = Load(c.bootstrap)
        task = asyncio.create_task(load.run())
        results = []
        for name, fault in phases:
            c.heal()
            fault()
            rtt = await _round_trip_ms(c, victim)
            count, started = len(load.acked), time.monotonic()
            await asyncio.sleep(phase_s)  # a measuring window, not a sync point
            assert not task.done(), "the producer stopped"
            rate = (len(load.acked) - count) / (time.monotonic() - started)
            lrs = sorted((await asyncio.to_thread(c.partition, TOPIC, 0))["liveReplicas"])
            results.append(
                {"phase": name, "records_per_s": round(rate), "connect_ms": rtt, "lrs_at_end": lrs}
            )
            print(f"  {role:8} {name:28} {rate:8.0f} records/s   connect {rtt:7.2f} ms   LRS {lrs}")
        c.heal()
        load.stop.set()
        await task
        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(_full_lrs, c):
            if time.monotonic() > deadline:
                raise TimeoutError("the LRS is not full again 60 s after the heal")
            await asyncio.sleep(0.2)
        final = {r.offset: r.value for r in await read_partition(c.bootstrap, TOPIC, 0)}
        values = list(final.values())
        lost = sum(1 for offset, value in load.acked if final.get(offset) != value)
        return {
            "victim": role,
            "broker": victim,
            "phases": results,
            "acknowledged": len(load.acked),
            "failed_deliveries": load.failed,
            "lost": lost,
            "duplicated": len(values) - len(set(values)),
        }


async def main_async(phase_s: float) -> dict[str, Any]:
    reason = netns.delay_unavailable()
    if reason is not None:
        raise SystemExit(f"bench.netdelay needs network namespaces and NFQUEUE: {reason}")
    cases = []
    for role in ("leader", "follower"):
        with tempfile.TemporaryDirectory(prefix="hr-netdelay-") as tmp:
            cases.append(await run_case(Path(tmp), role, phase_s))
        last = cases[-1]
        print(
            f"  {role}: {last['acknowledged']} acknowledged, lost {last['lost']},"
            f" duplicated {last['duplicated']}"
        )
    return {
        "scenario": f"{DELAY_MS} ms delay and {LOSS_PERCENT}% loss on one broker",
        "topic": "1 partition, RF=3, minInSync=2, acks=all, 100 B records",
        "phase_s": phase_s,
        "cases": cases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-s", type=float, default=8.0, help="seconds per phase")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args()
    report = asyncio.run(main_async(args.phase_s))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {args.out}")


if __name__ == "__main__":
    main()
