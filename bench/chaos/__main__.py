"""``python -m bench.chaos [--rounds N] [--seed S] [--out report.json]``: run the campaign.

``--targets objectstore`` runs the object-store campaign instead (``bench.chaos.objectstore``:
MinIO behind a fault proxy); it is not mixed with the other targets.

Exits 0 when the checker finds nothing wrong, 1 otherwise. The seed defaults to
a random one, printed first so that a run can be repeated.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import tempfile
from pathlib import Path

from bench.chaos import campaign, objectstore
from headrace.testing import procs

OBJECTSTORE = "objectstore"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos")
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("CHAOS_ROUNDS", "100")))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=procs.REPO / "bench" / "results" / "chaos.json")
    parser.add_argument(
        "--overlap-faults",
        action="store_true",
        help="do not wait for a restarted broker to be ready before the next round",
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory and logs")
    parser.add_argument(
        "--targets",
        default=",".join(campaign.TARGETS),
        help=f"comma-separated targets to draw rounds from (default: {','.join(campaign.TARGETS)});"
        " or objectstore alone",
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    logging.basicConfig(level=logging.ERROR)
    targets = tuple(t for t in args.targets.split(",") if t)
    store_faults = targets == (OBJECTSTORE,)
    unknown = set(targets) - set(campaign.TARGETS) - ({OBJECTSTORE} if store_faults else set())
    if unknown or not targets:
        parser.error(
            f"unknown targets {sorted(unknown)}; choose from {campaign.TARGETS},"
            f" or {OBJECTSTORE} alone"
        )
    settings = campaign.Settings(
        rounds=args.rounds,
        seed=seed,
        wait_ready=not args.overlap_faults,
        targets=campaign.TARGETS if store_faults else targets,
    )
    directory = Path(tempfile.mkdtemp(prefix="headrace-chaos-"))
    run = (
        objectstore.ObjectStoreCampaign(directory, settings)
        if store_faults
        else campaign.Campaign(directory, settings)
    )
    try:
        report = asyncio.run(run.run())
    finally:
        procs.kill_all()
        if not args.keep:
            procs.remove_dir(directory)
    campaign.save(report, args.out)
    print(campaign.table(report))
    if store_faults:
        print(objectstore.table(report))
    print(f"report: {args.out}")
    if not report["ok"]:
        print("examples:", report["examples"], file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
