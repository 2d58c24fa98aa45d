"""``python -m bench.fuzz [--seconds N] [--engine auto|atheris|random] [--out report.json]``.

Exits 0 when there was no crash, no hang and nothing acknowledged was lost.
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


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=procs.REPO / "bench" / "results" / "fuzz.json")
    args = parser.parse_args()
    settings = running.Settings(seconds=args.seconds, engine=args.engine, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="headrace-fuzz-") as tmp:
        try:
            report = asyncio.run(running.run(Path(tmp), settings))
        finally:
            procs.kill_all()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for key in (
        "engine",
        "inputs",
        "frames",
        "bytes",
        "crashes",
        "hangs",
        "slowest_ping_s",
        "tracebacks_in_broker_log",
        "acknowledged",
        "lost",
        "duplicated",
        "ok",
    ):
        print(f"{key:26s} {report.get(key)}")
    print(f"report: {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
