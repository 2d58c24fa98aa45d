"""``headrace``: broker, topic admin, produce, consume, bench.

Every command that talks to a broker takes ``--bootstrap HOST:PORT``
(default ``$HEADRACE_BOOTSTRAP`` or 127.0.0.1:9092). Errors print one line
on stderr and exit non-zero.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from headrace.aio import run
from headrace.broker import main as broker_main
from headrace.commands import one_line_errors
from headrace.protocol import messages as msg

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


def _options(auth_token: str | None) -> Any:
    from headrace.client.connection import ConnectOptions

    return ConnectOptions(client_id="headrace-cli", auth_token=auth_token)


@click.group()
@click.version_option(package_name="headrace", prog_name="headrace")
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

# The broker's own entry point (``python -m headrace.broker``) lives with the data plane.
main.add_command(broker_main.broker)


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
__import__("headrace.cli.jobs", fromlist=["register"]).register(main)  # verify, compact (Spark)


if __name__ == "__main__":
    main()
