"""``python -m bench.fuzz [--protocol native|kafka] [--seconds N] [--count N]
[--engine auto|atheris|random] [--out report.json]``.

Exits 0 when there was no crash, no hang, nothing acknowledged was lost and (Kafka)
no record of a malformed Produce was stored. The report goes to
``bench/results/fuzz.json`` (native) or ``fuzz-kafka.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from bench.fuzz import running
from headrace.testing import procs

#: how long a run of ``--count`` inputs may take at most (a busy machine sends slowly)
_COUNT_BOUND_S = 1800.0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz")
    parser.add_argument("--protocol", choices=("native", "kafka"), default="native")
    parser.add_argument(
        "--seconds", type=float, default=None, help="300 without --count; with it, a bound"
    )
    parser.add_argument("--count", type=int, default=None, help="stop after this many inputs")
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seconds = args.seconds
    if seconds is None:
        seconds = 300.0 if args.count is None else _COUNT_BOUND_S
    settings = running.Settings(
        seconds=seconds,
        protocol=args.protocol,
        count=args.count,
        engine=args.engine,
        seed=args.seed,
    )
    name = "fuzz.json" if args.protocol == "native" else f"fuzz-{args.protocol}.json"
    out: Path = args.out or procs.REPO / "bench" / "results" / name
    with tempfile.TemporaryDirectory(prefix="headrace-fuzz-") as tmp:
        try:
            report = asyncio.run(running.run(Path(tmp), settings))
        finally:
            procs.kill_all()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    for key in (
        "engine",
        "inputs",
        "frames",
        "bytes",
        "answers",
        "errors_answered",
        "error_codes",
        "closed_by_broker",
        "crashes",
        "hangs",
        "slowest_ping_s",
        "tracebacks_in_broker_log",
        "acknowledged",
        "lost",
        "duplicated",
        "well_formed_produce_records",
        "stored_seed_records",
        "stored_bad_records",
        "ok",
    ):
        if key in report:
            print(f"{key:26s} {report[key]}")
    print(f"report: {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
