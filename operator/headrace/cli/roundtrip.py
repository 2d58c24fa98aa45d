"""``headrace roundtrip``: produce marked records with acks=all and read exactly those back.

A check that a cluster takes writes and serves them (the chart's ``helm test`` pod runs
it). It must work on a topic that already holds data, and while other clients write to
it, and must not read the topic from its beginning (which can be large). So:

1. every record it produces carries a marker unique to this run (``MARKER-N``, with
   the marker as its key);
2. the producer's acknowledgements say where each batch landed: the lowest offset of
   this run in each partition;
3. a fresh cohort (named after the marker) joins, and each partition it holds is moved
   (``seek``) to this run's lowest offset there, so it reads from there on;
4. it reads until it has seen every marked record, ignoring everyone else's, and fails
   with a count of what is missing after ``--timeout``.

``--timeout`` bounds the whole check, and reaching the cluster is part of it: ``helm
test`` may run it right after an install, before the cluster's Service routes to a
broker (kube-proxy programs a pod's endpoint a moment after the pod is ready), so a
bootstrap that refuses connections is tried again until then.

``MarkedRecords`` is the bookkeeping (no I/O), unit tested on its own.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import click

from headrace.aio import run
from headrace.cli.options import ClientTarget, client_options
from headrace.commands import one_line_errors
from headrace.errors import HeadraceError


@dataclass
class MarkedRecords:
    """The records one run produces, and which of them have been read back."""

    marker: str
    count: int
    seen: set[int] = field(default_factory=set)
    #: records carrying our marker but no number of ours (should never happen)
    strangers: int = 0
    #: others' records read on the way (interleaved with ours, or before the seek)
    others: int = 0

    def values(self) -> list[bytes]:
        return [f"{self.marker}-{i}".encode() for i in range(self.count)]

    def observe(self, values: Iterable[bytes]) -> None:
        """Note the read ``values`` that are ours; others' records are skipped."""
        prefix = f"{self.marker}-".encode()
        for value in values:
            if not value.startswith(prefix):
                self.others += 1
                continue
            number = value[len(prefix) :]
            if number.isdigit() and int(number) < self.count:
                self.seen.add(int(number))
            else:
                self.strangers += 1

    @property
    def missing(self) -> int:
        return self.count - len(self.seen)

    @property
    def complete(self) -> bool:
        return self.missing == 0


def lowest_offsets(batches: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Partition -> the lowest offset among acknowledged ``(partition, base_offset)``."""
    lowest: dict[int, int] = {}
    for partition, base_offset in batches:
        lowest[partition] = min(base_offset, lowest.get(partition, base_offset))
    return lowest


class RoundTripFailed(click.ClickException):
    """Not every acknowledged record came back in time (exit status 1)."""


@click.command()
@click.argument("topic")
@click.option("--records", type=int, default=100, show_default=True, help="Records to send.")
@click.option("--acks", type=click.Choice(["leader", "all"]), default="all", show_default=True)
@click.option("--marker", default=None, help="Marker of this run's records (default: random).")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds the check may take: reaching the cluster, and every record back.",
)
@client_options
@one_line_errors
def roundtrip(
    topic: str,
    records: int,
    acks: str,
    marker: str | None,
    timeout_s: float,
    client: ClientTarget,
) -> None:
    """Produce RECORDS marked records, then read exactly those back as a fresh cohort."""
    from headrace.client.consumer import Consumer
    from headrace.client.producer import Producer

    if records < 1:
        raise click.BadParameter("must be at least 1", param_hint="--records")
    ours = MarkedRecords(marker or uuid.uuid4().hex[:12], records)

    deadline = time.monotonic() + timeout_s

    async def reached_producer() -> Producer:
        options = client.connect_options()
        backoff = 0.2
        while True:
            producer = Producer(client.bootstrap, acks=acks, options=options)
            try:
                return await producer.start()
            except HeadraceError as exc:
                await producer.close()
                if not exc.retriable or time.monotonic() + backoff > deadline:
                    raise
                click.echo(f"{client.bootstrap} not reachable yet ({exc}): trying again", err=True)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def go() -> None:
        options = client.connect_options()
        producer = await reached_producer()
        try:
            futures = await producer.send_many(topic, ours.values(), key=ours.marker.encode())
            await producer.flush()
            results = [await f for f in futures]
        finally:
            await producer.close()
        starts = lowest_offsets((r.partition, r.base_offset) for r in results)
        click.echo(f"produced {records} records marked {ours.marker} (acks={acks})", err=True)

        consumer = Consumer(
            client.bootstrap, topic, f"roundtrip-{ours.marker}", start="latest", options=options
        )
        await consumer.start()
        try:
            moved: set[int] = set()
            while not ours.complete:
                if time.monotonic() > deadline:
                    raise RoundTripFailed(
                        f"{ours.missing} of {records} acknowledged records marked"
                        f" {ours.marker} not read back within {timeout_s:g} s"
                    )
                # partitions come with the cohort's assignment: start each at our lowest
                # offset there as soon as it is held (what was read before is not ours)
                for partition in set(consumer.assignment) & set(starts) - moved:
                    await consumer.seek(partition, starts[partition])
                    moved.add(partition)
                for batch in await consumer.getmany(timeout_s=0.5):
                    ours.observe(r.value for r in batch.records())
                    consumer.ack_batch(batch)
        finally:
            await consumer.close()

    run(go())
    if ours.strangers:
        raise click.ClickException(f"{ours.strangers} records carried the marker but no number")
    click.echo(
        f"consumed all {records} records marked {ours.marker}"
        f" ({ours.others} records of others read on the way)",
        err=True,
    )
