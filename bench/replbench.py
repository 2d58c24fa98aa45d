"""``python -m bench.replbench``: what replication costs, RF=3 acks=all against RF=1.

One ``headrace local up`` cluster (three brokers and the controller), two
topics on it, RF=1 and RF=3 (minInSync 2), and back-to-back runs that
alternate between them (``--rounds`` pairs), so that a change in the other
load on this shared machine hits both sides alike. Each run is a fresh
``bench.worker`` ``hr_produce`` process. Per run it prints the rate, each
broker's CPU seconds per million records (from ``/proc``), the client's, and
the foreign cores and load average at the time; at the end the median of each
side and the RF=3 / RF=1 ratios. CPU per record swings far less with other
load than the rate does, but it is not immune: on this VM contention and
first touches of cold memory raise it (``docs/benchmarks.md``, "Replication
efficiency").

``--profile`` also runs ``py-spy record`` on the RF=3 leader and on one
follower during one more RF=3 run and prints each one's top functions by
own time (py-spy must be installed: ``.venv/bin/pip install py-spy``);
``--perf`` does the same with ``perf record`` (CPU time only, the kernel side
of syscalls included; needs perf and the rights to attach).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from bench.peerservers import HeadraceLocal
from headrace.testing import procs


def _leaders(cluster: HeadraceLocal, topic: str) -> list[int]:
    return [int(p["leader"]) for p in cluster.partitions(topic) if p.get("leader") is not None]


def _replica_fetches(cluster: HeadraceLocal) -> float:
    """Replica fetches the brokers have served, all together (their /metrics)."""
    total = 0.0
    for b in cluster.record["brokers"]:
        url = f"http://{b['host']}:{b['admin_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("headrace_replica_fetches_total "):
                    total += float(line.split()[1])
    return total


def _run(
    cluster: HeadraceLocal, topic: str, args: argparse.Namespace, pids: dict[int, int]
) -> dict[str, Any]:
    spec = {
        "kind": "hr_produce",
        "server_pids": [pids[b] for b in sorted(pids)],
        "bootstrap": cluster.bootstrap,
        "topic": topic,
        "value_bytes": args.value_bytes,
        "api": args.api,
        "acks": args.acks,
        "warmup_s": args.warmup_s,
        "duration_s": args.duration_s,
        **({"max_in_flight": args.max_in_flight} if args.max_in_flight else {}),
    }
    load1 = os.getloadavg()[0]
    fetches0 = _replica_fetches(cluster)
    result = procs.run_worker(spec, timeout=120 + 4 * args.duration_s)
    # over the warm-up and the flush too: per second of the whole run, roughly
    fetches = _replica_fetches(cluster) - fetches0
    rate = float(result["records_per_s"])
    cpu = result["cpu"]
    per_m = {b: round(cpu[f"server{i}_cores"] / rate * 1e6, 3) for i, b in enumerate(sorted(pids))}
    # Each process's cores on a CPU and cores runnable but waiting for one (schedstat):
    # a chain of processes that are neither is waiting on one another.
    names = {f"server{i}": f"b{b}" for i, b in enumerate(sorted(pids))} | {"client": "client"}
    busy = {label: cpu[f"{name}_cores"] for name, label in names.items()}
    runq = {label: cpu.get(f"runq_{name}_cores") for name, label in names.items()}
    return {
        "busy_cores": busy,
        "runq_cores": runq,
        "topic": topic,
        "records_per_s": rate,
        "server_cpu_s_per_m": per_m,
        "servers_cpu_s_per_m": round(sum(per_m.values()), 3),
        "client_cpu_s_per_m": round(cpu["client_cores"] / rate * 1e6, 3),
        "foreign_cores": cpu.get("foreign_cores"),
        "kernel_cores": cpu.get("kernel_cores"),
        "load1": round(load1, 2),
        "total_sent": result["total_sent"],
        "replica_fetches_per_mb": round(
            fetches / max(result["total_sent"] * args.value_bytes / 1e6, 1e-9), 2
        ),
    }


def _say(label: str, row: dict[str, Any]) -> None:
    brokers = " ".join(f"b{b}={v:.3f}" for b, v in row["server_cpu_s_per_m"].items())
    print(
        f"{label:>4} {row['records_per_s'] / 1e6:6.3f}M/s  server s/M {row['servers_cpu_s_per_m']:.3f}"
        f" ({brokers})  client s/M {row['client_cpu_s_per_m']:.3f}"
        f"  foreign {row['foreign_cores']}  kernel {row['kernel_cores']}  load1 {row['load1']}"
        f"  replica fetches/MB {row['replica_fetches_per_mb']}",
        flush=True,
    )
    print(
        "     on a CPU "
        + " ".join(f"{k}={v:.2f}" for k, v in row["busy_cores"].items())
        + "  waiting for one "
        + " ".join(f"{k}={v:.2f}" for k, v in row["runq_cores"].items() if v is not None),
        flush=True,
    )


def _own_time(folded: Path, top: int) -> list[tuple[str, float]]:
    """Each function's share of the samples where it is the innermost frame."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        own[stack.split(";")[-1]] += n
    return [(name, 100.0 * n / total) for name, n in own.most_common(top)] if total else []


def _profile(
    cluster: HeadraceLocal, topic: str, args: argparse.Namespace, pids: dict[int, int]
) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    leader = _leaders(cluster, topic)[0]
    follower = next(b for b in sorted(pids) if b != leader)
    out = Path(procs.temp_dir("replbench-profile"))
    seconds = int(args.warmup_s + args.duration_s)
    spies = {
        role: (
            subprocess.Popen(
                [spy, "record", "--format", "raw", "--nonblocking", "-r", "200",
                 "-d", str(seconds), "-p", str(pids[b]), "-o", str(out / f"{role}.txt")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            b,
        )
        for role, b in (("leader", leader), ("follower", follower))
    }  # fmt: skip
    row = _run(cluster, topic, args, pids)
    _say("prof", row)
    for role, (proc, broker) in spies.items():
        proc.wait(timeout=60)
        folded = out / f"{role}.txt"
        print(f"-- {role} (broker {broker}), own time, % of samples; stacks in {folded}")
        if folded.exists():
            for name, share in _own_time(folded, args.top):
                print(f"   {share:5.1f}%  {name}")


def _perf(
    cluster: HeadraceLocal, topic: str, args: argparse.Namespace, pids: dict[int, int]
) -> None:
    """``perf record`` (user and kernel, CPU time only) on the leader and one follower
    during one run: where the CPU goes, syscalls' kernel side included, which py-spy
    (wall time of the Python stack) cannot split."""
    leader = _leaders(cluster, topic)[0]
    follower = next(b for b in sorted(pids) if b != leader)
    out = Path(procs.temp_dir("replbench-perf"))
    seconds = args.warmup_s + args.duration_s
    perfs = {
        role: (
            subprocess.Popen(
                ["perf", "record", "-F", "499", "-g", "-p", str(pids[b]),
                 "-o", str(out / f"{role}.data"), "--", "sleep", str(seconds)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            b,
        )
        for role, b in (("leader", leader), ("follower", follower))
    }  # fmt: skip
    row = _run(cluster, topic, args, pids)
    _say("perf", row)
    for role, (proc, broker) in perfs.items():
        proc.wait(timeout=120)
        data = out / f"{role}.data"
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym",
             "--stdio", "-g", "none", "--percent-limit", "0.7"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        print(f"-- {role} (broker {broker}), CPU samples by function; data in {data}")
        for line in report.stdout.splitlines():
            if line.strip() and not line.startswith("#"):
                print("   " + line.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replbench", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="RF=1/RF=3 pairs, back to back")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--api", choices=("send_many", "send"), default="send_many")
    parser.add_argument("--acks", choices=("all", "leader"), default="all")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the RF=3 leader and a follower"
    )
    parser.add_argument(
        "--max-in-flight", type=int, default=0, help="the producer's (0: its default)"
    )
    parser.add_argument(
        "--perf", action="store_true", help="perf record the RF=3 leader and a follower"
    )
    parser.add_argument(
        "--fsync", choices=("interval", "always", "none"), default="interval",
        help="the brokers' fsync policy (the peers comparison uses interval, ~1 s)",
    )  # fmt: skip
    parser.add_argument(
        "--tiered", action="store_true", help="tier the topics too (a local cluster's default)"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)

    home = procs.temp_dir("replbench")
    cluster = HeadraceLocal(home / "cluster", 3, args.fsync)
    rows: dict[str, list[dict[str, Any]]] = {"rf1": [], "rf3": []}
    try:
        cluster.start()
        pids = cluster.broker_pids()
        # untiered unless asked: a local cluster tiers every topic to its directory object
        # store by default, and that upload (a full copy of the log, fsynced) is not
        # replication
        cluster.create_topic("rf1", args.partitions, 1, 1, tiered=args.tiered)
        cluster.create_topic("rf3", args.partitions, 3, 2, tiered=args.tiered)
        print(
            f"brokers {pids}; rf1 leaders {_leaders(cluster, 'rf1')},"
            f" rf3 leaders {_leaders(cluster, 'rf3')}; {args.api} acks={args.acks}"
            f" {args.partitions} partition(s), {args.value_bytes} B, tiered={args.tiered}",
            flush=True,
        )
        for _ in range(args.rounds):
            for topic in ("rf1", "rf3"):
                row = _run(cluster, topic, args, pids)
                rows[topic].append(row)
                _say(topic, row)
        if args.rounds:
            rate = {t: statistics.median(r["records_per_s"] for r in rows[t]) for t in rows}
            cpu = {t: statistics.median(r["servers_cpu_s_per_m"] for r in rows[t]) for t in rows}
            ratios = [
                b["records_per_s"] / a["records_per_s"]
                for a, b in zip(rows["rf1"], rows["rf3"], strict=True)
            ]
            print(
                f"median rf1 {rate['rf1'] / 1e6:.3f}M/s {cpu['rf1']:.3f} s/M;"
                f" rf3 {rate['rf3'] / 1e6:.3f}M/s {cpu['rf3']:.3f} s/M;"
                f" RF=3/RF=1 per pair {[round(x, 2) for x in ratios]},"
                f" of the medians {rate['rf3'] / rate['rf1']:.2f}",
                flush=True,
            )
        if args.profile:
            _profile(cluster, "rf3", args, pids)
        if args.perf:
            _perf(cluster, "rf3", args, pids)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    finally:
        cluster.stop()
        procs.remove_dir(home)
    return 0


if __name__ == "__main__":
    sys.exit(main())
