"""How long a kill -9'd broker stays in the live replica sets, and how long its leaderships
take to come back after it restarts, as the controller (``local status``) shows them.

    .venv/bin/python -m bench.lrs_drop [--runs N]

Starts a real local cluster (3 brokers, a topic with 3 partitions x 3 replicas,
default settings), kills one broker with SIGKILL and polls the controller's
``/v1/state`` every 50 ms until no partition lists the broker in its LRS any
more. Then restarts it and measures until every partition is led by its
preferred replica again (the preferred-leader quiet period, 10 s by default,
is part of it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.integration.localcluster import LocalCluster, topic_manifest

TOPIC = "default/lrs-drop"


def listed(c: LocalCluster, broker: int) -> bool:
    return any(broker in p["liveReplicas"] for p in c.partitions(TOPIC))


def everywhere(c: LocalCluster, broker: int) -> bool:
    parts = c.partitions(TOPIC)
    return bool(parts) and all(broker in p["liveReplicas"] for p in parts)


def preferred_lead(c: LocalCluster) -> bool:
    parts = c.partitions(TOPIC)
    return bool(parts) and all(p["leader"] == p["replicas"][0] for p in parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lrs-drop-") as tmp:
        c = LocalCluster(Path(tmp), 3)
        c.up()
        try:
            c.apply(topic_manifest("lrs-drop", 3, replicas=3, min_in_sync=1))
            figures = []
            returns = []
            for run in range(args.runs):
                victim = 1 + run % 2  # leads the partitions placed with it first
                c.wait(lambda: preferred_lead(c), 60, "preferred leaders")
                c.wait(lambda v=victim: everywhere(c, v), 60, f"broker {victim} in every LRS")
                c.kill_broker(victim)
                killed = time.monotonic()
                while listed(c, victim):
                    time.sleep(0.05)
                figures.append(time.monotonic() - killed)
                print(
                    f"run {run}: broker {victim} left every LRS {figures[-1]:.2f} s after kill -9"
                )
                c.restart_broker(victim)
                restarted = time.monotonic()
                while not preferred_lead(c):
                    time.sleep(0.05)
                returns.append(time.monotonic() - restarted)
                print(
                    f"run {run}: leadership back on preferred replicas {returns[-1]:.2f} s after restart"
                )
            print(
                f"LRS drop after kill -9: median {statistics.median(figures):.2f} s,"
                f" max {max(figures):.2f} s over {len(figures)} runs"
            )
            print(
                f"preferred leaders back after restart: median {statistics.median(returns):.2f} s,"
                f" max {max(returns):.2f} s over {len(returns)} runs"
            )
        finally:
            c.down()


if __name__ == "__main__":
    main()
