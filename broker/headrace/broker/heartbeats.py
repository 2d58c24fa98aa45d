"""What the controller polls (``GET /v1/heartbeat``): this broker's endpoint and state,
and its partitions' reports, whole or as a delta of the journal (``reporting``)."""

from __future__ import annotations

from collections.abc import Callable

from headrace.broker.client_links import ClientLinks
from headrace.broker.cohort_runtimes import CohortRuntimes
from headrace.broker.health import Health
from headrace.broker.listeners import Listeners
from headrace.broker.ports import BrokerCore
from headrace.broker.pushed_topology import PushedTopology
from headrace.broker.reporting import PartitionReports
from headrace.broker.tiering import Tiering
from headrace.broker.topics import Partition, Role, TopicRegistry
from headrace.protocol.coordination import (
    TOPOLOGY_FORMAT,
    CohortReport,
    Heartbeat,
    PartitionReport,
    parse_since,
)
from headrace.protocol.endpoints import KafkaAddress


def partition_report(tiering: Tiering, p: Partition) -> PartitionReport:
    """Partition ``p``'s report, as the journal keeps it."""
    return PartitionReport(
        p.topic.name,
        p.index,
        "leader" if p.role is Role.LEADER else "follower",
        p.leader_epoch,
        p.log.next_offset,
        p.high_watermark,
        tuple(p.lrs),
        p.moves,
        p.start_offset,
        tiering.seal_report(p),
        p.log.log_start_offset,
        tiering.stored_through(p),
        p.cursors.all(),
        p.cutover if p.role is Role.LEADER else None,
        upload_error=tiering.upload_error(p),
        stored_from=_stored_from(tiering, p),
    )


def _stored_from(tiering: Tiering, p: Partition) -> int | None:
    """The object store's first offset when it holds records the local log no longer
    does (the controller keeps a repartition's history while they are readable)."""
    stored = tiering.stored_start(p)
    return stored if stored is not None and stored < p.log.log_start_offset else None


def hosted_partition(registry: TopicRegistry, topic: str, index: int) -> Partition | None:
    """Partition ``index`` of ``topic`` if this broker hosts it."""
    t = registry.topics.get(topic)
    return None if t is None else t.partitions.get(index)


class HeartbeatReporter:
    def __init__(
        self,
        broker: BrokerCore,
        reports: PartitionReports,
        tiering: Tiering,
        listeners: Listeners,
        links: ClientLinks,
        cohorts: CohortRuntimes,
        pushed: PushedTopology,
        health: Health,
        admin_port: Callable[[], int],
    ) -> None:
        self._settings = broker.settings
        self._metrics = broker.metrics
        self._reports = reports
        self._tiering = tiering
        self._listeners = listeners
        self._links = links
        self._cohorts = cohorts
        self._pushed = pushed
        self._health = health
        #: the admin listener's bound port (-1: none)
        self._admin_port = admin_port

    def heartbeat(self, since: str | None = None) -> Heartbeat:
        """Every partition's report, or with ``since`` (``instance:seq`` of an earlier
        answer) only what changed since."""
        built = self._reports.rebuilt
        partitions, removed, journal = self._reports.answer(parse_since(since))
        self._metrics.heartbeat_reports.inc(self._reports.rebuilt - built)
        kafka = None
        if self._listeners.kafka_listening:
            kafka = KafkaAddress(*self._listeners.kafka_advertised())
        current = self._pushed.current
        return Heartbeat(
            self._listeners.own_endpoint(self._admin_port(), kafka),
            adoption=self._links.adoption_floor(),
            draining=self._health.draining or not self._health.ready,
            partitions=partitions,
            cohorts=tuple(
                CohortReport(t, c, tuple(sorted(r.gates.members)))
                for (t, c), r in sorted(self._cohorts.runtimes.items())
            ),
            # The cluster generation this broker has applied; 0 before the first push (the
            # standalone registry counter is a different counter and must not stand in for it).
            generation=current.generation if current else 0,
            connections=len(self._links.links),
            journal=journal,
            removed=removed,
            topology_format=TOPOLOGY_FORMAT,
            refused_topology_format=self._pushed.refused_format,
            rack=self._settings.rack,
            object_store=self._tiering.enabled,
            removed_incarnations=tuple(sorted(self._tiering.removed)),
        )
