"""``python -m bench.jobs``: the Spark jobs' throughput on local[2] over a local MinIO.

A real MinIO server (``headrace.testing.procs.minio_binary``) holds a topic written as brokers
write it (``PartitionTier.upload``): 100-byte records, 1000 per batch. Measures:

- **verify**: the verify job over ``--mib`` MiB in 16 MiB objects; MB/s of objects
  checked (every header, CRC and offset), wall time of the job on Spark;
- **compact**: the compact job over ``--mib`` MiB in 1 MiB objects merged into 64 MiB
  ones (grace 0); MB/s of objects read and rewritten;
- **compact_keyed**: the compact job with ``--keep-last-per-key`` over
  ``--keyed-mib`` MiB in 1 MiB objects of keyed records (``--keys`` distinct
  keys per partition, drawn at random, 1% of them tombstones older than the
  delete retention); records/s and MB/s of the topic's bytes (each object is
  read twice: once for the last offset per key, once to rewrite it), and the
  CPU seconds by process as for the source;
- **source**: ``spark.read.format("headrace")`` into Arrow, every column, through a
  ``noop`` sink; records/s; again with ``includeHeaders=false`` (and, for
  reference, the decoder alone on one core). Beside the wall time, the CPU
  seconds each kind of process spent on it (``cpu``: the Python workers, the
  JVM, MinIO; from /proc), which a machine shared with other work disturbs
  far less than the wall time.

Writes ``bench/results/jobs.json``; the figures are quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from headrace.jobs import arrow, run
from headrace.jobs.source import session
from headrace.objectstore.urls import ACCESS_KEY_ENV, SECRET_KEY_ENV, open_store
from headrace.records import batch as rb
from headrace.testing import procs
from headrace.testing.minio import MinioServer
from headrace.tiered import layout
from headrace.tiered.tier import PartitionTier

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
RECORD_BYTES = 100
RECORDS_PER_BATCH = 1000


def _batch(offset: int) -> bytes:
    values = [b"%099d|" % (offset + i) for i in range(RECORDS_PER_BATCH)]
    frame = bytearray(rb.encode(values, timestamp_ms=1_700_000_000_000))
    rb.stamp(frame, offset, 0)
    return bytes(frame)


def fill(url: str, cluster: str, topic: str, partitions: int, mib: int, object_mib: int) -> int:
    """Write ``mib`` MiB over ``partitions`` in objects of ``object_mib``; returns bytes."""
    store = open_store(url)
    template = _batch(0)
    batches_per_object = max(1, (object_mib << 20) // len(template))
    objects = max(1, (mib << 20) // partitions // (batches_per_object * len(template)))
    total = 0
    for p in range(partitions):
        tier = PartitionTier(store, layout.partition_prefix(cluster, topic, p))
        offset = 0
        for _ in range(objects):
            frames = []
            for _ in range(batches_per_object):
                frames.append(_batch(offset))
                offset += RECORDS_PER_BATCH
            data = b"".join(frames)
            tier.upload(data, 0)
            total += len(data)
        tier.close()
    store.close()
    return total


def fill_keyed(
    url: str, cluster: str, topic: str, partitions: int, mib: int, keys: int
) -> tuple[int, int]:
    """Write ``mib`` MiB of keyed records over ``partitions`` in 1 MiB objects: keys
    ``key<n>`` drawn at random from ``keys`` (fixed seed), 100-byte values, 1% of
    the records tombstones (an empty value); returns (bytes, records)."""
    store = open_store(url)
    rng = np.random.default_rng(13)
    value = b"v" * RECORD_BYTES
    names = [b"key%08d" % k for k in range(keys)]
    total = records = 0
    per_partition = (mib << 20) // partitions
    for p in range(partitions):
        tier = PartitionTier(store, layout.partition_prefix(cluster, topic, p))
        offset = written = 0
        while written < per_partition:
            frames = []
            size = 0
            while size < 1 << 20:
                picks = rng.integers(0, keys, RECORDS_PER_BATCH).tolist()
                dead = rng.random(RECORDS_PER_BATCH) < 0.01
                values = [b"" if d else value for d in dead.tolist()]
                frame = bytearray(
                    rb.encode(
                        values,
                        keys=[names[k] for k in picks],
                        timestamp_ms=1_700_000_000_000,
                    )
                )
                rb.stamp(frame, offset, 0)
                offset += RECORDS_PER_BATCH
                frames.append(bytes(frame))
                size += len(frame)
            tier.upload(b"".join(frames), 0)
            written += size
        tier.close()
        total += written
        records += offset
    store.close()
    return total, records


def _process_tree_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and its descendants, by pid,
    with the process's name (``java``, ``python``, ``minio``)."""
    tick = os.sysconf("SC_CLK_TCK")
    procs_by_pid: dict[int, tuple[int, str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            head, _, rest = (entry / "stat").read_text().rpartition(")")
        except OSError:
            continue  # ended meanwhile
        fields = rest.split()
        name = head.partition("(")[2]
        procs_by_pid[int(entry.name)] = (
            int(fields[1]),
            name,
            (int(fields[11]) + int(fields[12])) / tick,
        )
    tree = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, (parent, _, _) in procs_by_pid.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: procs_by_pid[pid][1:] for pid in tree}


def _cpu_by_kind(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent since ``before``, summed by process name (the bench itself
    is ``driver``)."""
    spent: dict[str, float] = {}
    for pid, (name, cpu) in _process_tree_cpu().items():
        kind = "driver" if pid == os.getpid() else name
        spent[kind] = spent.get(kind, 0.0) + cpu - before.get(pid, (name, 0.0))[1]
    return {kind: round(cpu, 2) for kind, cpu in sorted(spent.items()) if cpu >= 0.01}


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.jobs")
    parser.add_argument("--mib", type=int, default=256, help="data per measurement")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--keyed-mib", type=int, default=64, help="data of the keyed compaction")
    parser.add_argument("--keys", type=int, default=50_000, help="distinct keys per partition")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated measurements (verify,compact,compact_keyed,source); default all",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "jobs.json")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = MinioServer(procs.minio_binary(), Path(tmp) / "minio")
        server.start()
        try:
            os.environ[ACCESS_KEY_ENV] = server.access_key
            os.environ[SECRET_KEY_ENV] = server.secret_key
            url = f"s3://{server.host}:{server.port}/bench-jobs?create_bucket=1"
            results = measure(url, opts)
        finally:
            server.stop()
    if opts.only and opts.out.exists():
        # a partial run replaces its own rows of the last full run and leaves the rest
        # (the run's time and load stay those of the full run; each row has its own)
        rows = {k: v for k, v in results.items() if isinstance(v, dict)}
        results = {**json.loads(opts.out.read_text()), **rows}
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


MEASUREMENTS = ("verify", "compact", "compact_keyed", "source")


def measure(url: str, opts: argparse.Namespace) -> dict[str, Any]:
    cluster = "bench" + secrets.token_hex(3)
    wanted = set(opts.only.split(",")) if opts.only else set(MEASUREMENTS)
    if unknown := wanted - set(MEASUREMENTS):
        raise SystemExit(f"--only: unknown measurement(s) {sorted(unknown)}")
    results: dict[str, Any] = {
        "master": opts.master,
        "mib": opts.mib,
        "partitions": opts.partitions,
        "record_bytes": RECORD_BYTES,
        "load_before": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    big = 0
    if wanted & {"verify", "source"}:
        big = fill(url, cluster, "default/big", opts.partitions, opts.mib, 16)
    fill(url, cluster, "default/small", opts.partitions, opts.mib if "compact" in wanted else 1, 1)
    keyed_bytes = keyed_records = 0
    if "compact_keyed" in wanted:
        keyed_bytes, keyed_records = fill_keyed(
            url, cluster, "default/keyed", opts.partitions, opts.keyed_mib, opts.keys
        )
    spark = session("bench-jobs", opts.master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        base = ["--store", url, "--cluster", cluster, "--no-report-object"]
        # warm-up: JVM, Python workers
        run.run_job(run.parse_args(["verify", *base, "--topic", "default/small"]), spark)

        if "verify" in wanted:
            status, report = run.run_job(
                run.parse_args(["verify", *base, "--topic", "default/big"]), spark
            )
            assert status == 0, report
            results["verify"] = {
                "bytes": big,
                "seconds": report["seconds"],
                "mb_per_s": round(big / report["seconds"] / 1e6, 1),
            }

        if "compact" in wanted:
            args = ["compact", *base, "--topic", "default/small", "--grace-seconds", "0"]
            load = os.getloadavg()[0]
            cpu_before = _process_tree_cpu()
            status, report = run.run_job(run.parse_args(args), spark)
            cpu = _cpu_by_kind(cpu_before)
            assert status == 0, report
            read = report["summary"]["bytesRead"]
            results["compact"] = {
                "bytes": read,
                "seconds": report["seconds"],
                "mb_per_s": round(read / report["seconds"] / 1e6, 1),
                "objects": [
                    report["summary"]["segmentsBefore"],
                    report["summary"]["segmentsAfter"],
                ],
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "load_before": load,
                "cpu": cpu,
            }

        if "compact_keyed" in wanted:
            args = [
                "compact",
                *base,
                "--topic",
                "default/keyed",
                "--grace-seconds",
                "0",
                "--keep-last-per-key",
            ]
            load = os.getloadavg()[0]
            cpu_before = _process_tree_cpu()
            status, report = run.run_job(run.parse_args(args), spark)
            cpu = _cpu_by_kind(cpu_before)
            assert status == 0, report
            seconds = report["seconds"]
            results["compact_keyed"] = {
                "bytes": keyed_bytes,
                "records": keyed_records,
                "keys_per_partition": opts.keys,
                "seconds": seconds,
                "mb_per_s": round(keyed_bytes / seconds / 1e6, 1),
                "records_per_s": round(keyed_records / seconds),
                "records_removed": report["summary"]["recordsRemoved"],
                "bytes_after": sum(d["bytesAfter"] for d in report["partitions"]),
                "objects": [
                    report["summary"]["segmentsBefore"],
                    report["summary"]["segmentsAfter"],
                ],
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "load_before": load,
                "cpu": cpu,
            }

        if "source" in wanted:
            _measure_source(spark, url, cluster, results)
    finally:
        spark.stop()
    results["load_after"] = os.getloadavg()[0]
    return results


def _measure_source(spark: Any, url: str, cluster: str, results: dict[str, Any]) -> None:
    df = (
        spark.read.format("headrace")
        .option("store", url)
        .option("cluster", cluster)
        .option("topic", "default/big")
        .load()
    )
    records = df.count()  # also the warm-up of the read path (Python workers)
    cpu_before = _process_tree_cpu()
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    took = time.perf_counter() - started
    results["source"] = {
        "records": records,
        "seconds": round(took, 3),
        "records_per_s": round(records / took),
        "cpu": _cpu_by_kind(cpu_before),
    }
    lean = (
        spark.read.format("headrace")
        .option("store", url)
        .option("cluster", cluster)
        .option("topic", "default/big")
        .option("includeHeaders", "false")
        .load()
    )
    lean.count()
    cpu_before = _process_tree_cpu()
    started = time.perf_counter()
    lean.write.format("noop").mode("overwrite").save()
    took = time.perf_counter() - started
    results["source_no_headers"] = {
        "records": records,
        "seconds": round(took, 3),
        "records_per_s": round(records / took),
        "cpu": _cpu_by_kind(cpu_before),
    }
    data = b"".join(_batch(i * RECORDS_PER_BATCH) for i in range(160))  # one 16 MiB object
    started = time.perf_counter()
    decoded = arrow.to_record_batch(data, 0)
    took = time.perf_counter() - started
    results["decoder_one_core"] = {
        "records": decoded.num_rows,
        "records_per_s": round(decoded.num_rows / took),
    }


if __name__ == "__main__":
    main()
