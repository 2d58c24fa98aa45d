"""``headrace topics create|list|describe|alter|delete``.

Which path a command takes. ``create``, ``alter`` and ``delete`` change what a
controller manages whenever one is known: ``--controller``, ``$HEADRACE_CONTROLLER``, or
a local cluster recorded in ``--dir`` (``var/local``, what ``make run`` starts). Then
they write the same Topic document ``headrace apply -f`` would (through the
controller's ``/v1/apply`` and ``/v1/delete``), so nobody has to write YAML to make a
topic, and the document can be read back (``/v1/topics``) and edited. With no
controller known, or with ``--standalone``, ``create`` and ``delete`` send the broker
admin ops (50, 52) to ``--bootstrap``: the path for a standalone broker. ``list`` and
``describe`` always ask the brokers (op 54): they report offsets, which only brokers know.

One settings vocabulary for both paths: ``-c KEY=VALUE`` takes the broker's setting
names (``retention_ms``, ``segment_bytes``, ``tiered``, ...), which the controller path
writes to the matching Topic spec fields (the inverse of ``control.documents.topic_config``).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import click

from headrace.aio import run
from headrace.cli import controller_client, local_record, options
from headrace.cli.options import (
    ClientTarget,
    client_options,
    controller_http,
    controller_known,
    controller_option,
)
from headrace.commands import one_line_errors
from headrace.errors import InvalidRequest
from headrace.protocol import messages as msg
from headrace.resources.meta import API_VERSION

#: broker setting name -> (path in the Topic spec, factor from the setting to the spec field)
SPEC_FIELDS: dict[str, tuple[tuple[str, ...], int]] = {
    "retention_ms": (("retention", "ms"), 1),
    "retention_bytes": (("retention", "bytes"), 1),
    "segment_bytes": (("segments", "bytes"), 1),
    "segment_ms": (("segments", "ms"), 1),
    "max_batch_bytes": (("maxBatchBytes",), 1),
    "tiered": (("tieredStorage", "enabled"), 1),
    "upload_interval_ms": (("tieredStorage", "uploadIntervalSeconds"), 1000),
    "local_retention_ms": (("tieredStorage", "localRetentionMs"), 1),
    "local_retention_bytes": (("tieredStorage", "localRetentionBytes"), 1),
}
#: how long ``create`` waits for the controller to give every partition a leader
PLACEMENT_TIMEOUT_S = 15.0
#: how long the controller must keep reporting a problem with a new topic before ``create``
#: believes it (seconds)
PROBLEM_GRACE_S = 2.0

_CONFIG_HELP = "KEY=VALUE, repeatable: " + ", ".join(SPEC_FIELDS) + " (tiered takes true/false)."


@click.group()
def topics() -> None:
    """Create, list, describe, alter and delete topics.

    create, alter and delete go through the controller when one is known (--controller,
    $HEADRACE_CONTROLLER, or the local cluster in --dir) and write the same Topic
    document as `headrace apply`; otherwise, or with --standalone, they ask the broker.
    """


# ---------------------------------------------------------------------------- settings


def parse_config(items: tuple[str, ...]) -> dict[str, int | bool]:
    """``-c KEY=VALUE`` items as broker settings; unknown keys and bad values are refused."""
    out: dict[str, int | bool] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--config")
        if key not in SPEC_FIELDS:
            raise click.BadParameter(
                f"unknown setting {key!r}; known: {', '.join(SPEC_FIELDS)}", param_hint="--config"
            )
        if key == "tiered":
            if value.lower() not in ("true", "false", "1", "0"):
                raise click.BadParameter(f"{item!r}: expected true or false", param_hint="--config")
            out[key] = value.lower() in ("true", "1")
            continue
        if not value.lstrip("-").isdigit():
            raise click.BadParameter(f"{item!r}: expected KEY=INTEGER", param_hint="--config")
        out[key] = int(value)
    return out


def set_spec_setting(spec: dict[str, Any], key: str, value: int | bool | None) -> None:
    """Write broker setting ``key`` into its Topic spec field (None removes the field)."""
    path, factor = SPEC_FIELDS[key]
    node = spec
    for part in path[:-1]:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(path[-1], None)
        return
    if factor != 1 and not isinstance(value, bool):
        if value % factor:
            raise click.BadParameter(
                f"{key} must be a whole number of seconds ({value} ms is not)",
                param_hint="--config",
            )
        value = value // factor
    node[path[-1]] = value


def split_name(name: str) -> tuple[str, str]:
    """``NAME`` or ``NAMESPACE/NAME`` -> (namespace, name)."""
    namespace, sep, bare = name.rpartition("/")
    return (namespace if sep else "default"), bare


def topic_manifest(
    name: str,
    partitions: int,
    replicas: int | None,
    min_in_sync: int | None,
    settings: dict[str, int | bool],
    cluster_ref: str,
) -> dict[str, Any]:
    """The Topic document ``topics create`` applies (what a user would write in YAML)."""
    namespace, bare = split_name(name)
    spec: dict[str, Any] = {"clusterRef": {"name": cluster_ref}, "partitions": partitions}
    if replicas is not None:
        spec["replicas"] = replicas
    if min_in_sync is not None:
        spec["minInSync"] = min_in_sync
    for key, value in settings.items():
        set_spec_setting(spec, key, value)
    return {
        "apiVersion": API_VERSION,
        "kind": "Topic",
        "metadata": {"name": bare, "namespace": namespace},
        "spec": spec,
    }


def edited_manifest(
    current: dict[str, Any],
    partitions: int | None,
    replicas: int | None,
    min_in_sync: int | None,
    settings: dict[str, int | bool],
    unset: tuple[str, ...],
) -> dict[str, Any]:
    """``current`` (as applied) with ``alter``'s changes. A new partition count is a live
    repartition, which the controller carries out (docs/repartition.md); a replica count
    change is refused."""
    spec = current["spec"]
    name = f"{current['metadata'].get('namespace', 'default')}/{current['metadata']['name']}"
    if partitions is not None and partitions < 1:
        raise click.BadParameter(f"{partitions} (at least 1)", param_hint="--partitions")
    if replicas is not None and replicas != spec.get("replicas", 3):
        raise click.ClickException(
            f"topic {name}: changing the replica count ({spec.get('replicas', 3)} -> {replicas})"
            " is not implemented yet; nothing was changed"
        )
    meta = current["metadata"]
    doc: dict[str, Any] = {
        "apiVersion": current.get("apiVersion", API_VERSION),
        "kind": "Topic",
        "metadata": {
            k: copy.deepcopy(meta[k])
            for k in ("name", "namespace", "labels", "annotations")
            if k in meta
        },
        "spec": copy.deepcopy(spec),
    }
    if min_in_sync is not None:
        doc["spec"]["minInSync"] = min_in_sync
    if partitions is not None:
        doc["spec"]["partitions"] = partitions
    for key in unset:
        if key not in SPEC_FIELDS:
            raise click.BadParameter(
                f"unknown setting {key!r}; known: {', '.join(SPEC_FIELDS)}", param_hint="--unset"
            )
        set_spec_setting(doc["spec"], key, None)
    for key, value in settings.items():
        set_spec_setting(doc["spec"], key, value)
    return doc


# ---------------------------------------------------------------------------- controller path


def _applied_topics(url: str) -> dict[str, dict[str, Any]]:
    docs = controller_http("GET", f"{url}/v1/topics")["topics"]
    return {f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}": d for d in docs}


def _apply(url: str, doc: dict[str, Any]) -> None:
    controller_client.request_json(
        "POST", f"{url}/v1/apply", json.dumps(doc).encode(), "application/yaml"
    )


def _wait_placed(url: str, full_name: str, timeout_s: float = PLACEMENT_TIMEOUT_S) -> list[str]:
    """Wait until every partition of ``full_name`` has a leader: [] when it does, else the
    controller's problems with the topic once they have lasted ``PROBLEM_GRACE_S`` (a spec
    the cluster cannot honour will not be placed by waiting; a controller that has just
    started may report one for a moment). After ``timeout_s`` it gives up, leaving the
    topic applied (the cluster may yet place it)."""
    deadline = time.monotonic() + timeout_s
    problem_since: float | None = None
    while True:
        state = controller_http("GET", f"{url}/v1/state")
        topic = next(
            (t for t in state["cluster"].get("topics", []) if t["name"] == full_name), None
        )
        if (
            topic is not None
            and topic["partitions"]
            and all(p.get("leader") is not None for p in topic["partitions"])
        ):
            return []
        problems = [p["message"] for p in state.get("problems", []) if p["topic"] == full_name]
        now = time.monotonic()
        if not problems:
            problem_since = None
        elif problem_since is None:
            problem_since = now
        elif now - problem_since >= PROBLEM_GRACE_S:
            return problems
        if now > deadline:
            raise click.ClickException(
                f"topic {full_name} applied but not placed in {timeout_s:.0f}s"
                + (f": {'; '.join(problems)}" if problems else "")
                + "; see `headrace local status`"
            )
        time.sleep(0.2)


def _default_replicas(directory: Path) -> int | None:
    """min(3, brokers) for a local cluster recorded in ``directory``; None otherwise (the
    Topic model's default applies)."""
    try:
        record = json.loads((directory / local_record.STATE_FILE).read_text())
        return min(3, len(record["brokers"])) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------- broker path


async def admin_call(client: ClientTarget, op: int, body: bytes) -> Any:
    """One admin request to any broker of ``client.bootstrap``; its decoded JSON answer."""
    from headrace.client.cluster import ClusterClient
    from headrace.protocol.frames import Op

    cluster = ClusterClient(client.bootstrap, client.connect_options())
    try:
        conn = await cluster.bootstrap_connection()
        frame = await conn.request(Op(op), body)
        return msg.decode_json(frame.body)
    finally:
        await cluster.close()


async def _broker_admin(client: ClientTarget, op: int, body: bytes) -> Any:
    """``admin_call`` for create and delete: a cluster-mode broker's refusal says how to
    reach the controller instead."""
    try:
        return await admin_call(client, op, body)
    except InvalidRequest as exc:
        if "controller" not in exc.message:
            raise
        raise click.ClickException(
            f"{exc.message}; name it with --controller URL, $HEADRACE_CONTROLLER or --dir DIR"
        ) from exc


# ---------------------------------------------------------------------------- commands

standalone_option = click.option(
    "--standalone",
    is_flag=True,
    help="Ask the broker (admin op) even if a controller is known: for a standalone broker.",
)


@topics.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True)
@click.option(
    "--replicas",
    "-r",
    type=int,
    default=None,
    help="Copies of each partition [default: min(3, brokers) of a local cluster, else 3].",
)
@click.option("--min-in-sync", type=int, default=None, help="Replicas an acks=all produce needs.")
@click.option("--config", "-c", multiple=True, help=_CONFIG_HELP)
@click.option(
    "--cluster-ref",
    default=local_record.CLUSTER_ID,
    show_default=True,
    help="The Topic's clusterRef (controller path).",
)
@click.option("--no-wait", is_flag=True, help="Return once applied, before partitions are placed.")
@standalone_option
@controller_option
@client_options
@one_line_errors
def topics_create(
    name: str,
    partitions: int,
    replicas: int | None,
    min_in_sync: int | None,
    config: tuple[str, ...],
    cluster_ref: str,
    no_wait: bool,
    standalone: bool,
    controller_url: str | None,
    client: ClientTarget,
) -> None:
    """Create topic NAME (or NAMESPACE/NAME).

    Through the controller, it applies a Topic document and waits until every partition
    has a leader. A spec the cluster cannot honour (say, more replicas than brokers) is
    refused by the controller and nothing is applied; if it reports a problem while
    placing instead, the document is deleted again. Either way it fails with the
    controller's reason."""
    settings = parse_config(config)
    if standalone or not controller_known(controller_url, client):
        if replicas is not None or min_in_sync is not None:
            raise click.UsageError("--replicas and --min-in-sync need a controller (cluster mode)")
        from headrace.protocol.frames import Op

        body = msg.CreateTopic(name, partitions, dict(settings)).encode()
        result = run(_broker_admin(client, Op.CREATE_TOPIC, body))
        click.echo(f"created {result['name']} with {result['partitions']} partitions")
        return
    url = options.controller_url(controller_url, client.directory)
    namespace, bare = split_name(name)
    full_name = f"{namespace}/{bare}"
    if full_name in _applied_topics(url):
        raise click.ClickException(
            f"topic {full_name} already exists (`headrace topics alter` changes it)"
        )
    if replicas is None:
        replicas = _default_replicas(client.directory)
    doc = topic_manifest(name, partitions, replicas, min_in_sync, settings, cluster_ref)
    try:
        _apply(url, doc)
    except controller_client.ControllerRefusal as exc:  # admission: nothing was applied
        refused = exc.doc.get("problems") or [exc.message]
        prefix = f"topic {full_name}: "
        reasons = "; ".join(line.removeprefix(prefix) for line in refused)
        raise click.ClickException(f"topic {full_name} not created: {reasons}") from exc
    problems = [] if no_wait else _wait_placed(url, full_name)
    if problems:
        # The document is ours (the topic did not exist): take it back rather than leave
        # a topic the cluster cannot honour.
        controller_http("POST", f"{url}/v1/delete", {"topics": [full_name]})
        raise click.ClickException(f"topic {full_name} not created: {'; '.join(problems)}")
    shown = doc["spec"].get("replicas", 3)
    click.echo(f"created {full_name} with {partitions} partitions, {shown} replicas")


@topics.command("alter")
@click.argument("name")
@click.option("--config", "-c", multiple=True, help="Set: " + _CONFIG_HELP)
@click.option(
    "--unset", "-u", multiple=True, help="Remove a setting (the cluster default applies)."
)
@click.option("--min-in-sync", type=int, default=None)
@click.option(
    "--partitions",
    "-p",
    type=int,
    default=None,
    help="A new partition count: a live repartition (grow or shrink; each key keeps its"
    " order per cohort). Follow it with `headrace local status`.",
)
@click.option("--replicas", "-r", type=int, default=None, help="Refused unless unchanged.")
@click.option("--dry-run", is_flag=True, help="Print the Topic document instead of applying it.")
@controller_option
@client_options
@one_line_errors
def topics_alter(
    name: str,
    config: tuple[str, ...],
    unset: tuple[str, ...],
    min_in_sync: int | None,
    partitions: int | None,
    replicas: int | None,
    dry_run: bool,
    controller_url: str | None,
    client: ClientTarget,
) -> None:
    """Change topic NAME's settings (retention, segments, minInSync, partitions, ...).

    Edits the Topic document the controller holds and applies it back. Needs a controller:
    a standalone broker's topic settings change only through the Kafka API (docs/kafka.md)."""
    if not controller_known(controller_url, client):
        raise click.ClickException(
            "topics alter needs a controller (--controller, $HEADRACE_CONTROLLER or a local"
            " cluster in --dir); a standalone broker's topic settings change only through the"
            " Kafka API (IncrementalAlterConfigs, docs/kafka.md)"
        )
    settings = parse_config(config)
    url = options.controller_url(controller_url, client.directory)
    namespace, bare = split_name(name)
    full_name = f"{namespace}/{bare}"
    current = _applied_topics(url).get(full_name)
    if current is None:
        raise click.ClickException(f"topic {full_name} does not exist")
    doc = edited_manifest(current, partitions, replicas, min_in_sync, settings, unset)
    if dry_run:
        click.echo(json.dumps(doc, indent=2))
        return
    if doc["spec"] == current["spec"]:
        click.echo(f"topic {full_name} unchanged")
        return
    _apply(url, doc)
    click.echo(f"altered {full_name}")
    if doc["spec"]["partitions"] != current["spec"]["partitions"]:
        click.echo(
            f"repartitioning {full_name}: {current['spec']['partitions']} ->"
            f" {doc['spec']['partitions']} partitions, live (follow it with"
            " `headrace local status`)"
        )


@topics.command("list")
@client_options
@one_line_errors
def topics_list(client: ClientTarget) -> None:
    """List topics (from the brokers)."""
    from headrace.protocol.frames import Op

    result = run(admin_call(client, Op.DESCRIBE_TOPICS, b"{}"))
    click.echo(f"{'TOPIC':40} {'PARTITIONS':>10} {'VERSION':>8} {'RECORDS':>14}")
    for t in result["topics"]:
        records = sum(p["log_end_offset"] - readable_start(p) for p in t["partition_details"])
        click.echo(
            f"{t['name']:40} {t['partitions']:>10} {t['partitioning_version']:>8} {records:>14}"
        )


def readable_start(partition: dict[str, Any]) -> int:
    """The first offset a reader can get: the object store's, for records that left the disk."""
    start = int(partition["log_start_offset"])
    stored = partition.get("stored_start_offset")
    return min(start, int(stored)) if stored is not None else start


@topics.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the raw description.")
@client_options
@one_line_errors
def topics_describe(name: str, as_json: bool, client: ClientTarget) -> None:
    """Describe one topic: partitions, offsets, cursors."""
    from headrace.protocol.frames import Op

    result = run(admin_call(client, Op.DESCRIBE_TOPICS, msg.encode_json({"name": name})))
    topic = result["topics"][0]
    if as_json:
        click.echo(json.dumps(topic, indent=2))
        return
    click.echo(
        f"topic {topic['name']}  partitions={topic['partitions']}"
        f"  version={topic['partitioning_version']}"
    )
    click.echo(
        f"{'PART':>4} {'LEADER':>6} {'START':>12} {'END':>12} {'HW':>12} {'BYTES':>14}  CURSORS"
    )
    for p in topic["partition_details"]:
        cursors = ",".join(f"{c}={o}" for c, o in sorted(p["cursors"].items())) or "-"
        click.echo(
            f"{p['partition']:>4} {_or_dash(p['leader']):>6} {p['log_start_offset']:>12}"
            f" {p['log_end_offset']:>12} {p['high_watermark']:>12} {p['size_bytes']:>14}  {cursors}"
        )


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


@topics.command("delete")
@click.argument("name")
@standalone_option
@controller_option
@client_options
@one_line_errors
def topics_delete(
    name: str, standalone: bool, controller_url: str | None, client: ClientTarget
) -> None:
    """Delete a topic and its data."""
    if standalone or not controller_known(controller_url, client):
        from headrace.protocol.frames import Op

        run(_broker_admin(client, Op.DELETE_TOPIC, msg.TopicName(name).encode()))
        click.echo(f"deleted {name}")
        return
    url = options.controller_url(controller_url, client.directory)
    namespace, bare = split_name(name)
    full_name = f"{namespace}/{bare}"
    result = controller_http("POST", f"{url}/v1/delete", {"topics": [full_name]})
    if full_name not in result["deleted"]:
        raise click.ClickException(f"topic {full_name} does not exist")
    click.echo(f"deleted {full_name}")
