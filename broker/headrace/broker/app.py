"""The broker process: wires storage, the data port, cohorts and admin HTTP.

``Broker`` is the composition root. Its parts see it only through the ports in
``ports`` (a connection as ``ConnectionHost``, replication as ``ReplicationHost``,
...), report partition lifecycle events to ``_on_event``, and a pushed topology
is applied by planning (``replication.assigning``) and executing (``placing``).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import json
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from headrace import files, tlsnames
from headrace.aio import cancel_and_wait
from headrace.broker import certificates, cohort_admin
from headrace.broker.cohorting import CohortRuntime
from headrace.broker.config import BrokerSettings
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.placing import Placer, hosted
from headrace.broker.ports import (
    ClientLink,
    Cohort,
    LiveReplicasChanged,
    LogSyncFailed,
    PartitionEvent,
    PartitionReopened,
    RedirectRequired,
)
from headrace.broker.replicating import Replication
from headrace.broker.reporting import PartitionReports
from headrace.broker.server import Connection
from headrace.broker.syncing import GroupCommitter
from headrace.broker.tiering import Tiering
from headrace.broker.topics import Partition, Role, Topic, TopicRegistry
from headrace.cohorts.gates import validate_cohort_name
from headrace.errors import (
    HeadraceError,
    InvalidRequest,
    PartitionMoving,
    PolicyViolation,
    StorageError,
    UnknownPartition,
    UnsupportedDocument,
)
from headrace.objectstore.interface import ObjectStore
from headrace.protocol import messages as msg
from headrace.protocol.coordination import (
    TOPOLOGY_FORMAT,
    ClusterTopology,
    CohortReport,
    Heartbeat,
    PartitionReport,
    TopicPlacement,
    parse_since,
)
from headrace.protocol.endpoints import (
    DEFAULT_LISTENER,
    BrokerEndpoint,
    KafkaAddress,
    ListenerAddress,
)
from headrace.replication import assigning
from headrace.security.access import Access
from headrace.security.settings import TlsSettings
from headrace.storage.log import PartitionLog

if TYPE_CHECKING:
    from headrace.broker.admin import AdminServer
    from headrace.broker.kafka_groups import KafkaGroups
    from headrace.broker.kafka_listener import KafkaConnection

log = logging.getLogger(__name__)

#: the data directory's start count (Broker._count_incarnation)
INCARNATION_FILE = "incarnation.json"
#: gate admissions an incarnation may make per partition before its epochs reach the next
#: incarnation's floor (65536), and how many incarnations fit in a u32 epoch with that room
_EPOCHS_PER_INCARNATION_BITS = 16
_INCARNATIONS = 1 << 15


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        store = _open_object_store(settings.object_store_url)
        self.registry = TopicRegistry(
            settings.data_dir, settings.log, object_store_configured=store is not None
        )
        self.metrics = BrokerMetrics(self.registry.all_partitions)
        #: principals, grants and member identities (reads the credential files now)
        self.access = Access(
            settings.access_settings(), self.metrics.acl_denials, reloads=self.metrics.acl_reloads
        )
        #: the listeners' TLS contexts, kept so that renewed certificates reload into them
        self.server_ssl = self._serving(settings.tls, "tls")
        self.admin_ssl = self._serving(settings.admin_tls, "admin_tls")
        #: the named listeners that serve a certificate of their own, by name
        self.listener_ssl = {
            listener.name: ctx
            for listener in settings.listeners
            if (ctx := self._serving(listener.tls, f"listener_{listener.name}_tls")) is not None
        }
        #: the issuers whose client certificates name a principal on the data listener
        self.client_issuers = (
            certificates.client_issuers(settings.tls) if settings.tls else frozenset()
        )
        self.committer = GroupCommitter(
            settings.log.fsync,
            settings.log.flush_interval_ms,
            settings.log.checkpoint_interval_ms,
            self.registry.all_partitions,
            publish=self._on_event,
        )
        self.connections: set[ClientLink] = set()
        #: partitions whose cursors moved since the last flush, and those listened to
        self._cursors_moved: set[Partition] = set()
        self._cursor_watched: set[Partition] = set()
        self._cursor_sweep = False
        self.cohorts: dict[tuple[str, str], CohortRuntime] = {}
        self._server: asyncio.Server | None = None
        #: the servers of ``settings.listeners``, by name, and the ports they bound
        self._listener_servers: dict[str, asyncio.Server] = {}
        self.listener_ports: dict[str, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._lock_fd: int | None = None
        self.ready = False
        #: asked to drain (``POST /v1/drain``, a pod's preStop): the heartbeat says so, and
        #: the controller moves every leadership it can to another in-sync replica
        self.draining = False
        #: the format of the last topology push refused as too new (heartbeat); None: none
        self.refused_topology_format: int | None = None
        #: the first log whose data fdatasync failed: the broker must halt (see ``halting``)
        self.fatal: LogSyncFailed | None = None
        #: set once ``fatal`` is: the entry point stops the process and exits non-zero
        self.halting = asyncio.Event()
        #: cluster mode: the last topology the controller pushed (None until the first)
        self.cluster: ClusterTopology | None = None
        #: held while a pushed topology is applied (``receive_topology``)
        self._topology_lock = asyncio.Lock()
        self.replication = Replication(self, self._on_event)
        #: the journal heartbeats are answered from (deltas; see ``reporting``)
        self.reports = PartitionReports(self._report_of, self.registry.all_partitions, self._hosted)
        self.tiering = Tiering(self, store, self._on_event, report_changed=self.reports.mark)
        self.placer = Placer(settings, self.registry, self.tiering, self.metrics)
        self.started_at = time.monotonic()
        #: the first gate epoch of this incarnation's cohorts (see ``_count_incarnation``)
        self.gate_epoch_floor = 0
        self.recovery_seconds = 0.0
        self.port = settings.port
        self.admin: AdminServer | None = None
        self._kafka_server: asyncio.Server | None = None
        self.kafka_port = settings.kafka_port
        self.kafka_connections: set[KafkaConnection] = set()
        self.kafka_groups: KafkaGroups | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        files.mkdir_durable(self.settings.data_dir)
        self._lock_data_dir()
        self.gate_epoch_floor = self._count_incarnation() << _EPOCHS_PER_INCARNATION_BITS
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
        self._watch_cursors()
        self.committer.on_round = self.metrics.fsync_seconds.observe
        self.committer.start()
        self.replication.start()
        if not self.settings.cluster_mode:
            for partition in self.registry.all_partitions():
                self.tiering.attach(partition)
        self.tiering.start()
        self.metrics.topology_generation.set(self.registry.generation)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self),
            self.settings.host,
            self.settings.port,
            ssl=self.server_ssl,
            reuse_address=True,
            backlog=1024,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        for listener in self.settings.listeners:
            server = await loop.create_server(
                functools.partial(Connection, self, listener.name),
                listener.host,
                listener.port,
                ssl=self.listener_ssl.get(listener.name, self.server_ssl),
                reuse_address=True,
                backlog=1024,
            )
            self._listener_servers[listener.name] = server
            self.listener_ports[listener.name] = server.sockets[0].getsockname()[1]
        if self.settings.kafka_port >= 0:
            await self._start_kafka_listener()
        self._tasks.append(loop.create_task(self._flush_cursors_forever(), name="cursor-flush"))
        self._tasks.append(loop.create_task(self._tick_cohorts_forever(), name="cohort-tick"))
        self._tasks.append(loop.create_task(self._retention_forever(), name="retention"))
        if self.access.files.files and self.settings.acl_reload_interval_ms > 0:
            self._tasks.append(
                loop.create_task(self._watch_credential_files(), name="credentials-watch")
            )
        if self.settings.admin_port >= 0:
            from headrace.broker.admin import AdminServer

            self.admin = AdminServer(self)
            await self.admin.start()
        self.ready = True
        log.info(
            "broker %s ready on %s:%s (recovered %d partitions in %.3fs)",
            self.settings.broker_id,
            self.settings.host,
            self.port,
            len(self.registry.all_partitions()),
            self.recovery_seconds,
        )

    async def _start_kafka_listener(self) -> None:
        from headrace.broker.kafka_groups import KafkaGroups
        from headrace.broker.kafka_listener import KafkaConnection

        # In a cluster, group offsets live in the offsets topic and the heartbeat carries
        # this listener's address (Metadata names every broker's): docs/kafka.md.
        self.kafka_groups = KafkaGroups(
            self.settings.data_dir / "kafka-groups", self if self.settings.cluster_mode else None
        )
        groups = self.kafka_groups
        # A cluster broker binds its port now (the heartbeat names it) but accepts Kafka
        # clients only once it holds the controller's topology (``receive_topology``), as a
        # Kafka broker serves none before it has caught up with the cluster's metadata:
        # before that its Metadata would name itself alone, and a client that believed it
        # would forget every other broker.
        self._kafka_server = await asyncio.get_running_loop().create_server(
            lambda: KafkaConnection(self, self.kafka_advertised, self.kafka_connections, groups),
            self.settings.kafka_host or self.settings.host,
            self.settings.kafka_port,
            ssl=self.server_ssl,
            reuse_address=True,
            backlog=1024,
            start_serving=not self.settings.cluster_mode,
        )
        self.kafka_port = self._kafka_server.sockets[0].getsockname()[1]
        groups.start()
        log.info("broker %s: Kafka listener on port %d", self.settings.broker_id, self.kafka_port)

    def kafka_advertised(self) -> tuple[str, int]:
        """Where Kafka clients should connect (Metadata's broker list)."""
        s = self.settings
        host = s.kafka_advertised_host or s.advertised_host or s.kafka_host or s.host
        return (host, s.kafka_advertised_port or self.kafka_port)

    async def _watch_credential_files(self) -> None:
        """Reload the credential files when they change (SIGHUP reloads at once: ``main``)."""
        interval = self.settings.acl_reload_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.access.reload_if_changed()

    async def stop(self) -> None:
        self.ready = False
        if self._server is not None:
            self._server.close()
        for server in self._listener_servers.values():
            server.close()
        if self._kafka_server is not None:
            self._kafka_server.close()
        for kafka_conn in list(self.kafka_connections):
            kafka_conn.close()
        if self.kafka_groups is not None:
            await self.kafka_groups.close()
        for conn in list(self.connections):
            conn.close()
        await cancel_and_wait(*self._tasks)
        for cohort in list(self.cohorts.values()):
            await cohort.close()
        await self.replication.close()
        await self.tiering.close()
        self._flush_cursors_now(sync=True)
        await self.committer.close()
        if self.admin is not None:
            await self.admin.stop()
        self.registry.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    def _count_incarnation(self) -> int:
        """Bump and return this data directory's start count (``incarnation``, fsynced).

        Gate epochs are in memory; without a floor that grows per start they would
        begin at 0 again after a restart, and a delivery or ack of the previous
        incarnation could carry the same epoch as one of this. The count wraps so
        that the floor plus an incarnation's admissions stays within the wire's u32.
        """
        path = self.settings.data_dir / INCARNATION_FILE
        try:
            previous = int(json.loads(path.read_text())["incarnation"])
        except FileNotFoundError:
            previous = 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        current = (previous + 1) % _INCARNATIONS
        try:
            files.write_json_atomic(path, {"incarnation": current})
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        return current

    def _lock_data_dir(self) -> None:
        path = self.settings.data_dir / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise StorageError(
                f"data directory {self.settings.data_dir} is in use by another broker"
            ) from exc
        self._lock_fd = fd

    def _serving(self, tls: TlsSettings | None, source: str) -> ssl.SSLContext | None:
        if tls is None:
            return None
        ctx = certificates.serving_context(tls)
        certificates.watch(self.access.files, source, tls, ctx)
        return ctx

    # ------------------------------------------------------------------ connections and topology

    def connection_opened(self, conn: ClientLink) -> None:
        self.connections.add(conn)
        self.metrics.connections.set(len(self.connections))

    def connection_closed(self, conn: ClientLink) -> None:
        self.connections.discard(conn)
        self.metrics.connections.set(len(self.connections))

    def topology(self, listener: str = DEFAULT_LISTENER) -> tuple[msg.TopologySnapshot, object]:
        """The snapshot a client of ``listener`` is given (every broker's address on that
        listener), and its routing content (what decides whether to push)."""
        if self.cluster is not None:
            snapshot = self.cluster.client_snapshot(listener)
        elif self.settings.cluster_mode:
            # Awaiting the controller's first push: own nothing, at generation 0, so a client
            # prefers any other broker's view and never routes writes here on our word.
            snapshot = msg.TopologySnapshot(
                0,
                self.settings.cluster_id,
                self._own_on(listener),
                [
                    msg.TopicRouting(
                        t.name,
                        t.partition_count,
                        t.partitioning_version,
                        [-1] * t.partition_count,
                        [0] * t.partition_count,
                        creation_id=t.creation_id,
                    )
                    for t in sorted(self.registry.topics.values(), key=lambda t: t.name)
                ],
            )
        else:
            me = self.settings.broker_id
            routing = []
            for topic in sorted(self.registry.topics.values(), key=lambda t: t.name):
                epochs = [
                    topic.partitions[i].leader_epoch if i in topic.partitions else 0
                    for i in range(topic.partition_count)
                ]
                routing.append(
                    msg.TopicRouting(
                        topic.name,
                        topic.partition_count,
                        topic.partitioning_version,
                        [me] * topic.partition_count,
                        epochs,
                        creation_id=topic.creation_id,
                    )
                )
            snapshot = msg.TopologySnapshot(
                self.registry.generation,
                self.settings.cluster_id,
                self._own_on(listener),
                routing,
                self.registry.generation_epoch,
            )
        content = (
            tuple(snapshot.brokers),
            tuple(
                (
                    r.name,
                    r.partitions,
                    r.partitioning_version,
                    r.routing_partitions,
                    tuple(r.owners),
                    tuple(r.epochs),
                )
                for r in snapshot.topics
            ),
        )
        return snapshot, content

    def _own_on(self, listener: str) -> list[BrokerEndpoint]:
        """This broker as clients of ``listener`` dial it (none while that is pending)."""
        own = self.own_endpoint().on(listener)
        return [] if own is None else [own]

    @property
    def advertised(self) -> tuple[str, int]:
        """Where clients should connect: the bound port, even when asked for port 0."""
        return (self.settings.advertised_host or self.settings.host, self.port)

    def advertised_listeners(self) -> tuple[ListenerAddress, ...]:
        """Where clients of each named listener should connect (the bound port unless
        told another: a NodePort or a load balancer forwards to it)."""
        return tuple(
            ListenerAddress(
                listener.name,
                listener.advertised_host or listener.host,
                listener.advertised_port or self.listener_ports.get(listener.name, listener.port),
            )
            for listener in self.settings.listeners
        )

    def own_endpoint(
        self, admin_port: int = -1, kafka: KafkaAddress | None = None
    ) -> BrokerEndpoint:
        """This broker's endpoint: the default listener's address and the named ones'."""
        host, port = self.advertised
        return BrokerEndpoint(
            self.settings.broker_id, host, port, admin_port, kafka, self.advertised_listeners()
        )

    def push_topology(self) -> None:
        snapshots: dict[str, tuple[msg.TopologySnapshot, object]] = {}
        snapshots[DEFAULT_LISTENER] = self.topology()
        self.metrics.topology_generation.set(snapshots[DEFAULT_LISTENER][0].generation)
        for conn in list(self.connections):
            if conn.listener not in snapshots:
                snapshots[conn.listener] = self.topology(conn.listener)
            conn.push_topology(*snapshots[conn.listener])

    def adoption_floor(self) -> int | None:
        """Lowest topology generation acked by connections that ever acked (the adoption label)."""
        acked = [c.acked_generation for c in self.connections if c.acked_generation is not None]
        return min(acked) if acked else None

    def _redirect(self, topic: Topic, partition: int, reason: str) -> RedirectRequired:
        # the whole endpoint: the connection answers with its own listener's address of it
        owner: BrokerEndpoint | None = None
        if self.cluster is None and not self.settings.cluster_mode:
            owner = self.own_endpoint()
        elif self.cluster is not None:
            placement = next((t for t in self.cluster.topics if t.name == topic.name), None)
            leader = None
            if placement is not None:
                leader = next(
                    (a.leader for a in placement.assignments if a.partition == partition), None
                )
            owner = self.cluster.broker(leader) if leader is not None else None
        snapshot, _ = self.topology()
        redirect = msg.Redirect(
            topic.name, partition, owner, topic.partitioning_version, snapshot.generation, reason
        )
        return RedirectRequired(redirect)

    def _placement(self, topic: str) -> TopicPlacement | None:
        if self.cluster is None:
            return None
        return next((t for t in self.cluster.topics if t.name == topic), None)

    def delivery_hold(self, topic: str, cohort: str, partition: int) -> int | None:
        """The first offset of ``partition`` the cohort may not be delivered yet (a
        repartition, in flight or in the topic's history, holds a new partition's
        post-cutover records until the cohort drained the old partitions feeding it);
        None: no hold."""
        placement = self._placement(topic)
        if placement is None:
            return None
        holds: list[int] = []
        if placement.history is not None:
            held = placement.history.hold(cohort, partition)
            if held is not None:
                holds.append(held)
        t = placement.transition
        if t is not None:
            held = t.hold(cohort, partition, self._local_cutover(topic, partition, t.to_version))
            if held is not None:
                holds.append(held)
        return min(holds, default=None)

    def routed_anew_from(self, topic: str, partition: int) -> int | None:
        """While a grow is in flight, for a partition it routes keys to anew: where its
        post-cutover records begin (a cohort's member without a cursor there starts at
        the latest there, whatever its start: they are all newer than the cohort)."""
        placement = self._placement(topic)
        if placement is None or placement.transition is None:
            return None
        t = placement.transition
        return t.routed_anew_from(partition, self._local_cutover(topic, partition, t.to_version))

    def _local_cutover(self, topic: str, partition: int, version: int) -> int | None:
        """This copy's own record of where ``version`` began in ``partition``, if any."""
        t = self.registry.topics.get(topic)
        part = None if t is None else t.partitions.get(partition)
        if part is not None and part.cutover is not None and part.cutover[0] == version:
            return part.cutover[1]
        return None

    def _not_leader(self, topic: Topic, partition: int) -> RedirectRequired:
        me = self.settings.broker_id
        return self._redirect(
            topic, partition, f"broker {me} does not lead {topic.name}/{partition}"
        )

    def partition_for_write(self, topic: str, partition: int, version: int) -> Partition:
        t = self.registry.get(topic)
        if version != t.partitioning_version:
            reason = (
                f"routed under partitioning version {version}, current is {t.partitioning_version}"
            )
            raise self._redirect(t, partition, reason)
        placement = self._placement(t.name)
        if placement is not None and partition >= placement.routing_partitions:
            # A shrink retires partitions for routing, not for reading: they take no new
            # records (while it drains and after), and stay readable.
            reason = (
                f"{t.name}/{partition} is retired: version {version} routes to"
                f" {placement.routing_partitions} partitions"
            )
            raise self._redirect(t, partition, reason)
        part = self._led(t, partition)
        if part.moving:
            raise PartitionMoving(f"{part.name} is being moved; retry at its new owner")
        return part

    def partition_for_read(self, topic: str, partition: int) -> Partition:
        part = self._led(self.registry.get(topic), partition)
        if part.tiering is not None and part.tiering.reopening is not None:
            raise PartitionMoving(f"{part.name} is reopening after a move; retry shortly")
        return part

    def _led(self, t: Topic, partition: int) -> Partition:
        if not 0 <= partition < t.partition_count:
            raise UnknownPartition(f"topic {t.name!r} has no partition {partition}")
        part = t.partitions.get(partition)
        if part is None or part.role is not Role.LEADER:
            raise self._not_leader(t, partition)
        return part

    # ------------------------------------------------------------------ cluster mode

    async def receive_topology(self, doc: dict[str, Any]) -> bool:
        """``apply_topology``, with the new partitions' logs opened on a worker thread
        first (``Placer.prepare``), so that creating thousands of partitions leaves the
        event loop free for heartbeats and replication. One push at a time."""
        async with self._topology_lock:
            try:
                topology = self._newer_topology(doc)
            except UnsupportedDocument:
                fmt = doc.get("format")
                self.refused_topology_format = fmt if isinstance(fmt, int) else None
                self.metrics.refused_documents.labels("topology").inc()
                log.error(
                    "refused a topology push in format %s (this broker reads up to %d): the"
                    " controller is newer; this broker keeps its topology until it is upgraded",
                    fmt,
                    TOPOLOGY_FORMAT,
                )
                raise
            self.refused_topology_format = None
            if topology is None:
                return False
            prepared = await asyncio.to_thread(
                self.placer.prepare, topology, self.settings.broker_id
            )
            try:
                applied = self.apply_topology(doc, topology, prepared)
            finally:
                for unused in prepared.values():
                    unused.close()
            await self._serve_kafka_clients()
            return applied

    async def _serve_kafka_clients(self) -> None:
        """Accept Kafka clients from the first topology on (``_start_kafka_listener``)."""
        server = self._kafka_server
        if (
            self.cluster is not None
            and server is not None
            and server.sockets  # empty once ``stop`` closed it
            and not server.is_serving()
        ):
            await server.start_serving()

    def _newer_topology(self, doc: dict[str, Any]) -> ClusterTopology | None:
        if not self.settings.cluster_mode:
            raise InvalidRequest("this broker is standalone; it takes no pushed topology")
        topology = ClusterTopology.from_json(doc)
        current = self.cluster
        if current is not None and topology.generation <= current.generation:
            return None
        return topology

    def apply_topology(
        self,
        doc: dict[str, Any],
        topology: ClusterTopology | None = None,
        prepared: dict[tuple[str, int], PartitionLog] | None = None,
    ) -> bool:
        """Make local partitions match a pushed topology. False if it is older than ours.
        ``topology``: ``doc`` parsed already; ``prepared``: logs ``Placer.prepare`` opened."""
        if topology is None:
            topology = self._newer_topology(doc)
        elif self.cluster is not None and topology.generation <= self.cluster.generation:
            topology = None  # a newer one was applied meanwhile
        if topology is None:
            return False
        me = self.settings.broker_id
        self.cluster = topology  # before attaching: tier prefixes name the cluster
        stale = assigning.superseded(self.placer.hosted(), self.placer.creation_ids(), topology)
        if stale:
            gone = {a.name for a in stale if isinstance(a, assigning.DropTopic)}
            log.warning("dropping copies of deleted incarnations of %s", ", ".join(sorted(gone)))
            for key in [k for k in prepared or {} if k[0] in gone]:
                # opened in the old incarnation's directory, which the drop removes
                (prepared or {}).pop(key).close()
            self.placer.execute(stale)
        # Open first: a copy's incarnation is on its disk, and the plan depends on it.
        self.placer.execute(assigning.hosting(topology, me), prepared)
        self.placer.execute(assigning.plan(self.placer.hosted(), topology, me))
        self.placer.execute([assigning.removals(topology, me)])
        self._placement_changed()
        return True

    def _on_event(self, event: PartitionEvent) -> None:
        """Partition lifecycle events from replication and tiering."""
        match event:
            case LiveReplicasChanged(partition):
                self.metrics.lrs_changes.inc()
                self.reports.mark(partition)
            case PartitionReopened(partition):
                # A move's reopen finished: take the role the current topology gives.
                me = self.settings.broker_id
                self.placer.execute(assigning.plan_reopened(hosted(partition), self.cluster, me))
                self._placement_changed()
            case LogSyncFailed():
                self._halt(event)

    def _halt(self, failure: LogSyncFailed) -> None:
        """A log's data fdatasync failed: stop serving, and have the process exit.

        The log refuses writes and never counts data durable again, so leading
        its partition would only hand producers retriable errors until their
        timeouts. As Kafka does when its only log directory fails, the broker
        stops instead: the controller sees it gone and elects an in-sync replica,
        and a restart recovers the partition from what is on disk.
        """
        self.metrics.log_sync_failures.inc()
        self.ready = False  # /readyz and the heartbeat (draining) say so while we stop
        if self.fatal is not None:
            log.critical("fdatasync of %s failed too: %s", failure.partition.name, failure.error)
            return
        self.fatal = failure
        log.critical(
            "fdatasync of %s failed: %s; its log takes no more writes, so broker %s halts"
            " (a restart recovers the partition from disk)",
            failure.partition.name,
            failure.error.message,
            self.settings.broker_id,
        )
        self.halting.set()

    def _placement_changed(self) -> None:
        self.reports.mark_all()
        self.tiering.mark_all()
        self._watch_cursors()
        self.replication.reconcile()
        self.refresh_cohorts()
        self.push_topology()
        if self.kafka_groups is not None:
            self.kafka_groups.placement_changed()

    @property
    def cluster_id(self) -> str:
        """The cluster the pushed topology names (the configured one before any push)."""
        return self.cluster.cluster_id if self.cluster is not None else self.settings.cluster_id

    @property
    def cluster_generation(self) -> int | None:
        return self.cluster.generation if self.cluster is not None else None

    @property
    def awaiting_topology(self) -> bool:
        """A cluster broker before the controller's first push: roles are unknown."""
        return self.settings.cluster_mode and self.cluster is None

    def endpoint(self, broker_id: int) -> BrokerEndpoint | None:
        return self.cluster.broker(broker_id) if self.cluster is not None else None

    def cohorts_of(self, topic: str) -> list[CohortRuntime]:
        return [r for (t, _), r in self.cohorts.items() if t == topic]

    def cohort_plan(self, topic: str, cohort: str) -> dict[str, list[int]] | None:
        if self.cluster is None:
            return None
        placement = next((t for t in self.cluster.topics if t.name == topic), None)
        return None if placement is None else placement.cohort_plans.get(cohort)

    def refresh_cohorts(self) -> None:
        for (topic, cohort), runtime in list(self.cohorts.items()):
            if self.registry.topics.get(topic) is not runtime.topic:
                self._end_cohort((topic, cohort))  # its topic was deleted (or created again)
                continue
            runtime.refresh_partitions()
            runtime.set_plan(self.cohort_plan(topic, cohort))

    def _end_cohort(self, key: tuple[str, str]) -> None:
        """The cohort's topic is gone: end every membership in it (a member's next request
        gets ``UnknownMember``, and it joins again, the topic's next incarnation if one
        comes), then stop it."""
        runtime = self.cohorts.pop(key)
        runtime.end_memberships()
        asyncio.get_running_loop().create_task(runtime.close())

    @property
    def replication_token(self) -> str | None:
        return self.access.replication_token

    def client_ssl_context(self) -> ssl.SSLContext | None:
        tls = self.settings.tls
        if tls is None:
            return None
        return tlsnames.client_context(
            tls.ca_file or tls.client_ca_file or tls.cert_file,
            tls.server_name,
            tls.cert_file,
            tls.key_file,
        )

    def _report_of(self, p: Partition) -> PartitionReport:
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
            self.tiering.seal_report(p),
            p.log.log_start_offset,
            self.tiering.stored_through(p),
            p.cursors.all(),
            p.cutover if p.role is Role.LEADER else None,
            upload_error=self.tiering.upload_error(p),
            stored_from=self._stored_from(p),
        )

    def _stored_from(self, p: Partition) -> int | None:
        """The object store's first offset when it holds records the local log no longer
        does (the controller keeps a repartition's history while they are readable)."""
        stored = self.tiering.stored_start(p)
        return stored if stored is not None and stored < p.log.log_start_offset else None

    def _hosted(self, topic: str, index: int) -> Partition | None:
        t = self.registry.topics.get(topic)
        return None if t is None else t.partitions.get(index)

    def heartbeat(self, since: str | None = None) -> Heartbeat:
        """What the controller polls (``GET /v1/heartbeat``): every partition's report, or
        with ``since`` (``instance:seq`` of an earlier answer) only what changed since."""
        admin_port = self.admin.port if self.admin is not None else -1
        built = self.reports.rebuilt
        partitions, removed, journal = self.reports.answer(parse_since(since))
        self.metrics.heartbeat_reports.inc(self.reports.rebuilt - built)
        kafka = None
        if self._kafka_server is not None:
            kafka = KafkaAddress(*self.kafka_advertised())
        return Heartbeat(
            self.own_endpoint(admin_port, kafka),
            adoption=self.adoption_floor(),
            draining=self.draining or not self.ready,
            partitions=partitions,
            cohorts=tuple(
                CohortReport(t, c, tuple(sorted(r.gates.members)))
                for (t, c), r in sorted(self.cohorts.items())
            ),
            # The cluster generation this broker has applied; 0 before the first push (the
            # standalone registry counter is a different counter and must not stand in for it).
            generation=self.cluster.generation if self.cluster else 0,
            connections=len(self.connections),
            journal=journal,
            removed=removed,
            topology_format=TOPOLOGY_FORMAT,
            refused_topology_format=self.refused_topology_format,
            rack=self.settings.rack,
            object_store=self.tiering.enabled,
            removed_incarnations=tuple(sorted(self.tiering.removed)),
        )

    def drain_report(self) -> dict[str, Any]:
        """Where a drain stands (``/v1/drain``): the partitions this broker leads, and which
        of them it can hand off (their live replica set has another member). A leader with
        no in-sync peer keeps leading: stopping it takes the partition offline either way."""
        leading = sorted(
            (p for p in self.registry.all_partitions() if p.role is Role.LEADER),
            key=lambda p: (p.topic.name, p.index),
        )
        me = self.settings.broker_id
        movable = [p.name for p in leading if any(b != me for b in p.lrs)]
        return {
            "brokerId": me,
            "draining": self.draining,
            "leading": [p.name for p in leading],
            "movable": movable,
            "drained": self.draining and not movable,
        }

    # ------------------------------------------------------------------ topics

    def create_topic(
        self, name: str, partitions: int, config: dict[str, Any] | None = None
    ) -> Topic:
        if self.settings.cluster_mode:
            raise InvalidRequest(
                "in a cluster, topics are managed by the controller (headrace apply)"
            )
        topic = self.registry.create(name, partitions, config)
        self._watch_cursors()
        self.tiering.mark_all()
        self.reports.mark_all()
        self.push_topology()
        return topic

    def add_partitions(self, name: str, count: int) -> None:
        """Grow topic ``name`` to ``count`` partitions: never done here, and said so.

        A grow is a live repartition (docs/repartition.md): the partitioning version
        moves, and each cohort's delivery holds keep every key's pre-cutover records
        ahead of its post-cutover ones (invariant 6). Those holds come from the
        controller's transition marker, so a standalone broker, which has none, cannot
        grow a topic without breaking that order; in a cluster the controller owns the
        Topic, and this broker has no channel to it."""
        if self.settings.cluster_mode:
            raise PolicyViolation(
                f"{name}: partitions are added by the controller as a live repartition, not"
                f" through the Kafka API: run `headrace topics alter {name} --partitions"
                f" {count}` (local mode) or set the Topic's spec.partitions (Kubernetes)"
            )
        raise PolicyViolation(
            f"{name}: a standalone broker's partition count is fixed at creation; growing a"
            " topic is a live repartition, which needs a controller (a cluster: `headrace"
            f" topics alter {name} --partitions {count}`)"
        )

    def reconfigure_topic(
        self,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        validate_only: bool = False,
    ) -> None:
        """Give topic ``name`` the settings ``change`` makes of its current ones (by our
        names), checked whole first; ``validate_only``: check, change nothing. In a
        cluster the settings are the controller's Topic's, so refused there."""
        if self.settings.cluster_mode:
            raise PolicyViolation(
                f"{name}: topic settings are the controller's, not changed through the Kafka"
                f" API: run `headrace topics alter {name} -c KEY=VALUE` (local mode) or edit"
                " the Topic's spec (Kubernetes)"
            )
        config = change(self.registry.get(name).config)
        self.registry.log_config_of(config)  # raises InvalidTopicSpec
        if not validate_only:
            self.registry.reconfigure(name, config)

    def delete_topic(self, name: str) -> None:
        if self.settings.cluster_mode:
            raise InvalidRequest(
                "in a cluster, topics are managed by the controller (headrace delete)"
            )
        topic = self.registry.get(name)
        for key in [k for k in self.cohorts if k[0] == topic.name]:
            self._end_cohort(key)
        for partition in topic.partitions.values():
            self.tiering.forget(partition)
            self.tiering.detach(partition)
        self.registry.delete(topic.name)
        self.push_topology()

    def describe_topic(self, name: str) -> dict[str, Any]:
        topic = self.registry.get(name)
        cluster = self.settings.cluster_mode
        return {
            **topic.to_json(),
            "partition_details": [
                {
                    "partition": p.index,
                    # The partition's leader, not this broker: in a cluster a follower answers too.
                    "leader": p.leader_id if cluster else self.settings.broker_id,
                    "role": p.role.value,
                    "leader_epoch": p.leader_epoch,
                    "log_start_offset": p.log.log_start_offset,
                    "log_end_offset": p.log.next_offset,
                    "high_watermark": p.high_watermark,
                    "size_bytes": p.log.size_bytes,
                    "segments": len(p.log.segments),
                    "cursors": p.cursors.all(),
                    **self.tiering.describe(p),
                }
                for p in sorted(topic.partitions.values(), key=lambda p: p.index)
            ],
        }

    # ------------------------------------------------------------------ cohorts

    def _cohort_admin_view(self) -> cohort_admin.CohortAdminView:
        return cohort_admin.CohortAdminView(
            self.settings.broker_id, self.registry, self.cohorts, self.tiering.earliest
        )

    def describe_cohorts(self, request: msg.DescribeCohorts) -> dict[str, Any]:
        return cohort_admin.describe_cohorts(self._cohort_admin_view(), request)

    def reset_cursors(self, request: msg.ResetCursors) -> dict[str, Any]:
        return cohort_admin.reset_cursors(self._cohort_admin_view(), request)

    def cohort(self, topic_name: str, name: str) -> CohortRuntime:
        validate_cohort_name(name)
        topic = self.registry.get(topic_name)
        key = (topic.name, name)
        runtime = self.cohorts.get(key)
        if runtime is None:
            runtime = CohortRuntime(
                topic,
                name,
                grace_ms=self.settings.cohort_grace_ms,
                chunk_bytes=self.settings.delivery_chunk_bytes,
                tiering=self.tiering,
                hold=functools.partial(self.delivery_hold, topic.name, name),
                routed_anew_from=functools.partial(self.routed_anew_from, topic.name),
                epoch_floor=self.gate_epoch_floor,
            )
            runtime.on_delivered = self.metrics.delivered_bytes.inc
            runtime.on_skipped = functools.partial(self._count_skipped, topic.name, name)
            plan = self.cohort_plan(topic.name, name)
            if plan is not None:
                runtime.gates.plan = {m: frozenset(ps) for m, ps in plan.items()}
            runtime.start()
            self.cohorts[key] = runtime
        return runtime

    def _count_skipped(self, topic: str, cohort: str, partition: int, records: int) -> None:
        self.metrics.cohort_skipped_records.labels(topic, str(partition), cohort).inc(records)

    def maybe_drop_cohort(self, cohort: Cohort) -> None:
        key = (cohort.topic.name, cohort.name)
        runtime = self.cohorts.get(key)
        if runtime is cohort and runtime.empty:
            del self.cohorts[key]
            asyncio.get_running_loop().create_task(runtime.close())

    # ------------------------------------------------------------------ background work

    def _watch_cursors(self) -> None:
        """Listen to the cursors of every partition (after a placement or a new topic): the
        flush loop then looks at moved ones only, not at every partition 5 times a second."""
        for p in self.registry.all_partitions():
            if p not in self._cursor_watched:
                p.add_cursor_listener(self._cursor_moved)
                self._cursor_watched.add(p)
        hosted = set(self.registry.all_partitions())
        for p in self._cursor_watched - hosted:
            p.remove_cursor_listener(self._cursor_moved)
        self._cursor_watched &= hosted
        self._cursors_moved &= hosted

    def _cursor_moved(self, p: Partition) -> None:
        self._cursors_moved.add(p)

    def _flush_cursors_now(self, *, sync: bool) -> list[tuple[Any, dict[str, int]]]:
        pending = []
        if sync or self._cursor_sweep:
            partitions: Iterable[Partition] = self.registry.all_partitions()
            self._cursors_moved, self._cursor_sweep = set(), False
        else:
            partitions, self._cursors_moved = self._cursors_moved, set()
        for p in partitions:
            snap = p.cursors.snapshot_for_flush()
            if snap is not None:
                pending.append((p.cursors, snap))
        if sync:
            for store, snap in pending:
                store.write(snap)
        return pending

    async def _flush_cursors_forever(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.cursor_flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            pending = self._flush_cursors_now(sync=False)
            for store, snap in pending:
                try:
                    await loop.run_in_executor(None, store.write, snap)
                except OSError as exc:
                    log.error("cursor flush failed: %s", exc)
                    self._cursor_sweep = True  # the store stays dirty: look at all again

    async def _tick_cohorts_forever(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            for runtime in list(self.cohorts.values()):
                runtime.tick()
                self.maybe_drop_cohort(runtime)

    async def _retention_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.retention_check_interval_ms / 1000)
            for p in self.registry.all_partitions():
                if p.tiering is not None and not p.moving:
                    try:
                        # the whole log's retention, in the object store (leaders only)
                        if await self.tiering.uploader.apply_retention(p):
                            self.reports.mark(p)  # the log start clients see moved
                    except Exception as exc:
                        expected = isinstance(exc, HeadraceError)
                        log.warning(
                            "retention in the tier on %s failed: %s",
                            p.name,
                            exc,
                            exc_info=not expected,
                        )
                if p.moving or not p.log.retention_due():
                    continue  # nothing to delete: no manifest read
                try:
                    # Tiered: only what the object store already holds may go.
                    floor = await self.tiering.uploader.refresh_floor(p)
                    if p.moving or p.topic.partitions.get(p.index) is not p:
                        continue
                    deleted = p.log.apply_retention(upload_floor=floor)
                except StorageError as exc:
                    log.error("retention on %s failed: %s", p.name, exc)
                    continue
                except Exception:
                    # One partition's failure must not end retention for all of them.
                    log.exception("retention on %s failed", p.name)
                    continue
                if deleted:
                    self.reports.mark(p)  # its log start moved
                    log.info("retention deleted %d segments of %s", len(deleted), p.name)


def _open_object_store(url: str | None) -> ObjectStore | None:
    if url is None:
        return None
    from headrace.objectstore.urls import open_store

    return open_store(url)
