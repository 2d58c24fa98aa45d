"""``headrace``: broker, topic admin, produce, consume, bench.

Every command that talks to a broker takes ``--bootstrap HOST:PORT``
(default ``$HEADRACE_BOOTSTRAP`` or 127.0.0.1:9092). Errors print one line
on stderr and exit non-zero.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from headrace.cli.running import run
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig

F = TypeVar("F", bound=Callable[..., Any])

bootstrap_option = click.option(
    "--bootstrap",
    envvar="HEADRACE_BOOTSTRAP",
    default="127.0.0.1:9092",
    show_default=True,
    help="HOST:PORT of any broker (comma-separated list allowed).",
)
token_option = click.option(
    "--auth-token", envvar="HEADRACE_AUTH_TOKEN", default=None, help="Client auth token."
)


def one_line_errors(fn: F) -> F:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HeadraceError as exc:
            click.echo(f"error: {type(exc).__name__}: {exc.message}", err=True)
            sys.exit(1)
        except (OSError, ValueError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def _options(auth_token: str | None) -> Any:
    from headrace.client.connection import ConnectOptions

    return ConnectOptions(client_id="headrace-cli", auth_token=auth_token)


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def main(verbose: int) -> None:
    """headrace: a partitioned, replicated message broker."""
    from headrace.tuning import tune_allocator

    tune_allocator()
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


# ---------------------------------------------------------------------------- broker


@main.command()
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
    "--replication-token",
    envvar="HEADRACE_REPLICATION_TOKEN",
    default=None,
    help="Token this broker presents to other brokers (when they require auth).",
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
@click.option("--broker-id", type=int, default=0, show_default=True)
@click.option(
    "--fsync",
    type=click.Choice([p.value for p in FsyncPolicy]),
    default="interval",
    show_default=True,
)
@click.option("--flush-interval-ms", type=int, default=1000, show_default=True)
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
    "--cursor-flush-interval-ms",
    type=int,
    default=200,
    show_default=True,
    help="Cursor changes reach disk within this window: the redelivery bound after a crash.",
)
@click.option(
    "--auth-token", "auth_tokens", multiple=True, help="Accepted client token (repeatable)."
)
@click.option("--tls-cert", type=click.Path(path_type=Path), default=None)
@click.option("--tls-key", type=click.Path(path_type=Path), default=None)
@click.option(
    "--tls-client-ca", type=click.Path(path_type=Path), default=None, help="Require client certs."
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
    replication_token: str | None,
    data_dir: Path,
    host: str,
    port: int,
    admin_host: str,
    admin_port: int,
    advertised_host: str | None,
    broker_id: int,
    fsync: str,
    flush_interval_ms: int,
    segment_bytes: int,
    cohort_grace_ms: int,
    cursor_flush_interval_ms: int,
    retention_check_interval_ms: int,
    auth_tokens: tuple[str, ...],
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    object_store_url: str | None,
    cluster_id: str | None,
    announce: bool,
) -> None:
    """Run a broker."""
    from headrace.broker.app import Broker
    from headrace.broker.config import BrokerSettings, TlsSettings

    if standalone == cluster_mode:
        raise click.UsageError("choose one of --standalone or --cluster")
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    tls = TlsSettings(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
    settings = BrokerSettings(
        data_dir=data_dir,
        host=host,
        port=port,
        admin_host=admin_host,
        admin_port=admin_port,
        advertised_host=advertised_host,
        broker_id=broker_id,
        log=LogConfig(
            fsync=FsyncPolicy(fsync),
            flush_interval_ms=flush_interval_ms,
            segment_bytes=segment_bytes,
        ),
        cluster_mode=cluster_mode,
        replica_lag_max_ms=replica_lag_max_ms,
        replica_fetch_wait_ms=replica_fetch_wait_ms,
        replication_token=replication_token,
        cohort_grace_ms=cohort_grace_ms,
        cursor_flush_interval_ms=cursor_flush_interval_ms,
        retention_check_interval_ms=retention_check_interval_ms,
        auth_tokens=frozenset(auth_tokens),
        tls=tls,
        object_store_url=object_store_url,
        cluster_id=cluster_id or "standalone",
    )
    if not logging.getLogger().isEnabledFor(logging.INFO):
        logging.getLogger("headrace").setLevel(logging.INFO)

    async def serve() -> None:
        b = Broker(settings)
        await b.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if announce:
            admin = f"http://{admin_host}:{b.admin.port}" if b.admin else "(disabled)"
            click.echo(
                f"\nheadrace standalone broker ready\n"
                f"  data port   {host}:{b.port}\n  admin HTTP  {admin}  (/healthz /readyz /metrics /v1/topics)\n"
                f"  data dir    {data_dir}\n\nTry, in another shell:\n"
                f"  .venv/bin/headrace topics create demo --partitions 4\n"
                f"  seq 1 10 | .venv/bin/headrace produce demo\n"
                f"  .venv/bin/headrace consume demo --cohort readers --from-beginning --count 10\n",
                err=True,
            )
        await stop.wait()
        await b.stop()

    run(serve())


# ---------------------------------------------------------------------------- topics


async def _admin_call(bootstrap: str, token: str | None, op: int, body: bytes) -> Any:
    from headrace.client.cluster import ClusterClient
    from headrace.protocol.frames import Op

    cluster = ClusterClient(bootstrap, _options(token))
    try:
        conn = await cluster.bootstrap_connection()
        frame = await conn.request(Op(op), body)
        return msg.decode_json(frame.body)
    finally:
        await cluster.close()


@main.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


def _parse_config(items: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise click.BadParameter(f"{item!r}: expected KEY=INTEGER", param_hint="--config")
        out[key] = int(value)
    return out


@topics.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True)
@click.option(
    "--config", "-c", multiple=True, help="KEY=VALUE, e.g. retention_ms=3600000 (repeatable)."
)
@bootstrap_option
@token_option
@one_line_errors
def topics_create(
    name: str, partitions: int, config: tuple[str, ...], bootstrap: str, auth_token: str | None
) -> None:
    """Create topic NAME (or NAMESPACE/NAME)."""
    from headrace.protocol.frames import Op

    body = msg.CreateTopic(name, partitions, _parse_config(config)).encode()
    result = run(_admin_call(bootstrap, auth_token, Op.CREATE_TOPIC, body))
    click.echo(f"created {result['name']} with {result['partitions']} partitions")


@topics.command("list")
@bootstrap_option
@token_option
@one_line_errors
def topics_list(bootstrap: str, auth_token: str | None) -> None:
    """List topics."""
    from headrace.protocol.frames import Op

    result = run(_admin_call(bootstrap, auth_token, Op.DESCRIBE_TOPICS, b"{}"))
    click.echo(f"{'TOPIC':40} {'PARTITIONS':>10} {'VERSION':>8} {'RECORDS':>14}")
    for t in result["topics"]:
        records = sum(p["log_end_offset"] - p["log_start_offset"] for p in t["partition_details"])
        click.echo(
            f"{t['name']:40} {t['partitions']:>10} {t['partitioning_version']:>8} {records:>14}"
        )


@topics.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the raw description.")
@bootstrap_option
@token_option
@one_line_errors
def topics_describe(name: str, as_json: bool, bootstrap: str, auth_token: str | None) -> None:
    """Describe one topic: partitions, offsets, cursors."""
    from headrace.protocol.frames import Op

    result = run(
        _admin_call(bootstrap, auth_token, Op.DESCRIBE_TOPICS, msg.encode_json({"name": name}))
    )
    topic = result["topics"][0]
    if as_json:
        click.echo(json.dumps(topic, indent=2))
        return
    click.echo(
        f"topic {topic['name']}  partitions={topic['partitions']}  version={topic['partitioning_version']}"
    )
    click.echo(
        f"{'PART':>4} {'LEADER':>6} {'START':>12} {'END':>12} {'HW':>12} {'BYTES':>14}  CURSORS"
    )
    for p in topic["partition_details"]:
        cursors = ",".join(f"{c}={o}" for c, o in sorted(p["cursors"].items())) or "-"
        click.echo(
            f"{p['partition']:>4} {p['leader']:>6} {p['log_start_offset']:>12} {p['log_end_offset']:>12}"
            f" {p['high_watermark']:>12} {p['size_bytes']:>14}  {cursors}"
        )


@topics.command("delete")
@click.argument("name")
@bootstrap_option
@token_option
@one_line_errors
def topics_delete(name: str, bootstrap: str, auth_token: str | None) -> None:
    """Delete a topic and its data."""
    from headrace.protocol.frames import Op

    run(_admin_call(bootstrap, auth_token, Op.DELETE_TOPIC, msg.TopicName(name).encode()))
    click.echo(f"deleted {name}")


# ---------------------------------------------------------------------------- produce / consume


@main.command()
@click.argument("topic")
@click.option(
    "--key-sep", default=None, help="Split each line at the first SEP into key and value."
)
@click.option(
    "--acks", type=click.Choice(["none", "leader", "all"]), default="leader", show_default=True
)
@click.option("--partition", type=int, default=None, help="Send every record to this partition.")
@bootstrap_option
@token_option
@one_line_errors
def produce(
    topic: str,
    key_sep: str | None,
    acks: str,
    partition: int | None,
    bootstrap: str,
    auth_token: str | None,
) -> None:
    """Produce one record per line of stdin."""
    from headrace.client.producer import Producer

    async def go() -> int:
        producer = await Producer(bootstrap, acks=acks, options=_options(auth_token)).start()
        receipts = []
        try:
            loop = asyncio.get_running_loop()
            while True:
                line = await loop.run_in_executor(None, sys.stdin.buffer.readline)
                if not line:
                    break
                line = line.rstrip(b"\r\n")
                key = None
                if key_sep is not None:
                    k, sep, v = line.partition(key_sep.encode())
                    if sep:
                        key, line = k, v
                receipts.append(await producer.send(topic, line, key=key, partition=partition))
            await producer.flush()
            for r in receipts:
                await r
        finally:
            await producer.close()
        return len(receipts)

    count = run(go())
    click.echo(f"produced {count} records to {topic}", err=True)


@main.command()
@click.argument("topic")
@click.option("--cohort", required=True, help="Cohort (consumer group) to join.")
@click.option("--count", type=int, default=None, help="Exit after this many records.")
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the earliest offset when the cohort has no cursor.",
)
@click.option("--member-id", default=None)
@click.option("--print-offsets", is_flag=True, help="Prefix each line with partition:offset.")
@click.option(
    "--idle-timeout", type=float, default=None, help="Exit after this many seconds without records."
)
@bootstrap_option
@token_option
@one_line_errors
def consume(
    topic: str,
    cohort: str,
    count: int | None,
    from_beginning: bool,
    member_id: str | None,
    print_offsets: bool,
    idle_timeout: float | None,
    bootstrap: str,
    auth_token: str | None,
) -> None:
    """Consume records as a cohort member, one per line on stdout."""
    from headrace.client.consumer import Consumer

    async def go() -> int:
        consumer = Consumer(
            bootstrap,
            topic,
            cohort,
            member_id=member_id,
            start="earliest" if from_beginning else "latest",
            options=_options(auth_token),
        )
        await consumer.start()
        seen = 0
        out = sys.stdout.buffer
        try:
            while count is None or seen < count:
                batches = await consumer.getmany(timeout_s=idle_timeout or 3600.0)
                if not batches:
                    break
                for b in batches:
                    for record in b.records():
                        if count is not None and seen >= count:
                            break
                        prefix = (
                            f"{b.partition}:{record.offset} ".encode() if print_offsets else b""
                        )
                        key = (
                            record.key + b"\t" if record.key is not None and print_offsets else b""
                        )
                        out.write(prefix + key + record.value + b"\n")
                        seen += 1
                        consumer.ack(b.partition, record.offset)
                out.flush()
        finally:
            await consumer.close()
        return seen

    n = run(go())
    click.echo(f"consumed {n} records", err=True)


# ---------------------------------------------------------------------------- bench


@main.command()
@click.argument("topic")
@click.option("--records", type=int, default=1_000_000, show_default=True)
@click.option("--value-bytes", type=int, default=100, show_default=True)
@click.option(
    "--acks", type=click.Choice(["none", "leader", "all"]), default="leader", show_default=True
)
@bootstrap_option
@token_option
@one_line_errors
def bench(
    topic: str, records: int, value_bytes: int, acks: str, bootstrap: str, auth_token: str | None
) -> None:
    """Quick produce throughput check against a running broker (see bench/ for the full suite)."""
    from headrace.client.producer import Producer

    async def go() -> float:
        producer = await Producer(bootstrap, acks=acks, options=_options(auth_token)).start()
        value = b"x" * value_bytes
        chunk = [value] * 10_000
        started = time.perf_counter()
        futures = []
        sent = 0
        while sent < records:
            n = min(len(chunk), records - sent)
            futures += await producer.send_many(topic, chunk[:n])
            sent += n
        await producer.flush()
        for f in futures:
            await f
        elapsed = time.perf_counter() - started
        await producer.close()
        return elapsed

    elapsed = run(go())
    click.echo(
        f"{records} records of {value_bytes} B in {elapsed:.2f}s: {records / elapsed:,.0f} records/s,"
        f" {records * value_bytes / elapsed / 1e6:,.1f} MB/s"
    )


def _register_local_mode() -> None:
    from headrace.cli import local as local_mode

    main.add_command(local_mode.controller)
    main.add_command(local_mode.local)
    main.add_command(local_mode.apply)
    main.add_command(local_mode.delete)


_register_local_mode()


if __name__ == "__main__":
    main()
