"""``python -m bench.chaos [--rounds N] [--seed S] [--out report.json]``: run the campaign.

``--targets objectstore`` runs the object-store campaign instead (``bench.chaos.objectstore``:
MinIO behind a fault proxy); it is not mixed with the other targets.

Exits 0 when the checker finds nothing wrong, 1 otherwise. The seed defaults to
a random one, printed first so that a run can be repeated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from bench.chaos import campaign, objectstore, runner

OBJECTSTORE = "objectstore"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos")
    parser.add_argument(
        "--overlap-faults",
        action="store_true",
        help="do not wait for a restarted broker to be ready before the next round",
    )
    parser.add_argument(
        "--targets",
        default=",".join(campaign.TARGETS),
        help=f"comma-separated targets to draw rounds from (default: {','.join(campaign.TARGETS)});"
        " or objectstore alone",
    )

    store_faults = False

    def settings(args: argparse.Namespace, seed: int) -> campaign.Settings:
        nonlocal store_faults
        targets = tuple(t for t in args.targets.split(",") if t)
        store_faults = targets == (OBJECTSTORE,)
        unknown = set(targets) - set(campaign.TARGETS) - ({OBJECTSTORE} if store_faults else set())
        if unknown or not targets:
            parser.error(
                f"unknown targets {sorted(unknown)}; choose from {campaign.TARGETS},"
                f" or {OBJECTSTORE} alone"
            )
        return campaign.Settings(
            rounds=args.rounds,
            seed=seed,
            wait_ready=not args.overlap_faults,
            targets=campaign.TARGETS if store_faults else targets,
        )

    def run(settings: campaign.Settings, directory: Path) -> dict[str, Any]:
        chosen = (
            objectstore.ObjectStoreCampaign(directory, settings)
            if store_faults
            else campaign.Campaign(directory, settings)
        )
        return asyncio.run(chosen.run())

    def table(report: dict[str, Any]) -> str:
        rows = campaign.table(report)
        return f"{rows}\n{objectstore.table(report)}" if store_faults else rows

    return runner.main(
        parser,
        rounds=int(os.environ.get("CHAOS_ROUNDS", "100")),
        out="chaos.json",
        settings=settings,
        run=run,
        table=table,
    )


if __name__ == "__main__":
    sys.exit(main())
