"""``python -m bench.creating``: how long, and how much CPU, creating many partitions costs.

The creation half of the scale scenario (``bench.peerbench --only scale``) on its own, so
it can be rerun and profiled: ``headrace local up`` with 3 brokers, ``--partitions`` in
topics of at most 4,096 with RF=3, then the time until every partition has a leader and
until the controller has settled (``peerbench._wait_settled``), and the CPU seconds each
process spent from the first create until settled. ``--profile DIR`` records every
broker and the controller with py-spy (``pip install py-spy``) over the same window,
one flame graph each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import peerbench
from bench.peerservers import HeadraceLocal
from headrace.testing import procs


def _py_spy(pid: int, out: Path, native: bool) -> subprocess.Popen[bytes]:
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [binary, "record", "--pid", str(pid), "--rate", "50", "--subprocesses",
            "--output", str(out), "--format", "speedscope" if out.suffix == ".json" else "flamegraph",
            "--nonblocking"]  # fmt: skip
    if native:
        argv.append("--native")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def create(
    total: int, profile: Path | None = None, log: bool = True, keep_logs: Path | None = None
) -> dict[str, Any]:
    home = procs.temp_dir("create")
    cluster = HeadraceLocal(home / "cluster", 3, "interval")
    try:
        cluster.start()
        record = cluster.record
        pids = {f"broker{b['id']}": int(b["pid"]) for b in record["brokers"]}
        pids["controller"] = int(record["controller_pid"])
        spies: list[subprocess.Popen[bytes]] = []
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spies = [_py_spy(pid, profile / f"{name}.svg", False) for name, pid in pids.items()]
            time.sleep(1.0)  # py-spy attaches
        meter = procs.CpuMeter(pids)
        meter.start()
        started = time.perf_counter()
        names = peerbench.create_idle_topics(cluster, total)
        led_s = time.perf_counter() - started
        led_cpu = {name: procs.process_cpu_s(pid) - meter.cpu0[name] for name, pid in pids.items()}
        settled_s = peerbench._wait_settled(cluster.controller_url, 600) + led_s
        cores = meter.stop()
        elapsed = time.perf_counter() - started
        for spy in spies:
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for spy in spies:
            spy.wait(60)
        row = {
            "partitions": total,
            "topics": len(names),
            "led_s": round(led_s, 2),
            "settled_s": round(settled_s, 2),
            "cpu_s_until_led": {k: round(v, 2) for k, v in led_cpu.items()},
            "cpu_s_until_settled": {
                name: round(cores[f"{name}_cores"] * elapsed, 2) for name in pids
            },
            "foreign_cores": cores["foreign_cores"],
            "kernel_cores": cores["kernel_cores"],
            "load1": round(os.getloadavg()[0], 2),
        }
        if log:
            print(json.dumps(row), flush=True)
        return row
    finally:
        cluster.stop()
        if keep_logs is not None:
            shutil.copytree(cluster.dir / "logs", keep_logs / str(total), dirs_exist_ok=True)
        procs.remove_dir(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="1000,10000", help="comma-separated sizes")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy flame graphs here")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy the logs here")
    args = parser.parse_args()
    for total in (int(x) for x in args.partitions.split(",")):
        create(total, args.profile / str(total) if args.profile else None, keep_logs=args.keep_logs)


if __name__ == "__main__":
    main()
