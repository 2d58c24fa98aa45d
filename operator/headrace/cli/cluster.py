"""``headrace cluster health``: is the cluster serving every partition, fully replicated?

With a controller known (``--controller``, ``$HEADRACE_CONTROLLER`` or the local cluster
in ``--dir``) the answer comes from its ``/v1/state``: brokers it hears from, each
partition's leader and live replica set, and the problems it reports. Without one
(a standalone broker), from the brokers: the topology names the brokers and each
partition's leader, and each broker is pinged; replication is not known there.

``health_report`` is pure, so the rules are tested without a cluster.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import click

from headrace.aio import run
from headrace.cli import options
from headrace.cli.options import ClientTarget, client_options, controller_known, controller_option
from headrace.commands import one_line_errors
from headrace.errors import HeadraceError


@click.group()
def cluster() -> None:
    """Cluster-wide views: health."""


@dataclass(slots=True)
class HealthReport:
    """What ``cluster health`` prints; healthy when every list but ``brokers_up`` is empty."""

    source: str
    brokers_up: list[int] = field(default_factory=list)
    brokers_down: list[int] = field(default_factory=list)
    #: "topic/partition" with no leader, or a leader on a broker that is down
    offline: list[str] = field(default_factory=list)
    #: "topic/partition" with fewer live replicas on brokers that are up than replicas
    under_replicated: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: False when replication is unknown (no controller)
    replication_known: bool = True

    @property
    def healthy(self) -> bool:
        return not (self.brokers_down or self.offline or self.under_replicated or self.problems)

    def reasons(self) -> list[str]:
        named = [
            ("brokers_down", self.brokers_down),
            ("offline_partitions", self.offline),
            ("under_replicated_partitions", self.under_replicated),
            ("problems", self.problems),
        ]
        return [name for name, items in named if items]

    def to_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "reasons": self.reasons(),
            "source": self.source,
            "brokersUp": self.brokers_up,
            "brokersDown": self.brokers_down,
            "offlinePartitions": self.offline,
            "underReplicatedPartitions": self.under_replicated if self.replication_known else None,
            "problems": self.problems,
        }


def health_report(state: dict[str, Any], source: str) -> HealthReport:
    """A report from the controller's ``/v1/state`` document."""
    cluster_doc = state["cluster"]
    known = sorted(int(b["id"]) for b in cluster_doc.get("brokers", []))
    live = {int(b) for b in state.get("live", [])}
    report = HealthReport(source)
    report.brokers_up = sorted(live)
    report.brokers_down = [b for b in known if b not in live]
    down = set(report.brokers_down)
    for topic in cluster_doc.get("topics", []):
        for p in topic["partitions"]:
            name = f"{topic['name']}/{p['partition']}"
            # A broker that stopped answering still sits in the live replica sets (and may
            # still be named leader) until the leaders and the controller act on it, a few
            # seconds later: the report judges by the brokers it knows are down, at once.
            leader = p.get("leader")
            live_replicas = [r for r in p.get("liveReplicas", []) if int(r) not in down]
            if leader is None or int(leader) in down or p.get("state") == "Offline":
                report.offline.append(name)
            elif len(live_replicas) < len(p.get("replicas", [])):
                report.under_replicated.append(name)
    report.problems = [
        f"{p['topic']}: {p['reason']}: {p['message']}" for p in state.get("problems", [])
    ] + [
        f"broker {b['broker']}: refused topology format {b['refusedTopologyFormat']} (reads up"
        f" to {b['readsTopologyFormat']}): it runs an older release than the controller;"
        " upgrade it"
        for b in state.get("brokersBehind", [])
    ]
    return report


async def _broker_report(client: ClientTarget) -> HealthReport:
    from headrace.client.cluster import ClusterClient
    from headrace.protocol.frames import Op

    cluster_client = ClusterClient(client.bootstrap, client.connect_options())
    report = HealthReport(f"brokers ({client.bootstrap})", replication_known=False)
    try:
        await cluster_client.start()
        routing = cluster_client.routing
        brokers = dict(routing.brokers or {})

        async def ping(broker_id: int) -> bool:
            endpoint = brokers[broker_id]
            try:
                conn = await cluster_client.connect(endpoint.host, endpoint.port)
                await conn.request(Op.PING, b"health")
            except HeadraceError:
                return False
            return True

        answers = await asyncio.gather(*(ping(b) for b in sorted(brokers)))
        for broker_id, up in zip(sorted(brokers), answers, strict=True):
            (report.brokers_up if up else report.brokers_down).append(broker_id)
        for name, topic in sorted((routing.topics or {}).items()):
            for index in range(topic.partitions):
                owner = topic.owners[index] if index < len(topic.owners) else -1
                if owner not in brokers or owner in report.brokers_down:
                    report.offline.append(f"{name}/{index}")
    finally:
        await cluster_client.close()
    return report


@cluster.command("health")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@controller_option
@client_options
@one_line_errors
def cluster_health(as_json: bool, controller_url: str | None, client: ClientTarget) -> None:
    """Brokers up and down, offline and under-replicated partitions, problems.

    Exits 0 when healthy, 1 when not or when the cluster cannot be reached."""
    if controller_known(controller_url, client):
        url = options.controller_url(controller_url, client.directory)
        report = health_report(options.controller_http("GET", f"{url}/v1/state"), url)
    else:
        report = run(_broker_report(client))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for line in report_lines(report):
            click.echo(line)
    raise SystemExit(0 if report.healthy else 1)


def report_lines(report: HealthReport) -> list[str]:
    def listed(items: list[Any]) -> str:
        return ", ".join(map(str, items)) if items else "none"

    lines = [
        f"healthy:                     {'yes' if report.healthy else 'no'}",
        f"source:                      {report.source}",
        f"brokers up:                  {listed(report.brokers_up)}",
        f"brokers down:                {listed(report.brokers_down)}",
        f"offline partitions:          {listed(report.offline)}",
        "under-replicated partitions: "
        + (
            listed(report.under_replicated)
            if report.replication_known
            else "unknown (no controller)"
        ),
    ]
    lines += [f"problem: {p}" for p in report.problems]
    if not report.healthy:
        lines.append(f"unhealthy: {', '.join(report.reasons())}")
    return lines
