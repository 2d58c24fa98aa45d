"""Metadata and DescribeCluster: the brokers, topics and partition leaders a Kafka client
routes by, from this broker's registry (standalone) or the pushed topology (a cluster)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from headrace.broker.kafka_handlers.context import (
    KafkaHandlers,
    KafkaRequestContext,
    KafkaRoutes,
)
from headrace.broker.topics import Role
from headrace.errors import HeadraceError
from headrace.kafka import messages as km
from headrace.kafka import topic_ids
from headrace.kafka.errors import ErrorCode, code_of
from headrace.kafka.topic_ids import kafka_topic_name, placed_topic_id, topic_id
from headrace.records.topic_names import canonical_topic_name
from headrace.security.acl import Operation

if TYPE_CHECKING:
    from headrace.protocol.coordination import ClusterTopology


def _asked_names(
    header: km.RequestHeader, req: km.MetadataRequest, every: Callable[[], dict[str, bytes]]
) -> list[str]:
    """The topics a Metadata request names, by name or (v10+) by id; none (or v0's empty
    list) means every one. ``every``: each topic's name, as clients see it, to its id."""
    if req.topics is None or (header.api_version == 0 and not req.topics):
        return sorted(every())
    known = every()
    return [topic_ids.named(t.name, t.topic_id, known) for t in req.topics]


class Metadata(KafkaHandlers):
    def __init__(self, context: KafkaRequestContext) -> None:
        super().__init__(context)
        self.advertised = context.advertised

    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.METADATA: self.metadata,
            km.ApiKey.DESCRIBE_CLUSTER: self.describe_cluster,
        }

    def metadata(self, header: km.RequestHeader, req: km.MetadataRequest) -> km.MetadataResponse:
        if self.broker.cluster is not None:
            return self._cluster_metadata(header, req, self.broker.cluster)
        settings = self.broker.settings
        me = settings.broker_id
        host, port = self.advertised()
        registry = self.broker.registry
        names = _asked_names(
            header,
            req,
            lambda: {kafka_topic_name(n): topic_id(kafka_topic_name(n)) for n in registry.topics},
        )
        topics = []
        for name in names:
            try:
                topic = registry.get(name)
            except HeadraceError as exc:
                topics.append(km.MetadataResponseTopic(code_of(exc), name, bytes(16)))
                continue
            refused = self._refused(name)
            if refused is not None:
                topics.append(refused)
                continue
            partitions = []
            for index in range(topic.partition_count):
                part = topic.partitions.get(index)
                leader = -1 if part is None else me if part.role is Role.LEADER else part.leader_id
                if part is None or leader < 0:
                    partitions.append(
                        km.MetadataResponsePartition(ErrorCode.LEADER_NOT_AVAILABLE, index, -1)
                    )
                    continue
                partitions.append(
                    km.MetadataResponsePartition(
                        ErrorCode.NONE,
                        index,
                        leader,
                        part.leader_epoch,
                        list(part.replicas) or [leader],
                        # Kafka's ISR is our live replica set (a lone leader has none)
                        part.lrs if part.replica_set is not None else [leader],
                        [],
                    )
                )
            topics.append(
                km.MetadataResponseTopic(ErrorCode.NONE, name, topic_id(name), False, partitions)
            )
        return km.MetadataResponse(
            brokers=[km.MetadataResponseBroker(me, host, port)],
            cluster_id=settings.cluster_id,
            controller_id=me,
            topics=topics,
        )

    def _cluster_metadata(
        self, header: km.RequestHeader, req: km.MetadataRequest, cluster: ClusterTopology
    ) -> km.MetadataResponse:
        """Metadata from the pushed topology: every broker with a Kafka listener, and each
        partition's leader, epoch, replicas and ISR (the controller's live replica set,
        or this leader's own when it leads the partition). A topic lists its active
        partitions only: a shrink's retired partitions take no produce, and a Kafka
        producer spreads keys over every partition Metadata gives; and such a topic has
        a new id, without which Kafka clients keep the higher count (docs/kafka.md)."""
        me = self.broker.settings.broker_id
        kafka_brokers = {b.id: b.kafka for b in cluster.brokers if b.kafka is not None}
        placements = {kafka_topic_name(t.name): t for t in cluster.topics}
        ids = {
            name: placed_topic_id(name, t.partitions, t.routing_partitions)
            for name, t in placements.items()
        }
        internal = kafka_topic_name(canonical_topic_name(self.broker.settings.kafka_offsets_topic))
        topics = []
        for name in _asked_names(header, req, lambda: ids):
            placement = placements.get(name)
            if placement is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                topics.append(km.MetadataResponseTopic(code, name, bytes(16)))
                continue
            refused = self._refused(name)
            if refused is not None:
                topics.append(refused)
                continue
            local = self.broker.registry.topics.get(placement.name)
            partitions = []
            for a in sorted(placement.assignments, key=lambda a: a.partition):
                if a.partition >= placement.routing_partitions:
                    continue
                if a.leader is None or a.leader not in kafka_brokers:
                    partitions.append(
                        km.MetadataResponsePartition(
                            ErrorCode.LEADER_NOT_AVAILABLE,
                            a.partition,
                            -1,
                            a.epoch,
                            list(a.replicas),
                            list(a.lrs),
                            [],
                        )
                    )
                    continue
                isr = list(a.lrs)
                part = None if local is None else local.partitions.get(a.partition)
                if a.leader == me and part is not None and part.replica_set is not None:
                    isr = sorted(part.lrs)
                partitions.append(
                    km.MetadataResponsePartition(
                        ErrorCode.NONE, a.partition, a.leader, a.epoch, list(a.replicas), isr, []
                    )
                )
            topics.append(
                km.MetadataResponseTopic(
                    ErrorCode.NONE, name, ids[name], name == internal, partitions
                )
            )
        return km.MetadataResponse(
            brokers=[
                km.MetadataResponseBroker(b, address.host, address.port)
                for b, address in sorted(kafka_brokers.items())
            ],
            cluster_id=cluster.cluster_id,
            # admin requests go to the controller id: any broker answers them alike
            controller_id=me if me in kafka_brokers else min(kafka_brokers, default=-1),
            topics=topics,
        )

    def _refused(self, name: str) -> km.MetadataResponseTopic | None:
        """The topic's answer when this connection may not see it (None: it may)."""
        try:
            self.access.require(Operation.CONSUME, name)
        except HeadraceError as exc:
            return km.MetadataResponseTopic(code_of(exc), name, topic_id(name))
        return None

    def describe_cluster(
        self, header: km.RequestHeader, req: km.DescribeClusterRequest
    ) -> km.DescribeClusterResponse:
        host, port = self.advertised()
        me = self.broker.settings.broker_id
        described = [km.DescribeClusterBroker(me, host, port)]
        cluster = self.broker.cluster
        if cluster is not None:
            described = [
                km.DescribeClusterBroker(b.id, b.kafka.host, b.kafka.port)
                for b in cluster.brokers
                if b.kafka is not None
            ]
        return km.DescribeClusterResponse(
            0,
            ErrorCode.NONE,
            None,
            cluster.cluster_id if cluster is not None else self.broker.settings.cluster_id or "",
            me,
            described,
        )
