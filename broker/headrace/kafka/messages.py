"""The Kafka requests and responses this broker implements, and their headers (pure).

Field lists follow Kafka's message schemas field for field (names in snake
case); only the versions in ``SUPPORTED`` are served, and ``ApiVersions``
advertises exactly that table. A request for anything else is answered with
``UNSUPPORTED_VERSION`` (``errors.py``).

Headers: a request header is v1 (api key, version, correlation id, a nullable
non-compact client id) in a non-flexible version and v2 (v1 plus tagged fields)
in a flexible one. A response header is v0 (correlation id) or v1 (plus tagged
fields) likewise, except that ``ApiVersions`` always answers with v0 so that a
client that does not know the broker's versions yet can parse it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from headrace.kafka import schema
from headrace.kafka.schema import Array, Kind, kfield
from headrace.kafka.wire import MalformedKafkaRequest, Reader, Writer


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69


# --------------------------------------------------------------------------- headers


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def decode_request_header(r: Reader) -> RequestHeader:
    """The header of a request frame; leaves ``r`` at its tagged fields or body.

    Whether tagged fields follow depends on the API and version (``skip_header_tags``).
    """
    api_key = r.int16()
    api_version = r.int16()
    correlation_id = r.int32()
    client_id = r.string(compact=False)
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def skip_header_tags(r: Reader) -> None:
    """The request header v2's tagged fields: none are defined, all are skipped."""
    for _ in range(r.uvarint()):
        r.uvarint()
        r.take(r.uvarint())


def encode_request_header(w: Writer, header: RequestHeader, flexible: bool) -> None:
    """A client's side of the header (tests and tools drive the broker with it)."""
    w.int16(header.api_key)
    w.int16(header.api_version)
    w.int32(header.correlation_id)
    w.string(header.client_id, compact=False)
    if flexible:
        w.uvarint(0)


def encode_response_header(w: Writer, correlation_id: int, flexible_header: bool) -> None:
    w.int32(correlation_id)
    if flexible_header:
        w.uvarint(0)


# --------------------------------------------------------------------------- ApiVersions (18)


@dataclass(slots=True)
class ApiVersionsRequest:
    client_software_name: str = kfield(Kind.STRING, "3+")
    client_software_version: str = kfield(Kind.STRING, "3+")


@dataclass(slots=True)
class ApiVersion:
    api_key: int = kfield(Kind.INT16)
    min_version: int = kfield(Kind.INT16)
    max_version: int = kfield(Kind.INT16)


@dataclass(slots=True)
class ApiVersionsResponse:
    error_code: int = kfield(Kind.INT16)
    api_keys: list[ApiVersion] = kfield(Array(ApiVersion))
    throttle_time_ms: int = kfield(Kind.INT32, "1+")


# --------------------------------------------------------------------------- Metadata (3)


@dataclass(slots=True)
class MetadataRequestTopic:
    topic_id: bytes = kfield(Kind.UUID, "10+")
    name: str | None = kfield(Kind.STRING, nullable="10+")


@dataclass(slots=True)
class MetadataRequest:
    #: None (v1+) = every topic; v0's empty list means the same
    topics: list[MetadataRequestTopic] | None = kfield(Array(MetadataRequestTopic), nullable="1+")
    allow_auto_topic_creation: bool = kfield(Kind.BOOL, "4+", default=True)
    include_cluster_authorized_operations: bool = kfield(Kind.BOOL, "8-10")
    include_topic_authorized_operations: bool = kfield(Kind.BOOL, "8+")


@dataclass(slots=True)
class MetadataResponseBroker:
    node_id: int = kfield(Kind.INT32)
    host: str = kfield(Kind.STRING)
    port: int = kfield(Kind.INT32)
    rack: str | None = kfield(Kind.STRING, "1+", nullable="1+", default=None)


@dataclass(slots=True)
class MetadataResponsePartition:
    error_code: int = kfield(Kind.INT16)
    partition_index: int = kfield(Kind.INT32)
    leader_id: int = kfield(Kind.INT32)
    leader_epoch: int = kfield(Kind.INT32, "7+", default=-1)
    replica_nodes: list[int] = kfield(Array(Kind.INT32))
    isr_nodes: list[int] = kfield(Array(Kind.INT32))
    offline_replicas: list[int] = kfield(Array(Kind.INT32), "5+")


#: "not requested" for the authorized-operations bitfields
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)


@dataclass(slots=True)
class MetadataResponseTopic:
    error_code: int = kfield(Kind.INT16)
    name: str | None = kfield(Kind.STRING, nullable="12+")
    topic_id: bytes = kfield(Kind.UUID, "10+")
    is_internal: bool = kfield(Kind.BOOL, "1+")
    partitions: list[MetadataResponsePartition] = kfield(Array(MetadataResponsePartition))
    topic_authorized_operations: int = kfield(
        Kind.INT32, "8+", default=AUTHORIZED_OPERATIONS_OMITTED
    )


@dataclass(slots=True)
class MetadataResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "3+")
    brokers: list[MetadataResponseBroker] = kfield(Array(MetadataResponseBroker))
    cluster_id: str | None = kfield(Kind.STRING, "2+", nullable="2+", default=None)
    controller_id: int = kfield(Kind.INT32, "1+", default=-1)
    topics: list[MetadataResponseTopic] = kfield(Array(MetadataResponseTopic))
    cluster_authorized_operations: int = kfield(
        Kind.INT32, "8-10", default=AUTHORIZED_OPERATIONS_OMITTED
    )


# --------------------------------------------------------------------------- Produce (0)


@dataclass(slots=True)
class PartitionProduceData:
    index: int = kfield(Kind.INT32)
    records: memoryview | None = kfield(Kind.RECORDS, nullable="0+")


@dataclass(slots=True)
class TopicProduceData:
    name: str = kfield(Kind.STRING)
    partition_data: list[PartitionProduceData] = kfield(Array(PartitionProduceData))


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None = kfield(Kind.STRING, "3+", nullable="3+", default=None)
    acks: int = kfield(Kind.INT16)
    timeout_ms: int = kfield(Kind.INT32)
    topic_data: list[TopicProduceData] = kfield(Array(TopicProduceData))


@dataclass(slots=True)
class BatchIndexAndErrorMessage:
    batch_index: int = kfield(Kind.INT32, "8+")
    batch_index_error_message: str | None = kfield(Kind.STRING, "8+", nullable="8+", default=None)


@dataclass(slots=True)
class PartitionProduceResponse:
    index: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)
    base_offset: int = kfield(Kind.INT64)
    log_append_time_ms: int = kfield(Kind.INT64, "2+", default=-1)
    log_start_offset: int = kfield(Kind.INT64, "5+", default=-1)
    record_errors: list[BatchIndexAndErrorMessage] = kfield(Array(BatchIndexAndErrorMessage), "8+")
    error_message: str | None = kfield(Kind.STRING, "8+", nullable="8+", default=None)


@dataclass(slots=True)
class TopicProduceResponse:
    name: str = kfield(Kind.STRING)
    partition_responses: list[PartitionProduceResponse] = kfield(Array(PartitionProduceResponse))


@dataclass(slots=True)
class ProduceResponse:
    responses: list[TopicProduceResponse] = kfield(Array(TopicProduceResponse))
    throttle_time_ms: int = kfield(Kind.INT32, "1+")


# --------------------------------------------------------------------------- Fetch (1)


@dataclass(slots=True)
class FetchPartition:
    partition: int = kfield(Kind.INT32)
    current_leader_epoch: int = kfield(Kind.INT32, "9+", default=-1)
    fetch_offset: int = kfield(Kind.INT64)
    last_fetched_epoch: int = kfield(Kind.INT32, "12+", default=-1)
    log_start_offset: int = kfield(Kind.INT64, "5+", default=-1)
    partition_max_bytes: int = kfield(Kind.INT32)


@dataclass(slots=True)
class FetchTopic:
    topic: str = kfield(Kind.STRING, "0-12")
    topic_id: bytes = kfield(Kind.UUID, "13+")
    partitions: list[FetchPartition] = kfield(Array(FetchPartition))


@dataclass(slots=True)
class ForgottenTopic:
    topic: str = kfield(Kind.STRING, "7-12")
    topic_id: bytes = kfield(Kind.UUID, "13+")
    partitions: list[int] = kfield(Array(Kind.INT32), "7+")


class IsolationLevel(IntEnum):
    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


@dataclass(slots=True)
class FetchRequest:
    cluster_id: str | None = kfield(
        Kind.STRING, "12+", nullable="12+", tag=0, tagged="12+", default=None
    )
    replica_id: int = kfield(Kind.INT32, "0-14", default=-1)
    max_wait_ms: int = kfield(Kind.INT32)
    min_bytes: int = kfield(Kind.INT32)
    max_bytes: int = kfield(Kind.INT32, "3+", default=0x7FFFFFFF)
    isolation_level: int = kfield(Kind.INT8, "4+")
    session_id: int = kfield(Kind.INT32, "7+")
    session_epoch: int = kfield(Kind.INT32, "7+", default=-1)
    topics: list[FetchTopic] = kfield(Array(FetchTopic))
    forgotten_topics_data: list[ForgottenTopic] = kfield(Array(ForgottenTopic), "7+")
    rack_id: str = kfield(Kind.STRING, "11+")


@dataclass(slots=True)
class LeaderIdAndEpoch:
    leader_id: int = kfield(Kind.INT32, "12+", default=-1)
    leader_epoch: int = kfield(Kind.INT32, "12+", default=-1)


@dataclass(slots=True)
class AbortedTransaction:
    producer_id: int = kfield(Kind.INT64, "4+")
    first_offset: int = kfield(Kind.INT64, "4+")


@dataclass(slots=True)
class FetchPartitionData:
    partition_index: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)
    high_watermark: int = kfield(Kind.INT64)
    last_stable_offset: int = kfield(Kind.INT64, "4+", default=-1)
    log_start_offset: int = kfield(Kind.INT64, "5+", default=-1)
    current_leader: LeaderIdAndEpoch | None = kfield(LeaderIdAndEpoch, "12+", tag=1, tagged="12+")
    aborted_transactions: list[AbortedTransaction] | None = kfield(
        Array(AbortedTransaction), "4+", nullable="4+", default=None
    )
    preferred_read_replica: int = kfield(Kind.INT32, "11+", default=-1)
    #: the batches: one buffer, or several sent without joining them
    records: Any = kfield(Kind.RECORDS, nullable="0+")


@dataclass(slots=True)
class FetchableTopicResponse:
    topic: str = kfield(Kind.STRING, "0-12")
    topic_id: bytes = kfield(Kind.UUID, "13+")
    partitions: list[FetchPartitionData] = kfield(Array(FetchPartitionData))


@dataclass(slots=True)
class FetchResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    error_code: int = kfield(Kind.INT16, "7+")
    session_id: int = kfield(Kind.INT32, "7+")
    responses: list[FetchableTopicResponse] = kfield(Array(FetchableTopicResponse))


# --------------------------------------------------------------------------- ListOffsets (2)

#: ListOffsets' special timestamps
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2
#: v7+ (KIP-734): the first record with the largest timestamp
MAX_TIMESTAMP: Final = -3


@dataclass(slots=True)
class ListOffsetsPartition:
    partition_index: int = kfield(Kind.INT32)
    current_leader_epoch: int = kfield(Kind.INT32, "4+", default=-1)
    timestamp: int = kfield(Kind.INT64)
    max_num_offsets: int = kfield(Kind.INT32, "0", default=1)


@dataclass(slots=True)
class ListOffsetsTopic:
    name: str = kfield(Kind.STRING)
    partitions: list[ListOffsetsPartition] = kfield(Array(ListOffsetsPartition))


@dataclass(slots=True)
class ListOffsetsRequest:
    replica_id: int = kfield(Kind.INT32, default=-1)
    isolation_level: int = kfield(Kind.INT8, "2+")
    topics: list[ListOffsetsTopic] = kfield(Array(ListOffsetsTopic))


@dataclass(slots=True)
class ListOffsetsPartitionResponse:
    partition_index: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)
    old_style_offsets: list[int] = kfield(Array(Kind.INT64), "0")
    timestamp: int = kfield(Kind.INT64, "1+", default=-1)
    offset: int = kfield(Kind.INT64, "1+", default=-1)
    leader_epoch: int = kfield(Kind.INT32, "4+", default=-1)


@dataclass(slots=True)
class ListOffsetsTopicResponse:
    name: str = kfield(Kind.STRING)
    partitions: list[ListOffsetsPartitionResponse] = kfield(Array(ListOffsetsPartitionResponse))


@dataclass(slots=True)
class ListOffsetsResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "2+")
    topics: list[ListOffsetsTopicResponse] = kfield(Array(ListOffsetsTopicResponse))


# --------------------------------------------------------------------------- groups (8-16, 42)
# The classic group protocol, in its versions before flexible encoding.


@dataclass(slots=True)
class FindCoordinatorRequest:
    key: str = kfield(Kind.STRING)
    #: 0 = a group, 1 = a transactional id
    key_type: int = kfield(Kind.INT8, "1+")


@dataclass(slots=True)
class FindCoordinatorResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, "1+", nullable="1+", default=None)
    node_id: int = kfield(Kind.INT32)
    host: str = kfield(Kind.STRING)
    port: int = kfield(Kind.INT32)


@dataclass(slots=True)
class JoinGroupRequestProtocol:
    name: str = kfield(Kind.STRING)
    metadata: bytes = kfield(Kind.BYTES)


@dataclass(slots=True)
class JoinGroupRequest:
    group_id: str = kfield(Kind.STRING)
    session_timeout_ms: int = kfield(Kind.INT32)
    rebalance_timeout_ms: int = kfield(Kind.INT32, "1+", default=-1)
    member_id: str = kfield(Kind.STRING)
    group_instance_id: str | None = kfield(Kind.STRING, "5+", nullable="5+", default=None)
    protocol_type: str = kfield(Kind.STRING)
    protocols: list[JoinGroupRequestProtocol] = kfield(Array(JoinGroupRequestProtocol))


@dataclass(slots=True)
class JoinGroupResponseMember:
    member_id: str = kfield(Kind.STRING)
    group_instance_id: str | None = kfield(Kind.STRING, "5+", nullable="5+", default=None)
    metadata: bytes = kfield(Kind.BYTES)


@dataclass(slots=True)
class JoinGroupResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "2+")
    error_code: int = kfield(Kind.INT16)
    generation_id: int = kfield(Kind.INT32, default=-1)
    protocol_name: str = kfield(Kind.STRING)
    leader: str = kfield(Kind.STRING)
    member_id: str = kfield(Kind.STRING)
    members: list[JoinGroupResponseMember] = kfield(Array(JoinGroupResponseMember))


@dataclass(slots=True)
class HeartbeatRequest:
    group_id: str = kfield(Kind.STRING)
    generation_id: int = kfield(Kind.INT32)
    member_id: str = kfield(Kind.STRING)
    group_instance_id: str | None = kfield(Kind.STRING, "3+", nullable="3+", default=None)


@dataclass(slots=True)
class HeartbeatResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    error_code: int = kfield(Kind.INT16)


@dataclass(slots=True)
class LeaveGroupMember:
    member_id: str = kfield(Kind.STRING, "3+")
    group_instance_id: str | None = kfield(Kind.STRING, "3+", nullable="3+", default=None)


@dataclass(slots=True)
class LeaveGroupRequest:
    group_id: str = kfield(Kind.STRING)
    member_id: str = kfield(Kind.STRING, "0-2")
    #: v3+: the members leaving, each by member id or by instance id (KIP-345)
    members: list[LeaveGroupMember] = kfield(Array(LeaveGroupMember), "3+")


@dataclass(slots=True)
class LeaveGroupMemberResponse:
    member_id: str = kfield(Kind.STRING, "3+")
    group_instance_id: str | None = kfield(Kind.STRING, "3+", nullable="3+", default=None)
    error_code: int = kfield(Kind.INT16, "3+")


@dataclass(slots=True)
class LeaveGroupResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    error_code: int = kfield(Kind.INT16)
    members: list[LeaveGroupMemberResponse] = kfield(Array(LeaveGroupMemberResponse), "3+")


@dataclass(slots=True)
class SyncGroupRequestAssignment:
    member_id: str = kfield(Kind.STRING)
    assignment: bytes = kfield(Kind.BYTES)


@dataclass(slots=True)
class SyncGroupRequest:
    group_id: str = kfield(Kind.STRING)
    generation_id: int = kfield(Kind.INT32)
    member_id: str = kfield(Kind.STRING)
    group_instance_id: str | None = kfield(Kind.STRING, "3+", nullable="3+", default=None)
    assignments: list[SyncGroupRequestAssignment] = kfield(Array(SyncGroupRequestAssignment))


@dataclass(slots=True)
class SyncGroupResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    error_code: int = kfield(Kind.INT16)
    assignment: bytes = kfield(Kind.BYTES)


@dataclass(slots=True)
class DescribeGroupsRequest:
    groups: list[str] = kfield(Array(Kind.STRING))
    include_authorized_operations: bool = kfield(Kind.BOOL, "3+")


@dataclass(slots=True)
class DescribedGroupMember:
    member_id: str = kfield(Kind.STRING)
    group_instance_id: str | None = kfield(Kind.STRING, "4+", nullable="4+", default=None)
    client_id: str = kfield(Kind.STRING)
    client_host: str = kfield(Kind.STRING)
    member_metadata: bytes = kfield(Kind.BYTES)
    member_assignment: bytes = kfield(Kind.BYTES)


@dataclass(slots=True)
class DescribedGroup:
    error_code: int = kfield(Kind.INT16)
    group_id: str = kfield(Kind.STRING)
    group_state: str = kfield(Kind.STRING)
    protocol_type: str = kfield(Kind.STRING)
    protocol_data: str = kfield(Kind.STRING)
    members: list[DescribedGroupMember] = kfield(Array(DescribedGroupMember))
    authorized_operations: int = kfield(Kind.INT32, "3+", default=AUTHORIZED_OPERATIONS_OMITTED)


@dataclass(slots=True)
class DescribeGroupsResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    groups: list[DescribedGroup] = kfield(Array(DescribedGroup))


@dataclass(slots=True)
class ListGroupsRequest:
    pass


@dataclass(slots=True)
class ListedGroup:
    group_id: str = kfield(Kind.STRING)
    protocol_type: str = kfield(Kind.STRING)


@dataclass(slots=True)
class ListGroupsResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    error_code: int = kfield(Kind.INT16)
    groups: list[ListedGroup] = kfield(Array(ListedGroup))


@dataclass(slots=True)
class OffsetCommitRequestPartition:
    partition_index: int = kfield(Kind.INT32)
    committed_offset: int = kfield(Kind.INT64)
    committed_leader_epoch: int = kfield(Kind.INT32, "6+", default=-1)
    committed_metadata: str | None = kfield(Kind.STRING, nullable="0+", default=None)


@dataclass(slots=True)
class OffsetCommitRequestTopic:
    name: str = kfield(Kind.STRING)
    partitions: list[OffsetCommitRequestPartition] = kfield(Array(OffsetCommitRequestPartition))


@dataclass(slots=True)
class OffsetCommitRequest:
    group_id: str = kfield(Kind.STRING)
    generation_id: int = kfield(Kind.INT32, "1+", default=-1)
    member_id: str = kfield(Kind.STRING, "1+")
    group_instance_id: str | None = kfield(Kind.STRING, "7+", nullable="7+", default=None)
    retention_time_ms: int = kfield(Kind.INT64, "2-4", default=-1)
    topics: list[OffsetCommitRequestTopic] = kfield(Array(OffsetCommitRequestTopic))


@dataclass(slots=True)
class OffsetCommitResponsePartition:
    partition_index: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)


@dataclass(slots=True)
class OffsetCommitResponseTopic:
    name: str = kfield(Kind.STRING)
    partitions: list[OffsetCommitResponsePartition] = kfield(Array(OffsetCommitResponsePartition))


@dataclass(slots=True)
class OffsetCommitResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "3+")
    topics: list[OffsetCommitResponseTopic] = kfield(Array(OffsetCommitResponseTopic))


@dataclass(slots=True)
class OffsetFetchRequestTopic:
    name: str = kfield(Kind.STRING)
    partition_indexes: list[int] = kfield(Array(Kind.INT32))


@dataclass(slots=True)
class OffsetFetchRequestGroup:
    group_id: str = kfield(Kind.STRING, "8+")
    #: v9: a consumer-protocol member's id and epoch (KIP-848); null and -1 from an admin
    member_id: str | None = kfield(Kind.STRING, "9+", nullable="9+", default=None)
    member_epoch: int = kfield(Kind.INT32, "9+", default=-1)
    #: None = every partition the group has committed
    topics: list[OffsetFetchRequestTopic] | None = kfield(
        Array(OffsetFetchRequestTopic), "8+", nullable="8+", default=None
    )


@dataclass(slots=True)
class OffsetFetchRequest:
    """Up to v7 one group (``group_id``, ``topics``); from v8 several (``groups``, KIP-709)."""

    group_id: str = kfield(Kind.STRING, "0-7")
    #: None (v2+) = every partition the group has committed
    topics: list[OffsetFetchRequestTopic] | None = kfield(
        Array(OffsetFetchRequestTopic), "0-7", nullable="2-7", default=None
    )
    groups: list[OffsetFetchRequestGroup] = kfield(Array(OffsetFetchRequestGroup), "8+")
    #: v7+: transactions' pending offsets; there are none here, so it changes nothing
    require_stable: bool = kfield(Kind.BOOL, "7+")


@dataclass(slots=True)
class OffsetFetchResponsePartition:
    partition_index: int = kfield(Kind.INT32)
    committed_offset: int = kfield(Kind.INT64, default=-1)
    committed_leader_epoch: int = kfield(Kind.INT32, "5+", default=-1)
    metadata: str | None = kfield(Kind.STRING, nullable="0+", default="")
    error_code: int = kfield(Kind.INT16)


@dataclass(slots=True)
class OffsetFetchResponseTopic:
    name: str = kfield(Kind.STRING)
    partitions: list[OffsetFetchResponsePartition] = kfield(Array(OffsetFetchResponsePartition))


@dataclass(slots=True)
class OffsetFetchResponseGroup:
    group_id: str = kfield(Kind.STRING, "8+")
    topics: list[OffsetFetchResponseTopic] = kfield(Array(OffsetFetchResponseTopic), "8+")
    error_code: int = kfield(Kind.INT16, "8+")


@dataclass(slots=True)
class OffsetFetchResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "3+")
    topics: list[OffsetFetchResponseTopic] = kfield(Array(OffsetFetchResponseTopic), "0-7")
    error_code: int = kfield(Kind.INT16, "2-7")
    groups: list[OffsetFetchResponseGroup] = kfield(Array(OffsetFetchResponseGroup), "8+")


@dataclass(slots=True)
class DeleteGroupsRequest:
    groups_names: list[str] = kfield(Array(Kind.STRING))


@dataclass(slots=True)
class DeletableGroupResult:
    group_id: str = kfield(Kind.STRING)
    error_code: int = kfield(Kind.INT16)


@dataclass(slots=True)
class DeleteGroupsResponse:
    throttle_time_ms: int = kfield(Kind.INT32)
    results: list[DeletableGroupResult] = kfield(Array(DeletableGroupResult))


@dataclass(slots=True)
class OffsetDeleteRequestPartition:
    partition_index: int = kfield(Kind.INT32)


@dataclass(slots=True)
class OffsetDeleteRequestTopic:
    name: str = kfield(Kind.STRING)
    partitions: list[OffsetDeleteRequestPartition] = kfield(Array(OffsetDeleteRequestPartition))


@dataclass(slots=True)
class OffsetDeleteRequest:
    group_id: str = kfield(Kind.STRING)
    topics: list[OffsetDeleteRequestTopic] = kfield(Array(OffsetDeleteRequestTopic))


@dataclass(slots=True)
class OffsetDeleteResponsePartition:
    partition_index: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)


@dataclass(slots=True)
class OffsetDeleteResponseTopic:
    name: str = kfield(Kind.STRING)
    partitions: list[OffsetDeleteResponsePartition] = kfield(Array(OffsetDeleteResponsePartition))


@dataclass(slots=True)
class OffsetDeleteResponse:
    # the error before the throttle time, unlike most responses (Kafka's schema)
    error_code: int = kfield(Kind.INT16)
    throttle_time_ms: int = kfield(Kind.INT32)
    topics: list[OffsetDeleteResponseTopic] = kfield(Array(OffsetDeleteResponseTopic))


# --------------------------------------------------------------------------- ConsumerGroupHeartbeat (68)


@dataclass(slots=True)
class HeartbeatTopicPartitions:
    topic_id: bytes = kfield(Kind.UUID)
    partitions: list[int] = kfield(Array(Kind.INT32))


@dataclass(slots=True)
class ConsumerGroupHeartbeatRequest:
    group_id: str = kfield(Kind.STRING)
    member_id: str = kfield(Kind.STRING)
    #: 0 joins, -1 leaves, -2 leaves as a static member that will come back
    member_epoch: int = kfield(Kind.INT32)
    instance_id: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    rack_id: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    #: -1 = unchanged since the last heartbeat
    rebalance_timeout_ms: int = kfield(Kind.INT32, default=-1)
    #: None = unchanged since the last heartbeat (as every nullable field below)
    subscribed_topic_names: list[str] | None = kfield(
        Array(Kind.STRING), nullable="0+", default=None
    )
    subscribed_topic_regex: str | None = kfield(Kind.STRING, "1+", nullable="1+", default=None)
    server_assignor: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    #: the partitions the member owns now
    topic_partitions: list[HeartbeatTopicPartitions] | None = kfield(
        Array(HeartbeatTopicPartitions), nullable="0+", default=None
    )


@dataclass(slots=True)
class HeartbeatAssignment:
    topic_partitions: list[HeartbeatTopicPartitions] = kfield(Array(HeartbeatTopicPartitions))


@dataclass(slots=True)
class ConsumerGroupHeartbeatResponse:
    throttle_time_ms: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    member_id: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    member_epoch: int = kfield(Kind.INT32)
    heartbeat_interval_ms: int = kfield(Kind.INT32)
    #: None = unchanged; else the partitions the member may use now
    assignment: HeartbeatAssignment | None = kfield(HeartbeatAssignment, nullable="0+")


# --------------------------------------------------------------------------- ConsumerGroupDescribe (69)


@dataclass(slots=True)
class ConsumerGroupDescribeRequest:
    group_ids: list[str] = kfield(Array(Kind.STRING))
    include_authorized_operations: bool = kfield(Kind.BOOL)


@dataclass(slots=True)
class DescribedTopicPartitions:
    topic_id: bytes = kfield(Kind.UUID)
    topic_name: str = kfield(Kind.STRING)
    partitions: list[int] = kfield(Array(Kind.INT32))


@dataclass(slots=True)
class DescribedAssignment:
    topic_partitions: list[DescribedTopicPartitions] = kfield(Array(DescribedTopicPartitions))


@dataclass(slots=True)
class ConsumerGroupDescribeMember:
    member_id: str = kfield(Kind.STRING)
    instance_id: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    rack_id: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    member_epoch: int = kfield(Kind.INT32)
    client_id: str = kfield(Kind.STRING)
    client_host: str = kfield(Kind.STRING)
    subscribed_topic_names: list[str] = kfield(Array(Kind.STRING))
    subscribed_topic_regex: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    assignment: DescribedAssignment = kfield(DescribedAssignment)
    target_assignment: DescribedAssignment = kfield(DescribedAssignment)


@dataclass(slots=True)
class ConsumerGroupDescribed:
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    group_id: str = kfield(Kind.STRING)
    group_state: str = kfield(Kind.STRING)
    group_epoch: int = kfield(Kind.INT32)
    assignment_epoch: int = kfield(Kind.INT32)
    assignor_name: str = kfield(Kind.STRING)
    members: list[ConsumerGroupDescribeMember] = kfield(Array(ConsumerGroupDescribeMember))
    authorized_operations: int = kfield(Kind.INT32, default=AUTHORIZED_OPERATIONS_OMITTED)


@dataclass(slots=True)
class ConsumerGroupDescribeResponse:
    throttle_time_ms: int = kfield(Kind.INT32)
    groups: list[ConsumerGroupDescribed] = kfield(Array(ConsumerGroupDescribed))


# --------------------------------------------------------------------------- InitProducerId (22)


@dataclass(slots=True)
class InitProducerIdRequest:
    transactional_id: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    transaction_timeout_ms: int = kfield(Kind.INT32)
    producer_id: int = kfield(Kind.INT64, "3+", default=-1)
    producer_epoch: int = kfield(Kind.INT16, "3+", default=-1)


@dataclass(slots=True)
class InitProducerIdResponse:
    throttle_time_ms: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)
    producer_id: int = kfield(Kind.INT64, default=-1)
    producer_epoch: int = kfield(Kind.INT16, default=-1)


# --------------------------------------------------------------------------- admin (19, 20, 32, 33, 37, 44, 60)


@dataclass(slots=True)
class CreatableReplicaAssignment:
    partition_index: int = kfield(Kind.INT32)
    broker_ids: list[int] = kfield(Array(Kind.INT32))


@dataclass(slots=True)
class CreatableTopicConfig:
    name: str = kfield(Kind.STRING)
    value: str | None = kfield(Kind.STRING, nullable="0+", default=None)


@dataclass(slots=True)
class CreatableTopic:
    name: str = kfield(Kind.STRING)
    num_partitions: int = kfield(Kind.INT32)
    replication_factor: int = kfield(Kind.INT16)
    assignments: list[CreatableReplicaAssignment] = kfield(Array(CreatableReplicaAssignment))
    configs: list[CreatableTopicConfig] = kfield(Array(CreatableTopicConfig))


@dataclass(slots=True)
class CreateTopicsRequest:
    topics: list[CreatableTopic] = kfield(Array(CreatableTopic))
    timeout_ms: int = kfield(Kind.INT32)
    validate_only: bool = kfield(Kind.BOOL, "1+")


@dataclass(slots=True)
class CreatableTopicResult:
    name: str = kfield(Kind.STRING)
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, "1+", nullable="1+", default=None)


@dataclass(slots=True)
class CreateTopicsResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "2+")
    topics: list[CreatableTopicResult] = kfield(Array(CreatableTopicResult))


@dataclass(slots=True)
class DeleteTopicsRequest:
    topic_names: list[str] = kfield(Array(Kind.STRING))
    timeout_ms: int = kfield(Kind.INT32)


@dataclass(slots=True)
class DeletableTopicResult:
    name: str = kfield(Kind.STRING)
    error_code: int = kfield(Kind.INT16)


@dataclass(slots=True)
class DeleteTopicsResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "1+")
    responses: list[DeletableTopicResult] = kfield(Array(DeletableTopicResult))


#: DescribeConfigs resource types
RESOURCE_TOPIC: Final = 2
RESOURCE_BROKER: Final = 4
#: DescribeConfigs config sources
SOURCE_TOPIC: Final = 1
SOURCE_DEFAULT: Final = 5


@dataclass(slots=True)
class DescribeConfigsResource:
    resource_type: int = kfield(Kind.INT8)
    resource_name: str = kfield(Kind.STRING)
    configuration_keys: list[str] | None = kfield(Array(Kind.STRING), nullable="0+")


@dataclass(slots=True)
class DescribeConfigsRequest:
    resources: list[DescribeConfigsResource] = kfield(Array(DescribeConfigsResource))
    include_synonyms: bool = kfield(Kind.BOOL, "1+")
    include_documentation: bool = kfield(Kind.BOOL, "3+")


@dataclass(slots=True)
class DescribeConfigsSynonym:
    name: str = kfield(Kind.STRING)
    value: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    source: int = kfield(Kind.INT8)


@dataclass(slots=True)
class DescribeConfigsResourceResult:
    name: str = kfield(Kind.STRING)
    value: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    read_only: bool = kfield(Kind.BOOL)
    is_default: bool = kfield(Kind.BOOL, "0")
    config_source: int = kfield(Kind.INT8, "1+", default=-1)
    is_sensitive: bool = kfield(Kind.BOOL)
    synonyms: list[DescribeConfigsSynonym] = kfield(Array(DescribeConfigsSynonym), "1+")
    #: 0 = unknown
    config_type: int = kfield(Kind.INT8, "3+")
    documentation: str | None = kfield(Kind.STRING, "3+", nullable="0+", default=None)


@dataclass(slots=True)
class DescribeConfigsResult:
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    resource_type: int = kfield(Kind.INT8)
    resource_name: str = kfield(Kind.STRING)
    configs: list[DescribeConfigsResourceResult] = kfield(Array(DescribeConfigsResourceResult))


@dataclass(slots=True)
class DescribeConfigsResponse:
    throttle_time_ms: int = kfield(Kind.INT32)
    results: list[DescribeConfigsResult] = kfield(Array(DescribeConfigsResult))


@dataclass(slots=True)
class DescribeClusterRequest:
    include_cluster_authorized_operations: bool = kfield(Kind.BOOL)


@dataclass(slots=True)
class DescribeClusterBroker:
    broker_id: int = kfield(Kind.INT32)
    host: str = kfield(Kind.STRING)
    port: int = kfield(Kind.INT32)
    rack: str | None = kfield(Kind.STRING, nullable="0+", default=None)


@dataclass(slots=True)
class DescribeClusterResponse:
    throttle_time_ms: int = kfield(Kind.INT32)
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    cluster_id: str = kfield(Kind.STRING)
    controller_id: int = kfield(Kind.INT32, default=-1)
    brokers: list[DescribeClusterBroker] = kfield(Array(DescribeClusterBroker))
    cluster_authorized_operations: int = kfield(Kind.INT32, default=AUTHORIZED_OPERATIONS_OMITTED)


@dataclass(slots=True)
class CreatePartitionsAssignment:
    broker_ids: list[int] = kfield(Array(Kind.INT32))


@dataclass(slots=True)
class CreatePartitionsTopic:
    name: str = kfield(Kind.STRING)
    #: the new partition count (not the number of partitions to add)
    count: int = kfield(Kind.INT32)
    assignments: list[CreatePartitionsAssignment] | None = kfield(
        Array(CreatePartitionsAssignment), nullable="0+", default=None
    )


@dataclass(slots=True)
class CreatePartitionsRequest:
    topics: list[CreatePartitionsTopic] = kfield(Array(CreatePartitionsTopic))
    timeout_ms: int = kfield(Kind.INT32)
    validate_only: bool = kfield(Kind.BOOL)


@dataclass(slots=True)
class CreatePartitionsTopicResult:
    name: str = kfield(Kind.STRING)
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, nullable="0+", default=None)


@dataclass(slots=True)
class CreatePartitionsResponse:
    throttle_time_ms: int = kfield(Kind.INT32)
    results: list[CreatePartitionsTopicResult] = kfield(Array(CreatePartitionsTopicResult))


@dataclass(slots=True)
class IncrementalAlterableConfig:
    name: str = kfield(Kind.STRING)
    #: ``configs.Operation``: set, delete, append, subtract
    config_operation: int = kfield(Kind.INT8)
    value: str | None = kfield(Kind.STRING, nullable="0+", default=None)


@dataclass(slots=True)
class IncrementalAlterConfigsResource:
    resource_type: int = kfield(Kind.INT8)
    resource_name: str = kfield(Kind.STRING)
    configs: list[IncrementalAlterableConfig] = kfield(Array(IncrementalAlterableConfig))


@dataclass(slots=True)
class IncrementalAlterConfigsRequest:
    resources: list[IncrementalAlterConfigsResource] = kfield(
        Array(IncrementalAlterConfigsResource)
    )
    validate_only: bool = kfield(Kind.BOOL)


@dataclass(slots=True)
class AlterableConfig:
    name: str = kfield(Kind.STRING)
    value: str | None = kfield(Kind.STRING, nullable="0+", default=None)


@dataclass(slots=True)
class AlterConfigsResource:
    resource_type: int = kfield(Kind.INT8)
    resource_name: str = kfield(Kind.STRING)
    configs: list[AlterableConfig] = kfield(Array(AlterableConfig))


@dataclass(slots=True)
class AlterConfigsRequest:
    resources: list[AlterConfigsResource] = kfield(Array(AlterConfigsResource))
    validate_only: bool = kfield(Kind.BOOL)


@dataclass(slots=True)
class AlterConfigsResourceResponse:
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    resource_type: int = kfield(Kind.INT8)
    resource_name: str = kfield(Kind.STRING)


@dataclass(slots=True)
class AlterConfigsResponse:
    """The answer to both AlterConfigs and IncrementalAlterConfigs (the same fields)."""

    throttle_time_ms: int = kfield(Kind.INT32)
    responses: list[AlterConfigsResourceResponse] = kfield(Array(AlterConfigsResourceResponse))


# --------------------------------------------------------------------------- SASL (17, 36)


@dataclass(slots=True)
class SaslHandshakeRequest:
    mechanism: str = kfield(Kind.STRING)


@dataclass(slots=True)
class SaslHandshakeResponse:
    error_code: int = kfield(Kind.INT16)
    mechanisms: list[str] = kfield(Array(Kind.STRING))


@dataclass(slots=True)
class SaslAuthenticateRequest:
    auth_bytes: bytes = kfield(Kind.BYTES)


@dataclass(slots=True)
class SaslAuthenticateResponse:
    error_code: int = kfield(Kind.INT16)
    error_message: str | None = kfield(Kind.STRING, nullable="0+", default=None)
    auth_bytes: bytes = kfield(Kind.BYTES)
    session_lifetime_ms: int = kfield(Kind.INT64, "1+")


# --------------------------------------------------------------------------- OffsetForLeaderEpoch (23)


@dataclass(slots=True)
class OffsetForLeaderPartition:
    partition: int = kfield(Kind.INT32)
    #: the epoch the client knows the leader by (-1: unchecked), fenced like a fetch's
    current_leader_epoch: int = kfield(Kind.INT32, "2+", default=-1)
    leader_epoch: int = kfield(Kind.INT32)


@dataclass(slots=True)
class OffsetForLeaderTopic:
    topic: str = kfield(Kind.STRING)
    partitions: list[OffsetForLeaderPartition] = kfield(Array(OffsetForLeaderPartition))


@dataclass(slots=True)
class OffsetForLeaderEpochRequest:
    replica_id: int = kfield(Kind.INT32, "3+", default=-2)
    topics: list[OffsetForLeaderTopic] = kfield(Array(OffsetForLeaderTopic))


@dataclass(slots=True)
class EpochEndOffset:
    error_code: int = kfield(Kind.INT16)
    partition: int = kfield(Kind.INT32)
    leader_epoch: int = kfield(Kind.INT32, "1+", default=-1)
    end_offset: int = kfield(Kind.INT64, default=-1)


@dataclass(slots=True)
class OffsetForLeaderTopicResult:
    topic: str = kfield(Kind.STRING)
    partitions: list[EpochEndOffset] = kfield(Array(EpochEndOffset))


@dataclass(slots=True)
class OffsetForLeaderEpochResponse:
    throttle_time_ms: int = kfield(Kind.INT32, "2+")
    topics: list[OffsetForLeaderTopicResult] = kfield(Array(OffsetForLeaderTopicResult))


# --------------------------------------------------------------------------- the API table

#: ``flexible_from`` of an API that has no flexible version
NEVER: Final = 0x7FFF


@dataclass(frozen=True, slots=True)
class Api:
    key: ApiKey
    request: type[Any]
    response: type[Any]
    #: the versions this broker serves (a subset of Kafka's valid versions)
    min_version: int
    max_version: int
    #: Kafka's first flexible version of this API
    flexible_from: int

    def flexible(self, version: int) -> bool:
        return version >= self.flexible_from

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def response_header_flexible(self, version: int) -> bool:
        # ApiVersions answers with header v0 in every version (see the module docstring)
        return self.flexible(version) and self.key is not ApiKey.API_VERSIONS


SUPPORTED: Final[dict[int, Api]] = {
    api.key: api
    for api in (
        Api(ApiKey.PRODUCE, ProduceRequest, ProduceResponse, 3, 9, 9),
        Api(ApiKey.FETCH, FetchRequest, FetchResponse, 4, 12, 12),
        # v7 is v6 that may ask for MAX_TIMESTAMP; v8's earliest-local and v9's
        # latest-tiered offsets are not answered
        Api(ApiKey.LIST_OFFSETS, ListOffsetsRequest, ListOffsetsResponse, 1, 7, 6),
        Api(ApiKey.METADATA, MetadataRequest, MetadataResponse, 0, 12, 9),
        Api(ApiKey.API_VERSIONS, ApiVersionsRequest, ApiVersionsResponse, 0, 4, 3),
        # v9 is v8 for the consumer protocol's members (KIP-848): the generation is their epoch
        Api(ApiKey.OFFSET_COMMIT, OffsetCommitRequest, OffsetCommitResponse, 2, 9, 8),
        # v8 fetches several groups at once; v9 adds a consumer-protocol member's epoch
        Api(ApiKey.OFFSET_FETCH, OffsetFetchRequest, OffsetFetchResponse, 1, 9, 6),
        Api(ApiKey.FIND_COORDINATOR, FindCoordinatorRequest, FindCoordinatorResponse, 0, 2, 3),
        Api(ApiKey.JOIN_GROUP, JoinGroupRequest, JoinGroupResponse, 0, 5, 6),
        Api(ApiKey.HEARTBEAT, HeartbeatRequest, HeartbeatResponse, 0, 3, 4),
        # v3: members leave by instance id too (static membership)
        Api(ApiKey.LEAVE_GROUP, LeaveGroupRequest, LeaveGroupResponse, 0, 3, 4),
        Api(ApiKey.SYNC_GROUP, SyncGroupRequest, SyncGroupResponse, 0, 3, 4),
        Api(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest, DescribeGroupsResponse, 0, 4, 5),
        Api(ApiKey.LIST_GROUPS, ListGroupsRequest, ListGroupsResponse, 0, 2, 3),
        Api(ApiKey.DELETE_GROUPS, DeleteGroupsRequest, DeleteGroupsResponse, 0, 1, 2),
        # v0 is its only version, and it has no flexible one
        Api(ApiKey.OFFSET_DELETE, OffsetDeleteRequest, OffsetDeleteResponse, 0, 0, NEVER),
        Api(ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest, InitProducerIdResponse, 0, 4, 2),
        Api(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            OffsetForLeaderEpochRequest,
            OffsetForLeaderEpochResponse,
            0,
            3,
            4,
        ),
        Api(ApiKey.CREATE_TOPICS, CreateTopicsRequest, CreateTopicsResponse, 0, 4, 5),
        Api(ApiKey.DELETE_TOPICS, DeleteTopicsRequest, DeleteTopicsResponse, 0, 3, 4),
        Api(ApiKey.DESCRIBE_CONFIGS, DescribeConfigsRequest, DescribeConfigsResponse, 0, 3, 4),
        Api(ApiKey.DESCRIBE_CLUSTER, DescribeClusterRequest, DescribeClusterResponse, 0, 0, 0),
        Api(ApiKey.CREATE_PARTITIONS, CreatePartitionsRequest, CreatePartitionsResponse, 0, 3, 2),
        Api(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            IncrementalAlterConfigsRequest,
            AlterConfigsResponse,
            0,
            1,
            1,
        ),
        Api(ApiKey.ALTER_CONFIGS, AlterConfigsRequest, AlterConfigsResponse, 0, 2, 2),
        # v0 of the handshake is followed by raw SASL frames outside Kafka's framing: only
        # v1, whose tokens travel in SaslAuthenticate
        Api(ApiKey.SASL_HANDSHAKE, SaslHandshakeRequest, SaslHandshakeResponse, 1, 1, NEVER),
        Api(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 1, 2),
        Api(
            ApiKey.CONSUMER_GROUP_HEARTBEAT,
            ConsumerGroupHeartbeatRequest,
            ConsumerGroupHeartbeatResponse,
            0,
            1,
            0,
        ),
        Api(
            ApiKey.CONSUMER_GROUP_DESCRIBE,
            ConsumerGroupDescribeRequest,
            ConsumerGroupDescribeResponse,
            0,
            0,
            0,
        ),
    )
}


def advertised_versions() -> list[ApiVersion]:
    """What ``ApiVersions`` answers: exactly ``SUPPORTED``."""
    return [ApiVersion(api.key, api.min_version, api.max_version) for api in SUPPORTED.values()]


def decode_request(api: Api, version: int, r: Reader) -> Any:
    """The body of a request whose header has been read (tags included)."""
    # Bytes after the body are ignored, as Kafka's brokers ignore them: librdkafka's
    # all-topics Metadata (v9+) leaves a 4-byte array count slot where a 1-byte null goes.
    return schema.decode_from(r, api.request, version, api.flexible(version))


def encode_response(
    api: Api, version: int, correlation_id: int, body: Any
) -> list[bytes | bytearray | memoryview]:
    """A whole response frame (size prefix, header, body) as buffers to write in order."""
    w = Writer()
    w.int32(0)  # the size, patched below
    encode_response_header(w, correlation_id, api.response_header_flexible(version))
    schema.encode_into(w, body, version, api.flexible(version))
    parts = w.parts()
    size = w.size() - 4
    first = bytearray(parts[0])
    first[0:4] = size.to_bytes(4, "big")
    parts[0] = first
    return parts


def encode_request(
    api: Api, version: int, correlation_id: int, client_id: str | None, body: Any
) -> bytes:
    """A whole request frame, as a client sends it (tests and tools)."""
    w = Writer()
    encode_request_header(
        w, RequestHeader(api.key, version, correlation_id, client_id), api.flexible(version)
    )
    schema.encode_into(w, body, version, api.flexible(version))
    payload = w.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def decode_response(api: Api, version: int, frame: bytes | memoryview) -> tuple[int, Any]:
    """(correlation id, body) of a response frame without its size prefix (tests, tools)."""
    r = Reader(frame)
    correlation_id = r.int32()
    if api.response_header_flexible(version):
        skip_header_tags(r)
    body = schema.decode_from(r, api.response, version, api.flexible(version))
    if r.remaining:
        raise MalformedKafkaRequest(f"{r.remaining} bytes after the {api.key.name} response")
    return correlation_id, body
