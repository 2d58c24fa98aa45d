"""The consumer group protocol (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe,
over ``kafka_consumer_groups`` (the adapter of the pure ``kafka.consumer_groups``). Both
answer at once: the coordinator computes the assignment, the client reconciles to it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.broker import kafka_consumer_groups
from headrace.broker.kafka_handlers.context import (
    KafkaHandlers,
    KafkaRequestContext,
    KafkaRoutes,
)
from headrace.kafka import messages as km

if TYPE_CHECKING:
    from headrace.broker.kafka_groups import KafkaGroups


class ConsumerProtocol(KafkaHandlers):
    def __init__(self, context: KafkaRequestContext, coordinator: KafkaGroups) -> None:
        super().__init__(context)
        self.host = context.peer.rpartition(":")[0]
        self.groups = coordinator

    def routes(self) -> KafkaRoutes:
        return {
            km.ApiKey.CONSUMER_GROUP_HEARTBEAT: self.heartbeat,
            km.ApiKey.CONSUMER_GROUP_DESCRIBE: self.describe,
        }

    def heartbeat(
        self, header: km.RequestHeader, req: km.ConsumerGroupHeartbeatRequest
    ) -> km.ConsumerGroupHeartbeatResponse:
        topics = kafka_consumer_groups.topics_of(self.broker, self.access, req.group_id)
        return kafka_consumer_groups.heartbeat(
            self.groups, topics, self.access, header.client_id, self.host, req
        )

    def describe(
        self, header: km.RequestHeader, req: km.ConsumerGroupDescribeRequest
    ) -> km.ConsumerGroupDescribeResponse:
        return kafka_consumer_groups.describe(self.groups, self.broker, req)
