"""Local mode: ``headrace controller``, ``local up|status|stop|start|restart|down``,
``apply|delete -f``.

``local up`` starts one controller and N cluster-mode brokers as processes,
broker i on its own loopback address 127.0.0.(2+i) with the same ports, as
pods would have. Their pids, addresses and log files are recorded in
``<dir>/local.json`` so ``status`` and ``down`` find them.

Every broker tiers to one object store shared by the cluster:
``--object-store dir`` (the default) is a directory, ``<dir>/objects``;
``--object-store minio`` starts a real MinIO server (the binary
``tools/minio/build.sh`` builds, or ``$HEADRACE_MINIO_BIN``) on a free
loopback port with data in ``<dir>/minio`` and fresh root credentials, and
gives them to the brokers in their environment, never on a command line
(``ps`` shows command lines to every user). Its pid, port and credentials are
recorded in ``local.json`` (mode 0600), so ``down`` stops it and tests can
read the bucket.

Which processes answer. Ports are shared by every local cluster on
the machine, so a process that answers on an address may be another cluster's.
Each ``local up`` draws an instance token (``local-<hex>``), records it in
``local.json`` and gives it to its controller; ``/healthz`` of the controller
reports its pid and instance, a broker's its pid. ``local up`` waits until the
pid it started answers on each address, fails fast when one of its processes
exits, and then stops what it started and removes its ``local.json``.
``apply``, ``delete`` and ``local status`` refuse a controller whose instance is
not the one recorded in ``--dir``. The cluster id ("local", the object-store key
prefix and the Topic ``clusterRef`` name) stays the same for every local cluster.

One broker at a time. ``local stop|start|restart BROKER`` stop and start broker
processes of a running cluster with their data directories and addresses; a
stopped broker is recorded in ``local.json`` with no pid, so ``local down``
never signals a pid that may have been reused, and ``local status`` shows it.

Apply tells the truth. ``apply`` skips kinds local mode does not run, with a
note, and the controller refuses (HTTP 422 with one line per problem) a Topic
the cluster cannot honour (``headrace.control.admission``) unless
``--allow-problems`` turns the lines into warnings. ``delete`` names what did
not exist and then exits ``EXIT_NOT_FOUND``.

This module holds the click commands only. The controller process is
``controller.main`` (its options: ``controller_options``); a cluster's life is
``local_cluster`` (its ACL files ``local_access``, its record ``local_record``,
MinIO ``minio_launcher``, the processes ``processes``); ``local status``'s text
is ``local_status``; the controller's API is reached through ``controller_client``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Protocol

import click

from headrace.cli.controller_client import (
    ControllerRefusal,
    checked_dir_option,
    request_json,
    resolve_controller_url,
)
from headrace.cli.local_cluster import (
    DEFAULT_ADMIN_PORT,
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_KAFKA_PORT,
    DEFAULT_PORT,
    LocalClusterPlan,
    bring_down,
    bring_up,
    parse_listeners,
    parse_racks,
    report_up,
    start_broker,
    stop_broker,
)
from headrace.cli.local_record import CLUSTER_ID, DEFAULT_DIR
from headrace.cli.local_status import local_brokers, status_lines
from headrace.control.settings import ControlSettings

# ---------------------------------------------------------------------------- controller


@click.command()
@click.option("--state-dir", type=click.Path(path_type=Path), required=True)
@click.option(
    "--broker", "brokers", multiple=True, required=True, help="ID=HOST:ADMIN_PORT (repeatable)."
)
@click.option("--admin-host", default="127.0.0.1", show_default=True)
@click.option("--admin-port", type=int, default=9700, show_default=True)
@click.option("--poll-interval-ms", type=int, default=1000, show_default=True)
@click.option(
    "--transition-poll-interval-ms",
    type=int,
    default=100,
    show_default=True,
    help="Poll interval while an unload is unfinished or a partition is sealed.",
)
@click.option(
    "--unload-recovery-timeout-ms",
    type=int,
    default=ControlSettings().unload_recovery_timeout_ms,
    show_default=True,
    help="How long a move waits for a live replica to seal before reopening the partition"
    " from the object store (losing what was acknowledged but not uploaded).",
)
@click.option(
    "--preferred-leader-quiet-ms",
    type=click.IntRange(min=1),
    default=ControlSettings().preferred_leader_quiet_ms,
    show_default=True,
    help="How long a returning preferred replica must stay in sync before leadership moves"
    " back to it.",
)
@click.option(
    "--preferred-leader-rebalance/--no-preferred-leader-rebalance",
    default=ControlSettings().preferred_leader_rebalance,
    show_default=True,
    help="Give leadership back to each partition's preferred (first) replica once it is back"
    " in sync.",
)
@click.option("--cluster-id", default=CLUSTER_ID, show_default=True)
@click.option(
    "--instance",
    default=None,
    help="A token /healthz reports so `headrace local` can tell this controller from another"
    " cluster's (local up passes a fresh local-<hex>).",
)
@click.option(
    "--acl-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The brokers' ACL file: /v1/apply and /v1/delete then take a bearer token whose"
    " principal holds admin on every topic they touch. Reloaded on SIGHUP and on change.",
)
@click.option(
    "--auth-token",
    "auth_tokens",
    multiple=True,
    help="Accepted API token (repeatable); any may apply and delete. Not with --acl-file.",
)
@click.option(
    "--auth-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Accepted API tokens, one per line, re-read on SIGHUP and on change.",
)
@click.option(
    "--admin-read-access",
    type=click.Choice(["open", "authenticated"]),
    default="open",
    show_default=True,
    help="Who may read the API and the dashboard (/healthz, /readyz stay open).",
)
@click.option("--admin-tls-cert", type=click.Path(path_type=Path), default=None)
@click.option("--admin-tls-key", type=click.Path(path_type=Path), default=None)
@click.option(
    "--broker-token",
    envvar="HEADRACE_REPLICATION_TOKEN",
    default=None,
    help="Token presented to the brokers' admin ports (heartbeat polls, topology pushes):"
    " the brokers' replication token, or another with the cluster grant."
    " Default: $HEADRACE_REPLICATION_TOKEN.",
)
@click.option(
    "--broker-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="--broker-token from a file re-read on SIGHUP and on change: its first line is"
    " presented (rotation: docs/security.md §9). Replaces --broker-token.",
)
@click.option(
    "--broker-admin-ca",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Speak HTTPS to the brokers' admin ports, verifying them with this CA.",
)
@click.option(
    "--local-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="The local cluster's directory (local up passes it): TopicSnapshotSchedules take"
    " their snapshots with `headrace apply -f --dir` against it. None: schedules do not run.",
)
@click.option(
    "--schedule-clock-rate",
    type=float,
    default=1.0,
    hidden=True,
    help="Schedule time per real time (tests: a minutely schedule fires every few seconds).",
)
def controller(**options: Any) -> None:
    """Run the local-mode controller."""
    from headrace.cli.controller_options import ControllerOptions
    from headrace.controller.main import serve

    serve(ControllerOptions(**options).settings())


# ---------------------------------------------------------------------------- local up / status / down


@click.group()
def local() -> None:
    """A local cluster of processes: one controller, N brokers on 127.0.0.x."""


@local.command("up")
@click.option("--brokers", "count", type=int, default=3, show_default=True)
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
@click.option(
    "--port-base",
    type=int,
    default=None,
    help="Ports from N: brokers' data port N, their admin port N+1, the controller N+2,"
    " the brokers' Kafka listeners N+3 (so clusters with other --dir and --port-base run"
    " side by side).",
)
@click.option(
    "--port",
    type=int,
    default=None,
    help=f"Data port of every broker [default: {DEFAULT_PORT}, or the port base].",
)
@click.option(
    "--admin-port",
    type=int,
    default=None,
    help=f"Admin port of every broker [default: {DEFAULT_ADMIN_PORT}, or port base + 1].",
)
@click.option(
    "--controller-port",
    type=int,
    default=None,
    help=f"Controller port on 127.0.0.1 [default: {DEFAULT_CONTROLLER_PORT}, or port base + 2].",
)
@click.option(
    "--fsync",
    type=click.Choice(["none", "interval", "always"]),
    default="interval",
    show_default=True,
)
@click.option(
    "--object-store",
    "object_store",
    type=click.Choice(["dir", "minio"]),
    default="dir",
    show_default=True,
    help="Where tiered topics upload: a shared directory (DIR/objects) or a MinIO server"
    " started for the cluster (data in DIR/minio).",
)
@click.option(
    "--preferred-leader-quiet-ms",
    type=click.IntRange(min=1),
    default=None,
    help="The controller's quiet period before leadership returns to a preferred replica"
    f" [default: {ControlSettings().preferred_leader_quiet_ms}].",
)
@click.option(
    "--acl-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="Principals and grants (docs/security.md): every broker checks them, and cohort"
    " members need signed identities (the key is DIR/cluster.key).",
)
@click.option(
    "--racks",
    default=None,
    metavar="RACK,RACK,...",
    help="Put broker i in the (i mod N)-th of these racks (each broker's --rack): the"
    " controller spreads every partition's replicas over the racks.",
)
@click.option(
    "--kafka-port",
    type=int,
    default=None,
    help=f"Every broker's Kafka listener (docs/kafka.md) [default: {DEFAULT_KAFKA_PORT}, or"
    " port base + 3]; -1 turns it off.",
)
@click.option(
    "--listener",
    "listeners",
    multiple=True,
    metavar="NAME=PORT",
    help="Another data listener on every broker (repeatable): broker i's N-th binds and"
    " advertises 127.0.N.(2+i):PORT; clients that bootstrap through it are told every"
    " broker's address on it (docs/operations.md).",
)
@click.option(
    "--schedule-clock-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    hidden=True,
    help="The controller's schedule time per real time (tests: a minutely"
    " TopicSnapshotSchedule fires every few seconds).",
)
@click.option("--foreground", is_flag=True, help="Stay attached; Ctrl-C brings the cluster down.")
def local_up(
    count: int,
    directory: Path,
    port_base: int | None,
    port: int | None,
    admin_port: int | None,
    controller_port: int | None,
    fsync: str,
    object_store: str,
    preferred_leader_quiet_ms: int | None,
    acl_file: Path | None,
    racks: str | None,
    kafka_port: int | None,
    listeners: tuple[str, ...],
    schedule_clock_rate: float | None,
    foreground: bool,
) -> None:
    """Start the controller and COUNT brokers (and MinIO with --object-store minio).

    Each broker serves Kafka's protocol too (--kafka-port), and the Topic keeping Kafka
    groups' committed offsets is applied (kafka.group-offsets: 3 partitions, replicated
    on up to 3 brokers, minInSync 2 of 3, no retention).

    Waits until each process it started answers on its address; if one exits (say, its
    address is in use by another cluster) or another process answers there, it fails
    with one line, stops what it started and removes DIR/local.json."""
    if not 1 <= count <= 9:
        raise click.BadParameter("between 1 and 9 brokers", param_hint="--brokers")
    rack_names = parse_racks(racks)
    named_listeners = parse_listeners(listeners)
    if port_base is not None and not 1 <= port_base <= 65533:
        raise click.BadParameter("between 1 and 65533", param_hint="--port-base")
    if port is None:
        port = DEFAULT_PORT if port_base is None else port_base
    if admin_port is None:
        admin_port = DEFAULT_ADMIN_PORT if port_base is None else port_base + 1
    if controller_port is None:
        controller_port = DEFAULT_CONTROLLER_PORT if port_base is None else port_base + 2
    if kafka_port is None:
        kafka_port = DEFAULT_KAFKA_PORT if port_base is None else port_base + 3
    if not -1 <= kafka_port <= 65535:
        raise click.BadParameter("a port, or -1 for none", param_hint="--kafka-port")
    plan = LocalClusterPlan(
        directory=directory,
        count=count,
        port=port,
        admin_port=admin_port,
        controller_port=controller_port,
        kafka_port=kafka_port,
        fsync=fsync,
        object_store=object_store,
        preferred_leader_quiet_ms=preferred_leader_quiet_ms,
        acl_file=acl_file,
        racks=tuple(rack_names),
        listeners=tuple(named_listeners),
        schedule_clock_rate=schedule_clock_rate,
    )
    record = bring_up(plan)
    report_up(record, directory, count, foreground)


@local.command("down")
@click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
def local_down(directory: Path) -> None:
    """Stop the local cluster (SIGTERM, then SIGKILL after 20 s)."""
    bring_down(directory)


# ---------------------------------------------------------------------------- one broker


broker_dir_option = click.option(
    "--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True
)
kill_option = click.option(
    "--kill",
    is_flag=True,
    help="SIGKILL at once, as a crash would (default: drain, so the controller hands its"
    " leaderships over, then SIGTERM, then SIGKILL after 20 s).",
)


@local.command("stop")
@click.argument("broker_id", metavar="BROKER", type=int)
@broker_dir_option
@kill_option
def local_stop(broker_id: int, directory: Path, kill: bool) -> None:
    """Stop one broker of the local cluster; `local start` brings it back with its data.

    Without --kill the broker is drained first: the controller moves every partition it
    leads to another in-sync replica (at most 15 s), then it gets SIGTERM.

    `local status` then shows it as stopped, and `local down` knows it is."""
    stop_broker(directory, broker_id, kill)


@local.command("start")
@click.argument("broker_id", metavar="BROKER", type=int)
@broker_dir_option
def local_start(broker_id: int, directory: Path) -> None:
    """Start a stopped (or crashed) broker again, with its data directory and addresses.

    Waits until it answers as itself; the controller then lets it catch up, and once it is
    back in sync leadership returns to it after the quiet period (preferred-leader
    rebalance)."""
    start_broker(directory, broker_id)


@local.command("restart")
@click.argument("broker_id", metavar="BROKER", type=int)
@broker_dir_option
@kill_option
def local_restart(broker_id: int, directory: Path, kill: bool) -> None:
    """Stop one broker (if it runs) and start it again."""
    stop_broker(directory, broker_id, kill)
    start_broker(directory, broker_id)


@local.command("status")
@checked_dir_option
@click.option("--controller", "controller_url", default=None)
@click.option("--json", "as_json", is_flag=True)
def local_status(directory: Path, controller_url: str | None, as_json: bool) -> None:
    """Brokers, topics, leaders, epochs and live replica sets as the controller sees them."""
    doc = request_json("GET", f"{resolve_controller_url(controller_url, directory)}/v1/state")
    if as_json:
        doc["localBrokers"] = local_brokers(directory, doc.get("live", []))
        click.echo(json.dumps(doc, indent=2))
        return
    for line in status_lines(doc, directory):
        click.echo(line)


# ---------------------------------------------------------------------------- apply / delete


#: ``delete -f`` exit status when something it names did not exist (all that did is deleted)
EXIT_NOT_FOUND = 3

#: what ``headrace local`` runs; ``apply -f`` skips other kinds with a note
LOCAL_KINDS = ("Topic", "Unload", "Repartition")
#: run by ``apply`` itself, against the local cluster's object store (``cli.snapshots``),
#: their statuses kept in the controller's state directory (``headrace get``); the
#: controller runs the schedules (``controller.schedules``)
SNAPSHOT_KINDS = ("TopicSnapshot", "TopicRestore", "TopicSnapshotSchedule")


class SnapshotKinds(Protocol):
    """What ``apply -f`` and ``delete -f`` do with ``SNAPSHOT_KINDS``."""

    def apply(self, resources: list[Any], directory: Path) -> None: ...

    def delete(self, directory: Path, kind: str, namespace: str, name: str) -> None: ...


#: set by ``cli.snapshots.register``: that module imports this one (it registers the
#: handlers here), so this module cannot import it
snapshot_kinds: SnapshotKinds | None = None


def _snapshot_kinds() -> SnapshotKinds:
    if snapshot_kinds is None:
        raise click.ClickException(f"{', '.join(SNAPSHOT_KINDS)} are not available here")
    return snapshot_kinds


@click.command()
@click.option(
    "-f",
    "--filename",
    "paths",
    multiple=True,
    required=True,
    help="File, directory (its *.yaml, *.yml and *.json files, sorted, not recursive) or -"
    " (stdin). Repeatable.",
)
@checked_dir_option
@click.option(
    "--controller", "controller_url", default=None, help="Controller URL (default from local up)."
)
@click.option(
    "--allow-problems",
    is_flag=True,
    help="Apply a spec the cluster cannot honour (replicas above the broker count, another"
    " clusterRef, a partition-count change, cleanupPolicy compact) with a warning, instead of"
    " refusing it.",
)
def apply(
    paths: tuple[str, ...], directory: Path, controller_url: str | None, allow_problems: bool
) -> None:
    """Apply Topic, Unload, Repartition and snapshot manifests (the same YAML as for
    kubectl apply).

    All or nothing: every manifest is validated, and checked against the cluster (its
    name, its broker count, the topics it has), before any is applied. A problem is
    printed as one line and the exit status is 1, unless --allow-problems makes it a
    warning. A Repartition of a missing topic, to the count it has, or of a topic
    mid-Unload is refused. TopicSnapshots and TopicRestores run in this process, after
    the rest is applied; their statuses are kept (`headrace get`). A
    TopicSnapshotSchedule is kept for the controller, which takes its snapshots. Kinds
    local mode does not run (BrokerCluster, Compaction, ...) are skipped with a note."""
    from headrace.cli.manifests import manifests_to_apply
    from headrace.resources import ManifestError

    try:
        # field-level errors before anything is sent; stdin is read here, once
        resources = manifests_to_apply(paths, stdin=sys.stdin)
    except ManifestError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from exc
    kept = []
    snapshots = []
    for resource in resources:
        if resource.kind in LOCAL_KINDS:
            kept.append(resource)
        elif resource.kind in SNAPSHOT_KINDS:
            snapshots.append(resource)  # run here, after the Topics they name are applied
        else:
            click.echo(
                f"skipping {resource.kind} {resource.key.namespace}/{resource.key.name}:"
                f" local mode runs {', '.join(k + 's' for k in LOCAL_KINDS + SNAPSHOT_KINDS)}"
                " only",
                err=True,
            )
    url = resolve_controller_url(controller_url, directory)  # refuses another cluster's controller
    if not kept:
        if snapshots:
            _snapshot_kinds().apply(snapshots, directory)
        else:
            click.echo("nothing to apply", err=True)
        return
    text = "\n---\n".join(json.dumps(_sendable(r)) for r in kept)
    query = "?allowProblems=true" if allow_problems else ""
    try:
        result = request_json(
            "POST",
            f"{url}/v1/apply{query}",
            text.encode(),
            "application/yaml",
        )
    except ControllerRefusal as exc:
        for line in exc.doc.get("problems") or [exc.message]:
            click.echo(f"error: {line}", err=True)
        if exc.doc.get("problems"):
            click.echo("nothing applied (--allow-problems applies it anyway)", err=True)
        raise SystemExit(1) from exc
    for line in result.get("warnings", []):
        click.echo(f"warning: {line}", err=True)
    for item in result["applied"]:
        click.echo(f"{item['kind'].lower()} {item['name']} {item['result']}")
    _snapshot_kinds().apply(snapshots, directory)


def _sendable(resource: Any) -> dict[str, Any]:
    doc = dict(resource.to_manifest())
    doc.pop("status", None)
    return doc


@click.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True)
@checked_dir_option
@click.option("--controller", "controller_url", default=None)
@click.option(
    "--ignore-not-found",
    is_flag=True,
    help=f"Exit 0 when something named does not exist (default: exit {EXIT_NOT_FOUND}).",
)
def delete(
    paths: tuple[str, ...], directory: Path, controller_url: str | None, ignore_not_found: bool
) -> None:
    """Delete the Topics, Unloads, Repartitions and snapshot kinds the manifests name.

    Deleting a TopicSnapshot deletes its document in the store (its objects are no longer
    pinned); a TopicRestore's topic and a TopicSnapshotSchedule's snapshots stay.

    A Repartition deleted after its cutover rolls forward: the transition finishes
    (the topic's status carries it) and only the record of it goes.
    An Unload whose moves are in flight is deleted once they finish; its moves
    that have not started are cancelled. What does not exist is named on stderr
    and, after everything that does exist is deleted, the exit status is 3
    (0 with --ignore-not-found)."""
    from headrace.cli.manifests import manifests_to_delete
    from headrace.resources import ManifestError

    try:
        keys = manifests_to_delete(paths, stdin=sys.stdin)
    except ManifestError as exc:
        for line in exc.problems:
            click.echo(f"error: {line}", err=True)
        raise SystemExit(1) from exc
    for key in keys:
        if key.kind in SNAPSHOT_KINDS:
            _snapshot_kinds().delete(directory, key.kind, key.namespace, key.name)
        elif key.kind not in LOCAL_KINDS:
            click.echo(
                f"skipping {key.kind} {key.namespace}/{key.name}: local mode runs"
                f" {', '.join(k + 's' for k in LOCAL_KINDS + SNAPSHOT_KINDS)} only",
                err=True,
            )
    topics = [f"{k.namespace}/{k.name}" for k in keys if k.kind == "Topic"]
    unloads = [f"{k.namespace}/{k.name}" for k in keys if k.kind == "Unload"]
    repartitions = [f"{k.namespace}/{k.name}" for k in keys if k.kind == "Repartition"]
    if not (topics or unloads or repartitions):
        return  # only snapshot kinds: nothing for the controller
    result = request_json(
        "POST",
        f"{resolve_controller_url(controller_url, directory)}/v1/delete",
        json.dumps({"topics": topics, "unloads": unloads, "repartitions": repartitions}).encode(),
    )
    for name in result.get("repartitions", []):
        click.echo(f"repartition {name} deleted")
    for name in result["unloads"]["deleted"]:
        click.echo(f"unload {name} deleted")
    for name in result["unloads"]["deferred"]:
        click.echo(f"unload {name} will be deleted when its moves in flight finish")
    for name in result["deleted"]:
        click.echo(f"topic {name} deleted")
    missing = [f"topic {n}" for n in topics if n not in result["deleted"]]
    found = set(result["unloads"]["deleted"]) | set(result["unloads"]["deferred"])
    missing += [f"unload {n}" for n in unloads if n not in found]
    missing += [f"repartition {n}" for n in repartitions if n not in result.get("repartitions", [])]
    for what in missing:
        click.echo(f"{what} not found", err=True)
    if missing and not ignore_not_found:
        raise SystemExit(EXIT_NOT_FOUND)
