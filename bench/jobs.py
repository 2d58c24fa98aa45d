"""``python -m bench.jobs``: the Spark jobs' throughput on local[2] over a local MinIO.

A real MinIO server (``bench.procs.minio_binary``) holds a topic written as brokers
write it (``PartitionTier.upload``): 100-byte records, 1000 per batch. Measures:

- **verify**: the verify job over ``--mib`` MiB in 16 MiB objects; MB/s of objects
  checked (every header, CRC and offset), wall time of the job on Spark;
- **compact**: the compact job over ``--mib`` MiB in 1 MiB objects merged into 64 MiB
  ones (grace 0); MB/s of objects read and rewritten;
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

from bench import procs
from headrace.jobs import arrow, run
from headrace.jobs.source import session
from headrace.objectstore.minio_server import MinioServer
from headrace.objectstore.urls import ACCESS_KEY_ENV, SECRET_KEY_ENV, open_store
from headrace.records import batch as rb
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
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


def measure(url: str, opts: argparse.Namespace) -> dict[str, Any]:
    cluster = "bench" + secrets.token_hex(3)
    results: dict[str, Any] = {
        "master": opts.master,
        "mib": opts.mib,
        "partitions": opts.partitions,
        "record_bytes": RECORD_BYTES,
        "load_before": os.getloadavg()[0],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    big = fill(url, cluster, "default/big", opts.partitions, opts.mib, 16)
    fill(url, cluster, "default/small", opts.partitions, opts.mib, 1)
    spark = session("bench-jobs", opts.master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        base = ["--store", url, "--cluster", cluster, "--no-report-object"]
        # warm-up: JVM, Python workers
        run.run_job(run.parse_args(["verify", *base, "--topic", "default/small"]), spark)

        status, report = run.run_job(
            run.parse_args(["verify", *base, "--topic", "default/big"]), spark
        )
        assert status == 0, report
        results["verify"] = {
            "bytes": big,
            "seconds": report["seconds"],
            "mb_per_s": round(big / report["seconds"] / 1e6, 1),
        }

        args = ["compact", *base, "--topic", "default/small", "--grace-seconds", "0"]
        status, report = run.run_job(run.parse_args(args), spark)
        assert status == 0, report
        read = report["summary"]["bytesRead"]
        results["compact"] = {
            "bytes": read,
            "seconds": report["seconds"],
            "mb_per_s": round(read / report["seconds"] / 1e6, 1),
            "objects": [report["summary"]["segmentsBefore"], report["summary"]["segmentsAfter"]],
        }

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
    finally:
        spark.stop()
    results["load_after"] = os.getloadavg()[0]
    return results


if __name__ == "__main__":
    main()
