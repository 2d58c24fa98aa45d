"""``python -m bench.peerbench``: headrace against Kafka and NATS JetStream.

One server at a time, each in a fresh temp dir on loopback, and before every
measurement a wait (up to ``--settle-s``) for other processes to leave the
cores idle; the busy-core reading then is kept in the row. Scenarios:

``produce``
    Two families, labelled in every row. *Batch path* compares servers:
    headrace ``send_many`` against Kafka's Java ``ProducerPerformance`` (at
    matched fsync, and at Kafka's default page-cache-only durability).
    *Per-record Python clients* compares what a Python team calls: headrace
    ``await producer.send()``, confluent-kafka ``produce()`` + ``poll(0)``,
    aiokafka ``send()`` and nats-py JetStream ``publish_async()``. Sizes, partitions
    and acks are crossed; after each run the stored record count must equal
    what was sent.
``replicated``
    3 brokers, RF=3, acks=all, minInSync 2: ``headrace local up`` against a
    3-node KRaft Kafka.
``consume``
    Catch-up from the earliest offset: headrace's consumer against Kafka's Java
    ``ConsumerPerformance`` and confluent-kafka.
``latency``
    Produce-to-consume percentiles at fixed rates, one open-loop harness
    (``bench.worker.OpenLoop``) driving headrace's client and confluent-kafka.
``failover``
    kill -9 of the leader of a 3-node cluster's partition under acks=all load;
    the time from the kill to the first acknowledged produce after it.

Writes ``bench/results/peers.json`` and ``peers.png`` and rewrites the section
of ``docs/benchmarks.md`` between the ``bench:peers`` markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import re
import signal
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench import peerservers
from bench.peerservers import HeadraceLocal, KafkaCluster, NatsServer
from headrace.testing import procs, waiting

RESULTS = procs.REPO / "bench" / "results"
DOCS = procs.REPO / "docs" / "benchmarks.md"
START_MARKER = "<!-- bench:peers:start -->"
END_MARKER = "<!-- bench:peers:end -->"
#: as in bench.run: wait for other processes to leave the cores this idle first
BUSY_FOREIGN_CORES = 0.3
ACKS = {"1": "leader", "all": "all"}


@dataclass(slots=True)
class Settings:
    quick: bool = False
    produce_warmup_s: float = 1.0
    produce_s: float = 5.0
    value_bytes: tuple[int, ...] = (100, 1024)
    partitions: tuple[int, ...] = (1, 8)
    acks: tuple[str, ...] = ("1", "all")
    replicated_partitions: tuple[int, ...] = (1, 8)
    consume_records: int = 10_000_000
    latency_rates: tuple[int, ...] = (1_000, 10_000, 50_000)
    latency_warmup_s: float = 2.0
    latency_measure_s: float = 10.0
    latency_linger_ms: float = 1.0
    #: ProducerPerformance: MB of warm-up records (its JVM's JIT), then MB measured
    pp_warmup_mb: int = 500
    #: long enough that the steady part outlasts the tool's first 5 s report (which is
    #: where it says "In steady state.", and so where the CPU meter starts)
    pp_measure_mb: int = 3000
    failover_kill_after_s: float = 4.0
    #: Kafka notices a dead broker after broker.session.timeout.ms (9 s by default)
    failover_probe_s: float = 30.0
    #: partitions of an idle 3-broker cluster (RF=3) for the scale scenario
    scale_partitions: tuple[int, ...] = (10, 1_000, 10_000)
    scale_idle_settle_s: float = 5.0
    scale_idle_s: float = 10.0
    settle_s: float = 120.0
    #: pause before each measurement: memory freed by the previous one goes back first
    page_settle_s: float = 3.0
    log: Callable[[str], None] = field(default=print)

    @classmethod
    def for_quick(cls, **kwargs: Any) -> Settings:
        quick: dict[str, Any] = {
            "produce_warmup_s": 0.5,
            "produce_s": 2.0,
            "value_bytes": (100,),
            "partitions": (1,),
            "acks": ("1",),
            "replicated_partitions": (1,),
            "consume_records": 300_000,
            "latency_rates": (1_000,),
            "latency_warmup_s": 1.0,
            "latency_measure_s": 2.0,
            "failover_kill_after_s": 3.0,
            "failover_probe_s": 20.0,
            "settle_s": 30.0,
            "page_settle_s": 0.5,
            "scale_partitions": (10, 200),
            "pp_warmup_mb": 100,
            "pp_measure_mb": 100,
            "scale_idle_settle_s": 2.0,
            "scale_idle_s": 3.0,
        }
        return cls(quick=True, **{**quick, **kwargs})


# ---------------------------------------------------------------------------- helpers


def settle(settings: Settings) -> dict[str, Any]:
    """Wait (up to ``settle_s``) for a quiet machine; the busy cores then, to keep in the row."""
    time.sleep(settings.page_settle_s)
    deadline = time.monotonic() + settings.settle_s
    while True:
        busy = procs.machine_busy_cores(1.0)
        if busy <= BUSY_FOREIGN_CORES or time.monotonic() >= deadline:
            return {
                "busy_cores_before": busy,
                "load1": round(os.getloadavg()[0], 2),
                "at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        settings.log(f"   machine busy ({busy} cores): waiting for it to settle")
        time.sleep(5.0)


def per_million(row: dict[str, Any]) -> None:
    """CPU seconds per million records, server and client, from cores and the rate."""
    rate = float(row.get("records_per_s") or 0.0)
    cpu = row.get("cpu", {})
    if rate > 0:
        row["server_cpu_s_per_m"] = round(cpu.get("server_cores", 0.0) / rate * 1e6, 3)
        row["client_cpu_s_per_m"] = round(cpu.get("client_cores", 0.0) / rate * 1e6, 3)


def check_stored(system: str, topic: str, sent: int, stored: int) -> None:
    if stored != sent:
        raise RuntimeError(f"{system} {topic}: sent {sent} records, the log holds {stored}")


def _peer(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    return procs.run_worker({"kind": kind, **spec}, timeout=timeout, module="bench.peerworker")


def _hr(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """A ``bench.worker`` workload; several servers' cores are summed into ``server_cores``."""
    result = procs.run_worker({"kind": kind, **spec}, timeout=timeout)
    cpu = result.get("cpu")
    if cpu and "server_cores" not in cpu:
        servers = [k for k in cpu if k.startswith("server")]
        cpu["server_cores"] = round(sum(cpu.pop(k) for k in servers), 3)
    return result


@contextlib.contextmanager
def headrace_broker(prefix: str) -> Iterator[procs.BrokerProcess]:
    home = procs.temp_dir(prefix)
    broker = procs.BrokerProcess(home / "data", "interval", ready_timeout_s=120)
    try:
        broker.start()
        yield broker
    finally:
        broker.kill9()
        procs.remove_dir(home)


@contextlib.contextmanager
def kafka(prefix: str, nodes: int = 1, flush: str = "interval") -> Iterator[KafkaCluster]:
    home = procs.temp_dir(prefix)
    cluster = KafkaCluster(home, nodes, flush)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        procs.remove_dir(home)


@contextlib.contextmanager
def nats_server(prefix: str) -> Iterator[NatsServer]:
    home = procs.temp_dir(prefix)
    server = NatsServer(home, "1s")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        procs.remove_dir(home)


@contextlib.contextmanager
def headrace_local(prefix: str) -> Iterator[HeadraceLocal]:
    home = procs.temp_dir(prefix)
    cluster = HeadraceLocal(home / "cluster", 3, "interval")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        procs.remove_dir(home)


#: the shortest steady sending a ProducerPerformance row's CPU may be metered over
PP_MIN_WINDOW_S = 3.0
#: ProducerPerformance's report interval: it says "In steady state." at the first one
_PP_REPORT_S = 5.0
_PERF_STEADY = re.compile(
    r"(\d+) steady state records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)"
)


def producer_performance(
    kafka_: KafkaCluster, topic: str, size: int, acks: str, settings: Settings
) -> dict[str, Any]:
    """Kafka's ``ProducerPerformance`` at full speed in one JVM: ``--warmup-records`` worth
    ``pp_warmup_mb``, then ``pp_measure_mb`` measured ("steady state", its own rate).

    A fresh JVM needs seconds of JIT before it runs at speed (on this machine the rate
    climbed from 0.1M to 0.6M records/s over 15 s), so a short run would measure the
    JIT. Server and client CPU are metered over the steady-state part: the meter starts
    when the tool prints "In steady state." (its first report in that part, 5 s in) and
    stops at its steady summary; a steady part too short to report is metered over
    the whole run instead (``cpu_window``).
    """
    import subprocess

    warm = max(100_000, settings.pp_warmup_mb * 1_000_000 // size)
    measured = max(100_000, settings.pp_measure_mb * 1_000_000 // size)
    argv = peerservers.java_tool_argv(
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic", topic, "--num-records", str(warm + measured), "--warmup-records", str(warm),
        "--record-size", str(size), "--throughput", "-1",
        "--command-property", f"bootstrap.servers={kafka_.bootstrap}", f"acks={acks}",
    )  # fmt: skip
    proc = procs.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    pids = {**{f"server{i}": pid for i, pid in enumerate(kafka_.pids)}, "client": proc.pid}
    # The tool says "In steady state." at its first 5 s report after the warm-up, so the
    # steady meter covers the steady part from 5 s in to its summary. A steady part too
    # short for that is metered over the whole run instead (JIT warm-up included), and
    # the row says which (``cpu_window``).
    whole, steady_meter = procs.CpuMeter(pids), procs.CpuMeter(pids)
    whole.start()
    whole_from = time.perf_counter()
    whole_raw: dict[str, float] | None = None
    steady_raw: dict[str, float] | None = None
    steady: tuple[str, ...] | None = None
    tail: list[str] = []
    steady_from = window_s = whole_s = 0.0
    try:
        assert proc.stdout is not None
        for raw_line in proc.stdout:
            line = raw_line.decode(errors="replace").strip()
            tail = [*tail[-5:], line]
            if line.startswith("In steady state"):
                steady_meter.start()
                steady_from = time.perf_counter()
            found = _PERF_STEADY.search(line)
            if found:
                whole_raw = whole.stop()
                whole_s = time.perf_counter() - whole_from
                if steady_from:
                    steady_raw = steady_meter.stop()
                    window_s = time.perf_counter() - steady_from
                steady = found.groups()
        proc.wait(600)
    finally:
        procs.reap(proc)
    if whole_raw is None or steady is None:
        raise RuntimeError(f"ProducerPerformance printed no steady-state summary: {tail}")
    sent, rate_s, mb = steady
    records, rate = int(sent), float(rate_s)
    # the part of the steady window that overlaps sending: the window opens 5 s into the
    # steady part and closes at the summary, after the last send
    sending_in_window = records / rate - _PP_REPORT_S
    if steady_raw is not None and sending_in_window >= PP_MIN_WINDOW_S:
        raw, cpu_window = steady_raw, "steady state"
        cpu = {k: v for k, v in raw.items() if not k.startswith("server")}
        # cores over the window, all servers together (per record: over the rate)
        cpu["server_cores"] = round(sum(v for k, v in raw.items() if k.startswith("server")), 3)
    else:
        # CPU seconds over every record sent, warm-up included, as cores at the steady
        # rate, so that per_million gives CPU seconds per record of the whole run
        raw, cpu_window = whole_raw, "whole run"
        scale = whole_s / (warm + measured) * rate
        cpu = {
            k: (
                round(v * scale, 3)
                if k.endswith("_cores")
                and not k.startswith(("runq_", "foreign", "kernel", "steal", "machine"))
                else v
            )
            for k, v in raw.items()
            if not k.startswith("server")
        }
        cpu["server_cores"] = round(
            sum(v for k, v in raw.items() if k.startswith("server")) * scale, 3
        )
    return {
        "records": records,
        "records_per_s": rate,
        "mb_per_s": float(mb),
        "warmup_records": warm,
        "cpu": cpu,
        "cpu_window": cpu_window,
        "cpu_window_s": round(window_s if cpu_window == "steady state" else whole_s, 2),
        "total_sent": warm + measured,
    }


def nats_bench(server: NatsServer, stream: str, size: int, seconds: float) -> dict[str, Any]:
    """natscli's ``nats bench js pub async`` (the Go client, 500 publishes in flight) into a
    new file-backed stream: a warm-up run that sizes the measured one; server CPU over it."""
    cli = str(peerservers.peer_paths()["nats_cli"])

    def run(records: int, csv_path: Path) -> tuple[dict[str, Any], float]:
        _out, tool_cpu = procs.run_tool(
            [cli, "-s", server.url, "bench", "js", "pub", "async", f"{stream}.s",
             "--create", "--storage", "file", "--stream", stream, "--msgs", str(records),
             "--size", str(size), "--no-progress", "--csv", str(csv_path),
             # the stream keeps the probe's records too: its default 1 GB cap refused
             # the measured run's at 1 KiB (code 10077) once the machine was quiet
             "--maxbytes", "4GB"],
            timeout=600,
        )  # fmt: skip
        header, line = csv_path.read_text().strip().splitlines()[-2:]
        doc = dict(zip(header.lstrip("#").split(","), line.split(","), strict=False))
        rate = float(doc["MsgsPerSec"])
        return {"records_per_s": rate, "mb_per_s": round(rate * size / 1e6, 2)}, tool_cpu

    probe, _ = run(200_000, server.home / "probe.csv")
    records = max(200_000, int(probe["records_per_s"] * seconds))
    meter = procs.CpuMeter({"server": server.pid})
    meter.start()
    started = time.perf_counter()
    result, tool_cpu = run(records, server.home / "run.csv")
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    cpu["client_cores"] = round(tool_cpu / elapsed, 3)
    cpu["foreign_cores"] = round(max(0.0, cpu["foreign_cores"] - cpu["client_cores"]), 3)
    sending_s = records / result["records_per_s"]
    cpu["server_cores"] = round(cpu.pop("server_cores") * elapsed / sending_s, 3)
    stored = nats_streams(server.url, stream, 1, "count", names=[stream])
    check_stored("nats", stream, 200_000 + records, stored)
    return {"records": records, **result, "cpu": cpu, "total_sent": stored}


def nats_streams(
    url: str, topic: str, partitions: int, op: str, names: list[str] | None = None
) -> int:
    """Create (``op="create"``) or count and delete (``op="count"``) a topic's streams
    (``topic-0``...; or ``names``)."""
    import nats

    async def go() -> int:
        nc = await nats.connect(url)
        js = nc.jetstream()
        total = 0
        try:
            for i, name in enumerate(names or [f"{topic}-{i}" for i in range(partitions)]):
                if op == "create":
                    await js.add_stream(name=name, subjects=[f"{topic}.{i}"])
                else:
                    info = await js.stream_info(name)
                    total += int(info.state.messages)
                    await js.delete_stream(name)
        finally:
            await nc.close()
        return total

    return asyncio.run(go())


# ---------------------------------------------------------------------------- 1. produce


def _combos(settings: Settings) -> list[tuple[str, int, int]]:
    return [
        (acks, parts, size)
        for acks in settings.acks
        for parts in settings.partitions
        for size in settings.value_bytes
    ]


def _row(
    system: str, family: str, client: str, acks: str, parts: int, size: int, **rest: Any
) -> dict[str, Any]:
    row = {
        "system": system,
        "family": family,
        "client": client,
        "acks": acks,
        "partitions": parts,
        "value_bytes": size,
        **rest,
    }
    per_million(row)
    return row


def _say(settings: Settings, row: dict[str, Any]) -> None:
    settings.log(
        f"  {row['system']:8} {row['client']:22} acks={row['acks']:3} p={row['partitions']}"
        f" {row['value_bytes']:5} B: {row['records_per_s']:>12,.0f} rec/s"
        f"  server {row.get('server_cpu_s_per_m')} s/M  client {row.get('client_cpu_s_per_m')} s/M"
        f"  busy {row.get('busy_cores_before')}"
    )


def produce(settings: Settings, rows: list[dict[str, Any]]) -> None:
    common = {"warmup_s": settings.produce_warmup_s, "duration_s": settings.produce_s}
    timeout = 180 + 4 * settings.produce_s
    n = 0
    with headrace_broker("peers-produce") as broker:
        for acks, parts, size in _combos(settings):
            for family, api in (("batch", "send_many"), ("per-record", "send")):
                n += 1
                topic = f"produce-{n}"
                broker.create_topic(topic, parts)
                load = settle(settings)
                result = _hr(
                    "hr_produce",
                    {
                        "server_pid": broker.pid,
                        "bootstrap": broker.bootstrap,
                        "topic": topic,
                        "value_bytes": size,
                        "api": api,
                        "acks": ACKS[acks],
                        **common,
                    },
                    timeout,
                )
                check_stored("headrace", topic, result["total_sent"], _stored_hr(broker, topic))
                broker.delete_topic(topic)
                row = _row("headrace", family, api, acks, parts, size, **load, **result)
                rows.append(row)
                _say(settings, row)
    for flush in ("interval", "default"):
        with kafka(f"peers-kafka-{flush}", 1, flush) as k:
            for acks, parts, size in _combos(settings):
                clients = [("batch", "ProducerPerformance")]
                if flush == "interval":
                    clients += [("per-record", "confluent-kafka"), ("per-record", "aiokafka")]
                for family, client in clients:
                    n += 1
                    topic = f"produce-{n}"
                    k.create_topic(topic, parts)
                    load = settle(settings)
                    if client == "ProducerPerformance":
                        result = producer_performance(k, topic, size, acks, settings)
                    else:
                        result = _peer(
                            "ck_produce" if client == "confluent-kafka" else "aio_produce",
                            {
                                "server_pids": k.pids,
                                "bootstrap": k.bootstrap,
                                "topic": topic,
                                "value_bytes": size,
                                "acks": acks,
                                **common,
                            },
                            timeout,
                        )
                    check_stored("kafka", topic, result["total_sent"], k.records(topic))
                    k.delete_topic(topic)
                    row = _row(
                        "kafka" if flush == "interval" else "kafka-default-flush",
                        family,
                        client,
                        acks,
                        parts,
                        size,
                        kafka_flush=flush,
                        **load,
                        **result,
                    )
                    rows.append(row)
                    _say(settings, row)
    with nats_server("peers-nats") as server:
        for size in settings.value_bytes:
            n += 1
            load = settle(settings)
            result = nats_bench(server, f"batch{n}", size, settings.produce_s)
            row = _row(
                "nats", "batch", "nats bench js pub async", "stored", 1, size, **load, **result
            )
            rows.append(row)
            _say(settings, row)
        # a JetStream publish is acknowledged once stored: one row serves acks=1 and all
        for _, parts, size in _combos(settings)[
            : len(settings.partitions) * len(settings.value_bytes)
        ]:
            n += 1
            topic = f"produce{n}"
            nats_streams(server.url, topic, parts, "create")
            load = settle(settings)
            result = _peer(
                "nats_produce",
                {
                    "server_pids": [server.pid],
                    "url": server.url,
                    "topic": topic,
                    "partitions": parts,
                    "value_bytes": size,
                    **common,
                },
                timeout,
            )
            check_stored(
                "nats", topic, result["total_sent"], nats_streams(server.url, topic, parts, "count")
            )
            row = _row(
                "nats", "per-record", "nats-py publish_async", "stored", parts, size,
                streams=parts, **load, **result,
            )  # fmt: skip
            rows.append(row)
            _say(settings, row)


def _stored_hr(broker: procs.BrokerProcess, topic: str) -> int:
    status, doc = procs.http_json(f"{broker.admin_url}/v1/topics/default/{topic}")
    if status != 200:
        raise RuntimeError(f"describe {topic}: HTTP {status} {doc}")
    return sum(p["log_end_offset"] - p["log_start_offset"] for p in doc["partition_details"])


# ---------------------------------------------------------------------------- 2. replicated


def replicated(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """RF=3, acks=all, minInSync 2, 100 B records: headrace local cluster vs 3-node Kafka."""
    common = {"warmup_s": settings.produce_warmup_s, "duration_s": settings.produce_s}
    timeout = 240 + 4 * settings.produce_s
    size = 100
    n = 0
    with headrace_local("peers-replicated") as cluster:
        pids = list(cluster.broker_pids().values())
        for parts in settings.replicated_partitions:
            for family, api in (("batch", "send_many"), ("per-record", "send")):
                n += 1
                topic = f"rep-{n}"
                # Untiered, like the RF=1 rows' standalone broker and Kafka: a local cluster
                # tiers by default, and uploading every segment (a copy and an fsync on the
                # leader) is not replication.
                cluster.create_topic(topic, parts, 3, 2, tiered=False)
                load = settle(settings)
                result = _hr(
                    "hr_produce",
                    {
                        "server_pids": pids,
                        "bootstrap": cluster.bootstrap,
                        "topic": topic,
                        "value_bytes": size,
                        "api": api,
                        "acks": "all",
                        **common,
                    },
                    timeout,
                )
                check_stored("headrace", topic, result["total_sent"], cluster.records(topic))
                row = _row("headrace", family, api, "all", parts, size, rf=3, min_insync=2,
                           **load, **result)  # fmt: skip
                rows.append(row)
                _say(settings, row)
    with kafka("peers-kafka-rf3", 3, "interval") as k:
        for parts in settings.replicated_partitions:
            for family, client in (
                ("batch", "ProducerPerformance"),
                ("per-record", "confluent-kafka"),
            ):
                n += 1
                topic = f"rep-{n}"
                k.create_topic(topic, parts, 3, 2)
                load = settle(settings)
                if client == "ProducerPerformance":
                    result = producer_performance(k, topic, size, "all", settings)
                else:
                    result = _peer(
                        "ck_produce",
                        {
                            "server_pids": k.pids,
                            "bootstrap": k.bootstrap,
                            "topic": topic,
                            "value_bytes": size,
                            "acks": "all",
                            **common,
                        },
                        timeout,
                    )
                check_stored("kafka", topic, result["total_sent"], k.records(topic))
                row = _row("kafka", family, client, "all", parts, size, rf=3, min_insync=2,
                           **load, **result)  # fmt: skip
                rows.append(row)
                _say(settings, row)


# ---------------------------------------------------------------------------- 3. consume


def consume(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Catch-up of ``consume_records`` 100 B records on one partition, from the earliest."""
    total = settings.consume_records
    size = 100
    limit_s = 600.0
    with headrace_broker("peers-consume") as broker:
        topic = "catchup"
        broker.create_topic(topic, 1)
        _hr(
            "hr_preload",
            {"server_pid": broker.pid, "bootstrap": broker.bootstrap, "topic": topic,
             "records": total, "value_bytes": size},
            limit_s,
        )  # fmt: skip
        check_stored("headrace", topic, total, _stored_hr(broker, topic))
        load = settle(settings)
        result = _hr(
            "hr_consume",
            {"server_pid": broker.pid, "bootstrap": broker.bootstrap, "topic": topic,
             "records": total, "value_bytes": size, "max_s": limit_s},
            limit_s + 60,
        )  # fmt: skip
        row = _row("headrace", "per-record", "Consumer.batches", "-", 1, size, **load, **result)
        rows.append(row)
        _say(settings, row)
    with kafka("peers-kafka-consume", 1, "interval") as k:
        topic = "catchup"
        k.create_topic(topic, 1)
        peerservers.kafka_tool(
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic", topic, "--num-records", str(total), "--record-size", str(size),
            "--throughput", "-1", "--command-property", f"bootstrap.servers={k.bootstrap}",
            timeout=limit_s,
        )  # fmt: skip
        check_stored("kafka", topic, total, k.records(topic))
        load = settle(settings)
        meter = procs.CpuMeter({"server": k.pids[0]})
        meter.start()
        started = time.perf_counter()
        out, tool_cpu = peerservers.kafka_tool(
            "org.apache.kafka.tools.ConsumerPerformance",
            "--bootstrap-server", k.bootstrap, "--topic", topic, "--num-records", str(total),
            "--timeout", "30000",
            timeout=limit_s,
        )  # fmt: skip
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
        cpu["client_cores"] = round(tool_cpu / elapsed, 3)
        cpu["foreign_cores"] = round(max(0.0, cpu["foreign_cores"] - cpu["client_cores"]), 3)
        stats = _consumer_performance(out)
        # the tool's rate is over its fetch loop (after joining the group); ours over all
        row = _row(
            "kafka", "batch", "ConsumerPerformance", "-", 1, size,
            records=stats["records"], records_per_s=stats["records_per_s"],
            rate_from="ConsumerPerformance nMsg.sec (join included)",
            fetch_records_per_s=stats["fetch_records_per_s"], cpu=cpu, **load,
        )  # fmt: skip
        rows.append(row)
        _say(settings, row)
        load = settle(settings)
        result = _peer(
            "ck_consume",
            {"server_pids": k.pids, "bootstrap": k.bootstrap, "topic": topic,
             "records": total, "value_bytes": size, "max_s": limit_s},
            limit_s + 60,
        )  # fmt: skip
        row = _row("kafka", "per-record", "confluent-kafka consume", "-", 1, size, **load, **result)
        rows.append(row)
        _say(settings, row)


def _consumer_performance(out: str) -> dict[str, float]:
    """The data line of ConsumerPerformance's CSV-like output."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    header = next(i for i, ln in enumerate(lines) if ln.startswith("start.time"))
    names = [n.strip() for n in lines[header].split(",")]
    values = [v.strip() for v in lines[header + 1].split(",")]
    doc = dict(zip(names, values, strict=False))
    return {
        "records": int(float(doc["data.consumed.in.nMsg"])),
        "records_per_s": float(doc["nMsg.sec"]),
        "fetch_records_per_s": float(doc.get("fetch.nMsg.sec", "0") or 0),
    }


# ---------------------------------------------------------------------------- 4. latency


def latency(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Produce-to-consume percentiles at fixed rates, acks=1, one partition, 100 B."""
    common = {
        "value_bytes": 100,
        "warmup_s": settings.latency_warmup_s,
        "measure_s": settings.latency_measure_s,
        "drain_s": 5.0,
        "linger_ms": settings.latency_linger_ms,
    }
    timeout = 120 + settings.latency_warmup_s + settings.latency_measure_s

    def note(row: dict[str, Any]) -> None:
        lat = row["latency_ms"]
        settings.log(
            f"  {row['system']:8} {row['rate']:>6}/s: p50 {lat['p50']} p99 {lat['p99']}"
            f" p99.9 {lat['p99_9']} max {lat['max']} ms (missing {lat['missing']})"
            f"  busy {row['busy_cores_before']}"
        )

    with headrace_broker("peers-latency") as broker:
        for rate in settings.latency_rates:
            topic = f"latency-{rate}"
            broker.create_topic(topic, 1)
            load = settle(settings)
            result = _hr(
                "hr_latency",
                {"server_pid": broker.pid, "bootstrap": broker.bootstrap, "topic": topic,
                 "rate": rate, **common},
                timeout,
            )  # fmt: skip
            broker.delete_topic(topic)
            row = {"system": "headrace", "client": "headrace Producer.send + Consumer",
                   "acks": "1", **load, **result}  # fmt: skip
            rows.append(row)
            note(row)
    with kafka("peers-kafka-latency", 1, "interval") as k:
        for rate in settings.latency_rates:
            topic = f"latency-{rate}"
            k.create_topic(topic, 1)
            load = settle(settings)
            result = _peer(
                "ck_latency",
                {"server_pids": k.pids, "bootstrap": k.bootstrap, "topic": topic,
                 "rate": rate, "acks": "1", **common},
                timeout,
            )  # fmt: skip
            row = {"system": "kafka", "client": "confluent-kafka produce + consume",
                   "acks": "1", **load, **result}  # fmt: skip
            rows.append(row)
            note(row)


# ---------------------------------------------------------------------------- 5. failover


def _failover_gap(result: dict[str, Any], killed_at: float) -> dict[str, Any]:
    """From (sent, acked) pairs: the first record *sent* after the kill can only have been
    acknowledged by a new leader, so its ack time is when producing worked again."""
    pairs = [tuple(p) for p in result["acked_at"]]
    before = [p for p in pairs if p[1] <= killed_at]
    after_sent = [p for p in pairs if p[0] > killed_at]
    acks = [p[1] for p in pairs]
    gaps = [b - a for a, b in itertools.pairwise(acks)]
    return {
        "acked_before_kill": len(before),
        "acked_after_kill": len(pairs) - len(before),
        "first_ack_after_kill_s": round(after_sent[0][1] - killed_at, 3) if after_sent else None,
        "longest_ack_gap_s": round(max(gaps), 3) if gaps else None,
        "failed_sends": result["error_count"],
        "errors": result["errors"][:5],
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")


def failover(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """kill -9 the partition leader of a 3-node cluster under acks=all load (one record in
    flight at a time), RF=3, minInSync 2; both systems at their defaults otherwise."""
    spec = {"value_bytes": 100, "duration_s": settings.failover_probe_s}
    timeout = 120 + settings.failover_probe_s

    def probe_and_kill(
        kind: str, module: str, kill: Callable[[], None], **more: Any
    ) -> tuple[dict[str, Any], float]:
        proc_spec = {"kind": kind, **spec, **more}
        import subprocess

        proc = procs.spawn(
            [sys.executable, "-m", module, json.dumps(proc_spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            time.sleep(settings.failover_kill_after_s)  # the load runs meanwhile
            killed_at = time.time()
            kill()
            out, err = proc.communicate(timeout=timeout)
        finally:
            procs.reap(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} failed: {err.decode(errors='replace')[-1500:]}")
        return json.loads(out.decode().strip().splitlines()[-1]), killed_at

    with headrace_local("peers-failover") as cluster:
        topic = "failover"
        cluster.create_topic(topic, 1, 3, 2)
        leader = int(cluster.partitions(topic)[0]["leader"])
        load = settle(settings)
        leader_pid = cluster.broker_pids()[leader]
        result, killed_at = probe_and_kill(
            "hr_failover_probe", "bench.peerworker", lambda: cluster.kill9(leader),
            bootstrap=cluster.bootstrap, topic=topic,
        )  # fmt: skip
        if _alive(leader_pid):
            raise RuntimeError(f"broker {leader} (pid {leader_pid}) survived kill -9")
        row = {"system": "headrace", "killed_leader": leader, **load,
               **_failover_gap(result, killed_at)}  # fmt: skip
        rows.append(row)
        settings.log(f"  headrace failover: {row}")
    with kafka("peers-kafka-failover", 3, "default") as k:
        topic = "failover"
        k.create_topic(topic, 1, 3, 2)
        leader = k.leader_of(topic)
        load = settle(settings)
        result, killed_at = probe_and_kill(
            "ck_failover_probe", "bench.peerworker", lambda: k.kill9(k.node(leader)),
            bootstrap=k.bootstrap, topic=topic,
        )  # fmt: skip
        row = {"system": "kafka", "killed_leader": leader, **load,
               **_failover_gap(result, killed_at)}  # fmt: skip
        rows.append(row)
        settings.log(f"  kafka failover: {row}")


# ---------------------------------------------------------------------------- 6. scale


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _heartbeat_sizes(admin_url: str) -> tuple[int, int]:
    """Body bytes of a full heartbeat, and of the delta poll the controller makes after it
    (``?since=`` the full one's journal position) a second later."""
    with urllib.request.urlopen(f"{admin_url}/v1/heartbeat", timeout=30) as resp:
        body = resp.read()
    journal = json.loads(body).get("journal")
    if journal is None:
        return len(body), len(body)  # a broker without deltas: every poll is full
    time.sleep(1.0)
    since = f"{journal['instance']}:{journal['seq']}"
    with urllib.request.urlopen(f"{admin_url}/v1/heartbeat?since={since}", timeout=30) as resp:
        return len(body), len(resp.read())


def _controller_gauges(controller_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{controller_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(headrace_controller_\w+) (\S+)$", text, re.MULTILINE)
    }


def _wait_settled(controller_url: str, timeout_s: float) -> float:
    """Seconds until the controller has run ``SETTLED_STEPS`` steps in a row with no
    generation bump and no Offline partition: elections and LRS changes are over (being
    led is not enough; a broker still opening its partitions misses polls and loses them)."""
    started = time.perf_counter()
    mark: tuple[float, float] | None = None  # (bumps, steps) when bumps last moved

    def quiet() -> bool:
        nonlocal mark
        g = _controller_gauges(controller_url)
        bumps, steps = (
            g.get("headrace_controller_generation_bumps", 0.0),
            g.get("headrace_controller_steps_total", 0.0),
        )
        if mark is None or bumps != mark[0] or g.get("headrace_controller_offline_partitions"):
            mark = (bumps, steps)
            return False
        return steps - mark[1] >= SETTLED_STEPS

    waiting.until(quiet, timeout_s, "controller settled", poll_s=1.0)
    return time.perf_counter() - started


#: steps without a generation bump that count as settled (the controller polls once a second)
SETTLED_STEPS = 10


def _controller_steps(controller_url: str) -> tuple[float, float]:
    """(steps run, CPU seconds in them) from the controller's /metrics (0s if absent)."""
    with urllib.request.urlopen(f"{controller_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    found = {}
    for name in ("headrace_controller_steps_total", "headrace_controller_step_cpu_seconds_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        found[name] = float(m.group(1)) if m else 0.0
    return (
        found["headrace_controller_steps_total"],
        found["headrace_controller_step_cpu_seconds_total"],
    )


#: the most partitions one idle topic of the scale scenarios gets
IDLE_TOPIC_PARTITIONS = 4096


def create_idle_topics(cluster: HeadraceLocal, total: int) -> list[str]:
    """Create ``total`` partitions (RF=3, minInSync 2) in topics of at most
    ``IDLE_TOPIC_PARTITIONS`` and wait until every one has a leader; the topic names."""
    names: list[str] = []
    left = total
    while left > 0:
        count = min(IDLE_TOPIC_PARTITIONS, left)
        names.append(f"idle-{len(names)}")
        cluster.create_topic(names[-1], count, 3, 2, wait=False)
        left -= count
    waiting.until(functools.partial(cluster.led, names, total), 1200, f"{total} led", poll_s=0.5)
    return names


def scale(settings: Settings, rows: list[dict[str, Any]]) -> None:
    """Idle cost against partition count, headrace only: a 3-broker local cluster holding
    ``scale_partitions`` partitions (RF=3, topics of at most 4,096), no traffic. Per size:
    time until every partition has a leader, idle CPU of each broker and the controller,
    heartbeat body bytes (a full report, and the delta the controller polls each broker
    for once a second), the controller's CPU per step, broker RSS, and acks=all
    ``send_many`` throughput to one more 8-partition topic beside them."""
    for total in settings.scale_partitions:
        with headrace_local(f"peers-scale-{total}") as cluster:
            record = cluster.record
            brokers = {int(b["id"]): int(b["pid"]) for b in record["brokers"]}
            started = time.perf_counter()
            names = create_idle_topics(cluster, total)
            online_s = time.perf_counter() - started
            settled_s = _wait_settled(cluster.controller_url, 600) + online_s
            cluster.create_topic("scale-produce", 8, 3, 2)
            load = settle(settings)
            time.sleep(settings.scale_idle_settle_s)
            meter = procs.CpuMeter(
                {**{f"broker{b}": pid for b, pid in brokers.items()},
                 "controller": int(record["controller_pid"])}
            )  # fmt: skip
            controller_before = _controller_steps(cluster.controller_url)
            meter.start()
            time.sleep(settings.scale_idle_s)
            idle = meter.stop()
            controller_after = _controller_steps(cluster.controller_url)
            heartbeat_bytes, delta_bytes = [], []
            for b in record["brokers"]:
                full, delta = _heartbeat_sizes(f"http://{b['host']}:{b['admin_port']}")
                heartbeat_bytes.append(full)
                delta_bytes.append(delta)
            steps = controller_after[0] - controller_before[0]
            step_ms = (
                round(1000 * (controller_after[1] - controller_before[1]) / steps, 2)
                if steps
                else None
            )
            rss = [_rss_mb(pid) for pid in brokers.values()]
            result: dict[str, Any] = {"records_per_s": None, "cpu": None}
            try:
                waiting.until(
                    functools.partial(cluster.led, ["scale-produce"], 8), 300, "produce topic"
                )
                result = _hr(
                    "hr_produce",
                    {"server_pids": list(brokers.values()), "bootstrap": cluster.bootstrap,
                     "topic": "scale-produce", "value_bytes": 100, "api": "send_many",
                     "acks": "all", "warmup_s": settings.produce_warmup_s,
                     "duration_s": settings.produce_s},
                    240 + 4 * settings.produce_s,
                )  # fmt: skip
            except (RuntimeError, TimeoutError) as exc:
                # keep the idle figures; say why there is no produce figure
                result["error"] = str(exc).strip().splitlines()[-1][:300]
            broker_cores = [idle[f"broker{b}_cores"] for b in brokers]
            row = {
                "system": "headrace",
                "partitions": total,
                "topics": len(names),
                "replicas": 3,
                "online_s": round(online_s, 2),
                "settled_s": round(settled_s, 2),
                "idle_broker_cores": broker_cores,
                "idle_broker_cores_mean": round(sum(broker_cores) / len(broker_cores), 3),
                "idle_controller_cores": idle["controller_cores"],
                "idle_foreign_cores": idle["foreign_cores"],
                "heartbeat_bytes": heartbeat_bytes,
                "heartbeat_delta_bytes": delta_bytes,
                "controller_steps": steps,
                "controller_step_cpu_ms": step_ms,
                "broker_rss_mb": rss,
                "produce_records_per_s": result["records_per_s"],
                "produce_cpu": result["cpu"],
                **({"produce_error": result["error"]} if "error" in result else {}),
                **load,
            }
            rows.append(row)
            settings.log(
                f"  scale {total:>6} partitions: online in {row['online_s']} s, idle"
                f" {broker_cores} cores/broker, controller {idle['controller_cores']},"
                f" heartbeat {heartbeat_bytes} B full, {delta_bytes} B per idle poll,"
                f" controller step {step_ms} ms CPU, RSS {rss} MB,"
                f" acks=all produce {result['records_per_s']}/s {result.get('error', '')}"
            )


#: each appends its rows as it measures them, so a failure keeps what came before it
SCENARIOS: dict[str, Callable[[Settings, list[dict[str, Any]]], None]] = {
    "produce": produce,
    "replicated": replicated,
    "consume": consume,
    "latency": latency,
    "failover": failover,
    "scale": scale,
}


# ---------------------------------------------------------------------------- entry


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    from bench import peerreport

    parser = argparse.ArgumentParser(prog="python -m bench.peerbench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one small configuration each")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument("--render-only", action="store_true", help="re-render from peers.json")
    parser.add_argument("--settle-s", type=float, default=None)
    parser.add_argument("--consume-records", type=int, default=None)
    parser.add_argument(
        "--scale-partitions", default=None, help="comma-separated, e.g. 10,1000,10000"
    )
    args = parser.parse_args(argv)
    path = args.out / ("peers-quick.json" if args.quick else "peers.json")
    if args.render_only:
        stored: dict[str, Any] = json.loads(path.read_text())
        peerreport.publish(stored, args.out, DOCS if not args.no_docs else None, print)
        return 0

    def log(line: str) -> None:
        print(line, flush=True)

    overrides: dict[str, Any] = {"log": log}
    if args.settle_s is not None:
        overrides["settle_s"] = args.settle_s
    if args.consume_records:
        overrides["consume_records"] = args.consume_records
    if args.scale_partitions:
        overrides["scale_partitions"] = tuple(int(x) for x in args.scale_partitions.split(","))
    settings = Settings.for_quick(**overrides) if args.quick else Settings(**overrides)
    peerservers.peer_paths()  # build or find the peers before any clock starts
    previous: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(ValueError):
            previous = json.loads(path.read_text())
    doc: dict[str, Any] = {
        "schema": 1,
        "run_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": settings.quick,
        "versions": {
            "kafka": peerservers.kafka_version(),
            "nats_server": peerservers.nats_version(),
            "clients": peerreport.client_versions(),
        },
        "scenarios": dict(previous.get("scenarios", {})),
    }
    failed: list[str] = []
    # a TERM (or INT) ends the run cleanly: servers killed, what was measured written
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        for name in args.only or list(SCENARIOS):
            log(f"== {name}")
            started = time.monotonic()
            rows: list[dict[str, Any]] = []
            error = None
            try:
                SCENARIOS[name](settings, rows)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log(f"   {name} FAILED: {error}")
                log(traceback.format_exc())
                failed.append(name)
            except BaseException:
                error = "interrupted"  # a TERM or ^C: keep what it measured, then stop
                raise
            finally:
                procs.kill_all()
                if error is None or rows:  # nothing measured: the previous rows stay
                    doc["scenarios"][name] = {
                        "run_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "seconds": round(time.monotonic() - started, 1),
                        "rows": rows,
                        **({"failed": error} if error is not None else {}),
                    }
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
    finally:
        procs.kill_all()
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    peerreport.publish(doc, args.out, None if args.no_docs or settings.quick else DOCS, log)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
