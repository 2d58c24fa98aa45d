"""How long a local cluster takes to scale 3 -> 4 -> 3 brokers with data on it (replica moves).

    .venv/bin/python -m bench.scaling [--partitions 24] [--records 20000] [--value-bytes 1024]

Starts a real local cluster (3 brokers), applies a topic (RF 3, minInSync 2),
loads it with acks=all records, then times ``headrace local add-broker`` (a
share of the replicas is copied to broker 3 and the old copies removed) and
``headrace local remove-broker`` (broker 3's replicas copied back off, then it
stops). Each command waits until the controller reports no move in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from headrace.client import Producer
from headrace.testing.procs import run_headrace
from tests.integration.localcluster import LocalCluster, topic_manifest

TOPIC = "default/scaling-bench"


async def load(bootstrap: str, records: int, value_bytes: int) -> None:
    value = b"x" * value_bytes
    async with Producer(bootstrap, acks="all", linger_ms=5) as producer:
        receipts = [
            await producer.send("scaling-bench", value, key=str(i).encode()) for i in range(records)
        ]
        await asyncio.gather(*receipts)


def timed(c: LocalCluster, *args: str) -> float:
    started = time.monotonic()
    proc = run_headrace("local", *args, "--dir", str(c.dir), timeout=900)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"headrace local {' '.join(args)} failed: {proc.stderr.decode()}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", type=int, default=24)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        c = LocalCluster(Path(tmp) / "local")
        c.up()
        try:
            assert c.apply(topic_manifest("scaling-bench", args.partitions)).returncode == 0
            c.wait(
                lambda: (
                    len(c.partitions(TOPIC)) == args.partitions
                    and all(p["state"] == "Online" for p in c.partitions(TOPIC))
                ),
                what="topic online",
            )
            asyncio.run(load(c.bootstrap, args.records, args.value_bytes))
            mib = args.records * args.value_bytes / 2**20
            up = timed(c, "add-broker", "--timeout", "600")
            moved_on = sum(3 in p["replicas"] for p in c.partitions(TOPIC))
            down = timed(c, "remove-broker", "--timeout", "600")
            print(
                f"{args.partitions} partitions x 3 replicas, {mib:.1f} MiB of values:"
                f" add-broker {up:.1f} s ({moved_on} replicas moved onto broker 3),"
                f" remove-broker {down:.1f} s (moved back off, broker stopped)"
            )
        finally:
            c.down()


if __name__ == "__main__":
    main()
