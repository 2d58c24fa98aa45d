"""The broker process's entry point: ``python -m headrace.broker`` (also ``headrace broker``).

It reads its settings from the command line (and a few environment variables
for secrets) once, builds a :class:`~headrace.broker.config.BrokerSettings`
from the options :mod:`headrace.broker.options` declares,
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
from typing import Any

import click

from headrace.aio import run
from headrace.broker.app import Broker
from headrace.broker.options import broker_options, broker_settings
from headrace.commands import one_line_errors

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
@broker_options
@one_line_errors
def broker(**options: Any) -> None:
    """Run a broker."""
    settings = broker_settings(options)
    announce: bool = options["announce"]
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
            scheme = "https" if settings.admin_tls else "http"
            admin = f"{scheme}://{settings.admin_host}:{b.admin.port}" if b.admin else "(disabled)"
            click.echo(
                f"\nheadrace standalone broker ready\n"
                f"  data port   {settings.host}:{b.port}\n"
                + (
                    f"  Kafka port  {b.kafka_advertised()[0]}:{b.kafka_port}\n"
                    if settings.kafka_port >= 0
                    else ""
                )
                + f"  admin HTTP  {admin}  (/healthz /readyz /metrics /v1/topics)\n"
                f"  data dir    {settings.data_dir}\n\nTry, in another shell:\n"
                f"  .venv/bin/headrace topics create demo --partitions 4\n"
                f"  seq 1 10 | .venv/bin/headrace produce demo\n"
                f"  .venv/bin/headrace consume demo --cohort readers --from-beginning --count 10\n",
                err=True,
            )
        status = await serve_until_stopped(b, stop)
        if status:
            _halt(status)

    run(serve())
