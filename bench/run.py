"""``python -m bench.run``: run the benchmark scenarios and publish the results.

Writes ``<out>/<UTC timestamp>.json`` (this run only), merges it into
``<out>/latest.json`` (a partial run -- ``--only`` or ``--systems`` -- keeps
the other scenarios' previous rows, each scenario stamped with its own run
time), renders ``<out>/latest.png`` and rewrites the results section of
``docs/benchmarks.md`` between its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from bench import report, scenarios
from headrace import files
from headrace.testing import procs

DOCS = procs.REPO / "docs" / "benchmarks.md"
#: a scenario whose rows saw more foreign CPU than this on average is repeated once
BUSY_FOREIGN_CORES = 0.3


#: what identifies "the same measurement" across attempts of a scenario
ROW_KEY = ("system", "client", "durability", "partitions", "value_bytes", "rate", "size_gb")


def _row_foreign(row: dict[str, Any]) -> float:
    return float(row.get("cpu", {}).get("foreign_cores", 0.0))


def _foreign(rows: list[dict[str, Any]]) -> float:
    values = [_row_foreign(r) for r in rows if "cpu" in r]
    return round(sum(values) / len(values), 3) if values else 0.0


def _headline(row: dict[str, Any]) -> dict[str, Any]:
    """The few numbers that say how a discarded attempt differed."""
    out: dict[str, Any] = {"attempt": row["attempt"], "foreign_cores": _row_foreign(row)}
    if "records_per_s" in row:
        out["records_per_s"] = row["records_per_s"]
    if "mb_per_s" in row:
        out["mb_per_s"] = row["mb_per_s"]
    if "latency_ms" in row:
        out["latency_ms"] = row["latency_ms"]
    return out


def _combine(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario result from its attempts: per measurement, the least disturbed one.

    The same rule applies to every system; the discarded numbers stay in the
    row under ``other_attempts`` so nothing is hidden.
    """
    chosen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for number, attempt in enumerate(attempts, start=1):
        for raw in attempt["rows"]:
            row = {**raw, "attempt": number}
            key = tuple(row.get(k) for k in ROW_KEY)
            current = chosen.get(key)
            if current is None:
                chosen[key] = row
                continue
            keep, drop = (
                (row, current) if _row_foreign(row) < _row_foreign(current) else (current, row)
            )
            keep["other_attempts"] = [
                *current.get("other_attempts", []),
                _headline(drop),
            ]
            chosen[key] = keep
    rows = list(chosen.values())
    first = attempts[0]
    return {
        "run_utc": first["run_utc"],
        "quick": first["quick"],
        "load": first["load"],
        "seconds": round(sum(a["seconds"] for a in attempts), 1),
        "attempts": [
            {k: a[k] for k in ("run_utc", "load", "seconds", "mean_foreign_cores")}
            for a in attempts
        ],
        "mean_foreign_cores": _foreign(rows),
        "rows": rows,
    }


def _settle(limit_s: float, log: Any) -> dict[str, Any]:
    """Wait (up to ``limit_s``) for other processes to leave the cores idle; the load then."""
    deadline = time.monotonic() + limit_s
    while True:
        load = scenarios.load_snapshot()
        if load["busy_cores_before"] <= BUSY_FOREIGN_CORES or time.monotonic() >= deadline:
            return load
        log(f"   machine busy ({load['busy_cores_before']} cores): waiting for it to settle")
        time.sleep(5.0)


def _git(*argv: str) -> str:
    return subprocess.run(
        ["git", *argv], cwd=procs.REPO, capture_output=True, text=True, timeout=30, check=True
    ).stdout.strip()


def checkout_ref(ref: str) -> tuple[Path, str]:
    """Export the code roots at ``ref`` into a temp dir (no worktree, .git untouched); (dir, sha).

    The caller removes the dir when done.
    """
    root = Path(tempfile.mkdtemp(prefix="headrace-bench-src-"))
    return root, procs.export_ref(ref, root)


def machine_info(ref_sha: str | None) -> dict[str, Any]:
    model = "?"
    mem_gb = 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    commit = "unknown"
    try:
        if ref_sha is not None:
            commit = f"{ref_sha[:10]} (exported with git archive)"
        else:
            commit = _git("rev-parse", "--short=10", "HEAD")
            if _git("status", "--porcelain", "--", *procs.CODE_ROOTS):
                commit += " + uncommitted changes in broker/ or operator/ (working tree)"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import uvloop

        loop = f"uvloop {getattr(uvloop, '__version__', '?')}"
    except ImportError:
        loop = "asyncio"
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_gb": mem_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "event_loop": loop,
        "redis": procs.redis_version(),
        "headrace_commit": commit,
    }


def _merge(
    previous: dict[str, Any], current: dict[str, Any], systems: frozenset[str]
) -> dict[str, Any]:
    """``current`` on top of ``previous``: whole scenarios, and within one, by system."""
    merged = dict(previous)
    merged["machine"] = current["machine"]
    merged["run_utc"] = current["run_utc"]
    scenarios_out = dict(previous.get("scenarios", {}))
    for name, sc in current.get("scenarios", {}).items():
        old_rows = scenarios_out.get(name, {}).get("rows", [])
        kept = [r for r in old_rows if r.get("system") not in systems]
        scenarios_out[name] = {**sc, "rows": kept + sc["rows"]}
    merged["scenarios"] = scenarios_out
    merged["targets"] = report.targets(merged)
    return merged


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="reduced sizes and durations (~4 min)")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(scenarios.SCENARIOS),
        help="run just this scenario (repeatable)",
    )
    parser.add_argument(
        "--systems",
        default="headrace,redis",
        help="comma-separated subset of headrace,redis (default both)",
    )
    parser.add_argument(
        "--ref",
        default=None,
        help="benchmark headrace's broker/ and operator/ at this git ref (exported to a temp"
        " dir) instead of the working tree, e.g. --ref HEAD while others edit them",
    )
    parser.add_argument("--out", type=Path, default=procs.REPO / "bench" / "results")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="measure nothing: re-render the plot and the docs table from <out>/latest.json",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=120.0,
        help="before each scenario, wait up to this long for other processes to go idle",
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=2,
        help="run a scenario up to this many times while other processes disturb it",
    )
    parser.add_argument(
        "--no-repeat",
        action="store_true",
        help="do not repeat a scenario that ran while other processes were busy",
    )
    parser.add_argument(
        "--recovery-sizes",
        default=None,
        help="comma-separated log sizes in GB for the recovery scenario (default 0,0.5,1,2,5)",
    )
    parser.add_argument(
        "--consume-records", type=int, default=None, help="records for catch-up (default 10M)"
    )
    return parser.parse_args(argv)


def publish(latest: dict[str, Any], out: Path, docs: bool, log: Any) -> None:
    report.plot(latest, out / "latest.png")
    table = report.markdown(latest)
    if docs and DOCS.exists() and not report.update_docs(DOCS, table):
        log(f"{DOCS} has no results markers; table not written")
    log("")
    log(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render_only:
        latest = json.loads((args.out / "latest.json").read_text())
        latest["targets"] = report.targets(latest)
        publish(latest, args.out, not args.no_docs, print)
        return 0
    systems = frozenset(s.strip() for s in args.systems.split(",") if s.strip())
    unknown = systems - {"headrace", "redis"}
    if unknown:
        print(f"unknown systems: {sorted(unknown)}", file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {"systems": systems}
    if args.recovery_sizes:
        overrides["recovery_sizes_gb"] = tuple(float(x) for x in args.recovery_sizes.split(","))
    if args.consume_records:
        overrides["consume_records"] = args.consume_records

    def log(line: str) -> None:
        print(line, flush=True)

    overrides["log"] = log
    settings = (
        scenarios.Settings.for_quick(**overrides) if args.quick else scenarios.Settings(**overrides)
    )
    selected = args.only or list(scenarios.SCENARIOS)
    ref_sha: str | None = None
    if args.ref:
        procs.HEADRACE_SRC, ref_sha = checkout_ref(args.ref)
        log(f"headrace from {args.ref} = {ref_sha[:10]} ({procs.HEADRACE_SRC})")
    run_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc: dict[str, Any] = {
        "schema": 1,
        "run_utc": run_utc,
        "quick": settings.quick,
        "machine": machine_info(ref_sha),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",) and v is not None},
        "scenarios": {},
    }
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    failed: list[str] = []
    calibration_dir = procs.temp_dir("calibration")
    time.sleep(5.0)  # let recently freed memory go back to the host first
    doc["machine"]["page_cache_write"] = procs.page_touch_cost(calibration_dir)
    procs.remove_dir(calibration_dir)
    log(f"page-cache writes, MB per CPU-second: {doc['machine']['page_cache_write']}")
    try:
        for name in selected:
            log(f"== {name}")
            attempts: list[dict[str, Any]] = []
            tries = 1 if args.no_repeat else max(1, args.attempts)
            for attempt in range(tries):
                load = _settle(args.settle_s, log)
                log(f"   load {load['loadavg']}, busy cores {load['busy_cores_before']}")
                started = time.monotonic()
                try:
                    rows = scenarios.SCENARIOS[name](settings)
                except Exception as exc:
                    log(f"   {name} FAILED: {type(exc).__name__}: {exc}")
                    log(traceback.format_exc())
                    break
                finally:
                    procs.kill_all()
                foreign = _foreign(rows)
                attempts.append(
                    {
                        "run_utc": load["at_utc"],
                        "quick": settings.quick,
                        "load": load,
                        "seconds": round(time.monotonic() - started, 1),
                        "mean_foreign_cores": foreign,
                        "rows": rows,
                    }
                )
                busy = [r for r in rows if _row_foreign(r) > BUSY_FOREIGN_CORES]
                if not busy:
                    break
                log(f"   other processes were busy during {len(busy)} of {len(rows)} measurements")
                if attempt + 1 < tries:
                    log("   repeating it")
            if not attempts:
                failed.append(name)
                continue
            doc["scenarios"][name] = {
                **_combine(attempts),
                "headrace_commit": doc["machine"]["headrace_commit"],
            }
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
    finally:
        procs.kill_all()
        if procs.HEADRACE_SRC is not None:
            shutil.rmtree(procs.HEADRACE_SRC, ignore_errors=True)

    if not doc["scenarios"]:
        return 1
    doc["targets"] = report.targets(doc)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    stamp = run_utc.replace(":", "").replace("-", "")
    (out / f"{stamp}.json").write_text(json.dumps(doc, indent=2) + "\n")
    latest_path = out / "latest.json"
    previous: dict[str, Any] = {}
    if latest_path.exists():
        try:
            previous = json.loads(latest_path.read_text())
        except ValueError:
            previous = {}
    latest = _merge(previous, doc, systems)
    files.write_atomic(latest_path, (json.dumps(latest, indent=2) + "\n").encode(), sync=False)
    publish(latest, out, not args.no_docs, log)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
