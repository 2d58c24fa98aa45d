"""``spark-submit`` entry point of the verify and compact jobs.

::

    spark-submit --master 'local[2]' broker/headrace/jobs/run.py verify \\
        --store s3://127.0.0.1:9000/headrace --topic default/orders

The driver lists the topic's partitions; each partition is one Spark task that
opens the store on its executor and runs ``verify.verify_partition`` or
``compact.compact_partition``. The driver gathers the results into one JSON
report, writes it to the store under ``<cluster>/<namespace>/<topic>/<creation id>/reports/``
(and to ``--report-file``), and prints one progress line per partition to
stderr as each finishes. Partitions run concurrently, as many at once as Spark
has cores (``defaultParallelism``): each is its own small Spark job, submitted
from a driver thread, so a line is printed as soon as its partition is done
(``toLocalIterator`` would print as early, but it runs one partition's job at a
time, which left all but one core idle).

Exit status: 0 ok; 1 verification found a problem; 2 the job could not run
(bad input: an unparseable manifest, the store unreachable; the report says
which partition and why, and nothing was deleted in that partition).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from functools import partial
from typing import Any

from headrace.errors import HeadraceError
from headrace.jobs import compact, verify
from headrace.jobs.topics import TopicRef, stored_partitions
from headrace.objectstore.errors import ObjectStoreError
from headrace.objectstore.urls import open_store

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _guarded(work: Callable[[int], dict[str, Any]], partition: int) -> dict[str, Any]:
    """Run ``work`` for one partition; a typed failure becomes the partition's
    ``error`` instead of a Spark stack trace."""
    try:
        return work(partition)
    except (HeadraceError, ObjectStoreError, ValueError) as exc:
        message = exc.message if isinstance(exc, HeadraceError) else str(exc)
        return {"partition": partition, "error": f"{type(exc).__name__}: {message}"}


def _verify_one(
    url: str, ref: TopicRef, compacted: bool, bootstrap: str | None, partition: int
) -> dict[str, Any]:
    store = open_store(url)
    try:
        return verify.verify_partition(
            store, ref, partition, compacted=compacted, bootstrap=bootstrap
        ).to_doc()
    finally:
        store.close()


def _compact_one(
    url: str,
    ref: TopicRef,
    settings: compact.CompactSettings,
    now_ms: int,
    then_verify: bool,
    partition: int,
) -> dict[str, Any]:
    store = open_store(url)
    try:
        doc = compact.compact_partition(store, ref, partition, settings, now_ms=now_ms).to_doc()
        if then_verify:
            doc["verification"] = verify.verify_partition(
                store, ref, partition, compacted=settings.keep_last_per_key
            ).to_doc()
        return doc
    finally:
        store.close()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="headrace.jobs.run")
    parser.add_argument("job", choices=["verify", "compact"])
    parser.add_argument("--store", required=True, help="object store URL")
    parser.add_argument("--topic", required=True, help="namespace/name")
    parser.add_argument("--cluster", default="local")
    parser.add_argument(
        "--creation-id",
        default="",
        help="the topic's status.creationId (leave out for a topic without one: legacy layout)",
    )
    parser.add_argument("--partitions", default="", help="comma-separated; default all")
    parser.add_argument("--report-file", default=None)
    parser.add_argument("--no-report-object", action="store_true")
    parser.add_argument("--master", default=None, help="when not run through spark-submit")
    parser.add_argument("--compacted", action="store_true", help="the topic is key-compacted")
    parser.add_argument(
        "--bootstrap", default=None, help="host:port of a broker: check the stored range too"
    )
    parser.add_argument("--target-bytes", type=int, default=compact.DEFAULT_TARGET_BYTES)
    parser.add_argument("--keep-last-per-key", action="store_true")
    parser.add_argument(
        "--delete-retention-ms", type=int, default=compact.DEFAULT_DELETE_RETENTION_MS
    )
    parser.add_argument("--grace-seconds", type=float, default=compact.DEFAULT_GRACE_SECONDS)
    parser.add_argument("--verify", action="store_true", help="verify after compacting")
    return parser.parse_args(argv)


def run_job(args: argparse.Namespace, spark: Any) -> tuple[int, dict[str, Any]]:
    """Run the job on ``spark``; (exit status, report)."""
    started = time.time()
    ref = TopicRef(args.cluster, args.topic, args.creation_id)
    store = open_store(args.store)
    try:
        partitions = stored_partitions(store, ref)
    except ObjectStoreError as exc:
        # the store is down or refuses us: a clear reason, no Spark task started
        reason = f"cannot list {ref.prefix} in {args.store}: {type(exc).__name__}: {exc.message}"
        print(f"{args.job} {args.topic}: FAILED: {reason}", file=sys.stderr, flush=True)
        report = _report(args, [], started)
        report["ok"] = False
        report["error"] = reason
        if args.report_file:
            with open(args.report_file, "w") as f:
                json.dump(report, f, indent=1)
        return EXIT_ERROR, report
    finally:
        store.close()
    if args.partitions:
        wanted = {int(p) for p in args.partitions.split(",")}
        partitions = [p for p in partitions if p in wanted]
    work: Callable[[int], dict[str, Any]]
    if args.job == "verify":
        work = partial(_verify_one, args.store, ref, args.compacted, args.bootstrap)
    else:
        settings = compact.CompactSettings(
            target_bytes=args.target_bytes,
            keep_last_per_key=args.keep_last_per_key,
            delete_retention_ms=args.delete_retention_ms,
            grace_seconds=args.grace_seconds,
        )
        work = partial(_compact_one, args.store, ref, settings, int(started * 1000), args.verify)
    print(f"{args.job} {args.topic}: {len(partitions)} partition(s)", file=sys.stderr, flush=True)
    results: list[dict[str, Any]] = []
    for doc in _run_partitions(spark, partitions, partial(_guarded, work)):
        results.append(doc)
        print(_progress(args.job, doc), file=sys.stderr, flush=True)
    results.sort(key=lambda d: int(d["partition"]))
    report = _report(args, results, started)
    status = EXIT_OK
    if any("error" in d for d in results):
        status = EXIT_ERROR
    elif not report["ok"]:
        status = EXIT_FINDINGS
    if not args.no_report_object:
        key = f"{ref.prefix}reports/{args.job}-{int(started * 1000)}.json"
        store = open_store(args.store)
        try:
            store.put(key, json.dumps(report, indent=1).encode())
        finally:
            store.close()
        report["reportKey"] = key
    if args.report_file:
        with open(args.report_file, "w") as f:
            json.dump(report, f, indent=1)
    return status, report


def _run_partitions(
    spark: Any, partitions: list[int], work: Callable[[int], dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """``work(p)`` for every partition on Spark's executors, in order of completion.

    One Spark job per partition, at most ``defaultParallelism`` in flight (Spark
    runs jobs of concurrent driver threads side by side)."""
    if not partitions:
        return
    context = spark.sparkContext

    def one(partition: int) -> dict[str, Any]:
        docs: list[dict[str, Any]] = context.parallelize([partition], 1).map(work).collect()
        return docs[0]

    in_flight = max(1, min(len(partitions), int(context.defaultParallelism)))
    with ThreadPoolExecutor(in_flight, thread_name_prefix="partition-job") as pool:
        for done in as_completed([pool.submit(one, p) for p in partitions]):
            yield done.result()


def _progress(job: str, doc: dict[str, Any]) -> str:
    p = doc["partition"]
    if "error" in doc:
        return f"  partition {p}: ERROR {doc['error']}"
    if job == "verify":
        bad = [f for f in doc["findings"] if f["severity"] == "error"]
        state = "ok" if not bad else f"{len(bad)} problem(s)"
        return f"  partition {p}: {doc['objects']} objects, {doc['records']} records: {state}"
    return (
        f"  partition {p}: {doc['outcome']}, {doc['segmentsBefore']} -> {doc['segmentsAfter']}"
        f" objects, {doc['bytesBefore'] - doc['bytesAfter']} bytes reclaimed"
    )


def _report(
    args: argparse.Namespace, results: list[dict[str, Any]], started: float
) -> dict[str, Any]:
    findings: list[dict[str, Any]] = []
    for doc in results:
        findings.extend(doc.get("findings", []))
        findings.extend(doc.get("verification", {}).get("findings", []))
    errors = [f for f in findings if f["severity"] == "error"]
    failed = [d for d in results if "error" in d]
    finished = time.time()
    summary: dict[str, Any] = {"partitions": len(results), "errors": len(errors)}
    if args.job == "verify":
        summary["objects"] = sum(d.get("objects", 0) for d in results)
        summary["bytes"] = sum(d.get("bytes", 0) for d in results)
        summary["records"] = sum(d.get("records", 0) for d in results)
    else:
        summary["segmentsBefore"] = sum(d.get("segmentsBefore", 0) for d in results)
        summary["segmentsAfter"] = sum(d.get("segmentsAfter", 0) for d in results)
        summary["bytesReclaimed"] = sum(d.get("bytesReclaimed", 0) for d in results)
        summary["bytesRead"] = sum(d.get("bytesRead", 0) for d in results)
        summary["recordsRemoved"] = sum(d.get("recordsRemoved", 0) for d in results)
    return {
        "format": 1,
        "job": args.job,
        "cluster": args.cluster,
        "topic": args.topic,
        "startedMs": int(started * 1000),
        "finishedMs": int(finished * 1000),
        "seconds": round(finished - started, 3),
        "ok": not errors and not failed,
        "summary": summary,
        "findings": findings,
        "failed": [{"partition": d["partition"], "error": d["error"]} for d in failed],
        "partitions": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from headrace.jobs.source import session

    spark = session(f"headrace-{args.job}", args.master)
    try:
        status, report = run_job(args, spark)
    finally:
        spark.stop()
    print(
        json.dumps({k: report.get(k) for k in ("job", "topic", "ok", "summary", "failed", "error")})
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
