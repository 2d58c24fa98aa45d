"""What every fault campaign's run shares: its settings' common part, the command line,
the rounds, the cluster's lifetime, and the cohort's drain and read-back at the end.

A campaign (``campaign``, ``objectstore``, ``kafka_campaign``, ``operator``) is its
faults and its report; around them each does the same things:

* ``RunSettings``: rounds, the seed, and the keyed load's shape (partitions, keys, burst,
  tick), which each campaign's ``Settings`` extends with its own defaults and knobs;
* ``main``: ``--rounds``, ``--seed`` (a random one when not given), ``--out`` (the report
  JSON under ``bench/results/``) and ``--keep``; a fresh directory for the run, removed
  unless kept; the report saved, its table printed, the examples of a failure on stderr,
  and the exit status (0: the checker found nothing wrong);
* ``play_rounds``: each round in turn, kept in the round log and reported in one line;
* ``cluster_up``: a local cluster up for the run and down after it, whatever happens;
* ``Cohort``: the members of a consuming cohort started, drained of everything
  acknowledged and closed, and ``read_back``: every partition read from offset 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.chaos import checking
from bench.chaos.traffic import KeyedTraffic, Member, read_delivery_log
from headrace.client import Consumer
from headrace.errors import HeadraceError
from headrace.testing import procs
from headrace.testing.reading import read_partition
from tests.integration.localcluster import LocalCluster

S = TypeVar("S")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class RunSettings:
    """The part of a campaign's settings every campaign has."""

    #: faults played, one a round
    rounds: int = 100
    #: draws every round's target, victim and delays: the same seed plays the same rounds
    seed: int = 0
    #: the topic's partitions at the start (a campaign's repartitions change the count)
    partitions: int = 3
    #: the load's keys, each with its own sequence of values (``key:seq``)
    keys: int = 24
    #: records sent per tick, and the pause between ticks (about 1000 records/s at the default;
    #: the machine is shared, so the load is steady rather than maximal)
    burst: int = 20
    tick_s: float = 0.02


def main(
    parser: argparse.ArgumentParser,
    *,
    rounds: int,
    out: str,
    settings: Callable[[argparse.Namespace, int], S],
    run: Callable[[S, Path], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
    examples: Callable[[dict[str, Any]], tuple[Any, ...]] = lambda report: (report["examples"],),
    kill_processes: bool = True,
    keep_help: str = "keep the cluster directory and logs",
) -> int:
    """Run one campaign from the command line: ``parser`` holds the campaign's own options;
    ``settings`` makes its settings from them and the seed (``parser.error`` on a bad one);
    ``run`` runs it in a fresh directory and gives the report; ``out`` names the report's
    file under ``bench/results/``. With ``kill_processes``, every process the harness
    started is killed after the run (a campaign on the test bed leaves that to it)."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=procs.REPO / "bench" / "results" / out)
    parser.add_argument("--keep", action="store_true", help=keep_help)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    logging.basicConfig(level=logging.ERROR)
    chosen = settings(args, seed)
    directory = Path(tempfile.mkdtemp(prefix=f"headrace-{Path(out).stem}-"))
    try:
        report = run(chosen, directory)
    finally:
        if kill_processes:
            procs.kill_all()
        if not args.keep:
            procs.remove_dir(directory)
    save(report, args.out)
    print(table(report))
    print(f"report: {args.out}")
    if not report["ok"]:
        print("examples:", *examples(report), file=sys.stderr)
    return 0 if report["ok"] else 1


def save(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


async def play_rounds(
    rounds: int,
    play: Callable[[int], Awaitable[R]],
    log: list[R],
    describe: Callable[[R], str],
    progress: Callable[[str], None],
) -> None:
    """Play rounds ``0..rounds-1`` in turn; each one's record goes in ``log`` and its line
    (``describe``) to ``progress``."""
    for index in range(rounds):
        played = await play(index)
        log.append(played)
        progress(f"round {index:3d}: {describe(played)}")


def rounds_by_target(rounds: Iterable[Any], targets: Iterable[str]) -> dict[str, int]:
    """How many of ``rounds`` drew each of ``targets`` (those drawn none: 0)."""
    drawn = [r.target for r in rounds]
    return {t: drawn.count(t) for t in targets}


@contextlib.asynccontextmanager
async def cluster_up(cluster: LocalCluster) -> AsyncIterator[LocalCluster]:
    """The local cluster up for the block, and down after it, whatever happens."""
    await asyncio.to_thread(cluster.up)
    try:
        yield cluster
    finally:
        await asyncio.to_thread(cluster.down)


class Cohort:
    """The consuming cohort of a campaign: ``members`` members of ``cohort`` reading
    ``traffic``'s topic from the earliest offsets, each with its delivery log in
    ``directory`` (``member-N.log``)."""

    def __init__(self, traffic: KeyedTraffic, cohort: str, members: int, directory: Path) -> None:
        self.traffic = traffic
        self.cohort = cohort
        self.count = members
        self.directory = directory
        self.members: list[Member] = []
        #: each member's consuming task, while started
        self.consuming: list[asyncio.Task[None]] = []

    async def start(self, bootstrap: str) -> list[Member]:
        """Members joined and consuming (a fresh set: the logs carry on)."""
        self.members = [
            Member(
                Consumer(
                    bootstrap,
                    self.traffic.topic,
                    self.cohort,
                    member_id=f"member-{i}",
                    start="earliest",
                ),
                f"member-{i}",
                self.directory / f"member-{i}.log",
            )
            for i in range(self.count)
        ]
        for m in self.members:
            await m.consumer.start()
        self.consuming = [asyncio.create_task(self.traffic.consume(m)) for m in self.members]
        return self.members

    async def drain(self, acked: list[checking.Acked], timeout_s: float) -> None:
        """Wait until the cohort was delivered every acknowledged record (or the deadline)."""
        wanted = {(a.partition, a.offset) for a in acked}
        deadline = time.monotonic() + timeout_s
        while not wanted <= self.traffic.delivered and time.monotonic() < deadline:
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        """Stop consuming and close every member."""
        for task in self.consuming:
            task.cancel()
        for task in self.consuming:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for m in self.members:
            await m.consumer.close(grace_s=2.0)

    def deliveries(self) -> list[checking.Delivery]:
        """Every member's delivery log, read back."""
        return [d for m in self.members for d in read_delivery_log(m.path, m.name)]


#: how long a partition's read-back goes on through retriable answers (a leadership still
#: moving after the last fault: ``NotLeader`` from the broker the topology named)
READ_BACK_WAIT_S = 60.0


async def read_back(
    bootstrap: str, topic: str, partitions: int, progress: Callable[[str], None]
) -> dict[int, list[tuple[int, bytes]]]:
    """Partitions ``0..partitions-1`` read with plain FETCHes from offset 0: (offset, value)
    of each record. A partition that cannot be read (a retired one dropped: its records are
    lost) is said, and read as empty; one that answers a retriable error (its leadership
    still moving) is read again, for up to ``READ_BACK_WAIT_S``."""
    stored = {}
    for p in range(partitions):
        deadline = time.monotonic() + READ_BACK_WAIT_S
        while True:
            try:
                records = await read_partition(bootstrap, topic, p)
                break
            except HeadraceError as exc:
                if exc.retriable and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    continue
                progress(f"partition {p} unreadable: {exc}")
                records = []
                break
        stored[p] = [(r.offset, r.value) for r in records]
    return stored
