"""``python -m bench.powerloss``: cut the power under a broker, many times.

A standalone broker keeps its data directory on ``bench.powerfs`` (a FUSE
file system that, on "cut", forgets everything not fsynced, directory
entries included). Each round: an acks=all producer writes keyed records for
a random while (seeded, printed), the broker is killed with SIGKILL and the
power is cut at once (so nothing reaches the durable image after the kill),
the broker restarts on what survived, and a checker reads every partition:

- the broker must start, and every partition must read back as a contiguous
  run of offsets from 0 whose batches pass their CRC (no torn or corrupt log);
- ``--fsync always``: every record acknowledged before the cut is there, at
  the offset it was acknowledged at, with its value (lost must be 0);
- ``--fsync interval``: acknowledged records may be lost, but only ones
  acknowledged within the last flush interval (plus one fdatasync) before the
  cut. We report how many were lost and the oldest loss, as milliseconds
  between its acknowledgement and the cut: the bound we promise.

What survived becomes the next round's expectation (under ``interval`` the
offsets of lost records are handed out again, as the log says they are free).

Writes ``bench/results/powerloss-<fsync>[-<interval>ms].json`` and prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.powerfs import PowerLossMount
from headrace.client import Producer
from headrace.client.cluster import ClusterClient
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.testing import procs

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TOPIC = "powered"
PARTITIONS = 2


class MountedBroker(procs.BrokerProcess):
    """A broker whose log file lives beside the mount (a cut must not take it)."""

    log_file: Path = Path("broker.log")

    @property
    def log_path(self) -> Path:
        return self.log_file


@dataclass
class Acked:
    partition: int
    offset: int
    value: bytes
    #: ``time.monotonic()`` when the client saw the acknowledgement
    at: float


@dataclass
class CampaignReport:
    fsync: str
    flush_interval_ms: int
    seed: int
    cuts: int = 0
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    #: rounds whose broker did not start, or whose log did not read back contiguous
    corrupt_rounds: int = 0
    #: per round with losses: ms between the oldest lost acknowledgement and the cut
    loss_windows_ms: list[float] = field(default_factory=list)
    restart_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        windows = self.loss_windows_ms
        restarts = sorted(self.restart_s)
        return {
            "fsync": self.fsync,
            "flush_interval_ms": self.flush_interval_ms,
            "seed": self.seed,
            "cuts": self.cuts,
            "acked": self.acked,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "corrupt_rounds": self.corrupt_rounds,
            "rounds_with_loss": len(windows),
            "max_loss_window_ms": round(max(windows), 1) if windows else 0.0,
            # the promise under interval is the flush interval plus one fdatasync round (a
            # record appended just after a round starts waits for the next one to finish)
            "max_loss_window_over_interval_ms": (
                round(max(0.0, max(windows) - self.flush_interval_ms), 1) if windows else 0.0
            ),
            "restart_s_median": round(restarts[len(restarts) // 2], 3) if restarts else None,
            "restart_s_max": round(restarts[-1], 3) if restarts else None,
            "failures": self.failures[:20],
        }


async def read_partition(bootstrap: str, partition: int) -> list[rb.Record]:
    """Every committed record of ``partition``, each batch CRC-checked."""
    cluster = ClusterClient(bootstrap)
    records: list[rb.Record] = []
    try:
        await cluster.start()
        conn = await cluster.connection_for(TOPIC, partition)
        offset = 0
        while True:
            req = msg.FetchRequest(TOPIC, partition, offset, 4 << 20, 0, msg.Isolation.COMMITTED)
            frame = await conn.request(Op.FETCH, req.encode())
            head, data = msg.FetchResponseHeader.decode(frame.body)
            if not data:
                break
            for pos, header in rb.scan(data):
                batch = bytes(data[pos : pos + header.size])
                rb.validate(batch)
                records.extend(rb.decode(batch).records(offset))
                offset = header.next_offset
            if offset >= head.high_watermark:
                break
    finally:
        await cluster.close()
    return records


async def _create_topic(bootstrap: str) -> None:
    cluster = ClusterClient(bootstrap)
    try:
        conn = await cluster.bootstrap_connection()
        await conn.request(Op.CREATE_TOPIC, msg.CreateTopic(TOPIC, PARTITIONS, {}).encode())
    finally:
        await cluster.close()


@dataclass
class Load:
    producer: Producer
    #: one task per record sent, waiting for its acknowledgement
    pending: set[asyncio.Task[None]] = field(default_factory=set)

    async def abandon(self) -> None:
        """The broker is gone: let what was answered land, fail the rest, close."""
        with contextlib.suppress(HeadraceError, TimeoutError):
            await asyncio.wait_for(self.producer.close(), 10)
        for task in self.pending:
            task.cancel()
        await asyncio.gather(*self.pending, return_exceptions=True)


async def _load(bootstrap: str, round_no: int, duration_s: float, acked: list[Acked]) -> Load:
    """Produce acks=all for ``duration_s``, noting every acknowledgement with its time."""
    producer = await Producer(
        bootstrap, acks="all", linger_ms=1, delivery_timeout_ms=1_000, request_timeout_ms=1_000
    ).start()
    load = Load(producer)
    pending = load.pending

    async def note(receipt: Any, value: bytes) -> None:
        with contextlib.suppress(HeadraceError, asyncio.CancelledError):
            meta = await receipt
            acked.append(Acked(meta.partition, meta.offset, value, time.monotonic()))

    deadline = time.monotonic() + duration_s
    sent = 0
    while time.monotonic() < deadline:
        for _ in range(20):
            value = f"r{round_no:04d}-{sent:08d}".encode()
            sent += 1
            task = asyncio.create_task(note(await producer.send(TOPIC, value, key=value), value))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.sleep(0.005)
    return load


async def run_campaign(
    root: Path,
    *,
    fsync: str,
    cuts: int,
    seed: int,
    flush_interval_ms: int = 1000,
    min_load_s: float = 0.3,
    max_load_s: float = 1.5,
) -> CampaignReport:
    """``cuts`` power cuts under load on a broker at ``root``; the report says what was lost."""
    rng = random.Random(seed)
    report = CampaignReport(fsync=fsync, flush_interval_ms=flush_interval_ms, seed=seed)
    mount = PowerLossMount(root)
    mount.start()
    broker = MountedBroker(
        mount.mountpoint / "data",
        fsync=fsync,
        extra_args=[
            "--flush-interval-ms",
            str(flush_interval_ms),
            # small segments: rolls (new files, directory fsyncs) happen under the cuts too
            "--segment-bytes",
            str(128 * 1024),
        ],
    )
    broker.log_file = root / "broker.log"
    expected: dict[tuple[int, int], bytes] = {}
    try:
        broker.start()
        await _create_topic(broker.bootstrap)
        for round_no in range(cuts):
            acked: list[Acked] = []
            load = await _load(
                broker.bootstrap, round_no, rng.uniform(min_load_s, max_load_s), acked
            )
            cut_at = time.monotonic()
            broker.kill9()  # power loss: the process dies with the machine ...
            mount.cut()  # ... and so does everything not yet on the disk
            await load.abandon()  # acknowledgements already in our socket buffers count
            report.cuts += 1
            report.acked += len(acked)
            for a in acked:
                expected[(a.partition, a.offset)] = a.value
            started = time.perf_counter()
            try:
                broker.start()
            except (RuntimeError, TimeoutError) as exc:
                report.corrupt_rounds += 1
                report.failures.append(f"round {round_no}: broker did not restart: {exc}")
                break
            report.restart_s.append(time.perf_counter() - started)
            stored: dict[tuple[int, int], bytes] = {}
            try:
                for p in range(PARTITIONS):
                    records = await read_partition(broker.bootstrap, p)
                    offsets = [r.offset for r in records]
                    if offsets != list(range(len(offsets))):
                        raise ValueError(f"partition {p}: offsets not contiguous from 0")
                    stored.update({(p, r.offset): r.value for r in records})
            except (HeadraceError, ValueError) as exc:
                report.corrupt_rounds += 1
                report.failures.append(f"round {round_no}: log unreadable: {exc}")
                break
            values = list(stored.values())
            report.duplicated += len(values) - len(set(values))
            lost_now = [pos for pos, value in expected.items() if stored.get(pos) != value]
            report.lost += len(lost_now)
            if lost_now:
                acked_at = {(a.partition, a.offset): a.at for a in acked}
                oldest = min(acked_at.get(pos, float("-inf")) for pos in lost_now)
                report.loss_windows_ms.append((cut_at - oldest) * 1000)
                if fsync == "always":
                    report.failures.append(
                        f"round {round_no}: {len(lost_now)} acknowledged records lost"
                    )
            expected = stored
    finally:
        broker.kill9()
        mount.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsync", choices=["always", "interval"], default="always")
    parser.add_argument("--cuts", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--flush-interval-ms", type=int, default=1000)
    args = parser.parse_args()
    # every cut fails the batches in flight: expected, and too loud to print per batch
    logging.getLogger("headrace.client").setLevel(logging.ERROR)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"powerloss: fsync={args.fsync} cuts={args.cuts} seed={seed}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="headrace-powerloss-"))
    try:
        report = asyncio.run(
            run_campaign(
                root,
                fsync=args.fsync,
                cuts=args.cuts,
                seed=seed,
                flush_interval_ms=args.flush_interval_ms,
            )
        )
    finally:
        procs.kill_all()
        shutil.rmtree(root, ignore_errors=True)
    summary = report.summary()
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.flush_interval_ms == 1000 else f"-{args.flush_interval_ms}ms"
    out = RESULTS / f"powerloss-{args.fsync}{suffix}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    for key in ("cuts", "acked", "lost", "duplicated", "corrupt_rounds", "max_loss_window_ms"):
        print(f"  {key:<20} {summary[key]}")
    print(f"  wrote {out}")
    bad = summary["corrupt_rounds"] or summary["duplicated"]
    if bad or (args.fsync == "always" and summary["lost"]):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
