"""One group id, two group protocols: the Kafka listener's coordinator keeps them apart as
Kafka's does, and commits of either go to the same durable offsets."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from headrace.broker import kafka_consumer_groups
from headrace.broker.kafka_groups import KafkaGroups
from headrace.kafka import consumer_groups as cg
from headrace.kafka import messages as km
from headrace.kafka.errors import ErrorCode
from headrace.kafka.groups import Committed, JoinAsk
from headrace.kafka.topic_ids import topic_id
from headrace.security.access import Access
from headrace.security.acl import hash_token
from headrace.security.settings import AccessSettings

TOPIC = cg.TopicInfo("t", topic_id("t"), 2)


def lookup(name: str) -> cg.TopicInfo | None:
    return TOPIC if name == "t" else None


VIEW = cg.TopicView(lookup, lambda: ["t"])


def classic_join(group: str) -> JoinAsk:
    return JoinAsk(group, "", "client", "127.0.0.1", 10_000, 10_000, "consumer", (("range", b""),))


def consumer_join(group: str, member: str) -> cg.HeartbeatAsk:
    return cg.HeartbeatAsk(
        group, member, 0, rebalance_timeout_ms=10_000, subscribed=("t",), owned={}
    )


@pytest.fixture
async def groups(tmp_path: Path) -> AsyncIterator[KafkaGroups]:
    made = KafkaGroups(tmp_path / "kafka-groups")
    made.start()
    yield made
    await made.close()


async def test_a_consumer_heartbeat_to_a_classic_group_with_members_is_refused(
    groups: KafkaGroups,
) -> None:
    joined = await groups.join(classic_join("g"))
    assert joined.error == ErrorCode.NONE
    answer = groups.consumer_heartbeat(consumer_join("g", "m"), VIEW)
    assert answer.error == ErrorCode.GROUP_ID_NOT_FOUND
    assert groups.leave("g", joined.member_id) == ErrorCode.NONE
    # the classic group is empty now: the consumer protocol may take the id
    assert groups.consumer_heartbeat(consumer_join("g", "m"), VIEW).error == ErrorCode.NONE


async def test_a_classic_join_to_a_consumer_protocol_group_is_inconsistent(
    groups: KafkaGroups,
) -> None:
    assert groups.consumer_heartbeat(consumer_join("g", "m"), VIEW).error == ErrorCode.NONE
    refused = await groups.join(classic_join("g"))
    assert refused.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert ("g", "consumer") in groups.listed()
    assert await groups.delete("g") == ErrorCode.NON_EMPTY_GROUP
    leave = cg.HeartbeatAsk("g", "m", -1)
    assert groups.consumer_heartbeat(leave, VIEW).error == ErrorCode.NONE
    # empty now: a classic member may take the id, and commits by its generation
    joined = await groups.join(classic_join("g"))
    assert joined.error == ErrorCode.NONE
    me = joined.member_id
    assert (await groups.sync("g", joined.generation, me, {me: b""})).error == ErrorCode.NONE
    assert groups.may_commit("g", joined.generation, me, 9) == ErrorCode.NONE
    assert "g" not in groups.consumer.groups


async def test_commits_take_member_epochs_and_land_in_the_durable_offsets(
    groups: KafkaGroups, tmp_path: Path
) -> None:
    answer = groups.consumer_heartbeat(consumer_join("g", "m"), VIEW)
    epoch = answer.member_epoch
    assert groups.may_commit("g", epoch, "m", 9) == ErrorCode.NONE
    assert groups.may_commit("g", epoch - 1, "m", 9) == ErrorCode.STALE_MEMBER_EPOCH
    assert groups.may_commit("g", epoch, "m", 7) == ErrorCode.UNSUPPORTED_VERSION
    # a classic group's rules are unchanged: a generation, not an epoch
    assert groups.may_commit("other", 3, "x", 9) == ErrorCode.UNKNOWN_MEMBER_ID
    await groups.commit("g", {("t", 0): Committed(42, -1, "")})
    await groups.close()
    reopened = KafkaGroups(tmp_path / "kafka-groups")
    reopened.start()
    try:
        assert reopened.core.committed("g") == {("t", 0): Committed(42, -1, "")}
    finally:
        await reopened.close()


class Uncounted:
    """A denial counter that counts nothing (``prometheus_client.Counter``'s shape)."""

    def labels(self, *values: str) -> Any:
        return self

    def inc(self) -> None:
        pass


async def test_a_heartbeat_needs_the_grant_a_commit_of_the_group_needs(
    groups: KafkaGroups, tmp_path: Path
) -> None:
    acl = tmp_path / "acl.json"
    grant = {"operations": ["consume"], "topics": ["t"], "cohorts": ["audit-*"]}
    principal = {"name": "reader", "tokens": [hash_token("r-token")], "grants": [grant]}
    acl.write_text(json.dumps({"version": 1, "principals": [principal]}))
    session = Access(AccessSettings(acl_file=acl), Uncounted()).session()
    session.authenticate("r-token", None)

    def beat(group: str) -> km.ConsumerGroupHeartbeatResponse:
        req = km.ConsumerGroupHeartbeatRequest(
            group, "m", 0, None, None, 10_000, ["t"], None, None, []
        )
        return kafka_consumer_groups.heartbeat(groups, VIEW, session, "c", "h", req)

    refused = beat("billing")
    assert refused.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert "billing" not in groups.consumer.groups  # nothing was joined
    joined = beat("audit-eu")
    assert joined.error_code == ErrorCode.NONE
    assert joined.assignment == km.HeartbeatAssignment(
        [km.HeartbeatTopicPartitions(TOPIC.topic_id, [0, 1])]
    )
