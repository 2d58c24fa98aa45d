"""A local cluster's life: the brokers' and controller's command lines, bringing the
cluster up and down, and stopping and starting one broker.

Broker i runs on its own loopback address 127.0.0.(2+i) with the same ports, as pods
would have; what was started is recorded in ``<dir>/local.json`` (``local_record``).
Every broker tiers to one object store shared by the cluster: a directory,
``<dir>/objects``, or a MinIO server (``minio_launcher``) whose credentials reach the
brokers in their environment.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from headrace.cli.controller_client import ControllerRefusal, request_json
from headrace.cli.local_access import (
    access_args,
    controller_access_args,
    prepare_access,
    replication_token,
)
from headrace.cli.local_record import (
    CLUSTER_ID,
    STATE_FILE,
    broker_entry,
    controller_dir,
    recorded_pids,
    write_state,
)
from headrace.cli.minio_launcher import MINIO_BUCKET, start_minio
from headrace.cli.processes import (
    alive,
    spawn_headrace,
    stop_processes,
    wait_until_serving,
)
from headrace.protocol.endpoints import DEFAULT_LISTENER
from headrace.resources.clusters import offsets_topic_spec

#: ports when neither --port-base nor the port options are given
DEFAULT_PORT, DEFAULT_ADMIN_PORT, DEFAULT_CONTROLLER_PORT = 9092, 9644, 9700
#: every broker's Kafka listener when neither --port-base nor --kafka-port is given
DEFAULT_KAFKA_PORT = 9093
#: the Topic keeping Kafka groups' committed offsets (the brokers' default
#: ``--kafka-offsets-topic``); ``local up`` applies it with the Kafka listener on
KAFKA_OFFSETS_TOPIC = "kafka.group-offsets"
ACCESS_KEY_ENV = "HEADRACE_OBJECT_STORE_ACCESS_KEY"
SECRET_KEY_ENV = "HEADRACE_OBJECT_STORE_SECRET_KEY"
#: how long ``local stop`` waits for a broker's leadership to move away before it stops it
DRAIN_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class LocalClusterPlan:
    """What ``local up`` starts, its options checked and its ports resolved."""

    directory: Path
    count: int
    port: int
    admin_port: int
    controller_port: int
    #: -1: no Kafka listener (and no offsets Topic)
    kafka_port: int
    fsync: str
    #: ``dir`` or ``minio``
    object_store: str
    preferred_leader_quiet_ms: int | None
    acl_file: Path | None
    racks: tuple[str, ...]
    #: more data listeners, (name, port): broker i's k-th (from 1) binds and advertises
    #: ``listener_host(k, i)`` on that port
    listeners: tuple[tuple[str, int], ...] = ()
    #: the controller's schedule time per real time (None: the wall clock); tests only
    schedule_clock_rate: float | None = None


def object_store_args(
    record: Mapping[str, Any], directory: Path
) -> tuple[list[str], dict[str, str]]:
    """(broker arguments, broker environment) for the cluster's object store."""
    minio = record.get("minio")
    if minio is None:
        objects = (directory / "objects").resolve()
        objects.mkdir(parents=True, exist_ok=True)
        return ["--object-store", f"file://{objects}", "--cluster-id", CLUSTER_ID], {}
    url = f"s3://{minio['host']}:{minio['port']}/{minio['bucket']}?create_bucket=1"
    env = {ACCESS_KEY_ENV: minio["access_key"], SECRET_KEY_ENV: minio["secret_key"]}
    return ["--object-store", url, "--cluster-id", CLUSTER_ID], env


def broker_args(b: Mapping[str, Any], directory: Path, fsync: str | None = None) -> list[str]:
    """The command line of broker ``b`` of a local cluster (without the object store)."""
    args = [
        "broker",
        "--cluster",
        "--broker-id",
        str(b["id"]),
        "--host",
        b["host"],
        "--port",
        str(b["port"]),
        "--admin-host",
        b["host"],
        "--admin-port",
        str(b["admin_port"]),
        "--data-dir",
        str(directory / f"broker-{b['id']}"),
    ]
    if fsync is not None:
        args += ["--fsync", fsync]
    if b.get("kafka_port") is not None:
        args += ["--kafka-port", str(b["kafka_port"])]
    if b.get("rack"):
        args += ["--rack", str(b["rack"])]
    for listener in b.get("listeners", []):
        args += ["--listener", f"{listener['name']}={listener['host']}:{listener['port']}"]
    return args


def listener_host(listener: int, broker_id: int) -> str:
    """Where broker ``broker_id``'s ``listener``-th named listener (from 1) binds: a loopback
    address of its own (the default listener's is ``127.0.0.<2 + id>``)."""
    return f"127.0.{listener}.{2 + broker_id}"


def broker_listeners(named: Sequence[tuple[str, int]], broker_id: int) -> list[dict[str, Any]]:
    """Broker ``broker_id``'s record of the cluster's named listeners ((name, port) each)."""
    return [
        {"name": name, "host": listener_host(k, broker_id), "port": port}
        for k, (name, port) in enumerate(named, start=1)
    ]


def parse_listeners(texts: Sequence[str]) -> list[tuple[str, int]]:
    """``--listener NAME=PORT`` options as (name, port); refuses a malformed one, a name
    twice and the default listener's name."""
    listeners: list[tuple[str, int]] = []
    for text in texts:
        name, _, port = text.partition("=")
        if not name or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise click.BadParameter(f"{text!r}: expected NAME=PORT", param_hint="--listener")
        if name == DEFAULT_LISTENER or name in (n for n, _ in listeners):
            raise click.BadParameter(
                f"{name!r}: the default listener's name, or given twice", param_hint="--listener"
            )
        listeners.append((name, int(port)))
    return listeners


def rack_for(broker_id: int, racks: Sequence[str]) -> str | None:
    """The rack of broker ``broker_id`` in a local cluster with ``racks``: round the list,
    so consecutive brokers land in different racks; None without racks."""
    return racks[broker_id % len(racks)] if racks else None


def parse_racks(text: str | None) -> list[str]:
    """``--racks a,b,c`` as a list; refuses an empty name or one twice."""
    if not text:
        return []
    racks = [r.strip() for r in text.split(",")]
    if any(not r for r in racks) or len(set(racks)) != len(racks):
        raise click.BadParameter(
            f"{text!r}: expected distinct, non-empty names separated by commas",
            param_hint="--racks",
        )
    return racks


def bring_up(plan: LocalClusterPlan) -> dict[str, Any]:
    """Start MinIO (with ``--object-store minio``), the brokers and the controller, and
    apply the offsets Topic; the record local.json keeps.

    Refuses a directory whose cluster runs. If a step fails, what was started is stopped
    and local.json removed."""
    directory = plan.directory
    state_file = directory / STATE_FILE
    if state_file.exists():
        existing = json.loads(state_file.read_text())
        if any(alive(pid) for pid in recorded_pids(existing)):
            raise click.ClickException(
                f"a local cluster is already running from {directory}; `headrace local down` first"
            )
    instance = "local-" + secrets.token_hex(8)
    record: dict[str, Any] = {
        "object_store": plan.object_store,
        "instance": instance,
        "fsync": plan.fsync,
        "brokers": [],
    }
    if plan.racks:
        record["racks"] = list(plan.racks)
    if plan.acl_file is not None:
        prepare_access(record, directory, plan.acl_file)
    if plan.kafka_port >= 0:
        record["kafka_port"] = plan.kafka_port
    if plan.preferred_leader_quiet_ms is not None:
        record["controller_args"] = [
            "--preferred-leader-quiet-ms",
            str(plan.preferred_leader_quiet_ms),
        ]
    if plan.schedule_clock_rate is not None:
        record.setdefault("controller_args", []).extend(
            ["--schedule-clock-rate", str(plan.schedule_clock_rate)]
        )
    if plan.object_store == "minio":
        record["minio"] = start_minio(directory)
        write_state(state_file, record)  # so `local down` finds MinIO if a later step fails
    try:
        _start(record, plan)
        if plan.kafka_port >= 0:
            apply_offsets_topic(record["controller_url"], plan.count)
    except BaseException:
        stop_processes(
            [pid for pid in recorded_pids(record) if pid != record.get("minio", {}).get("pid")]
        )
        if "minio" in record:
            stop_processes([record["minio"]["pid"]])
        state_file.unlink(missing_ok=True)
        raise
    return record


def _start(record: dict[str, Any], plan: LocalClusterPlan) -> None:
    """Spawn the brokers and the controller into ``record`` (and local.json) and wait until
    each answers as itself; the caller stops them if this raises."""
    directory = plan.directory
    state_file = directory / STATE_FILE
    store_args, store_env = object_store_args(record, directory)
    acl_args, acl_env = access_args(record, directory)
    store_args, store_env = [*store_args, *acl_args], {**store_env, **acl_env}
    brokers: list[dict[str, Any]] = []
    for i in range(plan.count):
        host = f"127.0.0.{2 + i}"
        b: dict[str, Any] = {
            "id": i,
            "host": host,
            "port": plan.port,
            "admin_port": plan.admin_port,
        }
        if record.get("kafka_port") is not None:
            b["kafka_port"] = record["kafka_port"]
        if rack := rack_for(i, record.get("racks", [])):
            b["rack"] = rack
        if plan.listeners:
            b["listeners"] = broker_listeners(plan.listeners, i)
        b["pid"] = spawn_headrace(
            [*broker_args(b, directory, plan.fsync), *store_args],
            directory / "logs" / f"broker-{i}.log",
            store_env,
        )
        brokers.append(b)
        record["brokers"] = brokers  # so a failure below stops what was started
    controller_log = directory / "logs" / "controller.log"
    controller_pid = spawn_headrace(
        [
            "controller",
            "--state-dir",
            str(controller_dir(directory)),
            "--local-dir",
            str(directory),
            "--admin-port",
            str(plan.controller_port),
            "--cluster-id",
            CLUSTER_ID,
            "--instance",
            record["instance"],
            *record.get("controller_args", []),
            *controller_access_args(record),
            *[
                arg
                for b in brokers
                for arg in ("--broker", f"{b['id']}={b['host']}:{b['admin_port']}")
            ],
        ],
        controller_log,
        acl_env,  # the replication token: the brokers' admin ports take it (cluster grant)
    )
    controller_url = f"http://127.0.0.1:{plan.controller_port}"
    record.update({"controller_url": controller_url, "controller_pid": controller_pid})
    write_state(state_file, record)
    for b in brokers:
        wait_until_serving(
            b["pid"],
            f"http://{b['host']}:{b['admin_port']}",
            f"broker {b['id']}",
            directory / "logs" / f"broker-{b['id']}.log",
            30,
        )
    wait_until_serving(controller_pid, controller_url, "controller", controller_log, 30)


def offsets_topic_manifest(brokers: int) -> dict[str, Any]:
    """The Topic of Kafka groups' committed offsets for a local cluster of ``brokers``, as
    the operator makes it for a BrokerCluster (``offsets_topic_spec``)."""
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": KAFKA_OFFSETS_TOPIC, "namespace": "default"},
        "spec": offsets_topic_spec(CLUSTER_ID, brokers),
    }


def apply_offsets_topic(controller_url: str, brokers: int) -> None:
    """Apply it, or say how to: without it Kafka groups have no coordinator (the cluster
    is still up; an ACL-protected controller may refuse this command's credentials)."""
    manifest = json.dumps(offsets_topic_manifest(brokers))
    try:
        request_json("POST", f"{controller_url}/v1/apply", manifest.encode(), "application/yaml")
    except (ControllerRefusal, click.ClickException) as exc:
        click.echo(
            f"warning: the Topic {KAFKA_OFFSETS_TOPIC} was not applied ({exc.message}); Kafka"
            f" groups have no coordinator until it is: headrace apply -f <(echo '{manifest}')",
            err=True,
        )


def report_up(record: Mapping[str, Any], directory: Path, count: int, foreground: bool) -> None:
    """Print where the cluster is (the data bootstrap on stdout); with ``foreground``, stay
    until Ctrl-C and then bring it down."""
    controller_url = record["controller_url"]
    brokers = record["brokers"]
    bootstrap = ",".join(f"{b['host']}:{b['port']}" for b in brokers)
    kafka = ",".join(f"{b['host']}:{b['kafka_port']}" for b in brokers if "kafka_port" in b)
    store = (
        f"MinIO at {record['minio']['host']}:{record['minio']['port']}, bucket {MINIO_BUCKET}"
        if "minio" in record
        else str(directory / "objects")
    )
    click.echo(
        f"local cluster up: {count} brokers, controller {controller_url} (dashboard: {controller_url}/)\n"
        f"  bootstrap   {bootstrap}\n"
        + (f"  kafka       {kafka}\n" if kafka else "")
        + f"  objects     {store}\n  logs        {directory / 'logs'}\n",
        err=True,
    )
    click.echo(bootstrap)
    if foreground:
        click.echo("Ctrl-C to stop the cluster.", err=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            bring_down(directory)


def bring_down(directory: Path) -> None:
    """Stop every process local.json records (MinIO last) and remove it."""
    state_file = directory / STATE_FILE
    if not state_file.exists():
        click.echo(f"no local cluster recorded in {directory}", err=True)
        return
    doc = json.loads(state_file.read_text())
    stop_processes([pid for pid in recorded_pids(doc) if pid != doc.get("minio", {}).get("pid")])
    if "minio" in doc:  # last: brokers may be uploading on their way out
        stop_processes([doc["minio"]["pid"]])
    state_file.unlink()
    stopped = [str(b["id"]) for b in doc.get("brokers", []) if b.get("pid") is None]
    note = f" (broker {', '.join(stopped)} was already stopped)" if stopped else ""
    click.echo(f"local cluster stopped{note}", err=True)


def stop_broker(directory: Path, broker_id: int, kill: bool) -> None:
    """Stop one broker (drained first unless ``kill``) and record it as stopped."""
    record, b = broker_entry(directory, broker_id)
    pid = b.get("pid")
    if pid is None:
        click.echo(f"broker {broker_id} is already stopped", err=True)
        return
    if alive(int(pid)):
        if kill:
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except OSError:
                pass
        else:
            # controlled shutdown: the controller moves its leadership away first
            from headrace.cli.drain import drain

            admin = f"http://{b['host']}:{b['admin_port']}"
            try:
                finished, _ = drain(admin, DRAIN_TIMEOUT_S, token=replication_token(record))
            except (OSError, ValueError):
                finished = False  # not answering: stop it anyway
            if not finished:
                click.echo(f"broker {broker_id}: leadership not all moved away", err=True)
        stop_processes([int(pid)])
        how = "killed" if kill else "stopped"
        click.echo(f"broker {broker_id} {how} (pid {pid})", err=True)
    else:
        click.echo(f"broker {broker_id} had already exited (pid {pid})", err=True)
    b["pid"] = None
    write_state(directory / STATE_FILE, record)


def start_broker(directory: Path, broker_id: int, timeout: float = 30.0) -> None:
    """Start a stopped (or exited) broker with its data directory and addresses, and wait
    until it answers as itself."""
    record, b = broker_entry(directory, broker_id)
    pid = b.get("pid")
    if pid is not None and alive(int(pid)):
        raise click.ClickException(
            f"broker {broker_id} is running (pid {pid}); `headrace local restart {broker_id}`"
            " to restart it"
        )
    store_args, store_env = object_store_args(record, directory)
    acl_args, acl_env = access_args(record, directory)
    store_args, store_env = [*store_args, *acl_args], {**store_env, **acl_env}
    log_path = directory / "logs" / f"broker-{broker_id}.log"
    b["pid"] = spawn_headrace(
        [*broker_args(b, directory, record.get("fsync")), *store_args], log_path, store_env
    )
    write_state(directory / STATE_FILE, record)  # so `local down` finds it from now on
    try:
        wait_until_serving(
            b["pid"],
            f"http://{b['host']}:{b['admin_port']}",
            f"broker {broker_id}",
            log_path,
            timeout,
        )
    except click.ClickException:
        stop_processes([b["pid"]])
        b["pid"] = None
        write_state(directory / STATE_FILE, record)
        raise
    click.echo(f"broker {broker_id} started (pid {b['pid']})", err=True)
