"""The broker process's entry point: ``python -m headrace.broker`` (also ``headrace broker``).

It reads its settings from the command line (and a few environment variables
for secrets) once, builds a :class:`~headrace.broker.config.BrokerSettings`,
and runs the broker until SIGTERM or SIGINT, or until the broker halts because
a log's data fdatasync failed: then it stops what it can within
``HALT_STOP_SECONDS`` and exits with ``EXIT_LOG_SYNC_FAILED``, so that the
controller sees the broker gone and a restart recovers from disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import click

from headrace.aio import run
from headrace.broker.app import Broker
from headrace.broker.config import AdminReadAccess, BrokerSettings, TlsSettings
from headrace.commands import one_line_errors
from headrace.kafka.offsets_log import DEFAULT_OFFSETS_TOPIC
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig

log = logging.getLogger(__name__)

#: the exit status after a failed data fdatasync (sysexits' EX_IOERR: an I/O error on a file)
EXIT_LOG_SYNC_FAILED = 74
#: how long a halting broker may spend on its best-effort stop before it exits anyway
#: (long enough to close connections and sync the healthy logs; a dying disk can hang)
HALT_STOP_SECONDS = 10.0


async def serve_until_stopped(b: Broker, stop: asyncio.Event) -> int:
    """Run a started broker until ``stop`` is set or it halts; stop it. Returns the exit status."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(b.halting.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if b.fatal is None:
        await b.stop()
    else:
        # Best effort and bounded: the failed log is not synced again (GroupCommitter).
        try:
            await asyncio.wait_for(b.stop(), HALT_STOP_SECONDS)
        except TimeoutError:
            log.error("the halting broker did not stop within %.0fs", HALT_STOP_SECONDS)
        except Exception:
            log.exception("the halting broker did not stop cleanly")
    if b.fatal is None:
        return 0
    click.echo(
        f"error: broker halted: fdatasync of {b.fatal.partition.name} failed"
        f" ({b.fatal.error.message}); exiting with status {EXIT_LOG_SYNC_FAILED}."
        " Restart it to recover from disk.",
        err=True,
    )
    return EXIT_LOG_SYNC_FAILED


def raise_open_file_limit() -> int:
    """Raise the soft limit on open descriptors to the hard one; the soft limit now.

    A broker holds one descriptor per segment (plus sockets), so thousands of
    partitions need more than the common soft default of 1,024. Kafka asks for
    the same. The hard limit is the administrator's: never exceeded, only used.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open file limit from %s to %s: %s", soft, hard, exc)
            return soft
        return hard
    return soft


def _halt(status: int) -> None:
    """Exit now: a thread stuck in fdatasync on a failing disk must not hold the exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@click.command()
@click.option(
    "--standalone", is_flag=True, help="Own every partition of every topic (no controller)."
)
@click.option(
    "--cluster",
    "cluster_mode",
    is_flag=True,
    help="Take partitions, roles and epochs from a controller's pushed topology.",
)
@click.option("--replica-lag-max-ms", type=int, default=10_000, show_default=True)
@click.option("--replica-fetch-wait-ms", type=int, default=500, show_default=True)
@click.option(
    "--replica-fetch-silence-max-ms",
    type=click.IntRange(min=1),
    default=3_000,
    show_default=True,
    help="A follower that has not fetched for this long leaves the live replica set.",
)
@click.option(
    "--replication-token",
    envvar="HEADRACE_REPLICATION_TOKEN",
    default=None,
    help="Token this broker presents to other brokers (when they require auth).",
)
@click.option(
    "--replication-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Replication tokens, one per line, re-read on change: the first is presented to"
    " other brokers, every one is accepted from them (rotation: docs/security.md §9)."
    " Replaces --replication-token.",
)
@click.option("--data-dir", type=click.Path(path_type=Path), required=True)
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address the data port binds to."
)
@click.option("--port", type=int, default=9092, show_default=True)
@click.option("--admin-host", default="127.0.0.1", show_default=True)
@click.option(
    "--admin-port", type=int, default=9644, show_default=True, help="-1 disables admin HTTP."
)
@click.option("--advertised-host", default=None, help="Host clients are told to connect to.")
@click.option(
    "--rack",
    default=None,
    envvar="HEADRACE_RACK",
    help="The rack (zone) this broker runs in: the controller spreads each partition's"
    " replicas over racks.",
)
@click.option(
    "--kafka-port",
    type=int,
    default=-1,
    show_default=True,
    help="The Kafka listener's port (docs/kafka.md); -1 = off, 0 = a free one.",
)
@click.option(
    "--kafka-host", default=None, help="Address the Kafka listener binds to (default --host)."
)
@click.option(
    "--kafka-advertised-host", default=None, help="Host Kafka clients are told to connect to."
)
@click.option(
    "--kafka-advertised-port",
    type=int,
    default=None,
    help="Port Kafka clients are told to connect to (default: the bound one).",
)
@click.option(
    "--kafka-offsets-topic",
    default=DEFAULT_OFFSETS_TOPIC,
    show_default=True,
    help="Cluster mode: the topic Kafka groups' committed offsets are kept in; the leader"
    " of a group's partition of it coordinates the group.",
)
@click.option("--broker-id", type=int, default=0, show_default=True)
@click.option(
    "--fsync",
    type=click.Choice([p.value for p in FsyncPolicy]),
    default="interval",
    show_default=True,
)
@click.option("--flush-interval-ms", type=int, default=1000, show_default=True)
@click.option(
    "--checkpoint-interval-ms",
    type=click.IntRange(min=1),
    default=LogConfig().checkpoint_interval_ms,
    show_default=True,
    help="How often recovery points are written: bounds what a restart after a crash scans.",
)
@click.option("--segment-bytes", type=int, default=LogConfig().segment_bytes, show_default=True)
@click.option(
    "--cohort-grace-ms",
    type=int,
    default=10_000,
    show_default=True,
    help="How long a revoked partition's holder may finish in-flight records.",
)
@click.option(
    "--retention-check-interval-ms",
    type=int,
    default=30_000,
    show_default=True,
    help="How often retention deletes segments beyond the topic's time and size bounds.",
)
@click.option(
    "--tier-delete-grace-ms",
    type=int,
    default=30_000,
    show_default=True,
    help="How long objects that retention removed from a manifest stay for readers that"
    " hold the old manifest, before they are deleted.",
)
@click.option(
    "--cursor-flush-interval-ms",
    type=int,
    default=200,
    show_default=True,
    help="Cursor changes reach disk within this window: the redelivery bound after a crash.",
)
@click.option(
    "--auth-token", "auth_tokens", multiple=True, help="Accepted client token (repeatable)."
)
@click.option(
    "--auth-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Accepted client tokens, one per line, re-read on SIGHUP and on change (with or"
    " instead of --auth-token).",
)
@click.option("--tls-cert", type=click.Path(path_type=Path), default=None)
@click.option("--tls-key", type=click.Path(path_type=Path), default=None)
@click.option(
    "--tls-client-ca", type=click.Path(path_type=Path), default=None, help="Require client certs."
)
@click.option(
    "--tls-client-auth",
    type=click.Choice(["required", "optional"]),
    default="required",
    show_default=True,
    help="With --tls-client-ca: refuse clients without a certificate, or check one only when"
    " given (the others authenticate by token).",
)
@click.option(
    "--tls-ca",
    type=click.Path(path_type=Path),
    default=None,
    help="CA the other brokers' certificates are verified with when fetching from them"
    " (default: --tls-client-ca, else --tls-cert).",
)
@click.option(
    "--tls-server-name",
    default=None,
    help="Name the other brokers' certificates must carry (default: the host dialled); on"
    " Kubernetes the cluster's Service name, as brokers dial one another by pod IP.",
)
@click.option(
    "--acl-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Principals, their credentials and grants (YAML/JSON; docs/security.md)."
    " Turns on per-request ACL checks and signed member identities.",
)
@click.option(
    "--acl-reload-interval-ms",
    type=click.IntRange(min=0),
    default=2000,
    show_default=True,
    help="How often the credential files (ACL, token files, cluster key) are checked for"
    " changes and reloaded; 0: only on SIGHUP. A bad file keeps what is in force"
    ' (headrace_acl_reloads_total{source,result="error"}).',
)
@click.option(
    "--admin-read-access",
    type=click.Choice([a.value for a in AdminReadAccess]),
    default=AdminReadAccess.OPEN.value,
    show_default=True,
    help="Who may read admin HTTP (metrics, topics, status, heartbeat); /healthz and /readyz"
    " stay open. 'authenticated' takes a bearer token that authenticates on the data port."
    " Changes always take credentials when the data port does.",
)
@click.option("--admin-tls-cert", type=click.Path(path_type=Path), default=None)
@click.option("--admin-tls-key", type=click.Path(path_type=Path), default=None)
@click.option(
    "--admin-tls-client-ca",
    type=click.Path(path_type=Path),
    default=None,
    help="Require admin HTTP clients to present a certificate signed by this CA.",
)
@click.option(
    "--cluster-key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="HMAC keys (64 hex digits a line, mode 0600) signing member identities; shared by"
    " the cluster's brokers. The first signs, any verifies; re-read on change. Default with"
    " --acl-file: DATA_DIR/cluster.key, made if absent (standalone only).",
)
@click.option(
    "--object-store",
    "object_store_url",
    default=None,
    help="Where tiered topics upload segments: file:///DIR or s3://HOST:PORT/BUCKET"
    " (credentials from HEADRACE_OBJECT_STORE_ACCESS_KEY/_SECRET_KEY). Unset: no tiering.",
)
@click.option(
    "--cluster-id",
    default=None,
    help="Names this cluster in object-store keys (standalone; a controller sets it in a cluster).",
)
@click.option("--announce", is_flag=True, help="Print how to use the broker once it is ready.")
@one_line_errors
def broker(
    standalone: bool,
    cluster_mode: bool,
    replica_lag_max_ms: int,
    replica_fetch_wait_ms: int,
    replica_fetch_silence_max_ms: int,
    replication_token: str | None,
    replication_token_file: Path | None,
    data_dir: Path,
    host: str,
    port: int,
    admin_host: str,
    admin_port: int,
    advertised_host: str | None,
    rack: str | None,
    kafka_port: int,
    kafka_host: str | None,
    kafka_advertised_host: str | None,
    kafka_advertised_port: int | None,
    kafka_offsets_topic: str,
    broker_id: int,
    fsync: str,
    flush_interval_ms: int,
    checkpoint_interval_ms: int,
    segment_bytes: int,
    cohort_grace_ms: int,
    cursor_flush_interval_ms: int,
    retention_check_interval_ms: int,
    tier_delete_grace_ms: int,
    auth_tokens: tuple[str, ...],
    auth_token_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    tls_client_auth: str,
    tls_ca: Path | None,
    tls_server_name: str | None,
    acl_file: Path | None,
    acl_reload_interval_ms: int,
    admin_read_access: str,
    admin_tls_cert: Path | None,
    admin_tls_key: Path | None,
    admin_tls_client_ca: Path | None,
    cluster_key_file: Path | None,
    object_store_url: str | None,
    cluster_id: str | None,
    announce: bool,
) -> None:
    """Run a broker."""
    if standalone == cluster_mode:
        raise click.UsageError("choose one of --standalone or --cluster")
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    tls = (
        TlsSettings(
            tls_cert,
            tls_key,
            tls_client_ca,
            client_auth_required=tls_client_auth == "required",
            ca_file=tls_ca,
            server_name=tls_server_name,
        )
        if tls_cert and tls_key
        else None
    )
    if (admin_tls_cert is None) != (admin_tls_key is None):
        raise click.UsageError("--admin-tls-cert and --admin-tls-key go together")
    admin_tls = (
        TlsSettings(admin_tls_cert, admin_tls_key, admin_tls_client_ca)
        if admin_tls_cert and admin_tls_key
        else None
    )
    settings = BrokerSettings(
        data_dir=data_dir,
        host=host,
        port=port,
        admin_host=admin_host,
        admin_port=admin_port,
        advertised_host=advertised_host,
        rack=rack or None,
        kafka_port=kafka_port,
        kafka_host=kafka_host,
        kafka_advertised_host=kafka_advertised_host,
        kafka_advertised_port=kafka_advertised_port,
        kafka_offsets_topic=kafka_offsets_topic,
        broker_id=broker_id,
        log=LogConfig(
            fsync=FsyncPolicy(fsync),
            flush_interval_ms=flush_interval_ms,
            checkpoint_interval_ms=checkpoint_interval_ms,
            segment_bytes=segment_bytes,
        ),
        cluster_mode=cluster_mode,
        replica_lag_max_ms=replica_lag_max_ms,
        replica_fetch_wait_ms=replica_fetch_wait_ms,
        replica_fetch_silence_max_ms=replica_fetch_silence_max_ms,
        replication_token=None if replication_token_file else replication_token,
        replication_token_file=replication_token_file,
        cohort_grace_ms=cohort_grace_ms,
        cursor_flush_interval_ms=cursor_flush_interval_ms,
        retention_check_interval_ms=retention_check_interval_ms,
        tier_delete_grace_ms=tier_delete_grace_ms,
        auth_tokens=frozenset(auth_tokens),
        auth_token_file=auth_token_file,
        tls=tls,
        acl_file=acl_file,
        acl_reload_interval_ms=acl_reload_interval_ms,
        admin_read_access=AdminReadAccess(admin_read_access),
        admin_tls=admin_tls,
        cluster_key_file=cluster_key_file,
        object_store_url=object_store_url,
        cluster_id=cluster_id or "standalone",
    )
    if not logging.getLogger().isEnabledFor(logging.INFO):
        logging.getLogger("headrace").setLevel(logging.INFO)

    descriptors = raise_open_file_limit()

    async def serve() -> None:
        log.info("open file limit: %s descriptors", descriptors)
        b = Broker(settings)
        await b.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # SIGHUP re-reads the credential files (a no-op without any), as daemons reload
        # their config.
        loop.add_signal_handler(signal.SIGHUP, b.access.reload)
        if announce:
            scheme = "https" if admin_tls else "http"
            admin = f"{scheme}://{admin_host}:{b.admin.port}" if b.admin else "(disabled)"
            click.echo(
                f"\nheadrace standalone broker ready\n"
                f"  data port   {host}:{b.port}\n"
                + (
                    f"  Kafka port  {b.kafka_advertised()[0]}:{b.kafka_port}\n"
                    if kafka_port >= 0
                    else ""
                )
                + f"  admin HTTP  {admin}  (/healthz /readyz /metrics /v1/topics)\n"
                f"  data dir    {data_dir}\n\nTry, in another shell:\n"
                f"  .venv/bin/headrace topics create demo --partitions 4\n"
                f"  seq 1 10 | .venv/bin/headrace produce demo\n"
                f"  .venv/bin/headrace consume demo --cohort readers --from-beginning --count 10\n",
                err=True,
            )
        status = await serve_until_stopped(b, stop)
        if status:
            _halt(status)

    run(serve())
