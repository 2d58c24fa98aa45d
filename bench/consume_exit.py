"""``python -m bench.consume_exit``: how long ``headrace consume --count N`` takes to exit
after printing its last record.

A local cluster (``headrace local up``: three brokers and the controller, on free ports)
holds a 6-partition topic of ``--records`` lines produced with ``headrace produce``. Each
run is ``headrace consume TOPIC --cohort exit-K --count N --from-beginning`` as a user
types it (a new cohort each run, so each starts at the beginning); the figure is the
time from reading its N-th line on its stdout to its exit, which covers the member's
close (acks, leave, releases), the connections' shutdown and the interpreter's. The
time to the first line (start-up, joins, the controller's cohort plan) is reported
apart. The machine's busy cores before the runs say how loaded it was.

Writes ``bench/results/consume_exit.json``.

    .venv/bin/python -m bench.consume_exit [--runs 5] [--count 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from headrace.testing import procs

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOPIC = "exits"
PARTITIONS = 6


def cli(directory: Path, *args: str, stdin: bytes = b"") -> str:
    proc = procs.run_headrace(*args, "--dir", str(directory), stdin=stdin, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"headrace {' '.join(args)}: {proc.stderr.decode()}")
    return proc.stdout.decode()


def one_run(directory: Path, cohort: str, count: int) -> dict[str, float]:
    started = time.monotonic()
    consumer = subprocess.Popen(
        [
            *procs.HEADRACE_CLI, "consume", TOPIC, "--cohort", cohort, "--count", str(count),
            "--from-beginning", "--idle-timeout", "60", "--dir", str(directory),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=procs.child_env(),
    )  # fmt: skip
    assert consumer.stdout is not None
    assert consumer.stderr is not None
    first = 0.0
    for seen in range(1, count + 1):
        if not consumer.stdout.readline():
            consumer.kill()
            raise RuntimeError(f"consume printed {seen - 1} of {count} records")
        if seen == 1:
            first = time.monotonic()
    last = time.monotonic()
    code = consumer.wait(timeout=120)
    exited = time.monotonic()
    if code != 0:
        raise RuntimeError(f"consume exited with {code}: {consumer.stderr.read().decode()}")
    return {
        "first_record_s": round(first - started, 3),
        "last_record_s": round(last - started, 3),
        "last_record_to_exit_s": round(exited - last, 3),
    }


def measure(directory: Path, runs: int, count: int, records: int) -> dict[str, Any]:
    cli(
        directory, "local", "up", "--brokers", "3",
        "--port", str(procs.free_port()), "--admin-port", str(procs.free_port()),
        "--controller-port", str(procs.free_port()),
    )  # fmt: skip
    try:
        cli(directory, "topics", "create", TOPIC, "-p", str(PARTITIONS))
        lines = b"".join(b"record-%d\n" % i for i in range(records))
        cli(directory, "produce", TOPIC, stdin=lines)
        busy = procs.machine_busy_cores()
        results = [one_run(directory, f"exit-{k}", count) for k in range(runs)]
    finally:
        cli(directory, "local", "down")
    exits = [r["last_record_to_exit_s"] for r in results]
    return {
        "scenario": "consume_exit",
        "brokers": 3,
        "partitions": PARTITIONS,
        "topic_records": records,
        "count": count,
        "busy_cores_before": round(busy, 2),
        "last_record_to_exit_s": {
            "median": round(statistics.median(exits), 3),
            "min": min(exits),
            "max": max(exits),
        },
        "runs": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=100, help="consume --count")
    parser.add_argument("--records", type=int, default=10_000, help="lines in the topic")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="headrace-consume-exit-") as tmp:
        result = measure(Path(tmp) / "local", args.runs, args.count, args.records)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "consume_exit.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
