"""``headrace cohorts list|describe|seek``: cohorts (consumer groups) and their cursors.

Each partition's leader holds the partition's cohort cursors and delivery gate, and
members join every leader they read from, so these commands ask every broker of the
topology (``DescribeCohorts``, op 56; ``ResetCursors``, op 58) and merge the answers,
taking each partition from the broker the topology names as its leader.

``seek`` refuses while the cohort has live members (as Kafka's offset reset refuses a
group that is not empty): stop the consumers, seek, start them again. It first asks
every broker with ``dry_run`` (which also checks for members), then moves the cursors;
a member that joins between the two can still see a partial reset, which the command
reports as an error.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from dataclasses import dataclass, field
from typing import Any

import click

from headrace.aio import run
from headrace.cli.options import ClientTarget, client_options
from headrace.client.routing import canonical
from headrace.commands import one_line_errors
from headrace.errors import HeadraceError
from headrace.protocol import messages as msg


@click.group()
def cohorts() -> None:
    """List and describe cohorts (consumer groups); move their cursors."""


# ---------------------------------------------------------------------------- asking every broker


@dataclass(slots=True)
class BrokerAnswers:
    """What every broker answered to one request, and the topology it was asked under."""

    answers: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: broker id -> why it did not answer
    failures: dict[int, str] = field(default_factory=dict)
    #: topic -> partition -> leader id, from the topology
    leaders: dict[str, list[int]] = field(default_factory=dict)


async def ask_every_broker(client: ClientTarget, op: int, body: bytes) -> BrokerAnswers:
    """Send one request to each broker in the topology (the bootstrap broker alone when the
    topology names none) and collect the JSON answers."""
    from headrace.client.cluster import ClusterClient
    from headrace.protocol.frames import Op

    cluster = ClusterClient(client.bootstrap, client.connect_options())
    result = BrokerAnswers()
    try:
        await cluster.start()
        routing = cluster.routing
        result.leaders = {name: list(t.owners) for name, t in (routing.topics or {}).items()}
        brokers = dict(routing.brokers or {})

        async def ask(broker_id: int) -> None:
            try:
                if broker_id in brokers:
                    endpoint = brokers[broker_id]
                    conn = await cluster.connect(endpoint.host, endpoint.port)
                else:
                    conn = await cluster.bootstrap_connection()
                frame = await conn.request(Op(op), body)
                result.answers[broker_id] = msg.decode_json(frame.body)
            except HeadraceError as exc:
                if not exc.retriable:
                    raise
                result.failures[broker_id] = exc.message

        await asyncio.gather(*(ask(b) for b in (sorted(brokers) or [-1])))
    finally:
        await cluster.close()
    return result


@dataclass(slots=True)
class CohortView:
    """One cohort on one topic, merged over the brokers."""

    topic: str
    cohort: str
    members: set[str] = field(default_factory=set)
    #: partition -> (leader id, the leader's description of it)
    partitions: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def lag(self, partition: dict[str, Any]) -> int | None:
        cursor = partition.get("cursor")
        return None if cursor is None else max(0, int(partition["high_watermark"]) - int(cursor))

    def total_lag(self) -> int:
        return sum(self.lag(p) or 0 for _, p in self.partitions.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "cohort": self.cohort,
            "members": sorted(self.members),
            "partitions": [
                {**p, "leader": leader, "lag": self.lag(p)}
                for _, (leader, p) in sorted(self.partitions.items())
            ],
        }


def merge_cohorts(found: BrokerAnswers) -> list[CohortView]:
    """Cohort views from every broker's ``DescribeCohorts`` answer. A partition reported by
    two brokers (leadership just moved) is taken from the topology's leader."""
    views: dict[tuple[str, str], CohortView] = {}
    for broker_id, answer in sorted(found.answers.items()):
        for entry in answer["cohorts"]:
            key = (entry["topic"], entry["cohort"])
            view = views.setdefault(key, CohortView(entry["topic"], entry["cohort"]))
            view.members.update(entry["members"])
            owners = found.leaders.get(entry["topic"], [])
            for p in entry["partitions"]:
                index = int(p["partition"])
                named = owners[index] if index < len(owners) else None
                if index not in view.partitions or named == broker_id:
                    view.partitions[index] = (answer.get("broker_id", broker_id), p)
    return [views[k] for k in sorted(views)]


def _warn_unreachable(found: BrokerAnswers) -> None:
    for broker_id, reason in sorted(found.failures.items()):
        click.echo(f"warning: broker {broker_id} did not answer: {reason}", err=True)


def _describe(client: ClientTarget, cohort: str | None) -> tuple[list[CohortView], BrokerAnswers]:
    from headrace.protocol.frames import Op

    found = run(ask_every_broker(client, Op.DESCRIBE_COHORTS, msg.DescribeCohorts(cohort).encode()))
    return merge_cohorts(found), found


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------------------- list / describe


@cohorts.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON: one object per cohort and topic.")
@client_options
@one_line_errors
def cohorts_list(as_json: bool, client: ClientTarget) -> None:
    """Cohorts with cursors or members, per topic: members, partitions, total lag."""
    views, found = _describe(client, None)
    _warn_unreachable(found)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "cohort": v.cohort,
                        "topic": v.topic,
                        "members": len(v.members),
                        "partitions": len(v.partitions),
                        "lag": v.total_lag(),
                    }
                    for v in views
                ],
                indent=2,
            )
        )
        return
    click.echo(f"{'COHORT':30} {'TOPIC':30} {'MEMBERS':>7} {'PARTITIONS':>10} {'LAG':>12}")
    for v in views:
        click.echo(
            f"{v.cohort:30} {v.topic:30} {len(v.members):>7} {len(v.partitions):>10}"
            f" {v.total_lag():>12}"
        )


@cohorts.command("describe")
@click.argument("cohort")
@click.option("--json", "as_json", is_flag=True, help="The merged description as JSON.")
@client_options
@one_line_errors
def cohorts_describe(cohort: str, as_json: bool, client: ClientTarget) -> None:
    """Members and, per partition, leader, holder, cursor, high watermark and lag.

    CURSOR is the next offset the cohort will be delivered (acknowledged records are
    below it); LAG is HW - CURSOR, the committed records it has not acknowledged."""
    views, found = _describe(client, cohort)
    _warn_unreachable(found)
    if not views:
        raise click.ClickException(f"cohort {cohort} has no cursors and no members")
    if as_json:
        click.echo(json.dumps([v.to_json() for v in views], indent=2))
        return
    for v in views:
        click.echo(
            f"cohort {v.cohort}  topic {v.topic}  members {len(v.members)}  lag {v.total_lag()}"
        )
        for member in sorted(v.members):
            click.echo(f"  member {member}")
        click.echo(
            f"{'PART':>4} {'LEADER':>6} {'HOLDER':24} {'CURSOR':>12} {'HW':>12}"
            f" {'END':>12} {'LAG':>10}"
        )
        for index, (leader, p) in sorted(v.partitions.items()):
            click.echo(
                f"{index:>4} {leader:>6} {_dash(p.get('holder')):24} {_dash(p.get('cursor')):>12}"
                f" {p['high_watermark']:>12} {p['log_end_offset']:>12} {_dash(v.lag(p)):>10}"
            )


# ---------------------------------------------------------------------------- seek


def parse_seek_target(text: str) -> tuple[str, int | None]:
    """``earliest``, ``latest``, an OFFSET (an integer), or a TIMESTAMP: ISO 8601
    (``2026-11-24T05:00:00Z``; no zone means UTC) or ``@MS`` (milliseconds since the epoch).
    Returns (``to``, value) as ``ResetCursors`` takes them."""
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest"):
        return lowered, None
    if lowered.isdigit():
        return "offset", int(lowered)
    if lowered.startswith("@") and lowered[1:].isdigit():
        return "timestamp", int(lowered[1:])
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected earliest, latest, an offset, an ISO 8601 time or @MS",
            param_hint="--to",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return "timestamp", int(when.timestamp() * 1000)


def _reset(
    client: ClientTarget,
    topic: str,
    cohort: str,
    to: str,
    value: int | None,
    partitions: list[int] | None,
    dry_run: bool,
) -> dict[int, dict[str, Any]]:
    """ResetCursors on every broker; partition -> its leader's answer. Every partition asked
    for must be answered by some broker (its leader), or nothing is claimed."""
    from headrace.protocol.frames import Op

    topic = canonical(topic)
    request = msg.ResetCursors(topic, cohort, to, value, partitions, dry_run)
    found = run(ask_every_broker(client, Op.RESET_CURSORS, request.encode()))
    _warn_unreachable(found)
    owners = found.leaders.get(topic)
    if owners is None:
        raise click.ClickException(f"unknown topic {topic}")
    moved: dict[int, dict[str, Any]] = {}
    for broker_id, answer in sorted(found.answers.items()):
        for p in answer["partitions"]:
            index = int(p["partition"])
            if index not in moved or owners[index] == broker_id:
                moved[index] = p
    wanted = partitions if partitions is not None else list(range(len(owners)))
    missing = sorted(set(wanted) - set(moved))
    if missing:
        raise click.ClickException(
            f"no broker leads partition(s) {', '.join(map(str, missing))} of {topic} now"
            + (" (cursors of the others were moved)" if not dry_run and moved else "")
            + "; try again when `headrace cluster health` is healthy"
        )
    return moved


@cohorts.command("seek")
@click.argument("cohort")
@click.option(
    "--to",
    "target",
    required=True,
    help="earliest | latest | OFFSET | TIMESTAMP (ISO 8601, UTC unless a zone is given, or @MS).",
)
@click.option(
    "--topic",
    "topics",
    multiple=True,
    help="Only this topic (repeatable) [default: every topic the cohort has cursors on].",
)
@click.option("--partition", "partitions", type=int, multiple=True, help="Only this partition.")
@click.option("--dry-run", is_flag=True, help="Show the new cursors without moving them.")
@client_options
@one_line_errors
def cohorts_seek(
    cohort: str,
    target: str,
    topics: tuple[str, ...],
    partitions: tuple[int, ...],
    dry_run: bool,
    client: ClientTarget,
) -> None:
    """Move COHORT's cursors: the next delivery of each partition starts there.

    Refused while the cohort has live members (stop its consumers first), as Kafka
    refuses to reset a group that is not empty. A TIMESTAMP resolves, per partition, to
    the first batch holding a record at or after it (or the log end)."""
    to, value = parse_seek_target(target)
    chosen = list(topics)
    if not chosen:
        views, _ = _describe(client, cohort)
        chosen = sorted({v.topic for v in views})
        if not chosen:
            raise click.ClickException(
                f"cohort {cohort} has no cursors; name the topic with --topic"
            )
    wanted = sorted(set(partitions)) or None
    chosen = [canonical(t) for t in chosen]
    plans = {t: _reset(client, t, cohort, to, value, wanted, True) for t in chosen}
    if not dry_run:
        plans = {t: _reset(client, t, cohort, to, value, wanted, False) for t in chosen}
    click.echo(f"{'TOPIC':30} {'PART':>4} {'FROM':>12} {'TO':>12}")
    for topic, moved in plans.items():
        for index, p in sorted(moved.items()):
            click.echo(f"{topic:30} {index:>4} {_dash(p['previous']):>12} {p['offset']:>12}")
    if dry_run:
        click.echo("dry run: no cursor moved", err=True)
