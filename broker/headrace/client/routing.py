"""The client's routing cache (pure): who owns each partition, under which version.

Filled from ``TopologyOk`` and kept current by ``TopologyUpdate`` pushes. A
push is applied only if it is newer than what the cache holds (its epoch, then
its generation), so a late or reordered push can never roll routing back, and a
generation counter that started again is not mistaken for an old one.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from headrace.errors import UnknownPartition, UnknownTopic
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.protocol.messages import TopicRouting, TopologySnapshot


def partition_for_key(key: bytes, partitions: int) -> int:
    """Keyed routing: CRC-32 (IEEE, as zlib) of the key bytes, modulo the partition count.

    Every client must use this exact function; it is part of the protocol.
    """
    return zlib.crc32(key) % partitions


def canonical(name: str) -> str:
    return name if "/" in name else f"default/{name}"


@dataclass(slots=True)
class RoutingCache:
    generation: int = 0
    #: the epoch of the generation counter ``generation`` was numbered by
    epoch: int = 0
    cluster_id: str = ""
    brokers: dict[int, BrokerEndpoint] | None = None
    topics: dict[str, TopicRouting] | None = None

    def apply(self, snapshot: TopologySnapshot) -> bool:
        """Replace the cache with ``snapshot`` if it is newer; True if applied."""
        if self.topics is not None and snapshot.order <= self.order:
            return False
        self.generation = snapshot.generation
        self.epoch = snapshot.epoch
        self.cluster_id = snapshot.cluster_id
        self.brokers = {b.id: b for b in snapshot.brokers}
        self.topics = {t.name: t for t in snapshot.topics}
        return True

    @property
    def order(self) -> tuple[int, int]:
        return (self.epoch, self.generation)

    def topic(self, name: str) -> TopicRouting:
        if self.topics is None or canonical(name) not in self.topics:
            raise UnknownTopic(f"unknown topic {canonical(name)!r}")
        return self.topics[canonical(name)]

    def owner(self, name: str, partition: int) -> BrokerEndpoint | None:
        routing = self.topic(name)
        if not 0 <= partition < routing.partitions:
            raise UnknownPartition(f"topic {routing.name!r} has no partition {partition}")
        owner_id = routing.owners[partition] if partition < len(routing.owners) else -1
        return (self.brokers or {}).get(owner_id)

    def note_redirect(
        self, topic: str, partition: int, owner: BrokerEndpoint | None, version: int
    ) -> None:
        """Apply what a Redirect taught us without waiting for a full topology."""
        if self.topics is None or canonical(topic) not in self.topics:
            return
        routing = self.topics[canonical(topic)]
        owners = list(routing.owners)
        if owner is not None:
            if self.brokers is not None:
                self.brokers[owner.id] = owner
            if 0 <= partition < len(owners):
                owners[partition] = owner.id
        if version != routing.partitioning_version or owners != routing.owners:
            self.topics[routing.name] = TopicRouting(
                routing.name,
                routing.partitions,
                max(version, routing.partitioning_version),
                owners,
                routing.epochs,
                routing.routing_partitions,
                routing.creation_id,
            )
