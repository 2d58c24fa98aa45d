"""``python -m bench.kafka_peers``: the same Kafka clients, two servers.

Two Kafka clients, each held equal across the servers: Kafka's own Java client as
its perf tools drive it, and librdkafka (confluent-kafka, ``bench.kafka_rdkafka``).
Against (1) a 3-broker headrace local cluster through its Kafka listener and (2)
Apache Kafka in KRaft mode (3 nodes, each broker and controller; the jars of
``bench/peers/build.sh``). One server at a time, each in a fresh temp dir on
loopback, at matched durability: for each ``--replicas`` (RF 1 and RF 3 by
default; minInSync 2 at RF 3) a topic of ``--partitions`` partitions per client,
acks=all, fsync about every second (headrace ``--fsync interval``, Kafka
``log.flush.interval.ms=1000``); headrace's topics are untiered, as Kafka's.

For each server, first an unmeasured ``ProducerPerformance`` run of
``--server-warmup-records`` into another topic: the servers' warm-up (a JVM
server's JIT would otherwise be most of a short run's cost). Then, for each
replication factor and each client (one row each):

``produce``
    ``ProducerPerformance``: ``--records`` records of ``--record-size`` bytes,
    acks=all, the client's defaults otherwise (idempotent, linger 5 ms, 16 KiB
    batches), unthrottled unless ``--throughput``. The first ``--warmup-records``
    warm the JVM; the figures are its "steady state" summary over the rest:
    records/s, MB/s and the latency percentiles it measures per record (send to
    acknowledgement, so at full speed mostly time queued in the client). The log
    must then hold every record sent.
``consume``
    ``ConsumerPerformance`` reads them all back in a group from the earliest
    offset. Its fetch-phase rates are the figures (the group join is reported
    apart); it must read every record.
``rdkafka``
    the same two steps with librdkafka: idempotent acks=all produce after the
    same warm-up, latency sampled on every 64th record, then a group read of
    every record, its rate from the subscribe (librdkafka fetches ahead while
    the group forms). It is a Python process, so at these rates it can be the
    bound: then its rows compare the servers' CPU per record more than speed.

Server CPU (every broker and controller process) is metered over each tool's run
and reported per million records. Before each measurement the bench waits up to
``--settle-s`` for other processes to leave the cores idle, and keeps the busy
cores it saw in the row. MB is Kafka's tools' MB, 2^20 bytes.

Writes ``bench/results/kafka_peers.json`` and ``kafka_peers.png`` and rewrites
the table of ``docs/benchmarks.md`` between the ``bench:kafka-peers`` markers
(``--no-docs``: not).

    .venv/bin/python -m bench.kafka_peers [--records 300000] [--record-size 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import docs_block, peerservers
from bench.peerservers import HeadraceLocal, KafkaCluster
from headrace.testing import procs

RESULTS = procs.REPO / "bench" / "results"
DOCS = procs.REPO / "docs" / "benchmarks.md"
START_MARKER = "<!-- bench:kafka-peers:start -->"
END_MARKER = "<!-- bench:kafka-peers:end -->"
#: as in bench.run: wait for other processes to leave the cores this idle first
BUSY_FOREIGN_CORES = 0.3
TOOLS = "org.apache.kafka.tools"
TOPIC = "kbench"
WARMUP_TOPIC = "kbench-warmup"

#: ProducerPerformance's summary; " steady state" after the count when it had a warm-up
_PRODUCED = re.compile(
    r"(\d+)( steady state)? records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), "
    r"([\d.]+) ms avg latency, ([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, "
    r"(\d+) ms 99th, (\d+) ms 99.9th"
)


@dataclass(frozen=True)
class Sizes:
    records: int
    record_bytes: int
    warmup_records: int
    #: records of a first, unmeasured run into another topic: the servers' warm-up
    server_warmup_records: int
    partitions: int
    #: a topic per replication factor and client; minInSync 2 where RF allows
    replication: tuple[int, ...]
    clients: tuple[str, ...]
    #: records/s for ProducerPerformance's --throughput; -1: as fast as it goes
    throughput: int
    brokers: int
    settle_s: float


@dataclass(frozen=True)
class Server:
    """One running server as the bench sees it."""

    system: str
    brokers: int
    mode: str
    version: str
    bootstrap: str
    pids: dict[str, int]
    #: (topic, replicas, minInSync)
    create_topic: Callable[[str, int, int], None]
    stored_records: Callable[[str], int]


# ---------------------------------------------------------------------------- servers


@contextlib.contextmanager
def headrace(sizes: Sizes) -> Iterator[Server]:
    home = procs.temp_dir("kafka-peers-headrace")
    cluster = HeadraceLocal(home / "cluster", sizes.brokers, "interval")
    try:
        cluster.start()
        yield Server(
            system="headrace",
            brokers=sizes.brokers,
            mode="headrace local up, Kafka listener, --fsync interval",
            version=_headrace_version(),
            bootstrap=cluster.kafka_bootstrap,
            pids=cluster.pids,
            # untiered, like Kafka's: uploading segments is not what is compared
            create_topic=lambda topic, replicas, min_insync: cluster.create_topic(
                topic, sizes.partitions, replicas, min_insync, tiered=False
            ),
            stored_records=cluster.records,
        )
    finally:
        cluster.stop()
        procs.remove_dir(home)


@contextlib.contextmanager
def kafka(sizes: Sizes) -> Iterator[Server]:
    home = procs.temp_dir("kafka-peers-kafka")
    cluster = KafkaCluster(home, sizes.brokers, "interval")
    try:
        cluster.start()
        yield Server(
            system="kafka",
            brokers=sizes.brokers,
            mode=f"KRaft, {sizes.brokers} combined broker+controller nodes, flush every 1 s",
            version=peerservers.kafka_version(),
            bootstrap=cluster.bootstrap,
            pids={f"server{n.node_id}": n.pid for n in cluster.nodes},
            create_topic=lambda topic, replicas, min_insync: cluster.create_topic(
                topic, sizes.partitions, replicas, min_insync
            ),
            stored_records=cluster.records,
        )
    finally:
        cluster.stop()
        procs.remove_dir(home)


SERVERS = {"headrace": headrace, "kafka": kafka}
CLIENTS = ("java", "rdkafka")


def min_insync_for(replicas: int) -> int:
    return min(2, replicas)


def _headrace_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("headrace")


# ---------------------------------------------------------------------------- measuring


def settle(limit_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Wait (up to ``limit_s``) for a quiet machine; the busy cores then, to keep in the row."""
    deadline = time.monotonic() + limit_s
    while True:
        busy = procs.machine_busy_cores(1.0)
        if busy <= BUSY_FOREIGN_CORES or time.monotonic() >= deadline:
            return {"busy_cores_before": busy, "at_utc": _now()}
        log(f"   machine busy ({busy} cores): waiting for it to settle")
        time.sleep(2.0)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_metered(server: Server, argv: list[str], timeout: float) -> tuple[str, dict[str, Any]]:
    """Run a Kafka tool to completion; its output and the CPU it and the servers used."""
    meter = procs.CpuMeter(server.pids)
    meter.start()
    started = time.perf_counter()
    out, client_cpu_s = procs.run_tool(argv, timeout=timeout)
    elapsed = time.perf_counter() - started
    cores = meter.stop()
    server_cpu_s = sum(v for k, v in cores.items() if k.startswith("server")) * elapsed
    return out, {
        "tool_s": round(elapsed, 2),
        "server_cpu_s": round(server_cpu_s, 2),
        "client_cpu_s": round(client_cpu_s, 2),
        "foreign_cores": cores["foreign_cores"],
        "kernel_cores": cores["kernel_cores"],
    }


def parse_produced(out: str) -> dict[str, Any]:
    """ProducerPerformance's last summary: the steady-state one when it printed one."""
    found = list(_PRODUCED.finditer(out))
    if not found:
        tail = out.strip().splitlines()[-5:]
        raise RuntimeError(f"ProducerPerformance printed no summary: {tail}")
    steady = [m for m in found if m.group(2)]
    m = (steady or found)[-1]
    return {
        "measured_records": int(m.group(1)),
        "steady_state": bool(m.group(2)),
        "records_per_s": round(float(m.group(3)), 1),
        "mb_per_s": float(m.group(4)),
        "latency_ms": {
            "avg": float(m.group(5)),
            "max": float(m.group(6)),
            "p50": int(m.group(7)),
            "p95": int(m.group(8)),
            "p99": int(m.group(9)),
            "p99_9": int(m.group(10)),
        },
    }


def parse_consumed(out: str) -> dict[str, Any]:
    """The data line of ConsumerPerformance's CSV-like output."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    header = next((i for i, ln in enumerate(lines) if ln.startswith("start.time")), None)
    if header is None or header + 1 >= len(lines):
        raise RuntimeError(f"ConsumerPerformance printed no figures: {lines[-5:]}")
    names = [n.strip() for n in lines[header].split(",")]
    values = [v.strip() for v in lines[header + 1].split(",")]
    doc = dict(zip(names, values, strict=False))
    return {
        "records": int(float(doc["data.consumed.in.nMsg"])),
        "records_per_s": round(float(doc["fetch.nMsg.sec"]), 1),
        "mb_per_s": round(float(doc["fetch.MB.sec"]), 2),
        "group_join_ms": int(float(doc["rebalance.time.ms"])),
        "fetch_ms": int(float(doc["fetch.time.ms"])),
        "with_join": {
            "records_per_s": round(float(doc["nMsg.sec"]), 1),
            "mb_per_s": round(float(doc["MB.sec"]), 2),
        },
    }


def _per_million(cpu: dict[str, Any], records: int) -> None:
    cpu["server_cpu_s_per_m"] = round(cpu["server_cpu_s"] / records * 1e6, 2)
    cpu["client_cpu_s_per_m"] = round(cpu["client_cpu_s"] / records * 1e6, 2)


def producer_argv(server: Server, sizes: Sizes, topic: str, records: int, warmup: int) -> list[str]:
    return peerservers.java_tool_argv(
        f"{TOOLS}.ProducerPerformance",
        "--topic", topic, "--num-records", str(records), "--warmup-records", str(warmup),
        "--record-size", str(sizes.record_bytes), "--throughput", str(sizes.throughput),
        "--bootstrap-server", server.bootstrap, "--command-property", "acks=all",
    )  # fmt: skip


def rdkafka_argv(mode: str, server: Server, sizes: Sizes, topic: str) -> list[str]:
    argv = [
        sys.executable, "-m", "bench.kafka_rdkafka", mode, "--bootstrap", server.bootstrap,
        "--topic", topic, "--records", str(sizes.records),
        "--record-size", str(sizes.record_bytes),
    ]  # fmt: skip
    return argv + (["--warmup-records", str(sizes.warmup_records)] if mode == "produce" else [])


def measure(server: Server, sizes: Sizes, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per replication factor and client, on one running server."""
    timeout = 120 + sizes.records * max(sizes.record_bytes, 100) / 2e6
    if sizes.server_warmup_records:
        # A JVM server compiles its hot paths during its first seconds of load (on two
        # shared cores, tens of CPU seconds for three Kafka nodes): without this pass a
        # short run would measure that, not the server at work.
        top = max(sizes.replication)
        server.create_topic(WARMUP_TOPIC, top, min_insync_for(top))
        procs.run_tool(
            producer_argv(server, sizes, WARMUP_TOPIC, sizes.server_warmup_records, 0), timeout
        )
    rows = []
    for replicas in sizes.replication:
        for client in sizes.clients:
            topic = f"{TOPIC}-rf{replicas}-{client}"
            server.create_topic(topic, replicas, min_insync_for(replicas))
            rows.append(measure_one(server, sizes, topic, replicas, client, timeout, log))
    return rows


def measure_one(
    server: Server,
    sizes: Sizes,
    topic: str,
    replicas: int,
    client: str,
    timeout: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "system": server.system,
        "version": server.version,
        "brokers": server.brokers,
        "mode": server.mode,
        "client": client,
        "replicas": replicas,
        "min_insync": min_insync_for(replicas),
    }
    label = f"{server.system} {client} RF {replicas}"
    row["produce_load"] = settle(sizes.settle_s, log)
    if client == "java":
        argv = producer_argv(server, sizes, topic, sizes.records, sizes.warmup_records)
        out, cpu = run_metered(server, argv, timeout)
        produce = parse_produced(out)
    else:
        out, cpu = run_metered(server, rdkafka_argv("produce", server, sizes, topic), timeout)
        produce = json.loads(out.strip().splitlines()[-1])
    _per_million(cpu, sizes.records)
    stored = server.stored_records(topic)
    if stored != sizes.records:
        raise RuntimeError(f"{label}: sent {sizes.records} records, the log holds {stored}")
    row["produce"] = {**produce, "cpu": cpu}
    lat = produce["latency_ms"]
    log(
        f"   {label} produce: {produce['records_per_s']:,.0f} records/s "
        f"{produce['mb_per_s']} MB/s p50 {lat['p50']} ms p99 {lat['p99']} ms; "
        f"server {cpu['server_cpu_s_per_m']} CPU s per M records"
    )
    row["consume_load"] = settle(sizes.settle_s, log)
    if client == "java":
        argv = peerservers.java_tool_argv(
            f"{TOOLS}.ConsumerPerformance",
            "--bootstrap-server", server.bootstrap, "--topic", topic,
            "--num-records", str(sizes.records), "--timeout", "30000",
        )  # fmt: skip
        out, cpu = run_metered(server, argv, timeout)
        consume = parse_consumed(out)
    else:
        out, cpu = run_metered(server, rdkafka_argv("consume", server, sizes, topic), timeout)
        consume = json.loads(out.strip().splitlines()[-1])
    if consume["records"] < sizes.records:
        raise RuntimeError(f"{label}: consumed {consume['records']} of {sizes.records}")
    _per_million(cpu, sizes.records)
    row["consume"] = {**consume, "cpu": cpu}
    log(
        f"   {label} consume: {consume['records_per_s']:,.0f} records/s "
        f"{consume['mb_per_s']} MB/s (group join {consume['group_join_ms']} ms); "
        f"server {cpu['server_cpu_s_per_m']} CPU s per M records"
    )
    return row


# ---------------------------------------------------------------------------- report


CLIENT_NAMES = {
    "java": "Kafka's Java perf tools",
    "rdkafka": "librdkafka (confluent-kafka)",
}


def markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    c = doc["client"]
    lines = [
        f"_Same clients on both servers: Kafka {c['version']}'s ProducerPerformance and"
        f" ConsumerPerformance (Java {c['java']}), and librdkafka {c.get('librdkafka', '?')}"
        f" (confluent-kafka, one Python process). {s['records']:,} records of"
        f" {s['record_bytes']} B per row ({s['warmup_records']:,} of them the client's warm-up,"
        f" after {s['server_warmup_records']:,} unmeasured for the servers'),"
        f" {s['partitions']} partitions, RF 1, or RF 3 with minInSync 2, acks=all, throughput"
        f" {'unthrottled' if s['throughput'] < 0 else str(s['throughput']) + ' records/s'};"
        f" {s['brokers']} brokers each; run {doc['run_utc']} in {doc['seconds']} s."
        " *busy*: other processes' busy cores before produce / consume._",
        "",
        "| server | client | RF | produce records/s | produce MB/s | p50 ms | p99 ms"
        " | consume records/s | consume MB/s | group join ms"
        " | server CPU s / M records (produce, consume) | busy |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in doc["rows"]:
        p, q = r["produce"], r["consume"]
        lines.append(
            f"| {r['system']} {r['version']} | {r['client']} | {r['replicas']}"
            f" | {p['records_per_s']:,.0f} | {p['mb_per_s']:.2f}"
            f" | {p['latency_ms']['p50']} | {p['latency_ms']['p99']}"
            f" | {q['records_per_s']:,.0f} | {q['mb_per_s']:.2f} | {q['group_join_ms']}"
            f" | {p['cpu']['server_cpu_s_per_m']}, {q['cpu']['server_cpu_s_per_m']}"
            f" | {r['produce_load']['busy_cores_before']}"
            f" / {r['consume_load']['busy_cores_before']} |"
        )
    for system, error in doc["failed"].items():
        lines.append(f"| {system} | failed: {error.splitlines()[0][:120]} |||||||||||")
    ratios = ratio_lines(doc["rows"])
    if ratios:
        lines += ["", "headrace against Kafka with the same client and RF (produce):", ""]
        lines += ratios
    return "\n".join(lines)


def ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    """For each client and RF both servers ran: headrace's throughput and server CPU per
    record as a fraction of Kafka's."""
    by_key = {(r["system"], r["client"], r["replicas"]): r for r in rows}
    out = []
    for (system, client, replicas), ours in by_key.items():
        theirs = by_key.get(("kafka", client, replicas))
        if system != "headrace" or theirs is None:
            continue
        speed = ours["produce"]["records_per_s"] / theirs["produce"]["records_per_s"]
        cpu = (
            ours["produce"]["cpu"]["server_cpu_s_per_m"]
            / theirs["produce"]["cpu"]["server_cpu_s_per_m"]
        )
        out.append(
            f"- {CLIENT_NAMES[client]}, RF {replicas}: {speed:.2f}x Kafka's records/s,"
            f" {cpu:.2f}x its server CPU per record"
        )
    return out


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    if not rows:
        return
    systems = sorted({r["system"] for r in rows})
    cases = sorted({(r["client"], r["replicas"]) for r in rows})
    by_key = {(r["system"], r["client"], r["replicas"]): r for r in rows}
    panels = (
        ("produce records / s", lambda r: r["produce"]["records_per_s"]),
        ("consume records / s", lambda r: r["consume"]["records_per_s"]),
        ("server CPU s / M records, produce", lambda r: r["produce"]["cpu"]["server_cpu_s_per_m"]),
    )
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / len(systems)
    for ax, (label, value) in zip(axes, panels, strict=True):
        for k, system in enumerate(systems):
            heights = [
                value(by_key[(system, *case)]) if (system, *case) in by_key else 0 for case in cases
            ]
            ax.bar([i + k * width for i in range(len(cases))], heights, width, label=system)
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(cases))],
            [f"{client}\nRF {rf}" for client, rf in cases],
        )
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    s = doc["settings"]
    fig.suptitle(
        f"The same Kafka clients, acks=all: {s['records']:,} x {s['record_bytes']} B per case",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_docs(path: Path, table: str) -> bool:
    return docs_block.replace_between(path, START_MARKER, END_MARKER, table)


def _java_version() -> str:
    import subprocess

    said = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, timeout=60, check=False
    ).stderr
    found = re.search(r'version "([^"]+)"', said)
    return found.group(1) if found else "?"


def _librdkafka_version() -> str:
    import confluent_kafka

    return str(confluent_kafka.libversion()[0])


# ---------------------------------------------------------------------------- entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_peers", description=__doc__)
    parser.add_argument("--records", type=int, default=300_000, help="records produced in all")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record")
    parser.add_argument(
        "--warmup-records", type=int, default=None, help="of --records (default: a fifth)"
    )
    parser.add_argument(
        "--server-warmup-records",
        type=int,
        default=None,
        help="produced unmeasured into another topic first (default: a third of --records)",
    )
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--throughput", type=int, default=-1, help="records/s; -1: unthrottled")
    parser.add_argument("--brokers", type=int, choices=(1, 3), default=3, help="of each server")
    parser.add_argument(
        "--replicas",
        type=int,
        action="append",
        choices=(1, 3),
        help="a replication factor to run (repeatable; default: 1 and 3, 1 alone on 1 broker)",
    )
    parser.add_argument(
        "--client", action="append", choices=CLIENTS, help="repeatable; default: every client"
    )
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--only", action="append", choices=sorted(SERVERS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument(
        "--render-only", action="store_true", help="table and plot from --out's kafka_peers.json"
    )
    args = parser.parse_args(argv)
    if args.render_only:
        publish(json.loads((args.out / "kafka_peers.json").read_text()), args, print)
        return 0
    if args.records < 1 or args.record_size < 1 or args.partitions < 1:
        parser.error("--records, --record-size and --partitions must be positive")
    warmup = args.records // 5 if args.warmup_records is None else args.warmup_records
    if not 0 <= warmup < args.records:
        parser.error("--warmup-records must be below --records")
    if args.server_warmup_records is not None and args.server_warmup_records < 0:
        parser.error("--server-warmup-records must not be negative")
    replication = tuple(sorted(set(args.replicas or (1, 3))))
    if max(replication) > args.brokers:
        parser.error(f"--replicas {max(replication)} needs as many --brokers")
    sizes = Sizes(
        records=args.records,
        record_bytes=args.record_size,
        warmup_records=warmup,
        server_warmup_records=(
            args.records // 3 if args.server_warmup_records is None else args.server_warmup_records
        ),
        partitions=args.partitions,
        replication=replication,
        clients=tuple(args.client or CLIENTS),
        throughput=args.throughput,
        brokers=args.brokers,
        settle_s=args.settle_s,
    )

    def log(line: str) -> None:
        print(line, flush=True)

    peerservers.peer_paths("kafka")  # fetch Kafka's jars (once) before any clock starts
    started = time.monotonic()
    doc: dict[str, Any] = {
        "scenario": "kafka_peers",
        "schema": 2,
        "run_utc": _now(),
        "client": {
            "name": "Kafka Java client: ProducerPerformance, ConsumerPerformance; librdkafka",
            "version": peerservers.kafka_version(),
            "java": _java_version(),
            "librdkafka": _librdkafka_version(),
        },
        "settings": asdict(sizes),
        "rows": [],
        "failed": {},
    }
    try:
        for name in args.only or list(SERVERS):
            log(f"== {name} ({sizes.brokers} brokers)")
            try:
                with SERVERS[name](sizes) as server:
                    doc["rows"].extend(measure(server, sizes, log))
            except Exception as exc:
                doc["failed"][name] = f"{type(exc).__name__}: {exc}"
                log(f"   {name} FAILED: {doc['failed'][name]}")
                log(traceback.format_exc())
            finally:
                procs.kill_all()
    finally:
        procs.kill_all()
    doc["seconds"] = round(time.monotonic() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kafka_peers.json").write_text(json.dumps(doc, indent=2) + "\n")
    publish(doc, args, log)
    return 1 if doc["failed"] else 0


def publish(doc: dict[str, Any], args: argparse.Namespace, log: Callable[[str], None]) -> None:
    """The plot beside the JSON; the table printed and, unless ``--no-docs``, in the docs."""
    plot(doc, args.out / "kafka_peers.png")
    table = markdown(doc)
    log(table)
    if not args.no_docs and not update_docs(DOCS, table):
        log(f"{DOCS} has no {START_MARKER} markers; table not written")


if __name__ == "__main__":
    sys.exit(main())
