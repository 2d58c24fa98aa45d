"""The scenarios: each starts its servers, runs client workers, and returns result rows.

Every scenario measures headrace and, where there is a Redis Streams
equivalent, Redis side by side in the same run at matched durability:

=====================  ==============================  =============================
headrace ``--fsync``   Redis                           what survives a power loss
=====================  ==============================  =============================
``interval`` (1000 ms) ``appendfsync everysec``        all but the last ~1 s
``always``             ``appendfsync always``          every acknowledged write
=====================  ==============================  =============================

Servers are separate processes with fresh temp data dirs; clients are
separate worker processes (``bench.worker``). See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.testing import procs
from headrace.testing.minio import MinioServer

DURABILITY = {"interval": "everysec", "always": "always"}
#: how long a broker may take to become ready (recovering a 5 GB log) or to shut down
READY_TIMEOUT_S = 120.0


@dataclass(slots=True)
class Settings:
    """Sizes and durations of one run; ``quick()`` shrinks everything for a smoke run."""

    quick: bool = False
    systems: frozenset[str] = frozenset({"headrace", "redis"})
    #: seconds of warm-up then measurement per produce configuration
    produce_warmup_s: float = 1.0
    produce_s: float = 5.0
    produce_value_bytes: tuple[int, ...] = (100, 1024)
    produce_partitions: tuple[int, ...] = (1, 8)
    produce_fsync: tuple[str, ...] = ("interval", "always")
    #: records pre-loaded and read back by the catch-up scenario (100 B each)
    consume_records: int = 10_000_000
    consume_partitions: tuple[int, ...] = (1, 8)
    latency_rates: tuple[int, ...] = (1_000, 10_000, 50_000)
    latency_warmup_s: float = 2.0
    latency_measure_s: float = 10.0
    latency_linger_ms: float = 1.0
    #: log sizes for the recovery scenario, in GB (10^9 bytes); 0 = empty-log baseline
    recovery_sizes_gb: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 5.0)
    #: redis-benchmark: parallel connections and pipeline depth (its best on this box)
    redis_bench_clients: int = 4
    redis_bench_pipeline: int = 256
    #: redis-py pipelined XADD: commands per round trip, one connection
    redis_py_pipeline: int = 1000
    #: XREADGROUP COUNT for the Redis catch-up consumer
    redis_read_count: int = 10_000
    #: pause before each produce measurement so memory freed by the previous one has been
    #: handed back to the hypervisor: every measurement then starts from the same state
    #: (see ``procs.page_touch_cost`` and docs/benchmarks.md)
    page_settle_s: float = 5.0
    #: tiered storage: MiB uploaded through PartitionTier.upload per configuration, in
    #: objects of ``tiered_object_mb`` (the broker's default segment size is 16 MiB)
    tiered_mb: int = 512
    tiered_object_mb: int = 16
    #: partitions uploading at once (one uploader thread each)
    tiered_upload_partitions: tuple[int, ...] = (1, 4)
    #: records per batch and value size: 256 x 1 KiB, a ~260 KiB batch
    tiered_batch_records: int = 256
    tiered_value_bytes: int = 1024
    #: bytes per PartitionTier.read call: the broker's fetch size
    tiered_read_bytes: int = 1 << 20
    #: readahead chunks of the measured reader (PartitionTier's default); 0 is also measured
    tiered_prefetch: int = 2
    log: Callable[[str], None] = field(default=print)

    @classmethod
    def for_quick(cls, **kwargs: Any) -> Settings:
        return cls(
            quick=True,
            produce_warmup_s=0.5,
            produce_s=2.0,
            consume_records=1_000_000,
            latency_warmup_s=1.0,
            latency_measure_s=3.0,
            recovery_sizes_gb=(0.0, 0.2, 0.5),
            tiered_mb=128,
            **kwargs,
        )

    def wants(self, system: str) -> bool:
        return system in self.systems


def load_snapshot() -> dict[str, Any]:
    """Machine load before a scenario: load averages and a 1 s busy-core sample."""
    one, five, fifteen = os.getloadavg()
    return {
        "loadavg": [round(one, 2), round(five, 2), round(fifteen, 2)],
        "busy_cores_before": procs.machine_busy_cores(1.0),
        "at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _row_load() -> float:
    return round(os.getloadavg()[0], 2)


def _settle_memory(settings: Settings) -> None:
    time.sleep(settings.page_settle_s)


# ---------------------------------------------------------------------------- helpers


def _headrace_records(broker: procs.BrokerProcess, topic: str) -> int:
    status, doc = procs.http_json(f"{broker.admin_url}/v1/topics/default/{topic}")
    if status != 200:
        raise RuntimeError(f"describe {topic}: HTTP {status} {doc}")
    return sum(p["log_end_offset"] - p["log_start_offset"] for p in doc["partition_details"])


def _redis_benchmark(
    port: int, stream: str, value_bytes: int, requests: int, clients: int, pipeline: int
) -> tuple[dict[str, float], float]:
    """Run redis-benchmark's custom-command mode on XADD; (its CSV row, its CPU seconds)."""
    argv = [
        "redis-benchmark",
        "-h",
        procs.LOOPBACK,
        "-p",
        str(port),
        "-n",
        str(requests),
        "-c",
        str(clients),
        "-P",
        str(pipeline),
        "--csv",
        "XADD",
        stream,
        "*",
        "v",
        "x" * value_bytes,
    ]
    out, cpu = procs.run_tool(argv, timeout=600)
    rows = list(csv.DictReader(io.StringIO(out)))
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no CSV: {out[:300]!r}")
    row = rows[-1]
    return {k: float(v) for k, v in row.items() if k != "test"}, cpu


def _redis_client(port: int) -> Any:
    import redis

    return redis.Redis(host=procs.LOOPBACK, port=port)


def _redis_bench_row(
    settings: Settings, server: procs.RedisProcess, value_bytes: int, target_s: float
) -> dict[str, Any]:
    """Calibrate with a short run (also the warm-up), then a run sized to ``target_s``."""
    stream = f"bench-{value_bytes}"
    c, p = settings.redis_bench_clients, settings.redis_bench_pipeline
    probe, _ = _redis_benchmark(server.port, stream, value_bytes, 200_000, c, p)
    requests = max(200_000, int(probe["rps"] * target_s))
    meter = procs.CpuMeter({"server": server.pid})
    meter.start()
    started = time.perf_counter()
    stats, tool_cpu = _redis_benchmark(server.port, stream, value_bytes, requests, c, p)
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    cpu["client_cores"] = round(tool_cpu / elapsed, 3)
    cpu["foreign_cores"] = round(max(0.0, cpu["foreign_cores"] - cpu["client_cores"]), 3)
    rps = stats["rps"]
    with contextlib.closing(_redis_client(server.port)) as r:
        r.delete(stream)
    return {
        "records": requests,
        "records_per_s": rps,
        "mb_per_s": round(rps * value_bytes / 1e6, 2),
        "p50_ms": stats.get("p50_latency_ms"),
        "p99_ms": stats.get("p99_latency_ms"),
        "cpu": cpu,
    }


@contextlib.contextmanager
def _headrace_broker(
    settings: Settings, prefix: str, fsync: str = "interval"
) -> Iterator[procs.BrokerProcess]:
    """A broker (not started yet) in a temp dir; afterwards it is killed and the dir
    removed, and on a failure its log tail is logged."""
    home = procs.temp_dir(prefix)
    broker = procs.BrokerProcess(home / "data", fsync, ready_timeout_s=READY_TIMEOUT_S)
    try:
        yield broker
    except BaseException:
        settings.log(f"--- broker log tail:\n{broker.log_tail()}")
        raise
    finally:
        broker.kill9()
        procs.remove_dir(home)


def _headrace_worker(
    kind: str, broker: procs.BrokerProcess, topic: str, *, timeout: float, **spec: Any
) -> dict[str, Any]:
    """Run a headrace client workload (``bench.worker``) against ``topic`` on ``broker``."""
    return procs.run_worker(
        {
            "kind": kind,
            "server_pid": broker.pid,
            "bootstrap": broker.bootstrap,
            "topic": topic,
            **spec,
        },
        timeout=timeout,
    )


@contextlib.contextmanager
def _redis_server(prefix: str, appendfsync: str) -> Iterator[procs.RedisProcess]:
    """A started redis-server in a temp dir; stopped and removed afterwards."""
    home = procs.temp_dir(prefix)
    server = procs.RedisProcess(home, appendfsync)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        procs.remove_dir(home)


# ---------------------------------------------------------------------------- 1. produce


def produce(settings: Settings) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    log = settings.log
    for fsync in settings.produce_fsync:
        if settings.wants("headrace"):
            with _headrace_broker(settings, f"produce-{fsync}", fsync) as broker:
                broker.start()
                configs: list[tuple[str, int, int]] = [
                    ("send_many", parts, size)
                    for parts in settings.produce_partitions
                    for size in settings.produce_value_bytes
                ]
                if fsync == "interval":
                    configs.append(("send", 1, 100))
                for i, (api, parts, size) in enumerate(configs):
                    topic = f"produce-{i}"
                    broker.create_topic(topic, parts)
                    _settle_memory(settings)
                    load1 = _row_load()
                    result = _headrace_worker(
                        "hr_produce",
                        broker,
                        topic,
                        timeout=120 + 4 * settings.produce_s,
                        value_bytes=size,
                        api=api,
                        acks="leader",
                        warmup_s=settings.produce_warmup_s,
                        duration_s=settings.produce_s,
                    )
                    stored = _headrace_records(broker, topic)
                    if stored != result["total_sent"]:
                        raise RuntimeError(
                            f"{topic}: sent {result['total_sent']} records, log holds {stored}"
                        )
                    broker.delete_topic(topic)
                    row = {
                        "system": "headrace",
                        "client": api,
                        "durability": fsync,
                        "partitions": parts,
                        "value_bytes": size,
                        "acks": "leader",
                        "load1": load1,
                        **result,
                    }
                    rows.append(row)
                    log(
                        f"  headrace {api:9} fsync={fsync:8} p={parts} {size:5} B:"
                        f" {row['records_per_s']:>12,.0f} rec/s {row['mb_per_s']:8.1f} MB/s"
                        f"  cpu {row['cpu']}"
                    )
        if settings.wants("redis"):
            appendfsync = DURABILITY[fsync]
            with _redis_server(f"redis-produce-{appendfsync}", appendfsync) as server:
                for size in settings.produce_value_bytes:
                    _settle_memory(settings)
                    load1 = _row_load()
                    bench = _redis_bench_row(settings, server, size, settings.produce_s)
                    rows.append(
                        {
                            "system": "redis",
                            "client": "redis-benchmark",
                            "client_config": f"-c {settings.redis_bench_clients}"
                            f" -P {settings.redis_bench_pipeline}",
                            "durability": fsync,
                            "appendfsync": appendfsync,
                            "partitions": 1,
                            "value_bytes": size,
                            "load1": load1,
                            **bench,
                        }
                    )
                    log(
                        f"  redis    redis-benchmark appendfsync={appendfsync:8} {size:5} B:"
                        f" {bench['records_per_s']:>12,.0f} rec/s  cpu {bench['cpu']}"
                    )
                    _settle_memory(settings)
                    load1 = _row_load()
                    stream = f"py-{size}"
                    result = procs.run_worker(
                        {
                            "kind": "redis_py_produce",
                            "server_pid": server.pid,
                            "port": server.port,
                            "stream": stream,
                            "value_bytes": size,
                            "pipeline": settings.redis_py_pipeline,
                            "warmup_s": settings.produce_warmup_s,
                            "duration_s": settings.produce_s,
                        },
                        timeout=120 + 4 * settings.produce_s,
                    )
                    with contextlib.closing(_redis_client(server.port)) as r:
                        r.delete(stream)
                    rows.append(
                        {
                            "system": "redis",
                            "client": "redis-py",
                            "client_config": f"pipeline {settings.redis_py_pipeline}, 1 connection",
                            "durability": fsync,
                            "appendfsync": appendfsync,
                            "partitions": 1,
                            "value_bytes": size,
                            "load1": load1,
                            **result,
                        }
                    )
                    log(
                        f"  redis    redis-py        appendfsync={appendfsync:8} {size:5} B:"
                        f" {result['records_per_s']:>12,.0f} rec/s  cpu {result['cpu']}"
                    )
    return rows


# ---------------------------------------------------------------------------- 2. consume


def consume(settings: Settings) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    log = settings.log
    total = settings.consume_records
    size = 100
    limit_s = 600.0
    if settings.wants("headrace"):
        with _headrace_broker(settings, "consume") as broker:
            broker.start()
            for parts in settings.consume_partitions:
                topic = f"catchup-{parts}"
                broker.create_topic(topic, parts)
                pre = _headrace_worker(
                    "hr_preload",
                    broker,
                    topic,
                    timeout=limit_s,
                    records=total,
                    value_bytes=size,
                )
                stored = _headrace_records(broker, topic)
                if stored != total:
                    raise RuntimeError(f"{topic}: preloaded {total}, log holds {stored}")
                load1 = _row_load()
                result = _headrace_worker(
                    "hr_consume",
                    broker,
                    topic,
                    timeout=limit_s + 60,
                    records=total,
                    value_bytes=size,
                    max_s=limit_s,
                )
                broker.delete_topic(topic)
                row = {
                    "system": "headrace",
                    "partitions": parts,
                    "value_bytes": size,
                    "preload_records_per_s": pre["records_per_s"],
                    "load1": load1,
                    **result,
                }
                rows.append(row)
                log(
                    f"  headrace catch-up p={parts}: {row['records']:,} records"
                    f" {row['records_per_s']:>12,.0f} rec/s (preload {pre['records_per_s']:,.0f}/s)"
                    f"  cpu {row['cpu']}"
                )
    if settings.wants("redis"):
        with _redis_server("redis-consume", "everysec") as server:
            stream = "catchup"
            started = time.perf_counter()
            _redis_benchmark(
                server.port,
                stream,
                size,
                total,
                settings.redis_bench_clients,
                settings.redis_bench_pipeline,
            )
            preload_rate = total / (time.perf_counter() - started)
            with contextlib.closing(_redis_client(server.port)) as r:
                stored = int(r.xlen(stream))
                used_memory = int(r.info("memory")["used_memory"])
            load1 = _row_load()
            result = procs.run_worker(
                {
                    "kind": "redis_consume",
                    "server_pid": server.pid,
                    "port": server.port,
                    "stream": stream,
                    "records": stored,
                    "value_bytes": size,
                    "count": settings.redis_read_count,
                    "max_s": limit_s,
                },
                timeout=limit_s + 60,
            )
            row = {
                "system": "redis",
                "partitions": 1,
                "value_bytes": size,
                "client": f"redis-py XREADGROUP COUNT {settings.redis_read_count} + XACK",
                "preload_records_per_s": round(preload_rate, 1),
                "redis_used_memory_bytes": used_memory,
                "load1": load1,
                **result,
            }
            rows.append(row)
            log(
                f"  redis    catch-up: {row['records']:,} records"
                f" {row['records_per_s']:>12,.0f} rec/s  cpu {row['cpu']}"
            )
    return rows


# ---------------------------------------------------------------------------- 3. latency


def latency(settings: Settings) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    log = settings.log
    common = {
        "value_bytes": 100,
        "warmup_s": settings.latency_warmup_s,
        "measure_s": settings.latency_measure_s,
        "drain_s": 5.0,
    }
    timeout = 120 + settings.latency_warmup_s + settings.latency_measure_s

    def note(system: str, row: dict[str, Any]) -> None:
        lat = row["latency_ms"]
        log(
            f"  {system:8} {row['rate']:>6}/s: p50 {lat['p50']} p99 {lat['p99']}"
            f" p99.9 {lat['p99_9']} max {lat['max']} ms (missing {lat['missing']})"
            f"  cpu {row['cpu']}"
        )

    if settings.wants("headrace"):
        with _headrace_broker(settings, "latency") as broker:
            broker.start()
            for rate in settings.latency_rates:
                topic = f"latency-{rate}"
                broker.create_topic(topic, 1)
                load1 = _row_load()
                result = _headrace_worker(
                    "hr_latency",
                    broker,
                    topic,
                    timeout=timeout,
                    rate=rate,
                    linger_ms=settings.latency_linger_ms,
                    **common,
                )
                broker.delete_topic(topic)
                row = {
                    "system": "headrace",
                    "durability": "interval",
                    "linger_ms": settings.latency_linger_ms,
                    "load1": load1,
                    **result,
                }
                rows.append(row)
                note("headrace", row)
    if settings.wants("redis"):
        with _redis_server("redis-latency", "everysec") as server:
            for rate in settings.latency_rates:
                load1 = _row_load()
                result = procs.run_worker(
                    {
                        "kind": "redis_latency",
                        "server_pid": server.pid,
                        "port": server.port,
                        "stream": f"latency-{rate}",
                        "rate": rate,
                        **common,
                    },
                    timeout=timeout,
                )
                row = {"system": "redis", "durability": "interval", "load1": load1, **result}
                rows.append(row)
                note("redis", row)
    return rows


# ---------------------------------------------------------------------------- 4. recovery


def _partition_dir(broker: procs.BrokerProcess, topic: str) -> Path:
    return broker.data_dir / "topics" / "default" / topic / "0"


def _segments(pdir: Path) -> list[tuple[int, int]]:
    """(base offset, size) of every segment file, in order."""
    out = []
    for path in pdir.glob("*.log"):
        out.append((int(path.stem), path.stat().st_size))
    return sorted(out)


def _recovery_point(pdir: Path) -> dict[str, Any] | None:
    try:
        doc: dict[str, Any] = json.loads((pdir / "recovery-point.json").read_text())
    except (OSError, ValueError):
        return None
    return doc


def _tail_after_recovery_point(pdir: Path) -> int:
    """Bytes a restart must scan: everything after the recovery point."""
    segments = _segments(pdir)
    rp = _recovery_point(pdir)
    if rp is None:
        return sum(size for _, size in segments)
    tail = 0
    for base, size in segments:
        if base > rp["segment"]:
            tail += size
        elif base == rp["segment"]:
            tail += max(0, size - int(rp["position"]))
    return tail


def _wait_recovery_point(pdir: Path, end_offset: int, timeout: float) -> float:
    """Wait until the recovery point names the log end; returns seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        rp = _recovery_point(pdir)
        if rp is not None and int(rp["offset"]) >= end_offset:
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"recovery point did not reach offset {end_offset} in {timeout}s")


def _evict_page_cache(root: Path) -> None:
    """Drop *our* data files from the page cache (not the machine's: others share it)."""
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _terminate(broker: procs.BrokerProcess) -> float:
    """A clean shutdown's seconds; one that does not finish fails the scenario."""
    took = broker.stop(timeout=READY_TIMEOUT_S)
    if took is None:
        raise TimeoutError(f"broker did not shut down within {READY_TIMEOUT_S}s")
    return took


def _restart(broker: procs.BrokerProcess) -> dict[str, Any]:
    ready = broker.start()
    return {
        "ready_s": round(ready["ready_s"], 4),
        "recovery_seconds": round(float(ready.get("recovery_seconds", -1.0)), 4),
    }


def recovery(settings: Settings) -> list[dict[str, Any]]:
    """Restart time vs log size after a crash (SIGKILL) and after a clean stop (SIGTERM)."""
    rows: list[dict[str, Any]] = []
    log = settings.log
    if not settings.wants("headrace"):
        return rows
    value_bytes = 1024
    topic = "recovery"
    for size_gb in settings.recovery_sizes_gb:
        with _headrace_broker(settings, "recovery") as broker:
            load1 = _row_load()
            broker.start()
            broker.create_topic(topic, 1)
            pdir = _partition_dir(broker, topic)
            records = int(size_gb * 1e9 / (value_bytes + 8))
            row: dict[str, Any] = {
                "system": "headrace",
                "size_gb": size_gb,
                "records": records,
                "value_bytes": value_bytes,
                "load1": load1,
            }
            if records:
                pre = _headrace_worker(
                    "hr_preload",
                    broker,
                    topic,
                    timeout=1200,
                    records=records,
                    value_bytes=value_bytes,
                )
                row["write_mb_per_s"] = round(pre["mb_per_s"], 1)
                # (a) crash right after the last write: the recovery point is up to
                # checkpoint_interval old, so the tail written since must be scanned.
                broker.kill9()
                row["log_bytes"] = sum(size for _, size in _segments(pdir))
                row["segments"] = len(_segments(pdir))
                tail = _tail_after_recovery_point(pdir)
                row["kill_stale"] = {**_restart(broker), "tail_bytes": tail}
            # (b) crash with a recent recovery point, our files evicted from the page cache
            waited = _wait_recovery_point(pdir, records, timeout=30.0)
            broker.kill9()
            row["log_bytes"] = sum(size for _, size in _segments(pdir))
            tail = _tail_after_recovery_point(pdir)
            _evict_page_cache(broker.data_dir)
            row["kill_recent_cold"] = {
                **_restart(broker),
                "tail_bytes": tail,
                "waited_for_recovery_point_s": round(waited, 2),
            }
            # (c) the same crash again, page cache warm
            broker.kill9()
            row["kill_recent_warm"] = {
                **_restart(broker),
                "tail_bytes": _tail_after_recovery_point(pdir),
            }
            # (d) clean shutdown (SIGTERM: final sync + recovery point), then restart
            shutdown_s = _terminate(broker)
            row["clean"] = {
                **_restart(broker),
                "shutdown_s": round(shutdown_s, 4),
                "tail_bytes": _tail_after_recovery_point(pdir),
            }
            _terminate(broker)
            rows.append(row)
            log(
                f"  recovery {size_gb:4} GB ({row['log_bytes'] / 1e9:.2f} GB on disk):"
                f" stale {row.get('kill_stale')} | recent cold {row['kill_recent_cold']}"
                f" | recent warm {row['kill_recent_warm']} | clean {row['clean']}"
            )
    return rows


# ---------------------------------------------------------------------------- 5. tiered


def tiered(settings: Settings) -> list[dict[str, Any]]:
    """Upload and sequential-read throughput of ``PartitionTier`` against a local MinIO.

    No Redis equivalent: headrace only. MinIO is the server process (its CPU is
    ``server_cores``), a worker the client. The store is opened the way a broker
    opens it (``open_store`` with an ``s3://`` URL: retries on, credentials from
    the environment).
    """
    rows: list[dict[str, Any]] = []
    log = settings.log
    if not settings.wants("headrace"):
        return rows
    home = procs.temp_dir("tiered")
    server = MinioServer(
        procs.minio_binary(), home / "minio" / "data", log_path=home / "minio" / "minio.log"
    )
    try:
        server.start(timeout=60.0)
        assert server.pid is not None
        url = f"s3://{server.endpoint}/bench-tiered?create_bucket=1"
        # what ``headrace.objectstore.urls.open_store`` reads the credentials from
        env = {
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": server.access_key,
            "HEADRACE_OBJECT_STORE_SECRET_KEY": server.secret_key,
        }
        common = {
            "server_pid": server.pid,
            "url": url,
            "value_bytes": settings.tiered_value_bytes,
        }
        for parts in settings.tiered_upload_partitions:
            _settle_memory(settings)
            load1 = _row_load()
            result = procs.run_worker(
                {
                    **common,
                    "kind": "tier_upload",
                    "topic": f"bench/upload-{parts}",
                    "partitions": parts,
                    "total_mb": settings.tiered_mb,
                    "object_mb": settings.tiered_object_mb,
                    "batch_records": settings.tiered_batch_records,
                    "warmup_objects": 4,
                },
                timeout=900,
                env=env,
            )
            row = {
                "system": "headrace",
                "client": "tier_upload",
                "partitions": parts,
                "value_bytes": settings.tiered_value_bytes,
                "load1": load1,
                **result,
            }
            rows.append(row)
            log(
                f"  tiered upload p={parts}: {row['bytes'] / 1e6:,.0f} MB in {row['objects']}"
                f" objects, {row['mb_per_s']:7.1f} MB/s  cpu {row['cpu']}"
            )
        for prefetch in (settings.tiered_prefetch, 0):
            _settle_memory(settings)
            load1 = _row_load()
            result = procs.run_worker(
                {
                    **common,
                    "kind": "tier_read",
                    "topic": f"bench/upload-{settings.tiered_upload_partitions[0]}",
                    "read_bytes": settings.tiered_read_bytes,
                    "prefetch": prefetch,
                    "warmup_mb": 32,
                },
                timeout=900,
                env=env,
            )
            row = {
                "system": "headrace",
                "client": "tier_read" if prefetch else "tier_read_no_prefetch",
                "partitions": 1,
                "value_bytes": settings.tiered_value_bytes,
                "prefetch_chunks": prefetch,
                "read_bytes": settings.tiered_read_bytes,
                "load1": load1,
                **result,
            }
            rows.append(row)
            log(
                f"  tiered read prefetch={prefetch}: {row['bytes'] / 1e6:,.0f} MB"
                f" {row['mb_per_s']:7.1f} MB/s  cpu {row['cpu']}"
            )
    finally:
        server.stop()
        procs.remove_dir(home)
    return rows


SCENARIOS: dict[str, Callable[[Settings], list[dict[str, Any]]]] = {
    "produce": produce,
    "consume": consume,
    "latency": latency,
    "recovery": recovery,
    "tiered": tiered,
}
