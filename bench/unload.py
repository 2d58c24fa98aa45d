"""``python -m bench.unload``: producer-visible unavailability of a move.

A local cluster (``headrace local up --object-store minio``: two brokers, the
controller and a real MinIO) hosts one RF=1 tiered partition; the bench fills
it with ``--gib`` of records, waits for the uploader to store them, then keeps
one acks=all producer sending a record every millisecond while an Unload moves
the partition to the other broker. Unavailability is the longest gap between
two consecutive acknowledgements around the move (the producer retries through
it; no record is lost or reordered, which the bench checks too).

Writes ``bench/results/unload.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from headrace.client import Producer
from headrace.testing import procs, waiting

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOPIC = "default/moving"


def cli(*args: str) -> str:
    proc = procs.run_headrace(*args, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"headrace {' '.join(args)}: {proc.stderr.decode()}")
    return proc.stdout.decode()


def state(controller: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{controller}/v1/state", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def partition0(controller: str) -> dict[str, Any]:
    for t in state(controller)["cluster"].get("topics", []):
        if t["name"] == TOPIC:
            return dict(t["partitions"][0])
    return {}


def unload_status(controller: str, name: str) -> dict[str, Any]:
    for u in state(controller).get("unloads", []):
        if u["metadata"]["name"] == name:
            return dict(u.get("status") or {})
    return {}


def wait(predicate: Any, timeout: float, what: str) -> None:
    waiting.until(predicate, timeout, what, retry_on=(OSError,))


def broker_admin(directory: Path, broker_id: int) -> str:
    record = json.loads((directory / "local.json").read_text())
    b = next(b for b in record["brokers"] if b["id"] == broker_id)
    return f"http://{b['host']}:{b['admin_port']}"


def uploaded_through(directory: Path, broker_id: int) -> int:
    url = f"{broker_admin(directory, broker_id)}/v1/topics/{TOPIC}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.loads(resp.read())
    return int(doc["partition_details"][0].get("uploaded_through", -1))


async def fill(bootstrap: str, total_bytes: int, value_bytes: int) -> int:
    value = b"x" * value_bytes
    sent = 0
    async with Producer(bootstrap, acks="leader", linger_ms=5) as producer:
        while sent * value_bytes < total_bytes:
            await producer.send_many(TOPIC, [value] * 1000, partition=0)
            sent += 1000
        await producer.flush()
    return sent


async def steady_load(bootstrap: str, stop: asyncio.Event) -> list[tuple[float, int]]:
    """(ack time, offset) of each record, sent one per millisecond with acks=all."""
    acks: list[tuple[float, int]] = []
    pending: set[asyncio.Task[None]] = set()
    async with Producer(bootstrap, acks="all", linger_ms=0, delivery_timeout_ms=60_000) as p:

        async def settle(receipt: Any) -> None:
            meta = await receipt
            acks.append((time.monotonic(), meta.offset))

        while not stop.is_set():
            task = asyncio.create_task(settle(await p.send(TOPIC, b"steady", partition=0)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(0.001)
        await asyncio.gather(*pending)
    return acks


async def measure(directory: Path, gib: float, value_bytes: int) -> dict[str, Any]:
    bootstrap = (
        cli("local", "up", "--dir", str(directory), "--brokers", "2", "--object-store", "minio")
        .strip()
        .splitlines()[-1]
    )
    controller = json.loads((directory / "local.json").read_text())["controller_url"]
    try:
        manifest = """apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata: {name: moving}
spec:
  clusterRef: {name: local}
  partitions: 1
  replicas: 1
  minInSync: 1
"""
        (directory / "topic.yaml").write_text(manifest)
        cli("apply", "-f", str(directory / "topic.yaml"), "--controller", controller)
        wait(lambda: partition0(controller).get("state") == "Online", 30, "topic online")
        owner = int(partition0(controller)["leader"])
        started = time.monotonic()
        records = await fill(bootstrap, int(gib * (1 << 30)), value_bytes)
        fill_s = time.monotonic() - started
        wait(lambda: uploaded_through(directory, owner) >= records - 1, 600, "uploads caught up")
        upload_wait_s = time.monotonic() - started - fill_s

        stop = asyncio.Event()
        load = asyncio.create_task(steady_load(bootstrap, stop))
        await asyncio.sleep(2.0)
        target = 1 - owner
        unload = f"""apiVersion: headrace.dev/v1alpha1
kind: Unload
metadata: {{name: bench-move}}
spec:
  topicRef: {{name: moving}}
  partitions: [0]
  targetBroker: {target}
"""
        (directory / "unload.yaml").write_text(unload)
        applied = time.monotonic()
        # Off the event loop: the steady producer shares it and must not be held up.
        await asyncio.to_thread(
            cli, "apply", "-f", str(directory / "unload.yaml"), "--controller", controller
        )
        await asyncio.to_thread(
            wait,
            lambda: unload_status(controller, "bench-move").get("phase") in ("Completed", "Failed"),
            120,
            "unload finished",
        )
        completed = time.monotonic()
        await asyncio.sleep(2.0)
        stop.set()
        acks = await load
        status = unload_status(controller, "bench-move")
        move = status["moves"][0]
        offsets = sorted(o for _, o in acks)
        times = sorted(t for t, _ in acks)
        window = [t for t in times if applied - 1 <= t <= completed + 2]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        return {
            "scenario": "unload",
            "partition_bytes": records * value_bytes,
            "records": records,
            "value_bytes": value_bytes,
            "fill_s": round(fill_s, 2),
            "upload_catch_up_s": round(upload_wait_s, 2),
            "unload_phase": status["phase"],
            "sealed_offset": move.get("sealedOffset"),
            "unload_wall_s": round(completed - applied, 3),
            "unavailability_s": round(max(gaps, default=float("nan")), 3),
            "steady_acks": len(acks),
            "steady_offsets_contiguous": offsets
            == list(range(offsets[0], offsets[0] + len(offsets)))
            if offsets
            else False,
        }
    finally:
        cli("local", "down", "--dir", str(directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=1.0, help="partition size before the move")
    parser.add_argument("--value-bytes", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="headrace-unload-") as tmp:
        result = asyncio.run(measure(Path(tmp) / "local", args.gib, args.value_bytes))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "unload.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
