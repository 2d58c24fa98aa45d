"""Cluster mode: applying the topology the controller pushes.

A push newer than the one held is planned by the pure ``replication.assigning``
(partitions hosted here, the topology, this broker's id -> actions) and carried
out by ``placing.Placer``; the new partitions' logs are opened on a worker thread
first, so that creating thousands of them leaves the event loop free. One push
is applied at a time, and an older or equal one is ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from headrace.broker.placing import Placer, hosted
from headrace.broker.ports import BrokerCore
from headrace.broker.pushed_topology import PushedTopology
from headrace.broker.topics import Partition
from headrace.errors import InvalidRequest, UnsupportedDocument
from headrace.protocol.coordination import TOPOLOGY_FORMAT, ClusterTopology
from headrace.replication import assigning
from headrace.storage.log import PartitionLog

log = logging.getLogger(__name__)


class TopologyApplier:
    def __init__(
        self,
        broker: BrokerCore,
        pushed: PushedTopology,
        placer: Placer,
        *,
        placement_changed: Callable[[], None],
        serve_kafka_clients: Callable[[], Awaitable[None]],
    ) -> None:
        self._settings = broker.settings
        self._metrics = broker.metrics
        self._pushed = pushed
        self._placer = placer
        #: told after every placement: the broker's parts take up the new roles
        self._placement_changed = placement_changed
        #: awaited after every push once a topology is held: the Kafka listener
        #: accepts clients from the first one on
        self._serve_kafka_clients = serve_kafka_clients
        #: held while a pushed topology is applied (``receive``)
        self._lock = asyncio.Lock()

    async def receive(self, doc: dict[str, Any]) -> bool:
        """``apply``, with the new partitions' logs opened on a worker thread first
        (``Placer.prepare``). One push at a time."""
        async with self._lock:
            try:
                topology = self._newer(doc)
            except UnsupportedDocument:
                fmt = doc.get("format")
                self._pushed.refused_format = fmt if isinstance(fmt, int) else None
                self._metrics.refused_documents.labels("topology").inc()
                log.error(
                    "refused a topology push in format %s (this broker reads up to %d): the"
                    " controller is newer; this broker keeps its topology until it is upgraded",
                    fmt,
                    TOPOLOGY_FORMAT,
                )
                raise
            self._pushed.refused_format = None
            if topology is None:
                return False
            prepared = await asyncio.to_thread(
                self._placer.prepare, topology, self._settings.broker_id
            )
            try:
                applied = self.apply(doc, topology, prepared)
            finally:
                for unused in prepared.values():
                    unused.close()
            if self._pushed.current is not None:
                await self._serve_kafka_clients()
            return applied

    def _newer(self, doc: dict[str, Any]) -> ClusterTopology | None:
        if not self._settings.cluster_mode:
            raise InvalidRequest("this broker is standalone; it takes no pushed topology")
        topology = ClusterTopology.from_json(doc)
        current = self._pushed.current
        if current is not None and topology.generation <= current.generation:
            return None
        return topology

    def apply(
        self,
        doc: dict[str, Any],
        topology: ClusterTopology | None = None,
        prepared: dict[tuple[str, int], PartitionLog] | None = None,
    ) -> bool:
        """Make local partitions match a pushed topology. False if it is older than ours.
        ``topology``: ``doc`` parsed already; ``prepared``: logs ``Placer.prepare`` opened."""
        current = self._pushed.current
        if topology is None:
            topology = self._newer(doc)
        elif current is not None and topology.generation <= current.generation:
            topology = None  # a newer one was applied meanwhile
        if topology is None:
            return False
        me = self._settings.broker_id
        self._pushed.current = topology  # before attaching: tier prefixes name the cluster
        stale = assigning.superseded(self._placer.hosted(), self._placer.creation_ids(), topology)
        if stale:
            gone = {a.name for a in stale if isinstance(a, assigning.DropTopic)}
            log.warning("dropping copies of deleted incarnations of %s", ", ".join(sorted(gone)))
            for key in [k for k in prepared or {} if k[0] in gone]:
                # opened in the old incarnation's directory, which the drop removes
                (prepared or {}).pop(key).close()
            self._placer.execute(stale)
        # Open first: a copy's incarnation is on its disk, and the plan depends on it.
        self._placer.execute(assigning.hosting(topology, me), prepared)
        self._placer.execute(assigning.plan(self._placer.hosted(), topology, me))
        self._placer.execute([assigning.removals(topology, me)])
        self._placement_changed()
        return True

    def reopened(self, partition: Partition) -> None:
        """A move's reopen finished: take the role the current topology gives."""
        me = self._settings.broker_id
        self._placer.execute(assigning.plan_reopened(hosted(partition), self._pushed.current, me))
        self._placement_changed()
