"""``headrace verify TOPIC`` and ``headrace compact TOPIC``: the Spark jobs, run locally;
``headrace tier sweep TOPIC``: the orphan sweep, run in this process (``tier snapshot``
and ``tier restore`` are in ``cli.snapshots``).

Each command runs ``headrace/jobs/run.py`` with pyspark's bundled ``spark-submit``
(``--master local[*]`` by default) against the local cluster's object store (the
one ``<dir>/local.json`` records, with its credentials), or against ``--store``
and ``--cluster``. The topic's objects are found under its creation id
(``--creation-id``; with a local cluster, the one its controller gave the topic).
It shows the job's per-partition progress, prints a summary
and exits with the job's status: 0 ok, 1 verification found a problem, 2 the job
could not run. Spark's own log goes to ``<dir>/jobs/<job>-<time>.log``.

Registered on the main group by ``register`` (one line in ``cli/main.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from headrace.cli import controller_client, local_cluster, local_record
from headrace.jobs import sweep

_PROGRESS_PREFIXES = ("verify ", "compact ", "  partition ")


def _qualified(topic: str) -> str:
    """``name`` -> ``default/name``, as the broker's topic names."""
    return topic if "/" in topic else f"default/{topic}"


def _spark_submit() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise click.ClickException(
            "pyspark is not installed; install headrace with the 'jobs' extra"
            " (pip install -e '.[jobs]', or make setup)"
        )
    path = Path(spec.origin).parent / "bin" / "spark-submit"
    if not path.exists():
        raise click.ClickException(f"pyspark has no spark-submit at {path}")
    return path


def _job_script() -> Path:
    spec = importlib.util.find_spec("headrace.jobs.run")
    if spec is None or spec.origin is None:
        raise click.ClickException("headrace.jobs is not installed")
    return Path(spec.origin)


def _local_bootstrap(directory: Path) -> str | None:
    """``host:port`` of the local cluster's brokers, from ``local.json`` (None: none)."""
    try:
        record = json.loads((directory / local_record.STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    brokers = record.get("brokers") or []
    return ",".join(f"{b['host']}:{b['port']}" for b in brokers) or None


def _creation_id(topic: str, directory: Path, store: str | None, explicit: str | None) -> str:
    """The creation id the topic's objects are stored under: ``--creation-id``, else the
    one in the local cluster's controller's state ("" with ``--store``, or for a topic
    without one: the legacy layout)."""
    if explicit is not None or store is not None:
        return explicit or ""
    try:
        record = json.loads((directory / local_record.STATE_FILE).read_text())
    except (OSError, ValueError):
        return ""
    if not record.get("controller_url"):
        return ""
    url = controller_client.resolve_controller_url(None, directory)
    state = controller_client.request_json("GET", f"{url}/v1/state")
    name = _qualified(topic)
    placed = next((t for t in state["cluster"].get("topics", []) if t["name"] == name), None)
    return str((placed or {}).get("creationId") or "")


def _target(
    directory: Path, store: str | None, cluster: str | None
) -> tuple[str, str, dict[str, str]]:
    """(store URL, cluster id, extra environment) of the job."""
    if store is not None:
        return store, cluster or local_record.CLUSTER_ID, {}
    state = directory / local_record.STATE_FILE
    try:
        record = json.loads(state.read_text())
    except FileNotFoundError:
        raise click.ClickException(
            f"no local cluster in {directory} (no {local_record.STATE_FILE}); start one with"
            " `headrace local up`, or name the object store with --store"
        ) from None
    args, env = local_cluster.object_store_args(record, directory)
    return args[args.index("--object-store") + 1], cluster or local_record.CLUSTER_ID, env


def _run(
    job: str,
    topic: str,
    directory: Path,
    store: str | None,
    cluster: str | None,
    master: str,
    job_args: list[str],
    verbose: bool,
    spark_conf: tuple[str, ...] = (),
    executor_pod_template: str | None = None,
    creation_id: str | None = None,
) -> tuple[int, dict[str, Any] | None, Path]:
    url, cluster_id, env = _target(directory, store, cluster)
    incarnation = _creation_id(topic, directory, store, creation_id)
    logs = directory / "jobs"
    logs.mkdir(parents=True, exist_ok=True)
    if executor_pod_template is not None:
        # Spark's driver reads the template from a file; the given --conf come after this
        # one, so a spark.kubernetes.executor.podTemplateFile of their own wins
        template = directory / "executor-pod-template.json"
        template.write_text(executor_pod_template)
        spark_conf = (f"spark.kubernetes.executor.podTemplateFile={template}", *spark_conf)
    log_path = logs / f"{job}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        report_path = Path(tmp.name)
    argv = [
        str(_spark_submit()),
        "--master",
        master,
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        *(arg for conf in spark_conf for arg in ("--conf", conf)),
        str(_job_script()),
        job,
        "--store",
        url,
        "--cluster",
        cluster_id,
        "--topic",
        _qualified(topic),
        *(["--creation-id", incarnation] if incarnation else []),
        "--report-file",
        str(report_path),
        *job_args,
    ]
    child_env = {**os.environ, **env, "PYSPARK_PYTHON": sys.executable}
    child_env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    click.echo(f"{job} {_qualified(topic)}: spark-submit --master {master} (log: {log_path})")
    with log_path.open("w") as log:
        # spark-submit's JVM forwards the Python driver's stdout and stderr to its
        # own stdout; take both and keep the job's progress lines from the noise
        proc = subprocess.Popen(
            argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if verbose or line.startswith(_PROGRESS_PREFIXES):
                click.echo(line.rstrip("\n"), err=True)
        status = proc.wait()
    report: dict[str, Any] | None = None
    try:
        text = report_path.read_text()
        report = json.loads(text) if text else None
    finally:
        report_path.unlink(missing_ok=True)
    return status, report, log_path


def _finding_line(f: dict[str, Any]) -> str:
    at = f" (byte {f['position']})" if f.get("position") is not None else ""
    offset = f"offset {f['offset']}" if f.get("offset") is not None else "no offset"
    return (
        f"  partition {f['partition']}: {f['kind']} at {offset} in {f['key']}{at}: {f['message']}"
    )


def _summarize(job: str, status: int, report: dict[str, Any] | None, log_path: Path) -> None:
    if report is None or "error" in report:
        why = f"exit {status}; see {log_path}" if report is None else report["error"]
        click.echo(f"Error: the {job} job failed: {why}", err=True)
        sys.exit(status if status > 1 else 2)
    s = report["summary"]
    if job == "verify":
        click.echo(
            f"verified {s['objects']} objects, {s['records']} records, {s['bytes']} bytes in"
            f" {s['partitions']} partition(s) in {report['seconds']:.1f}s"
        )
    else:
        click.echo(
            f"compacted {s['partitions']} partition(s): {s['segmentsBefore']} -> "
            f"{s['segmentsAfter']} objects, {s['bytesReclaimed']} bytes reclaimed,"
            f" {s['recordsRemoved']} records removed in {report['seconds']:.1f}s"
        )
    for f in report["findings"]:
        click.echo(_finding_line(f))
    for failed in report["failed"]:
        click.echo(f"  partition {failed['partition']}: FAILED: {failed['error']}")
    if "reportKey" in report:
        click.echo(f"report: {report['reportKey']}")
    click.echo("OK" if report["ok"] else "PROBLEMS FOUND" if status == 1 else "FAILED")


def result_summary(job: str, status: int, report: dict[str, Any] | None) -> dict[str, Any]:
    """The job's outcome in a few hundred bytes: what ``--result-file`` gets (a Kubernetes
    termination message, read by the operator into the Compaction's status, holds 4 KiB).
    """
    if report is None:
        return {"job": job, "ok": False, "exit": status, "error": f"the job exited {status}"}
    summary = report.get("summary") or {}
    errors = int(summary.get("errors", 0))
    verified = job == "verify" or any("verification" in p for p in report.get("partitions", []))
    out: dict[str, Any] = {
        "job": job,
        "ok": bool(report.get("ok")),
        "exit": status,
        "verified": verified and errors == 0 and not report.get("failed"),
        "mismatches": errors,
        "reportKey": report.get("reportKey"),
    }
    for name in ("segmentsBefore", "segmentsAfter", "bytesReclaimed", "objects", "records"):
        if name in summary:
            out[name] = summary[name]
    why = report.get("error") or "; ".join(
        f"partition {f['partition']}: {f['error']}" for f in report.get("failed", [])
    )
    if why:
        out["error"] = why[:2000]
    return out


def _write_result(
    path: Path | None, job: str, status: int, report: dict[str, Any] | None, log_path: Path
) -> None:
    if path is None:
        return
    result = result_summary(job, status, report)
    if report is None:  # no report: Spark's last words say why
        with contextlib.suppress(OSError):
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            result["error"] = f"{result['error']}: {' | '.join(tail)}"[:2000]
    path.write_text(json.dumps(result, separators=(",", ":")))


def _json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The option's text, once it is known to be a JSON object (Spark would otherwise fail
    late, when it asks for its first executor)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object (a Pod)")
    return value


def _common(f: Any) -> Any:
    for option in reversed(
        [
            click.argument("topic"),
            local_record.dir_option(
                "The local cluster's directory (its local.json names the object store)."
            ),
            click.option("--store", default=None, help="Object store URL instead of --dir's."),
            click.option("--cluster", default=None, help="Cluster id (default: local)."),
            click.option(
                "--creation-id",
                default=None,
                help="The topic's status.creationId (default: the local cluster's"
                " controller's; none with --store: the legacy layout).",
            ),
            click.option("--master", default="local[*]", show_default=True),
            click.option("--partitions", default="", help="Comma-separated; default all."),
            click.option("-v", "--verbose", is_flag=True, help="Show Spark's log too."),
            click.option(
                "--conf",
                "spark_conf",
                multiple=True,
                metavar="KEY=VALUE",
                help="A Spark property for spark-submit (repeatable).",
            ),
            click.option(
                "--executor-pod-template",
                default=None,
                metavar="JSON",
                callback=_json_object,
                help="A pod (JSON) Spark's Kubernetes executors are made from"
                " (spark.kubernetes.executor.podTemplateFile); written under --dir.",
            ),
            click.option(
                "--result-file",
                type=click.Path(path_type=Path),
                default=None,
                help="Also write a short JSON summary here (a Job's /dev/termination-log).",
            ),
        ]
    ):
        f = option(f)
    return f


@click.command()
@_common
@click.option("--compacted", is_flag=True, help="The topic is key-compacted (holes are fine).")
@click.option(
    "--bootstrap",
    default=None,
    help="Brokers (HOST:PORT) to check the stored range against; default: the local"
    " cluster's brokers when --dir has them.",
)
def verify(
    topic: str,
    directory: Path,
    store: str | None,
    cluster: str | None,
    creation_id: str | None,
    master: str,
    partitions: str,
    verbose: bool,
    spark_conf: tuple[str, ...],
    executor_pod_template: str | None,
    result_file: Path | None,
    compacted: bool,
    bootstrap: str | None,
) -> None:
    """Verify TOPIC's stored segments: offsets, CRCs, manifest against objects, and
    the stored range against the brokers' log start and high watermark."""
    args = ["--partitions", partitions] if partitions else []
    if compacted:
        args.append("--compacted")
    bootstrap = bootstrap or (None if store else _local_bootstrap(directory))
    if bootstrap:
        args += ["--bootstrap", bootstrap]
    status, report, log_path = _run(
        "verify",
        topic,
        directory,
        store,
        cluster,
        master,
        args,
        verbose,
        spark_conf,
        executor_pod_template,
        creation_id,
    )
    _write_result(result_file, "verify", status, report, log_path)
    _summarize("verify", status, report, log_path)
    sys.exit(status)


@click.command()
@_common
@click.option("--target-bytes", type=int, default=64 << 20, show_default=True)
@click.option(
    "--keep-last-per-key",
    is_flag=True,
    help="Keep the last record per key (cleanupPolicy compact).",
)
@click.option("--delete-retention-ms", type=int, default=24 * 3600 * 1000, show_default=True)
@click.option("--grace-seconds", type=float, default=30.0, show_default=True)
@click.option("--verify/--no-verify", "then_verify", default=True, show_default=True)
def compact(
    topic: str,
    directory: Path,
    store: str | None,
    cluster: str | None,
    creation_id: str | None,
    master: str,
    partitions: str,
    verbose: bool,
    spark_conf: tuple[str, ...],
    executor_pod_template: str | None,
    result_file: Path | None,
    target_bytes: int,
    keep_last_per_key: bool,
    delete_retention_ms: int,
    grace_seconds: float,
    then_verify: bool,
) -> None:
    """Compact TOPIC's stored segments into objects of --target-bytes."""
    args = [
        "--target-bytes",
        str(target_bytes),
        "--delete-retention-ms",
        str(delete_retention_ms),
        "--grace-seconds",
        str(grace_seconds),
    ]
    if partitions:
        args += ["--partitions", partitions]
    if keep_last_per_key:
        args.append("--keep-last-per-key")
    if then_verify:
        args.append("--verify")
    status, report, log_path = _run(
        "compact",
        topic,
        directory,
        store,
        cluster,
        master,
        args,
        verbose,
        spark_conf,
        executor_pod_template,
        creation_id,
    )
    _write_result(result_file, "compact", status, report, log_path)
    _summarize("compact", status, report, log_path)
    sys.exit(status)


@click.group()
def tier() -> None:
    """The object store's tier of a topic."""


@tier.command("sweep")
@click.argument("topic")
@local_record.dir_option("The local cluster's directory (its local.json names the object store).")
@click.option("--store", default=None, help="Object store URL instead of --dir's.")
@click.option("--cluster", default=None, help="Cluster id (default: local).")
@click.option(
    "--creation-id",
    default=None,
    help="The incarnation to sweep: the topic's status.creationId (default: the local"
    " cluster's controller's; none with --store: the legacy layout).",
)
@click.option(
    "--grace-seconds",
    type=click.IntRange(min=0),
    default=sweep.DEFAULT_GRACE_MS // 1000,
    show_default=True,
    help="Unlisted objects written more recently than this are kept: an upload or a"
    " compaction may still list them.",
)
@click.option("--apply", is_flag=True, help="Delete the orphans (default: only report them).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
def sweep_cmd(
    topic: str,
    directory: Path,
    store: str | None,
    cluster: str | None,
    creation_id: str | None,
    grace_seconds: int,
    apply: bool,
    as_json: bool,
) -> None:
    """Find the objects under TOPIC's prefix that no manifest lists (failed or fenced
    uploads, a compaction's or retention's leftovers, a deleted topic's remains) and
    are older than --grace-seconds; with --apply, delete them."""
    from headrace.jobs.topics import TopicRef
    from headrace.objectstore.urls import open_store

    url, cluster_id, env = _target(directory, store, cluster)
    try:
        incarnation = _creation_id(topic, directory, store, creation_id)
        ref = TopicRef(cluster_id, _qualified(topic), incarnation)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TOPIC") from exc
    opened = open_store(url, {**os.environ, **env})
    try:
        report = sweep.sweep_topic(
            opened,
            ref,
            now_ms=int(time.time() * 1000),
            grace_ms=grace_seconds * 1000,
            apply=apply,
        )
    finally:
        opened.close()
    doc = report.to_doc()
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    counts = doc["objects"]
    click.echo(
        f"{ref.topic}: {sum(counts.values())} objects: {counts['listed']} listed,"
        f" {counts['other']} other, {counts['pinned']} kept for snapshots,"
        f" {counts['young']} unlisted but younger than"
        f" {grace_seconds} s, {counts['orphan']} orphans ({doc['orphanBytes']} bytes)"
    )
    for orphan in report.orphans:
        click.echo(f"  orphan {orphan.key} ({orphan.size} bytes)")
    if apply:
        click.echo(f"deleted {len(report.deleted)}; kept {len(report.spared)} listed or rewritten")
    elif report.orphans:
        click.echo("dry run: nothing deleted (--apply deletes the orphans)")


def register(group: click.Group) -> None:
    group.add_command(verify)
    group.add_command(compact)
    group.add_command(tier)
