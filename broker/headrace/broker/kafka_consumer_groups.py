"""The Kafka listener's consumer group protocol (KIP-848): ``ConsumerGroupHeartbeat`` and
``ConsumerGroupDescribe`` over ``kafka.consumer_groups``.

The state machine is pure (``headrace.kafka.consumer_groups``); ``KafkaGroups`` owns
it beside the classic coordinator, with the clock and the ticker, so both protocols
share one coordinator per group, its ownership checks and its durable offsets.
This module turns requests into its asks and its answers into responses, and names
the subscribed topics (their ids and the partition counts Kafka clients see in
``Metadata``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from headrace.errors import HeadraceError, InvalidTopicSpec
from headrace.kafka import consumer_groups as cg
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode, code_of
from headrace.kafka.topic_ids import kafka_topic_name, placed_topic_id, topic_id
from headrace.records.topic_names import canonical_topic_name

if TYPE_CHECKING:
    from headrace.broker.kafka_groups import KafkaGroups
    from headrace.broker.ports import ConnectionHost
    from headrace.security.access import ConnectionAccess

log = logging.getLogger(__name__)


def topics_of(broker: ConnectionHost, access: ConnectionAccess, group_id: str) -> cg.TopicView:
    """The topics as a member of ``group_id`` on this connection sees them: ids and
    partition counts as ``Metadata`` gives them (in a cluster the topology's active
    partitions), and, for a regular expression to match, the names it may read in the
    group (the offsets topic is internal: never matched)."""
    lookup = lookup_of(broker)
    internal = canonical_topic_name(broker.settings.kafka_offsets_topic)

    def names() -> list[str]:
        cluster = broker.cluster
        every = broker.registry.topics if cluster is None else [t.name for t in cluster.topics]
        readable = []
        for canonical in every:
            if canonical == internal:
                continue
            try:
                access.require_cohort(canonical, group_id)
            except HeadraceError:
                continue
            readable.append(kafka_topic_name(canonical))
        return readable

    return cg.TopicView(lookup, names)


def lookup_of(broker: ConnectionHost) -> Callable[[str], cg.TopicInfo | None]:
    """A subscribed name -> its id and partition count, None if there is no such topic."""

    def lookup(name: str) -> cg.TopicInfo | None:
        try:
            canonical = canonical_topic_name(name)
        except InvalidTopicSpec:
            return None
        shown = kafka_topic_name(canonical)
        cluster = broker.cluster
        if cluster is None:
            topic = broker.registry.topics.get(canonical)
            if topic is None:
                return None
            return cg.TopicInfo(shown, topic_id(shown), topic.partition_count)
        placement = next((t for t in cluster.topics if t.name == canonical), None)
        if placement is None:
            return None
        return cg.TopicInfo(
            shown,
            placed_topic_id(shown, placement.partitions, placement.routing_partitions),
            placement.routing_partitions,
        )

    return lookup


def heartbeat(
    groups: KafkaGroups,
    topics: cg.TopicView,
    access: ConnectionAccess,
    client_id: str | None,
    peer_host: str,
    req: km.ConsumerGroupHeartbeatRequest,
) -> km.ConsumerGroupHeartbeatResponse:
    owner = groups.owner_error(req.group_id)
    if owner != ErrorCode.NONE:
        return km.ConsumerGroupHeartbeatResponse(0, owner, None, None, -1, 0)
    for name in req.subscribed_topic_names or ():
        try:
            # a member is given partitions to read: it needs what a commit of the
            # group's offsets needs, so that it cannot take partitions it may not read
            access.require_cohort(name, req.group_id)
        except HeadraceError as exc:
            return km.ConsumerGroupHeartbeatResponse(0, code_of(exc), exc.message, None, -1, 0)
    owned = (
        None
        if req.topic_partitions is None
        else cg.assignment_of((t.topic_id, t.partitions) for t in req.topic_partitions)
    )
    ask = cg.HeartbeatAsk(
        req.group_id,
        req.member_id,
        req.member_epoch,
        client_id or "",
        peer_host,
        req.instance_id,
        req.rack_id,
        req.rebalance_timeout_ms,
        None if req.subscribed_topic_names is None else tuple(req.subscribed_topic_names),
        req.subscribed_topic_regex,
        req.server_assignor,
        owned,
    )
    answer = groups.consumer_heartbeat(ask, topics)
    if answer.error != ErrorCode.NONE:
        log.info(
            "kafka: group %r: heartbeat of %r at epoch %d: %s (%s)",
            req.group_id,
            req.member_id,
            req.member_epoch,
            answer.error.name,
            answer.message,
        )
    assignment = None
    if answer.assignment is not None:
        assignment = km.HeartbeatAssignment(_listed(answer.assignment))
    return km.ConsumerGroupHeartbeatResponse(
        0,
        answer.error,
        answer.message,
        answer.member_id,
        answer.member_epoch,
        answer.heartbeat_interval_ms,
        assignment,
    )


def describe(
    groups: KafkaGroups, broker: ConnectionHost, req: km.ConsumerGroupDescribeRequest
) -> km.ConsumerGroupDescribeResponse:
    return km.ConsumerGroupDescribeResponse(
        0, [_described(groups, broker, group_id) for group_id in req.group_ids]
    )


def _described(
    groups: KafkaGroups, broker: ConnectionHost, group_id: str
) -> km.ConsumerGroupDescribed:
    owner = groups.owner_error(group_id)
    if owner != ErrorCode.NONE:
        return km.ConsumerGroupDescribed(owner, None, group_id)
    group = groups.consumer.groups.get(group_id)
    if group is None:
        why = f"group {group_id!r} is not a consumer-protocol group"
        return km.ConsumerGroupDescribed(ErrorCode.GROUP_ID_NOT_FOUND, why, group_id)
    lookup = lookup_of(broker)
    names = {info.topic_id: name for name, info in group.topics.items()}
    for member in group.members.values():
        for name in member.topics():
            info = lookup(name)
            if info is not None:
                names.setdefault(info.topic_id, info.name)

    def shown(assignment: cg.Assignment) -> km.DescribedAssignment:
        return km.DescribedAssignment(
            [
                km.DescribedTopicPartitions(topic, names.get(topic, ""), sorted(parts))
                for topic, parts in sorted(assignment.items())
                if parts
            ]
        )

    members = [
        km.ConsumerGroupDescribeMember(
            m.member_id,
            m.instance_id,
            m.rack_id,
            m.epoch,
            m.client_id,
            m.client_host,
            list(m.subscribed),
            m.regex,
            shown(m.assigned),
            shown(group.target.get(m.member_id, {})),
        )
        for m in group.members.values()
    ]
    return km.ConsumerGroupDescribed(
        ErrorCode.NONE,
        None,
        group_id,
        group.state.value,
        group.epoch,
        group.assignment_epoch,
        group.assignor(groups.consumer.settings.default_assignor),
        members,
    )


def _listed(assignment: cg.Assignment) -> list[km.HeartbeatTopicPartitions]:
    return [
        km.HeartbeatTopicPartitions(topic, sorted(parts))
        for topic, parts in sorted(assignment.items())
        if parts
    ]
