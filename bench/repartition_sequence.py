"""``python -m bench.repartition_sequence [--seed S] [--no-faults]``: repartitions in a row
under keyed load, then a fresh cohort reads the whole history.

A local cluster (three brokers and the controller as processes) hosts a topic of 4
partitions, RF=3, minInSync 2. One acks=all producer sends records of 150 keys, each value
``key:seq`` with a per-key sequence number, and one cohort member consumes live the whole
time. Three Repartitions follow one another, with ``--between-s`` of load before each and
after the last: 4 -> 8, 8 -> 6 (partitions 6 and 7 retire after holding records), then
6 -> 12 (their numbers come back). With faults (the default), each is hit while its
transition marker is set, and the victims are restarted after ``--restart-delay`` seconds
drawn from the seed (0.5 to 3 s by default):

* the grow to 8: kill -9 the leader of a random partition;
* the shrink to 6: kill -9 the controller;
* the grow to 12: kill -9 two brokers at once.

Then the load stops and the campaign's checker (``bench.chaos.checking``) judges it as it
judges a fault campaign: every acknowledged record stored once with offsets unique per
partition, every one delivered to the running cohort, each key in order; and a cohort
created afterwards reads every acknowledged record from the earliest offsets, each key in
order across the partitioning history. Reported besides: how long acknowledged produce took
to resume after each fault, and the longest gap between two acknowledged batches.

The cluster, topic, load and checks are the fault campaign's (``bench.chaos.campaign``);
only the rounds differ. Writes ``bench/results/repartition-sequence-seed-S.json``; exits 0
when the checker finds nothing wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos import campaign
from bench.chaos.campaign import TOPIC, Campaign, Round, Settings
from headrace.testing import procs


@dataclass(frozen=True, slots=True)
class Step:
    partitions: int
    #: the fault while the transition marker is set: "leader", "controller", "two-brokers"
    fault: str


#: 4 -> 8 -> 6 -> 12: a grow, a shrink retiring partitions that took records, and a grow
#: that brings the retired partition numbers back
STEPS = (Step(8, "leader"), Step(6, "controller"), Step(12, "two-brokers"))


class RepartitionSequence(Campaign):
    """The fault campaign's run with ``STEPS`` for rounds."""

    def __init__(
        self,
        directory: Path,
        seed: int,
        *,
        faults: bool,
        between_s: float,
        restart_delay_s: tuple[float, float],
    ) -> None:
        settings = Settings(
            rounds=len(STEPS),
            seed=seed,
            partitions=4,
            keys=150,
            members=1,
            targets=("repartition",),
            restart_delay_s=restart_delay_s,
            max_partitions=12,
            warmup_s=between_s,
        )
        super().__init__(directory, settings)
        self.faults = faults
        self.between_s = between_s

    async def _round(self, index: int) -> Round:
        step = STEPS[index]
        c = self.cluster
        partition = self.rng.randrange(self.partitions)
        down_s = self.rng.uniform(*self.settings.restart_delay_s)
        if index > 0:
            await asyncio.sleep(self.between_s)  # load on the previous partitioning
        r = Round(index, "repartition", partition, "", down_s if self.faults else 0.0)
        r.kind = f"to {step.partitions}" + (f", kill {step.fault}" if self.faults else "")
        r.partitions_before = self.partitions
        name = f"sequence-{index}-to-{step.partitions}"
        try:
            if not self.faults:
                await self._repartition_to(r, step.partitions, name)
            else:
                applied = await self._repartition_to(r, step.partitions, name, wait=False)
                victims: list[int] = []
                if step.fault == "controller":
                    r.victim = "controller"
                    c.kill_controller()
                else:
                    part = (await asyncio.to_thread(c.partitions, TOPIC))[partition]
                    leader = part["leader"] if part["leader"] is not None else part["replicas"][0]
                    victims = [leader]
                    if step.fault == "two-brokers":
                        victims.append(
                            next(b["id"] for b in c.record["brokers"] if b["id"] != leader)
                        )
                    r.victim = "brokers " + "+".join(str(v) for v in victims)
                    for v in victims:
                        c.kill_broker(v)
                acked_at_fault = self.traffic.acked_count()
                await asyncio.sleep(down_s)
                if step.fault == "controller":
                    await asyncio.to_thread(c.restart_controller)
                for v in victims:
                    await asyncio.to_thread(c.restart_broker, v)
                await self._recovered(r, time.monotonic(), applied)
                r.note = (
                    f"{acked_at_fault} acknowledged at the fault,"
                    f" {self.traffic.acked_count()} when the round ended"
                    + (f"; {r.note}" if r.note else "")
                )
        except TimeoutError as exc:
            r.note = str(exc)
        r.partitions_after = self.partitions
        return r

    def _report(self, verdict: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
        """The campaign's report, with the topic's partitioning history as the controller
        keeps it at the end (the cutover offsets a fresh cohort's holds come from)."""
        report = super()._report(verdict, elapsed_s)
        topics = (self.cluster.state().get("cluster") or {}).get("topics") or []
        topic = next((t for t in topics if t["name"] == TOPIC), {})
        report["history"] = topic.get("history")
        return report


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.repartition_sequence")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-faults", action="store_true", help="repartition without kills")
    parser.add_argument(
        "--between-s", type=float, default=8.0, help="load before each Repartition and after"
    )
    parser.add_argument(
        "--restart-delay",
        type=float,
        nargs=2,
        default=(0.5, 3.0),
        metavar=("MIN", "MAX"),
        help="a victim stays dead for uniform(MIN, MAX) seconds",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory and logs")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    out = args.out or (procs.REPO / "bench" / "results" / f"repartition-sequence-seed-{seed}.json")
    logging.basicConfig(level=logging.ERROR)
    directory = Path(tempfile.mkdtemp(prefix="headrace-repartition-sequence-"))
    run = RepartitionSequence(
        directory,
        seed,
        faults=not args.no_faults,
        between_s=args.between_s,
        restart_delay_s=(args.restart_delay[0], args.restart_delay[1]),
    )
    try:
        report = asyncio.run(run.run())
    finally:
        procs.kill_all()
        if not args.keep:
            procs.remove_dir(directory)
    report["faults"] = not args.no_faults
    campaign.save(report, out)
    print(campaign.table(report))
    for r in report["round_log"]:
        print(
            f"round {r['index']}: {r['kind']}, victim {r['victim'] or '-'},"
            f" down {r['down_s']:.2f}s, produce resumed {r['produce_resumed_s']}s,"
            f" finalized {r['finalize_s']}s  {r['note']}"
        )
    print(f"report: {out}")
    if not report["ok"]:
        print("examples:", report["examples"], file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
