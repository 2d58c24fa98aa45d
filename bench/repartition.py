"""``python -m bench.repartition``: what a live grow costs a keyed acks=all producer.

A local cluster (``headrace local up``: three brokers and the controller as
processes) hosts a topic of 4 partitions, RF=3. One producer sends keyed
records (``--keys`` keys, each with its own sequence numbers) with acks=all as
fast as it can, keeping a few rounds in flight, and a 3-member cohort reads
everything and checks each key's sequence. A Repartition grows the topic to 8
partitions mid-load. Reported:

* the **producer-visible stall**: the longest gap between two consecutive
  acknowledged batches, from one second before the apply to two seconds after
  Finalized (target ≤ 1 s);
* **apply to Finalized** and the drain time inside it (target ≤ 3 s plus the
  drain);
* the throughput the producer reached, and the order violations and
  duplicates the cohort saw (target 0).

Writes ``bench/results/repartition.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

from headrace.client import Consumer, Producer
from headrace.control.documents import epoch_ms
from headrace.testing import procs, waiting

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOPIC = "default/growing"


def cli(*args: str) -> str:
    proc = procs.run_headrace(*args, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"headrace {' '.join(args)}: {proc.stderr.decode()}")
    return proc.stdout.decode()


def state(controller: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{controller}/v1/state", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def repartition_status(controller: str, name: str) -> dict[str, Any]:
    for doc in state(controller).get("repartitions", []):
        if doc["metadata"]["name"] == name:
            return dict(doc.get("status") or {})
    return {}


def wait(predicate: Any, timeout: float, what: str) -> None:
    waiting.until(predicate, timeout, what, retry_on=(OSError,))


async def keyed_load(
    producer: Producer, keys: int, stop: asyncio.Event, acks: list[float], sent: list[int]
) -> None:
    """Rounds of one record per key; up to 4 rounds in flight; each batch's ack time."""
    in_flight: deque[list[asyncio.Future[Any]]] = deque()
    seen: set[int] = set()
    for seq in itertools.count():
        if stop.is_set():
            break
        batches: list[asyncio.Future[Any]] = []
        for k in range(keys):
            receipt = await producer.send(TOPIC, b"%d" % seq, key=b"k%d" % k)
            fut = receipt.batch
            if id(fut) not in seen:
                seen.add(id(fut))
                batches.append(fut)
                fut.add_done_callback(lambda f: acks.append(time.monotonic()))
        sent[0] += keys
        in_flight.append(batches)
        if len(in_flight) > 4:
            await asyncio.gather(*in_flight.popleft(), return_exceptions=True)
    for batches in in_flight:
        await asyncio.gather(*batches, return_exceptions=True)


async def cohort_member(
    consumer: Consumer, stop: asyncio.Event, last: dict[bytes, int], problems: list[str]
) -> None:
    seen: set[tuple[int, int]] = set()
    while not stop.is_set():
        for batch in await consumer.getmany(timeout_s=0.2):
            for offset, record in zip(batch.offsets(), batch.records(), strict=True):
                key, seq = record.key or b"", int(record.value)
                if (batch.partition, offset) in seen:
                    problems.append(f"duplicate {batch.partition}/{offset}")
                seen.add((batch.partition, offset))
                if seq <= last.get(key, -1):
                    problems.append(f"{key!r}: {seq} after {last[key]}")
                last[key] = max(seq, last.get(key, -1))
            consumer.ack_batch(batch)


async def measure(directory: Path, keys: int, seconds: float) -> dict[str, Any]:
    bootstrap = (
        cli("local", "up", "--dir", str(directory), "--brokers", "3").strip().splitlines()[-1]
    )
    controller = json.loads((directory / "local.json").read_text())["controller_url"]
    try:
        (directory / "topic.yaml").write_text(
            "apiVersion: headrace.dev/v1alpha1\nkind: Topic\nmetadata: {name: growing}\n"
            "spec: {clusterRef: {name: local}, partitions: 4, replicas: 3, minInSync: 2}\n"
        )
        cli("apply", "-f", str(directory / "topic.yaml"), "--controller", controller)
        wait(
            lambda: any(
                t["name"] == TOPIC and all(p["state"] == "Online" for p in t["partitions"])
                for t in state(controller)["cluster"]["topics"]
            ),
            30,
            "topic online",
        )
        stop_load, stop_read = asyncio.Event(), asyncio.Event()
        acks: list[float] = []
        sent = [0]
        last: dict[bytes, int] = {}
        problems: list[str] = []
        producer = await Producer(bootstrap, acks="all", linger_ms=2).start()
        members = [
            await Consumer(bootstrap, TOPIC, "bench", member_id=f"m{i}", start="earliest").start()
            for i in range(3)
        ]
        load = asyncio.create_task(keyed_load(producer, keys, stop_load, acks, sent))
        readers = [
            asyncio.create_task(cohort_member(m, stop_read, last, problems)) for m in members
        ]
        await asyncio.sleep(seconds / 2)
        (directory / "grow.yaml").write_text(
            "apiVersion: headrace.dev/v1alpha1\nkind: Repartition\nmetadata: {name: grow}\n"
            "spec: {topicRef: {name: growing}, partitions: 8, adoptionTimeoutSeconds: 30}\n"
        )
        applied = time.monotonic()
        applied_wall = time.time()
        await asyncio.to_thread(
            cli, "apply", "-f", str(directory / "grow.yaml"), "--controller", controller
        )
        await asyncio.to_thread(
            wait,
            lambda: repartition_status(controller, "grow").get("phase") == "Finalized",
            120,
            "grow finalized",
        )
        finalized = time.monotonic()
        await asyncio.sleep(seconds / 2)
        stop_load.set()
        await load
        await producer.close()
        total = sent[0]
        await asyncio.to_thread(
            wait, lambda: sum(v + 1 for v in last.values()) >= total, 120, "all delivered"
        )
        stop_read.set()
        await asyncio.gather(*readers)
        for m in members:
            await m.close(grace_s=1)
        status = repartition_status(controller, "grow")
        window = sorted(t for t in acks if applied - 1 <= t <= finalized + 2)
        gaps = [b - a for a, b in itertools.pairwise(window)]
        drained = status.get("drainedAt")
        duration = (max(acks) - min(acks)) if acks else float("nan")
        return {
            "scenario": "repartition-grow-4-to-8",
            "keys": keys,
            "records_acked": total,
            "records_per_s": round(total / duration) if duration else None,
            "longest_ack_gap_s": round(max(gaps, default=float("nan")), 3),
            "apply_to_finalized_s": round(finalized - applied, 3),
            "apply_to_drained_s": None
            if drained is None
            else round(epoch_ms(drained) / 1000 - applied_wall, 3),
            "finalized_by": status.get("finalizedBy"),
            "order_violations_or_duplicates": len(problems),
            "first_problems": problems[:5],
        }
    finally:
        cli("local", "down", "--dir", str(directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0, help="load before + after the grow")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="headrace-repartition-") as tmp:
        result = asyncio.run(measure(Path(tmp) / "local", args.keys, args.seconds))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "repartition.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
