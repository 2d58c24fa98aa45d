"""``headrace tier snapshot TOPIC NAME`` and ``headrace tier restore TOPIC NAME --to NEW``.

Both run in this process against the local cluster's object store (``<dir>/local.json``)
and controller. ``snapshot`` cuts every partition at the high watermark its brokers
report in one round of requests (produce goes on), retries until the uploaders have
stored that far, and writes the snapshot document (``jobs.snapshot.take_snapshot``).
``restore`` applies the new Topic annotated ``headrace.dev/restore: pending`` (the
controller holds it: ``WaitingForRestore``), writes the restore under the creation id
the controller gave it (``jobs.snapshot.restore_snapshot``), then marks it ``written``:
the controller places it at incarnation 1 and its brokers open every partition at the
snapshot's cut, with its cursors. See docs/tiered-storage.md, *Snapshots*.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import click

from headrace.cli import controller_client, local_record
from headrace.cli import local as local_mode
from headrace.cli.jobs import _creation_id, _local_bootstrap, _qualified, _target

#: how long ``snapshot`` retries while the uploaders have not stored the cut yet, s
STORED_TIMEOUT_S = 120.0

_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=local_record.DEFAULT_DIR,
    show_default=True,
    help="The local cluster's directory (its local.json names the store and controller).",
)


async def _high_watermarks(bootstraps: list[str], topic: str) -> dict[int, int]:
    """Per partition, the highest high watermark any broker reports (each is committed)."""
    from headrace.client.cluster import ClusterClient
    from headrace.client.connection import ConnectOptions
    from headrace.protocol import messages as msg
    from headrace.protocol.frames import Op

    options = ConnectOptions(
        client_id="headrace-cli", auth_token=os.environ.get(controller_client.AUTH_TOKEN_ENV)
    )
    found: dict[int, int] = {}
    for bootstrap in bootstraps:
        cluster = ClusterClient(bootstrap, options)
        try:
            conn = await cluster.bootstrap_connection()
            frame = await conn.request(Op.DESCRIBE_TOPICS, msg.encode_json({"name": topic}))
            for detail in msg.decode_json(frame.body)["topics"][0]["partition_details"]:
                p, hw = int(detail["partition"]), int(detail["high_watermark"])
                found[p] = max(found.get(p, 0), hw)
        finally:
            await cluster.close()
    return found


def _open(directory: Path) -> tuple[Any, str]:
    from headrace.objectstore.urls import open_store

    url, cluster_id, env = _target(directory, None, None)
    return open_store(url, {**os.environ, **env}), cluster_id


def take_local(directory: Path, topic: str, name: str) -> Any:
    """Snapshot ``topic`` of the local cluster in ``directory`` as ``name`` (a
    ``tiered.snapshots.Snapshot``); ``SnapshotExists`` if the name is taken."""
    from headrace.jobs.snapshot import take_snapshot
    from headrace.jobs.topics import TopicRef
    from headrace.tiered.snapshots import SnapshotNotReady

    bootstrap = _local_bootstrap(directory)
    if bootstrap is None:
        raise click.ClickException(f"no local cluster in {directory}: start one with local up")
    store, cluster_id = _open(directory)
    try:
        ref = TopicRef(cluster_id, _qualified(topic), _creation_id(topic, directory, None, None))
        cuts = {
            p: hw - 1
            for p, hw in asyncio.run(_high_watermarks(bootstrap.split(","), ref.topic)).items()
        }
        if not cuts:
            raise click.ClickException(f"no broker reports topic {ref.topic}")
        deadline = time.monotonic() + STORED_TIMEOUT_S
        while True:
            try:
                return take_snapshot(
                    store, ref, name, sorted(cuts), now_ms=int(time.time() * 1000), cuts=cuts
                )
            except SnapshotNotReady as exc:
                if time.monotonic() > deadline:
                    raise click.ClickException(str(exc)) from exc
                time.sleep(0.5)  # the next upload round stores more
    finally:
        store.close()


def find_snapshot(directory: Path, namespace: str, name: str) -> tuple[str, str]:
    """(topic, creation id) of the one snapshot called ``name`` in ``namespace`` of the
    local cluster's store (a TopicRestore names only the snapshot)."""
    from headrace.tiered.snapshots import SNAPSHOT_SUFFIX, SNAPSHOTS_DIR

    store, cluster_id = _open(directory)
    try:
        tail = f"/{SNAPSHOTS_DIR}{name}{SNAPSHOT_SUFFIX}"
        found = [o.key for o in store.list(f"{cluster_id}/{namespace}/") if o.key.endswith(tail)]
    finally:
        store.close()
    if len(found) != 1:
        where = ", ".join(found) if found else "none"
        raise click.ClickException(
            f"snapshot {namespace}/{name}: expected one in the object store, found {where}"
        )
    parts = found[0].removesuffix(tail).split("/")  # cluster, namespace, topic[, creation id]
    return f"{namespace}/{parts[2]}", (parts[3] if len(parts) > 3 else "")


def restore_local(
    directory: Path, topic: str, name: str, new_topic: str, creation_id: str | None
) -> Any:
    """Create ``new_topic`` from ``topic``'s snapshot ``name`` through the local controller;
    returns the ``jobs.snapshot.RestoreResult`` once the new topic is placed."""
    from headrace.cli.topics import _applied_topics, _apply, _wait_placed
    from headrace.control.documents import API_VERSION, RESTORE_ANNOTATION
    from headrace.jobs.snapshot import restore_snapshot, verify_restore
    from headrace.jobs.topics import TopicRef
    from headrace.objectstore.errors import ObjectNotFound
    from headrace.tiered import pins

    controller = controller_client.resolve_controller_url(None, directory)
    target_name = _qualified(new_topic)
    applied = _applied_topics(controller)
    if target_name in applied:
        raise click.ClickException(f"topic {target_name} exists: restore into a new topic")
    store, cluster_id = _open(directory)
    try:
        source = TopicRef(
            cluster_id, _qualified(topic), _creation_id(topic, directory, None, creation_id)
        )
        try:
            snap = pins.read_snapshot(store, source.prefix, name)
        except ObjectNotFound:
            raise click.ClickException(f"no snapshot {name} of {source.topic}") from None
        namespace, _, bare = target_name.partition("/")
        spec: dict[str, Any] = dict(
            applied.get(source.topic, {}).get("spec")
            or {"clusterRef": {"name": local_record.CLUSTER_ID}}
        )
        spec["partitions"] = max(p.partition for p in snap.partitions) + 1
        doc: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "Topic",
            "metadata": {
                "name": bare,
                "namespace": namespace,
                "annotations": {RESTORE_ANNOTATION: "pending"},
            },
            "spec": spec,
        }
        _apply(controller, doc)  # held: not placed while pending
        uid = str(_applied_topics(controller)[target_name]["metadata"]["uid"])
        target = TopicRef(cluster_id, target_name, uid)
        result = restore_snapshot(store, snap, target, now_ms=int(time.time() * 1000))
        problems = verify_restore(store, target, [p.partition for p in snap.partitions])
    finally:
        store.close()
    if problems:
        raise click.ClickException(
            f"the restore of {target_name} failed verification; the topic stays pending"
            f" (delete it): {'; '.join(problems[:5])}"
        )
    doc["metadata"]["annotations"][RESTORE_ANNOTATION] = "written"
    _apply(controller, doc)
    problems = _wait_placed(controller, target_name)
    if problems:
        raise click.ClickException(f"topic {target_name} not placed: {'; '.join(problems)}")
    return result


@click.command("snapshot")
@click.argument("topic")
@click.argument("name")
@_dir_option
def snapshot_cmd(topic: str, name: str, directory: Path) -> None:
    """Snapshot TOPIC as NAME: every partition up to the high watermark at one moment,
    and the cohorts' cursors. Its objects are kept (against retention, compaction, the
    sweep and the topic's deletion) until the snapshot is deleted."""
    snap = take_local(directory, topic, name)
    click.echo(f"snapshot {name} of {snap.topic}: {snap.objects} objects, {snap.size_bytes} bytes")
    for part in snap.partitions:
        cursors = ",".join(f"{c}={o}" for c, o in sorted(part.cursors.items())) or "-"
        click.echo(f"  partition {part.partition}: offsets {part.start}..{part.cut}  {cursors}")


@click.command("restore")
@click.argument("topic")
@click.argument("name")
@click.option("--to", "new_topic", required=True, help="The new topic to create from it.")
@click.option(
    "--creation-id",
    default=None,
    help="TOPIC's incarnation the snapshot belongs to (default: the controller's; needed"
    " once TOPIC is deleted).",
)
@_dir_option
def restore_cmd(
    topic: str, name: str, new_topic: str, creation_id: str | None, directory: Path
) -> None:
    """Create topic --to from TOPIC's snapshot NAME: the same offsets, the same records,
    and each cohort resumes at its cursor."""
    result = restore_local(directory, topic, name, new_topic, creation_id)
    click.echo(
        f"restored {_qualified(new_topic)} from snapshot {name} of {_qualified(topic)}:"
        f" {result.objects} objects, {result.bytes} bytes copied"
    )
    for partition, next_offset in sorted(result.next_offsets.items()):
        click.echo(f"  partition {partition}: continues at offset {next_offset}")


def apply_resources(resources: list[Any], directory: Path) -> None:
    """TopicSnapshots and TopicRestores, run in this process against the local cluster's
    store and controller (``cli.snapshots``); one already done is ``unchanged``."""
    from headrace.tiered.snapshots import SnapshotExists

    for resource in resources:
        namespace, name = resource.key.namespace, resource.key.name
        if resource.kind == "TopicSnapshot":
            try:
                snap = take_local(directory, f"{namespace}/{resource.spec.topic_ref.name}", name)
            except SnapshotExists:
                click.echo(f"topicsnapshot {namespace}/{name} unchanged")
                continue
            click.echo(
                f"topicsnapshot {namespace}/{name} taken: {snap.objects} objects,"
                f" {snap.size_bytes} bytes"
            )
            continue
        target = f"{namespace}/{resource.spec.topic}"
        state = controller_client.request_json(
            "GET", f"{controller_client.resolve_controller_url(None, directory)}/v1/topics"
        )
        if any(
            f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}" == target
            for d in state["topics"]
        ):
            click.echo(f"topicrestore {namespace}/{name} unchanged ({target} exists)")
            continue
        topic, creation_id = find_snapshot(directory, namespace, resource.spec.snapshot_ref.name)
        restored = restore_local(
            directory, topic, resource.spec.snapshot_ref.name, target, creation_id
        )
        click.echo(
            f"topicrestore {namespace}/{name} restored {target}: {restored.objects} objects,"
            f" {restored.bytes} bytes copied"
        )


def delete_resource(directory: Path, namespace: str, name: str) -> None:
    """Delete the snapshot document: its objects are no longer kept (those no manifest
    lists become orphans for ``tier sweep``)."""
    from headrace.jobs.topics import TopicRef
    from headrace.objectstore.urls import open_store
    from headrace.tiered import pins

    try:
        topic, creation_id = find_snapshot(directory, namespace, name)
    except click.ClickException:
        click.echo(f"topicsnapshot {namespace}/{name} not found")
        return
    url, cluster_id, env = _target(directory, None, None)
    store = open_store(url, {**os.environ, **env})
    try:
        pins.delete_snapshot(store, TopicRef(cluster_id, topic, creation_id).prefix, name)
    finally:
        store.close()
    click.echo(f"topicsnapshot {namespace}/{name} deleted")


class _Kinds:
    """``apply -f`` and ``delete -f`` of TopicSnapshot and TopicRestore in local mode."""

    def apply(self, resources: list[Any], directory: Path) -> None:
        apply_resources(resources, directory)

    def delete(self, directory: Path, namespace: str, name: str) -> None:
        delete_resource(directory, namespace, name)


def register() -> None:
    """``tier snapshot``, ``tier restore``, and the kinds for ``apply -f`` / ``delete -f``."""
    from headrace.cli.jobs import tier

    tier.add_command(snapshot_cmd)
    tier.add_command(restore_cmd)
    local_mode.snapshot_kinds = _Kinds()
