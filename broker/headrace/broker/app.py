"""The broker process: composes storage, the listeners, replication, tiering, cohorts
and the admin HTTP server, and starts and stops them in order.

``Broker`` is the composition root, and only composes. Each concern is a part of its
own, wired here by constructor arguments: the sockets (``listeners``), client
routing (``routing``), the connections' topology pushes (``client_links``), the
cohorts (``cohort_runtimes``), topic changes (``topic_admin``), the controller's
pushes (``pushed_topology``, ``topology_apply``), the heartbeat (``heartbeats``),
health and halting (``health``), and the cursor flush and retention loops
(``cursor_flush``, ``retention``). The parts see the broker only through the
ports in ``ports`` (a connection as ``ConnectionHost``, replication as
``ReplicationHost``, ...), which it implements by handing each call to its part;
they report partition lifecycle events to ``_on_event``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from headrace import files
from headrace.aio import cancel_and_wait
from headrace.broker import data_dir
from headrace.broker.client_links import ClientLinks
from headrace.broker.cohort_runtimes import CohortRuntimes
from headrace.broker.cohorting import CohortRuntime
from headrace.broker.config import BrokerSettings
from headrace.broker.cursor_flush import CursorFlusher
from headrace.broker.health import Health
from headrace.broker.heartbeats import HeartbeatReporter, hosted_partition, partition_report
from headrace.broker.listeners import Listeners
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.placing import Placer
from headrace.broker.ports import (
    ClientLink,
    LiveReplicasChanged,
    LogSyncFailed,
    PartitionEvent,
    PartitionReopened,
)
from headrace.broker.pushed_topology import PushedTopology
from headrace.broker.repartition_holds import RepartitionHolds
from headrace.broker.replicating import Replication
from headrace.broker.reporting import PartitionReports
from headrace.broker.retention import RetentionSweeper
from headrace.broker.routing import Routing
from headrace.broker.serving_tls import ServingTls
from headrace.broker.syncing import GroupCommitter
from headrace.broker.tiering import Tiering
from headrace.broker.topic_admin import TopicAdmin
from headrace.broker.topics import Partition, Role, TopicRegistry
from headrace.broker.topology_apply import TopologyApplier
from headrace.objectstore.interface import ObjectStore
from headrace.protocol.coordination import ClusterTopology, PartitionReport
from headrace.security.access import Access

if TYPE_CHECKING:
    from headrace.broker.admin import AdminServer

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        store = _open_object_store(settings.object_store_url)
        self.registry = TopicRegistry(
            settings.data_dir, settings.log, object_store_configured=store is not None
        )
        hosted = self.registry.all_partitions
        self.metrics = BrokerMetrics(hosted)
        #: principals, grants and member identities (reads the credential files now)
        self.access = Access(
            settings.access_settings(), self.metrics.acl_denials, reloads=self.metrics.acl_reloads
        )
        self.tls = ServingTls(settings, self.access.files)
        self.admin_ssl = self.tls.admin
        self.client_issuers = self.tls.client_issuers
        self.committer = GroupCommitter(
            settings.log.fsync,
            settings.log.flush_interval_ms,
            settings.log.checkpoint_interval_ms,
            hosted,
            publish=self._on_event,
            on_round=self.metrics.fsync_seconds.observe,
        )
        #: the first gate epoch of this incarnation's cohorts (``data_dir.count_incarnation``)
        self.gate_epoch_floor = 0
        self.recovery_seconds = 0.0
        self.admin: AdminServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lock_fd: int | None = None
        self._compose(store)
        self._answer_ports()

    def _compose(self, store: ObjectStore | None) -> None:
        """Make the parts, each given what it works on and whom it tells."""
        settings = self.settings
        hosted = self.registry.all_partitions
        self.health = Health(self.metrics, settings.broker_id, hosted)
        self.pushed = PushedTopology(settings)
        self.listeners = Listeners(self, settings, self.tls)
        self.routing = Routing(self, self.pushed, self.listeners.own_endpoint)
        self.links = ClientLinks(self.metrics, self.routing.topology)
        self.replication = Replication(self, self._on_event)
        #: the journal heartbeats are answered from (deltas; see ``reporting``)
        self.reports = PartitionReports(
            self._report_of, hosted, functools.partial(hosted_partition, self.registry)
        )
        self.tiering = Tiering(self, store, self._on_event, report_changed=self.reports.mark)
        self.placer = Placer(settings, self.registry, self.tiering, self.metrics)
        holds = RepartitionHolds(self.registry, self.pushed)
        self.cohort_runtimes = CohortRuntimes(
            self, self.tiering, self.pushed, holds, lambda: self.gate_epoch_floor
        )
        self.topic_admin = TopicAdmin(
            self,
            self.tiering,
            self.cohort_runtimes,
            created=self._topic_created,
            deleted=self.links.push_topology,
        )
        self.cursors = CursorFlusher(hosted, settings.cursor_flush_interval_ms)
        self.retention = RetentionSweeper(
            hosted, self.tiering.uploader, self.reports.mark, settings.retention_check_interval_ms
        )
        self.applier = TopologyApplier(
            self,
            self.pushed,
            self.placer,
            placement_changed=self._placement_changed,
            serve_kafka_clients=self.listeners.serve_kafka_clients,
        )
        self.heartbeats = HeartbeatReporter(
            self,
            self.reports,
            self.tiering,
            self.listeners,
            self.links,
            self.cohort_runtimes,
            self.pushed,
            self.health,
            lambda: self.admin.port if self.admin is not None else -1,
        )

    def _answer_ports(self) -> None:
        """The ports (``ports``) the parts see this broker through, each answered by the
        part that owns it."""
        self.kafka_advertised = self.listeners.kafka_advertised
        self.endpoint = self.pushed.endpoint
        self.client_ssl_context = self.tls.client
        self.connection_opened = self.links.opened
        self.connection_closed = self.links.closed
        self.adoption_floor = self.links.adoption_floor
        self.topology = self.routing.topology
        self.partition_for_write = self.routing.partition_for_write
        self.partition_for_read = self.routing.partition_for_read
        self.cohort = self.cohort_runtimes.cohort
        self.maybe_drop_cohort = self.cohort_runtimes.maybe_drop
        self.cohorts_of = self.cohort_runtimes.of_topic
        self.describe_cohorts = self.cohort_runtimes.describe
        self.reset_cursors = self.cohort_runtimes.reset_cursors
        self.create_topic = self.topic_admin.create_topic
        self.add_partitions = self.topic_admin.add_partitions
        self.reconfigure_topic = self.topic_admin.reconfigure_topic
        self.delete_topic = self.topic_admin.delete_topic
        self.describe_topic = self.topic_admin.describe_topic
        self.heartbeat = self.heartbeats.heartbeat
        self.drain_report = self.health.drain_report
        self.receive_topology = self.applier.receive
        self.apply_topology = self.applier.apply

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        files.mkdir_durable(self.settings.data_dir)
        self._lock_fd = data_dir.lock(self.settings.data_dir)
        incarnation = data_dir.count_incarnation(self.settings.data_dir)
        self.gate_epoch_floor = data_dir.gate_epoch_floor(incarnation)
        self._recover()
        self.cursors.watch()
        self.committer.start()
        self.replication.start()
        if not self.settings.cluster_mode:
            for partition in self.registry.all_partitions():
                self.tiering.attach(partition)
        self.tiering.start()
        self.metrics.topology_generation.set(self.registry.generation)
        await self.listeners.start()
        self._run(self.cursors.run(), "cursor-flush")
        self._run(self.cohort_runtimes.tick_forever(), "cohort-tick")
        self._run(self.retention.run(), "retention")
        if self.access.files.files and self.settings.acl_reload_interval_ms > 0:
            self._run(self._watch_credential_files(), "credentials-watch")
        if self.settings.admin_port >= 0:
            from headrace.broker.admin import AdminServer

            self.admin = AdminServer(self)
            await self.admin.start()
        self.health.ready = True
        log.info(
            "broker %s ready on %s:%s (recovered %d partitions in %.3fs)",
            self.settings.broker_id,
            self.settings.host,
            self.port,
            len(self.registry.all_partitions()),
            self.recovery_seconds,
        )

    def _recover(self) -> None:
        """Read every partition on disk, and give each the role it may take until told."""
        started = time.monotonic()
        self.registry.load()
        self.recovery_seconds = time.monotonic() - started
        self.metrics.recovery_seconds.set(self.recovery_seconds)
        for partition in self.registry.all_partitions():
            if self.settings.cluster_mode:
                # A copy on disk says nothing about the role: the controller may have elected
                # another leader while we were down. Until its topology arrives, lead nothing
                # (a lone "leader" with no replica set would acknowledge acks=all by itself,
                # and the real leader's epochs would later truncate those records away).
                partition.role = Role.FOLLOWER
                partition.leader_id = -1
            else:
                partition.leader_id = self.settings.broker_id
                partition.replicas = [self.settings.broker_id]

    def _run(self, work: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(work, name=name))

    async def _watch_credential_files(self) -> None:
        """Reload the credential files when they change (SIGHUP reloads at once: ``main``)."""
        interval = self.settings.acl_reload_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.access.reload_if_changed()

    async def stop(self) -> None:
        self.health.ready = False
        self.listeners.close_servers()
        await self.listeners.close_kafka_groups()
        self.links.close_all()
        await cancel_and_wait(*self._tasks)
        await self.cohort_runtimes.close()
        await self.replication.close()
        await self.tiering.close()
        self.cursors.flush_now(sync=True)
        await self.committer.close()
        if self.admin is not None:
            await self.admin.stop()
        self.registry.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    # ------------------------------------------------------------------ what the parts report

    def _on_event(self, event: PartitionEvent) -> None:
        """Partition lifecycle events from replication, tiering and group commit."""
        match event:
            case LiveReplicasChanged(partition):
                self.metrics.lrs_changes.inc()
                self.reports.mark(partition)
            case PartitionReopened(partition):
                self.applier.reopened(partition)
            case LogSyncFailed():
                self.health.halt(event)

    def _placement_changed(self) -> None:
        self.reports.mark_all()
        self.tiering.mark_all()
        self.cursors.watch()
        self.replication.reconcile()
        self.cohort_runtimes.refresh()
        self.links.push_topology()
        if self.listeners.kafka_groups is not None:
            self.listeners.kafka_groups.placement_changed()

    def _report_of(self, p: Partition) -> PartitionReport:
        return partition_report(self.tiering, p)

    def _topic_created(self) -> None:
        self.cursors.watch()
        self.tiering.mark_all()
        self.reports.mark_all()
        self.links.push_topology()

    # ------------------------------------------------------------------ state, by its part

    @property
    def port(self) -> int:
        """The data port bound (the configured one until started)."""
        return self.listeners.port

    @property
    def kafka_port(self) -> int:
        return self.listeners.kafka_port

    @property
    def ready(self) -> bool:
        return self.health.ready

    @property
    def draining(self) -> bool:
        return self.health.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.health.draining = value

    @property
    def fatal(self) -> LogSyncFailed | None:
        return self.health.fatal

    @property
    def halting(self) -> asyncio.Event:
        return self.health.halting

    @property
    def connections(self) -> set[ClientLink]:
        return self.links.links

    @property
    def cohorts(self) -> dict[tuple[str, str], CohortRuntime]:
        return self.cohort_runtimes.runtimes

    @property
    def cluster(self) -> ClusterTopology | None:
        return self.pushed.current

    @property
    def cluster_id(self) -> str:
        return self.pushed.cluster_id

    @property
    def cluster_generation(self) -> int | None:
        return self.pushed.generation

    @property
    def awaiting_topology(self) -> bool:
        return self.pushed.awaiting

    @property
    def replication_token(self) -> str | None:
        return self.access.replication_token


def _open_object_store(url: str | None) -> ObjectStore | None:
    if url is None:
        return None
    from headrace.objectstore.urls import open_store

    return open_store(url)
