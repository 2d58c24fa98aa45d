"""``headrace``: broker, topic admin, produce, consume, bench.

Every command that talks to a broker takes the options of ``cli.options``
(``--bootstrap``, default ``$HEADRACE_BOOTSTRAP``, else the local cluster in
``--dir``, else 127.0.0.1:9092; ``--auth-token``; ``--tls*``). Errors print one
line on stderr and exit non-zero. Commands live in ``topics``, ``cohorts``,
``cluster``, ``consume`` and ``local``; this module keeps the group, produce and bench.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from headrace.aio import run
from headrace.broker import main as broker_main
from headrace.cli.options import ENVIRONMENT_HELP, ClientTarget, client_options
from headrace.commands import one_line_errors
from headrace.records import codecs

F = TypeVar("F", bound=Callable[..., Any])

compression_option = click.option(
    "--compression",
    type=click.Choice(list(codecs.IDS)),
    default="none",
    show_default=True,
    help="Batch codec (lz4 and zstd need the compression extra).",
)


@click.group(epilog=ENVIRONMENT_HELP)
@click.version_option(package_name="headrace", prog_name="headrace")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
def main(verbose: int) -> None:
    """headrace: a partitioned, replicated message broker.

    Client commands (topics, cohorts, cluster, produce, consume, bench) share --bootstrap,
    --auth-token, --tls* and --dir; see `headrace produce --help`."""
    from headrace.tuning import tune_allocator

    tune_allocator()
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


# ---------------------------------------------------------------------------- broker

# The broker's own entry point (``python -m headrace.broker``) lives with the data plane.
main.add_command(broker_main.broker)


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
@compression_option
@client_options
@one_line_errors
def produce(
    topic: str,
    key_sep: str | None,
    acks: str,
    partition: int | None,
    compression: str,
    client: ClientTarget,
) -> None:
    """Produce one record per line of stdin (a progress bar on a terminal's stderr)."""
    from headrace.cli import producing
    from headrace.cli.progress import Progress
    from headrace.client.producer import Producer

    stdin = sys.stdin.buffer
    progress = Progress(
        f"produce {topic}",
        total=producing.remaining_bytes(stdin),
        unit="bytes",
        # lines typed at the terminal: a redrawn bar would erase what is being typed
        quiet=producing.is_terminal(stdin),
    )

    async def go() -> int:
        producer = await Producer(
            client.bootstrap, acks=acks, compression=compression, options=client.connect_options()
        ).start()
        try:
            with progress:
                return await producing.produce_lines(
                    producer,
                    topic,
                    stdin,
                    key_sep=None if key_sep is None else key_sep.encode(),
                    partition=partition,
                    progress=progress,
                )
        finally:
            await producer.close()

    count = run(go())
    click.echo(f"produced {count} records to {topic}", err=True)


# ---------------------------------------------------------------------------- bench


@main.command()
@click.argument("topic")
@click.option("--records", type=int, default=1_000_000, show_default=True)
@click.option("--value-bytes", type=int, default=100, show_default=True)
@click.option(
    "--acks", type=click.Choice(["none", "leader", "all"]), default="leader", show_default=True
)
@compression_option
@client_options
@one_line_errors
def bench(
    topic: str,
    records: int,
    value_bytes: int,
    acks: str,
    compression: str,
    client: ClientTarget,
) -> None:
    """Quick produce throughput check against a running broker (see bench/ for the full suite).

    Shows a progress bar when stderr is a terminal.
    """
    from headrace.cli.progress import Progress
    from headrace.client.producer import Producer

    async def go() -> float:
        producer = await Producer(
            client.bootstrap, acks=acks, compression=compression, options=client.connect_options()
        ).start()
        value = b"x" * value_bytes
        chunk = [value] * 10_000
        started = time.perf_counter()
        futures = []
        sent = 0
        with Progress(f"bench {topic}", total=records, unit="records") as progress:
            while sent < records:
                n = min(len(chunk), records - sent)
                futures += await producer.send_many(topic, chunk[:n])
                sent += n
                progress.advance(n)
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


def _register_commands() -> None:
    from headrace.cli import (
        acl,
        cluster,
        cohorts,
        consume,
        drain,
        local_get,
        roundtrip,
        scaling,
        topics,
    )
    from headrace.cli import local as local_mode

    main.add_command(acl.acl)
    main.add_command(topics.topics)
    main.add_command(cohorts.cohorts)
    main.add_command(cluster.cluster)
    main.add_command(consume.consume)
    main.add_command(roundtrip.roundtrip)
    main.add_command(local_mode.controller)
    main.add_command(local_mode.local)  # with scaling's add-broker and remove-broker
    assert scaling.add_broker.name in local_mode.local.commands
    main.add_command(local_mode.apply)
    main.add_command(local_mode.delete)
    main.add_command(local_get.get)
    main.add_command(drain.drain_command)


_register_commands()
__import__("headrace.cli.jobs", fromlist=["register"]).register(main)  # verify, compact (Spark)
# tier snapshot and restore, and the snapshot kinds of apply -f (they use the jobs' helpers)
__import__("headrace.cli.snapshots", fromlist=["register"]).register()


if __name__ == "__main__":
    main()
