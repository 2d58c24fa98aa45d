"""``headrace tier snapshot TOPIC NAME`` and ``headrace tier restore TOPIC NAME --to NEW``.

Both run in this process against the local cluster's object store (``<dir>/local.json``)
and controller. ``snapshot`` cuts every partition at the high watermark its brokers
report in one round of requests (produce goes on), retries until the uploaders have
stored that far, and writes the snapshot document (``jobs.snapshot.take_snapshot``).
``restore`` applies the new Topic annotated ``headrace.dev/restore: pending`` (the
controller holds it: ``WaitingForRestore``), writes the restore under the creation id
the controller gave it (``jobs.snapshot.restore_snapshot``), verifies the copy with the
Spark verify job (``spark-submit jobs/run.py verify``, as ``headrace verify``), then marks
it ``written``: the controller places it at incarnation 1 and its brokers open every
partition at the snapshot's cut, with its cursors. A restore that died before the mark
is finished by running it again: the Topic still pending is resumed under its creation
id. See docs/tiered-storage.md, *Snapshots*.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from headrace.cli import controller_client, local_record
from headrace.cli import local as local_mode
from headrace.cli.jobs import _creation_id, _local_bootstrap, _qualified, _target
from headrace.errors import HeadraceError
from headrace.resources.snapshots import SnapshotPhase

if TYPE_CHECKING:
    from headrace.jobs.snapshot import RestoreResult
    from headrace.jobs.topics import TopicRef
    from headrace.resources.snapshots import RestoreVerification

_dir_option = local_record.dir_option(
    "The local cluster's directory (its local.json names the store and controller)."
)
_store_option = click.option(
    "--store", default=None, help="Object store URL instead of --dir's (a Job's way)."
)
_cluster_option = click.option("--cluster", default=None, help="Cluster id (default: local).")
_result_option = click.option(
    "--result-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write a short JSON summary here (a Job's /dev/termination-log).",
)
#: where the restore's Spark verification runs (``headrace verify``'s default)
SPARK_MASTER = "local[*]"
#: a summary longer than this leaves out its per-partition lines (a Kubernetes
#: termination message holds 4 KiB)
RESULT_BYTES = 3500
#: a failed verification's reason in a summary: short enough for its report's key beside it
VERDICT_CHARS = 1500


async def _high_watermarks(bootstraps: list[str], topic: str) -> list[tuple[int, int]]:
    """(partition, high watermark) as every broker reports it (each is committed)."""
    from headrace.client.cluster import ClusterClient
    from headrace.client.connection import ConnectOptions
    from headrace.protocol import messages as msg
    from headrace.protocol.frames import Op

    options = ConnectOptions(
        client_id="headrace-cli", auth_token=os.environ.get(controller_client.AUTH_TOKEN_ENV)
    )
    found: list[tuple[int, int]] = []
    for bootstrap in bootstraps:
        cluster = ClusterClient(bootstrap, options)
        try:
            conn = await cluster.bootstrap_connection()
            frame = await conn.request(Op.DESCRIBE_TOPICS, msg.encode_json({"name": topic}))
            for detail in msg.decode_json(frame.body)["topics"][0]["partition_details"]:
                found.append((int(detail["partition"]), int(detail["high_watermark"])))
        finally:
            await cluster.close()
    return found


def _open(directory: Path, store: str | None = None, cluster: str | None = None) -> tuple[Any, str]:
    from headrace.objectstore.urls import open_store

    url, cluster_id, env = _target(directory, store, cluster)
    return open_store(url, {**os.environ, **env}), cluster_id


def _parse_cuts(text: str) -> dict[int, int]:
    """``0=41,1=17`` -> {0: 41, 1: 17} (partition = last offset kept)."""
    cuts: dict[int, int] = {}
    for item in filter(None, text.split(",")):
        partition, equals, cut = item.partition("=")
        try:
            if not equals:
                raise ValueError(item)
            cuts[int(partition)] = int(cut)
        except ValueError:
            raise click.BadParameter(
                f"{item!r} is not PARTITION=OFFSET", param_hint="--cuts"
            ) from None
    return cuts


def take_local(
    directory: Path,
    topic: str,
    name: str,
    *,
    store_url: str | None = None,
    cluster: str | None = None,
    creation_id: str | None = None,
    cuts: dict[int, int] | None = None,
) -> Any:
    """Snapshot ``topic`` as ``name`` (a ``tiered.snapshots.Snapshot``): at ``cuts``, else at
    the high watermarks the local cluster's brokers report now; a snapshot of that name
    already written for this incarnation is returned as it is (``jobs.snapshot.take_once``)."""
    from headrace.jobs.snapshot import take_once
    from headrace.jobs.topics import TopicRef
    from headrace.tiered.snapshots import SnapshotNotReady, cuts_at

    if cuts is None:
        bootstrap = _local_bootstrap(directory)
        if bootstrap is None:
            raise click.ClickException(
                f"no local cluster in {directory}: start one with local up, or give --cuts"
            )
        cuts = cuts_at(asyncio.run(_high_watermarks(bootstrap.split(","), _qualified(topic))))
        if not cuts:
            raise click.ClickException(f"no broker reports topic {_qualified(topic)}")
    store, cluster_id = _open(directory, store_url, cluster)
    try:
        incarnation = _creation_id(topic, directory, store_url, creation_id)
        ref = TopicRef(cluster_id, _qualified(topic), incarnation)
        try:
            return take_once(store, ref, name, cuts)
        except SnapshotNotReady as exc:
            raise click.ClickException(str(exc)) from exc
    finally:
        store.close()


def find_snapshot(directory: Path, namespace: str, name: str) -> tuple[str, str]:
    """(topic, creation id) of the one snapshot called ``name`` in ``namespace`` of the
    local cluster's store (a TopicRestore names only the snapshot)."""
    from headrace.jobs.snapshot import SnapshotNotFound
    from headrace.jobs.snapshot import find_snapshot as find_in

    store, cluster_id = _open(directory)
    try:
        ref = find_in(store, cluster_id, namespace, name)
    except SnapshotNotFound as exc:
        raise click.ClickException(exc.message) from None
    finally:
        store.close()
    return ref.topic, ref.creation_id


def restore_into(
    directory: Path,
    topic: str,
    name: str,
    target_name: str,
    target_creation_id: str,
    *,
    creation_id: str | None,
    store_url: str | None = None,
    cluster: str | None = None,
    master: str = SPARK_MASTER,
) -> tuple[RestoreResult, RestoreVerification]:
    """Write ``topic``'s snapshot ``name`` under the incarnation ``target_creation_id`` of
    ``target_name`` (``jobs.snapshot.restore_snapshot``: a rerun after a failure finishes
    it) and verify the copy with the Spark verify job (``_verified_by_spark``); the Topic
    itself is the caller's to create (held pending) and to release (``written``)."""
    from headrace.jobs.snapshot import restore_snapshot
    from headrace.jobs.topics import TopicRef

    store, cluster_id = _open(directory, store_url, cluster)
    try:
        _, snap = _read_snapshot(
            store, cluster_id, topic, name, _creation_id(topic, directory, store_url, creation_id)
        )
        target = TopicRef(cluster_id, _qualified(target_name), target_creation_id)
        result = restore_snapshot(store, snap, target, now_ms=int(time.time() * 1000))
    finally:
        store.close()
    partitions = [p.partition for p in snap.partitions]
    return result, _verified_by_spark(directory, target, partitions, store_url, cluster, master)


class RestoreNotVerified(click.ClickException):
    """The Spark verify job failed the restore's copy, or could not run: the new topic
    stays pending. Carries the verdict (``verification``) the restore Job's summary
    reports, so the TopicRestore's status says where the report is and why it failed."""

    def __init__(self, verification: RestoreVerification) -> None:
        super().__init__(verification.reason or "the restore was not verified")
        self.verification = verification


def verification_of(
    target: TopicRef,
    partitions: list[int],
    status: int,
    report: dict[str, Any] | None,
    log_path: Path,
) -> RestoreVerification:
    """The verify job's verdict on the restore into ``target`` from its exit ``status``
    and ``report`` (``jobs/run.py``'s JSON): ``Verified`` only if it ran, found no error
    and verified every partition of ``partitions``."""
    from headrace.cli.jobs import _finding_line
    from headrace.resources.snapshots import RestoreVerification, VerificationOutcome

    failed = VerificationOutcome.FAILED
    if report is None or "error" in report:
        why = f"exit {status}; see {log_path}" if report is None else report["error"]
        return RestoreVerification(
            outcome=failed,
            report_key=None if report is None else report.get("reportKey"),
            reason=f"the Spark verification of the restore into {target.prefix} could not run"
            f" ({why}); the topic stays pending: run the restore again"[:4096],
        )
    problems = [_finding_line(f).strip() for f in report["findings"] if f["severity"] == "error"]
    problems += [f"partition {f['partition']}: {f['error']}" for f in report["failed"]]
    verified = {int(d["partition"]) for d in report["partitions"]}
    problems += [
        f"partition {p}: not verified (no manifest)" for p in partitions if p not in verified
    ]
    if problems:
        return RestoreVerification(
            outcome=failed,
            report_key=report.get("reportKey"),
            reason=f"the restore into {target.prefix} failed the Spark verification:"
            f" {'; '.join(problems[:5])}; the topic stays pending (delete it)"[:4096],
        )
    return RestoreVerification(
        outcome=VerificationOutcome.VERIFIED, report_key=report.get("reportKey")
    )


def _verified_by_spark(
    directory: Path,
    target: TopicRef,
    partitions: list[int],
    store_url: str | None,
    cluster: str | None,
    master: str,
) -> RestoreVerification:
    """Run the Spark verify job (``jobs/run.py verify``, as ``headrace verify`` does) over
    the restored incarnation ``target``: every object there at its size, every header and
    CRC, no offset gap or overlap, the sealed states covered. Its report is written to the
    store under the new incarnation's ``reports/``. Any error, a partition it did not
    verify, or a job that could not run fails the restore (``RestoreNotVerified``): the
    topic stays pending."""
    from headrace.cli.jobs import _run
    from headrace.resources.snapshots import VerificationOutcome

    status, report, log_path = _run(
        "verify",
        target.topic,
        directory,
        store_url,
        cluster,
        master,
        ["--partitions", ",".join(str(p) for p in partitions)] if partitions else [],
        False,
        creation_id=target.creation_id,
    )
    verification = verification_of(target, partitions, status, report, log_path)
    if verification.outcome is not VerificationOutcome.VERIFIED:
        raise RestoreNotVerified(verification)
    assert report is not None  # verified: it ran and reported
    click.echo(
        f"verified the restore with Spark: {report['summary']['objects']} objects,"
        f" {report['summary']['records']} records"
        + (f" (report: {verification.report_key})" if verification.report_key else "")
    )
    return verification


def _read_snapshot(
    store: Any, cluster_id: str, topic: str, name: str, creation_id: str
) -> tuple[Any, Any]:
    """``topic``'s incarnation as a ``jobs.topics.TopicRef`` and its snapshot ``name``."""
    from headrace.jobs.topics import TopicRef
    from headrace.objectstore.errors import ObjectNotFound
    from headrace.tiered import pins

    source = TopicRef(cluster_id, _qualified(topic), creation_id)
    try:
        return source, pins.read_snapshot(store, source.prefix, name)
    except ObjectNotFound:
        raise click.ClickException(f"no snapshot {name} of {source.topic}") from None


def refuse_unless_held_for(topic_doc: dict[str, Any], snapshot_key: str) -> None:
    """Refuse to finish the restore of a pending Topic held for another snapshot than
    ``snapshot_key`` (``RestoreOfAnotherSnapshot``'s message, naming both): writing this
    one into it would mix the two. One pending without a recorded snapshot is left to the
    store's claim (``jobs.snapshot.restore_snapshot``)."""
    from headrace.control.documents import full_name, restore_held_for
    from headrace.tiered.snapshots import RestoreOfAnotherSnapshot, refuse_another_snapshot

    metadata = topic_doc.get("metadata", {})
    held_for = restore_held_for(metadata.get("annotations") or {})
    if held_for is None:
        return
    try:
        refuse_another_snapshot(f"topic {full_name(topic_doc)}", held_for, snapshot_key)
    except RestoreOfAnotherSnapshot as exc:
        raise click.ClickException(exc.message) from exc


def restore_pending(topic_doc: dict[str, Any]) -> bool:
    """Whether an applied Topic is held for a restore that has not been released yet."""
    from headrace.control.documents import RESTORE_ANNOTATION
    from headrace.control.model import RestoreStage

    annotations = topic_doc.get("metadata", {}).get("annotations") or {}
    return annotations.get(RESTORE_ANNOTATION) == str(RestoreStage.PENDING)


def restore_local(
    directory: Path,
    topic: str,
    name: str,
    new_topic: str,
    creation_id: str | None,
    *,
    master: str = SPARK_MASTER,
    restore: str | None = None,
) -> tuple[RestoreResult, RestoreVerification]:
    """Create ``new_topic`` from ``topic``'s snapshot ``name`` through the local controller;
    returns what was copied and the verify job's verdict once the new topic is placed. A
    ``new_topic`` held pending (a restore that died before releasing it) is finished, if
    it is held for this snapshot (``refuse_unless_held_for``). ``restore``: the
    TopicRestore asking, recorded on the new Topic."""
    from headrace.cli.topics import _applied_topics, _apply, _wait_placed
    from headrace.control.documents import TOPIC_RESTORE_LABEL, restored_topic
    from headrace.control.model import RestoreStage

    controller = controller_client.resolve_controller_url(None, directory)
    target_name = _qualified(new_topic)
    existing = _applied_topics(controller).get(target_name)
    if existing is not None and not restore_pending(existing):
        raise click.ClickException(f"topic {target_name} exists: restore into a new topic")
    store, cluster_id = _open(directory)
    try:
        source, snap = _read_snapshot(
            store, cluster_id, topic, name, _creation_id(topic, directory, None, creation_id)
        )
    finally:
        store.close()
    namespace, _, bare = target_name.partition("/")
    applied = _applied_topics(controller)
    source_spec = applied.get(source.topic, {}).get("spec") or {
        "clusterRef": {"name": local_record.CLUSTER_ID}
    }
    partitions = max(p.partition for p in snap.partitions) + 1
    if existing is None:
        doc = restored_topic(
            namespace, bare, source_spec, partitions, RestoreStage.PENDING, snap.key, restore
        )
        _apply(controller, doc)  # held: not placed while pending
        existing = _applied_topics(controller)[target_name]
    else:
        refuse_unless_held_for(existing, snap.key)
    if int(existing.get("spec", {}).get("partitions", -1)) != partitions:
        raise click.ClickException(
            f"topic {target_name} waits for a restore of {existing['spec'].get('partitions')}"
            f" partitions, not of snapshot {name}'s {partitions}: delete it first"
        )
    # a pending Topic is a restore that died before it was released: its creation id is
    # where that run wrote, and writing there again finishes it (restore_snapshot)
    uid = str(existing["metadata"]["uid"])
    restored = restore_into(
        directory,
        source.topic,
        name,
        target_name,
        uid,
        creation_id=source.creation_id,
        master=master,
    )
    held_by = (existing.get("metadata", {}).get("labels") or {}).get(TOPIC_RESTORE_LABEL)
    _apply(
        controller,
        restored_topic(
            namespace,
            bare,
            source_spec,
            partitions,
            RestoreStage.WRITTEN,
            snap.key,
            held_by or restore,
        ),
    )
    problems = _wait_placed(controller, target_name)
    if problems:
        raise click.ClickException(f"topic {target_name} not placed: {'; '.join(problems)}")
    return restored


def snapshot_summary(snap: Any) -> dict[str, Any]:
    """What a snapshot Job reports (``--result-file``), read into the TopicSnapshot's
    status by the operator: short enough for a termination message."""
    summary: dict[str, Any] = {
        "ok": True,
        "key": snap.key,
        "creationId": snap.creation_id,
        "timeMs": snap.time_ms,
        "objects": snap.objects,
        "bytes": snap.size_bytes,
        "partitions": [[p.partition, p.start, p.cut, len(p.objects)] for p in snap.partitions],
    }
    if len(json.dumps(summary)) > RESULT_BYTES:
        del summary["partitions"]  # the document in the store has them
    return summary


def verification_summary(verification: RestoreVerification) -> dict[str, Any]:
    """The verify job's verdict as a restore Job's summary carries it (``verification``),
    read back by the operator as the same model into the TopicRestore's status."""
    return verification.model_dump(mode="json", by_alias=True, exclude_none=True)


def _write_summary(path: Path | None, summary: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(summary, separators=(",", ":")))


def _reporting(path: Path | None, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s summary, written to ``path``; a failure is written there as
    ``{"ok": false, "error": ...}`` before it ends the command."""
    try:
        summary = run()
    except RestoreNotVerified as exc:
        # the verdict with its report's key; the reason shortened so both fit in 4 KiB
        reason = (exc.verification.reason or "")[:VERDICT_CHARS]
        verdict = exc.verification.model_copy(update={"reason": reason})
        _write_summary(
            path, {"ok": False, "error": reason, "verification": verification_summary(verdict)}
        )
        raise
    except (click.ClickException, HeadraceError) as exc:
        text = exc.message if isinstance(exc, HeadraceError) else exc.format_message()
        _write_summary(path, {"ok": False, "error": text[:2000]})
        raise
    _write_summary(path, summary)
    return summary


_creation_id_option = click.option(
    "--creation-id",
    default=None,
    help="TOPIC's incarnation (its status.creationId; default: the local controller's;"
    " none with --store: the legacy layout).",
)


@click.command("snapshot")
@click.argument("topic")
@click.argument("name")
@_dir_option
@_store_option
@_cluster_option
@_creation_id_option
@click.option(
    "--cuts",
    default=None,
    metavar="P=OFFSET,...",
    help="Each partition's last offset to keep (the operator's cut from its heartbeats);"
    " default: the high watermarks the local cluster's brokers report now.",
)
@_result_option
def snapshot_cmd(
    topic: str,
    name: str,
    directory: Path,
    store: str | None,
    cluster: str | None,
    creation_id: str | None,
    cuts: str | None,
    result_file: Path | None,
) -> None:
    """Snapshot TOPIC as NAME: every partition up to the high watermark at one moment,
    and the cohorts' cursors. Its objects are kept (against retention, compaction, the
    sweep and the topic's deletion) until the snapshot is deleted."""
    snaps: list[Any] = []

    def run() -> dict[str, Any]:
        snaps.append(
            take_local(
                directory,
                topic,
                name,
                store_url=store,
                cluster=cluster,
                creation_id=creation_id,
                cuts=None if cuts is None else _parse_cuts(cuts),
            )
        )
        return snapshot_summary(snaps[0])

    _reporting(result_file, run)
    snap = snaps[0]
    click.echo(f"snapshot {name} of {snap.topic}: {snap.objects} objects, {snap.size_bytes} bytes")
    for part in snap.partitions:
        cursors = ",".join(f"{c}={o}" for c, o in sorted(part.cursors.items())) or "-"
        click.echo(f"  partition {part.partition}: offsets {part.start}..{part.cut}  {cursors}")


@click.command("restore")
@click.argument("topic")
@click.argument("name")
@click.option("--to", "new_topic", required=True, help="The new topic to create from it.")
@_creation_id_option
@click.option(
    "--into-creation-id",
    default=None,
    help="Only write the restore under this incarnation of --to and verify it: the Topic"
    " is created and released by someone else (the operator).",
)
@_dir_option
@_store_option
@_cluster_option
@click.option(
    "--master",
    default=SPARK_MASTER,
    show_default=True,
    help="Spark's master for the verification of the restore (its log goes under --dir).",
)
@_result_option
def restore_cmd(
    topic: str,
    name: str,
    new_topic: str,
    creation_id: str | None,
    into_creation_id: str | None,
    directory: Path,
    store: str | None,
    cluster: str | None,
    master: str,
    result_file: Path | None,
) -> None:
    """Create topic --to from TOPIC's snapshot NAME: the same offsets, the same records,
    and each cohort resumes at its cursor."""
    results: list[tuple[RestoreResult, RestoreVerification]] = []

    def run() -> dict[str, Any]:
        if into_creation_id is None:
            if store is not None:
                raise click.UsageError("--store writes a restore only: give --into-creation-id")
            results.append(
                restore_local(directory, topic, name, new_topic, creation_id, master=master)
            )
        else:
            results.append(
                restore_into(
                    directory,
                    topic,
                    name,
                    new_topic,
                    into_creation_id,
                    creation_id=creation_id,
                    store_url=store,
                    cluster=cluster,
                    master=master,
                )
            )
        copied, verification = results[0]
        return {
            "ok": True,
            "objects": copied.objects,
            "bytes": copied.bytes,
            "verification": verification_summary(verification),
        }

    _reporting(result_file, run)
    result, _ = results[0]
    click.echo(
        f"restored {_qualified(new_topic)} from snapshot {name} of {_qualified(topic)}:"
        f" {result.objects} objects, {result.bytes} bytes copied"
    )
    for partition, next_offset in sorted(result.next_offsets.items()):
        click.echo(f"  partition {partition}: continues at offset {next_offset}")


@click.command("delete-snapshot")
@click.argument("topic")
@click.argument("name")
@_dir_option
@_store_option
@_cluster_option
@_creation_id_option
@_result_option
def delete_snapshot_cmd(
    topic: str,
    name: str,
    directory: Path,
    store: str | None,
    cluster: str | None,
    creation_id: str | None,
    result_file: Path | None,
) -> None:
    """Delete TOPIC's snapshot NAME: its objects are no longer kept (those no manifest
    lists become orphans for ``tier sweep``). Deleting one that is gone is no error."""
    from headrace.jobs.topics import TopicRef
    from headrace.tiered import pins

    def run() -> dict[str, Any]:
        opened, cluster_id = _open(directory, store, cluster)
        try:
            incarnation = _creation_id(topic, directory, store, creation_id)
            ref = TopicRef(cluster_id, _qualified(topic), incarnation)
            pins.delete_snapshot(opened, ref.prefix, name)
        finally:
            opened.close()
        return {"ok": True}

    _reporting(result_file, run)
    click.echo(f"snapshot {name} of {_qualified(topic)} deleted")


def _snapshot_exists(directory: Path, topic: str, name: str) -> bool:
    from headrace.jobs.topics import TopicRef
    from headrace.tiered.snapshots import snapshot_key

    store, cluster_id = _open(directory)
    try:
        ref = TopicRef(cluster_id, topic, _creation_id(topic, directory, None, None))
        return bool(store.exists(snapshot_key(ref.prefix, name)))
    finally:
        store.close()


def _kept(directory: Path) -> Any:
    """Where local mode keeps these resources and their statuses: the controller's state
    directory (``controller.store``), which its schedules read."""
    from headrace.controller.store import FileStore

    return FileStore(local_record.controller_dir(directory))


def _now_ms() -> int:
    return int(time.time() * 1000)


def local_status(
    doc: dict[str, Any], phase: SnapshotPhase, message: str, now_ms: int, **fields: Any
) -> dict[str, Any]:
    """A TopicSnapshot's or TopicRestore's status as the operator writes it (its kind's
    status model): ``phase``, the Ready condition (its reason the phase) and ``fields``."""
    from headrace.control.documents import condition, condition_time
    from headrace.resources.meta import READY
    from headrace.resources.snapshots import TopicRestoreStatus, TopicSnapshotStatus

    generation = int(doc["metadata"].get("generation", 1))
    conditions = (doc.get("status") or {}).get("conditions") or []
    previous = next((c for c in conditions if c.get("type") == READY), None)
    ready = "True" if phase is SnapshotPhase.READY else "False"
    now = condition_time(now_ms)
    status = {
        "observedGeneration": generation,
        "phase": str(phase),
        **{k: v for k, v in fields.items() if v is not None},
        "conditions": [condition(READY, ready, str(phase), message, generation, previous, now)],
    }
    model = TopicSnapshotStatus if doc["kind"] == "TopicSnapshot" else TopicRestoreStatus
    return model.model_validate(status).model_dump(mode="json", by_alias=True, exclude_none=True)


def snapshot_ready_fields(snap: Any) -> dict[str, Any]:
    """A Ready TopicSnapshot's status fields from its document (``tiered.snapshots``)."""
    from headrace.control.documents import rfc3339

    summary = snapshot_summary(snap)
    return {
        "creationId": summary["creationId"],
        "key": summary["key"],
        "partitions": [
            {"partition": p.partition, "start": p.start, "cut": p.cut, "objects": len(p.objects)}
            for p in snap.partitions
        ],
        "objects": summary["objects"],
        "bytes": summary["bytes"],
        "takenAt": rfc3339(summary["timeMs"]),
    }


def _admit(kind: str, resource: Any, directory: Path) -> dict[str, Any]:
    """Keep the applied resource (its metadata as the API server would) with its status;
    the document kept."""
    from headrace.control.documents import condition_time
    from headrace.controller.store import admitted

    kept = _kept(directory)
    name = f"{resource.key.namespace}/{resource.key.name}"
    manifest = dict(resource.to_manifest())
    manifest.pop("status", None)
    previous = kept.document(kind, name)
    doc = admitted(manifest, previous, condition_time(_now_ms()))
    kept.put(kind, doc)
    found: dict[str, Any] = kept.document(kind, name)
    return found


def _record(kind: str, doc: dict[str, Any], directory: Path, status: dict[str, Any]) -> None:
    meta = doc["metadata"]
    _kept(directory).write_status(kind, f"{meta['namespace']}/{meta['name']}", status)
    doc["status"] = status


@contextlib.contextmanager
def _recording_failure(kind: str, doc: dict[str, Any], directory: Path) -> Iterator[None]:
    """Record an exception leaving the block as the resource's Failed status (with the
    verify job's verdict for a restore it failed), then let it go on."""
    try:
        yield
    except Exception as exc:
        verification = None
        if isinstance(exc, RestoreNotVerified):
            verification = verification_summary(exc.verification)
        if isinstance(exc, HeadraceError):
            why = exc.message
        elif isinstance(exc, click.ClickException):
            why = exc.format_message()
        else:
            why = f"{type(exc).__name__}: {exc}"
        status = local_status(doc, SnapshotPhase.FAILED, why, _now_ms(), verification=verification)
        _record(kind, doc, directory, status)
        raise


def apply_resources(resources: list[Any], directory: Path) -> None:
    """TopicSnapshots and TopicRestores, run in this process against the local cluster's
    store and controller (``cli.snapshots``), their statuses kept for ``headrace get``;
    one already done is ``unchanged``. TopicSnapshotSchedules are kept for the
    controller, which runs them (``controller.schedules``)."""
    from headrace.controller.store import RESTORES, SCHEDULES, SNAPSHOTS

    for resource in resources:
        namespace, name = resource.key.namespace, resource.key.name
        if resource.kind == "TopicSnapshotSchedule":
            before = _kept(directory).document(SCHEDULES, f"{namespace}/{name}")
            doc = _admit(SCHEDULES, resource, directory)
            if before is None:
                result = "applied"
            else:
                same = doc["metadata"]["generation"] == before["metadata"]["generation"]
                result = "unchanged" if same else "configured"
            click.echo(f"topicsnapshotschedule {namespace}/{name} {result}")
            continue
        if resource.kind == "TopicSnapshot":
            doc = _admit(SNAPSHOTS, resource, directory)
            topic = f"{namespace}/{resource.spec.topic_ref.name}"
            done = (doc.get("status") or {}).get("phase") == str(SnapshotPhase.READY)
            if done and _snapshot_exists(directory, topic, name):
                click.echo(f"topicsnapshot {namespace}/{name} unchanged")
                continue
            if not done:
                pending = local_status(doc, SnapshotPhase.PENDING, "taking", _now_ms())
                _record(SNAPSHOTS, doc, directory, pending)
            with _recording_failure(SNAPSHOTS, doc, directory):
                snap = take_local(directory, topic, name)
            message = f"{snap.objects} objects, {snap.size_bytes} bytes pinned"
            status = local_status(
                doc, SnapshotPhase.READY, message, _now_ms(), **snapshot_ready_fields(snap)
            )
            _record(SNAPSHOTS, doc, directory, status)
            click.echo(
                f"topicsnapshot {namespace}/{name} taken: {snap.objects} objects,"
                f" {snap.size_bytes} bytes"
            )
            continue
        doc = _admit(RESTORES, resource, directory)
        target = f"{namespace}/{resource.spec.topic}"
        controller = controller_client.resolve_controller_url(None, directory)
        state = controller_client.request_json("GET", f"{controller}/v1/topics")
        existing = next(
            (
                d
                for d in state["topics"]
                if f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}" == target
            ),
            None,
        )
        if existing is not None and not restore_pending(existing):
            from headrace.control.documents import TOPIC_RESTORE_LABEL

            labels = existing.get("metadata", {}).get("labels") or {}
            if labels.get(TOPIC_RESTORE_LABEL) != name and (doc.get("status") or {}).get(
                "phase"
            ) != str(SnapshotPhase.READY):
                # a topic this restore did not create, as the operator's TopicExists
                why = f"topic {target} exists and was not created by this restore"
                _record(
                    RESTORES,
                    doc,
                    directory,
                    local_status(doc, SnapshotPhase.FAILED, why, _now_ms()),
                )
            click.echo(f"topicrestore {namespace}/{name} unchanged ({target} exists)")
            continue
        if existing is not None:
            click.echo(
                f"topicrestore {namespace}/{name}: {target} is pending, finishing its restore"
            )
        pending = local_status(doc, SnapshotPhase.PENDING, f"restoring {target}", _now_ms())
        _record(RESTORES, doc, directory, pending)
        with _recording_failure(RESTORES, doc, directory):
            topic, creation_id = find_snapshot(
                directory, namespace, resource.spec.snapshot_ref.name
            )
            restored, verification = restore_local(
                directory, topic, resource.spec.snapshot_ref.name, target, creation_id, restore=name
            )
        from headrace.cli.topics import _applied_topics
        from headrace.control.documents import condition_time

        placed = _applied_topics(controller).get(target, {})
        status = local_status(
            doc,
            SnapshotPhase.READY,
            f"{target} restored: {restored.objects} objects, {restored.bytes} bytes copied",
            _now_ms(),
            creationId=placed.get("metadata", {}).get("uid"),
            objects=restored.objects,
            bytes=restored.bytes,
            verification=verification_summary(verification),
            completedAt=condition_time(_now_ms()),
        )
        _record(RESTORES, doc, directory, status)
        click.echo(
            f"topicrestore {namespace}/{name} restored {target}: {restored.objects} objects,"
            f" {restored.bytes} bytes copied"
        )


def delete_resource(directory: Path, namespace: str, name: str) -> None:
    """Delete the snapshot document: its objects are no longer kept (those no manifest
    lists become orphans for ``tier sweep``); then the resource kept for ``get``."""
    from headrace.controller.store import SNAPSHOTS
    from headrace.jobs.topics import TopicRef
    from headrace.tiered import pins

    kept = _kept(directory)
    try:
        topic, creation_id = find_snapshot(directory, namespace, name)
    except click.ClickException:
        found = kept.document(SNAPSHOTS, f"{namespace}/{name}") is not None
        kept.remove(SNAPSHOTS, f"{namespace}/{name}")
        click.echo(f"topicsnapshot {namespace}/{name} {'deleted' if found else 'not found'}")
        return
    store, cluster_id = _open(directory)
    try:
        pins.delete_snapshot(store, TopicRef(cluster_id, topic, creation_id).prefix, name)
    finally:
        store.close()
    kept.remove(SNAPSHOTS, f"{namespace}/{name}")
    click.echo(f"topicsnapshot {namespace}/{name} deleted")


def delete_kept(directory: Path, kind: str, namespace: str, name: str) -> None:
    """Forget a TopicRestore (its topic stays) or a TopicSnapshotSchedule (the snapshots
    it took stay: delete them by name)."""
    from headrace.controller.store import RESTORES, SCHEDULES

    folder = RESTORES if kind == "TopicRestore" else SCHEDULES
    kept = _kept(directory)
    found = kept.document(folder, f"{namespace}/{name}") is not None
    kept.remove(folder, f"{namespace}/{name}")
    what = "deleted (its topic stays)" if kind == "TopicRestore" else "deleted"
    click.echo(f"{kind.lower()} {namespace}/{name} {what if found else 'not found'}")


class _Kinds:
    """``apply -f`` and ``delete -f`` of the snapshot kinds in local mode."""

    def apply(self, resources: list[Any], directory: Path) -> None:
        apply_resources(resources, directory)

    def delete(self, directory: Path, kind: str, namespace: str, name: str) -> None:
        if kind == "TopicSnapshot":
            delete_resource(directory, namespace, name)
        else:
            delete_kept(directory, kind, namespace, name)


def register() -> None:
    """``tier snapshot``, ``tier restore``, and the kinds for ``apply -f`` / ``delete -f``."""
    from headrace.cli.jobs import tier

    tier.add_command(snapshot_cmd)
    tier.add_command(restore_cmd)
    tier.add_command(delete_snapshot_cmd)
    local_mode.snapshot_kinds = _Kinds()
