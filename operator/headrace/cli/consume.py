"""``headrace consume``: read a topic as a cohort member, one record per line.

Two output formats:

- ``text`` (the default): the value, raw bytes, one per line; ``--print-keys`` puts the
  key and a tab first (an empty key when the record has none); ``--print-offsets`` puts
  ``partition:offset`` and a space first.
- ``json``: one JSON object per line (JSON Lines) with ``partition``, ``offset``,
  ``timestamp`` (ms since the epoch), ``key``, ``value`` and ``headers`` (a list of
  ``{"name", "value"}``). ``key`` is null when the record has none. A key, value or header
  value that is valid UTF-8 is a JSON string; one that is not is the object
  ``{"base64": "..."}``, so text stays readable and binary survives (``jq`` can tell them
  apart with ``type``).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import click

from headrace.aio import run
from headrace.cli.options import ClientTarget, client_options
from headrace.commands import one_line_errors
from headrace.records.batch import Record


def json_bytes(data: bytes) -> str | dict[str, str]:
    """``data`` as a JSON string when it is UTF-8, else ``{"base64": ...}``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def json_line(partition: int, record: Record) -> bytes:
    """One record of ``--format json``, newline included."""
    doc: dict[str, Any] = {
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
        "key": None if record.key is None else json_bytes(record.key),
        "value": json_bytes(record.value),
        "headers": [{"name": n, "value": json_bytes(v)} for n, v in record.headers],
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def text_line(partition: int, record: Record, print_keys: bool, print_offsets: bool) -> bytes:
    """One record of ``--format text``, newline included."""
    prefix = f"{partition}:{record.offset} ".encode() if print_offsets else b""
    if print_keys:
        prefix += (record.key or b"") + b"\t"
    elif print_offsets and record.key is not None:
        prefix += record.key + b"\t"
    return prefix + record.value + b"\n"


@click.command()
@click.argument("topic")
@click.option("--cohort", required=True, help="Cohort (consumer group) to join.")
@click.option("--count", type=int, default=None, help="Exit after this many records.")
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at the earliest offset when the cohort has no cursor.",
)
@click.option("--member-id", default=None)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line with partition, offset, timestamp, key, value, headers"
    ' (non-UTF-8 bytes as {"base64": ...}).',
)
@click.option("--print-keys", is_flag=True, help="text: put each record's key and a tab first.")
@click.option("--print-offsets", is_flag=True, help="text: prefix each line with partition:offset.")
@click.option(
    "--idle-timeout", type=float, default=None, help="Exit after this many seconds without records."
)
@client_options
@one_line_errors
def consume(
    topic: str,
    cohort: str,
    count: int | None,
    from_beginning: bool,
    member_id: str | None,
    output_format: str,
    print_keys: bool,
    print_offsets: bool,
    idle_timeout: float | None,
    client: ClientTarget,
) -> None:
    """Consume records as a cohort member, one per line on stdout."""
    from headrace.client.consumer import Consumer

    as_json = output_format == "json"

    async def go() -> int:
        consumer = Consumer(
            client.bootstrap,
            topic,
            cohort,
            member_id=member_id,
            start="earliest" if from_beginning else "latest",
            options=client.connect_options(),
        )
        await consumer.start()
        seen = 0
        out = sys.stdout.buffer
        try:
            while count is None or seen < count:
                # Never more than it will print: a record handed out and not acked would
                # hold up the close below for the grace period.
                batches = await consumer.getmany(
                    timeout_s=idle_timeout or 3600.0,
                    max_records=None if count is None else count - seen,
                )
                if not batches:
                    break
                for b in batches:
                    for record in b.records():
                        if as_json:
                            out.write(json_line(b.partition, record))
                        else:
                            out.write(text_line(b.partition, record, print_keys, print_offsets))
                        seen += 1
                        consumer.ack(b.partition, record.offset)
                out.flush()
        finally:
            await consumer.close()
        return seen

    n = run(go())
    click.echo(f"consumed {n} records", err=True)
