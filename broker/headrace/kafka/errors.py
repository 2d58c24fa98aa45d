"""Kafka's error codes (the subset this broker answers with) and the mapping from ours (pure).

Codes and names are Kafka's (``org.apache.kafka.common.protocol.Errors``); a
client library maps each to its own exception and decides whether to retry.
"""

from __future__ import annotations

from enum import IntEnum

from headrace import errors as hr


class ErrorCode(IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    FENCED_INSTANCE_ID = 82
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNKNOWN_TOPIC_ID = 100
    FENCED_MEMBER_EPOCH = 110
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    INVALID_REGULAR_EXPRESSION = 128


#: most specific first: subclasses before their bases
_FROM_HEADRACE: tuple[tuple[type[hr.HeadraceError], ErrorCode], ...] = (
    (hr.BatchTooLarge, ErrorCode.MESSAGE_TOO_LARGE),
    (hr.FrameTooLarge, ErrorCode.MESSAGE_TOO_LARGE),
    (hr.InvalidRecordBatch, ErrorCode.INVALID_RECORD),
    (hr.CorruptBatch, ErrorCode.CORRUPT_MESSAGE),
    (hr.UnknownTopic, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (hr.TopicAlreadyExists, ErrorCode.TOPIC_ALREADY_EXISTS),
    (hr.InvalidTopicSpec, ErrorCode.INVALID_TOPIC_EXCEPTION),
    (hr.UnknownPartition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (hr.OffsetOutOfRange, ErrorCode.OFFSET_OUT_OF_RANGE),
    (hr.NotLeader, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (hr.PartitionMoving, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (hr.Redirected, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (hr.StalePartitioningVersion, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (hr.StaleEpoch, ErrorCode.FENCED_LEADER_EPOCH),
    (hr.NotEnoughReplicas, ErrorCode.NOT_ENOUGH_REPLICAS),
    (hr.RequestTimedOut, ErrorCode.REQUEST_TIMED_OUT),
    (hr.StorageError, ErrorCode.KAFKA_STORAGE_ERROR),
    (hr.DuplicateSequence, ErrorCode.DUPLICATE_SEQUENCE_NUMBER),
    (hr.OutOfOrderSequence, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (hr.ProduceDenied, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (hr.ConsumeDenied, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (hr.AccessDenied, ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
    (hr.IllegalSaslState, ErrorCode.ILLEGAL_SASL_STATE),
    (hr.AuthenticationFailed, ErrorCode.SASL_AUTHENTICATION_FAILED),
    (hr.UnsupportedVersion, ErrorCode.UNSUPPORTED_VERSION),
    (hr.MalformedFrame, ErrorCode.INVALID_REQUEST),
    (hr.PolicyViolation, ErrorCode.POLICY_VIOLATION),
    (hr.InvalidRequest, ErrorCode.INVALID_REQUEST),
)


def commit_code_of(exc: BaseException) -> ErrorCode:
    """The code for an offset commit (or group deletion) whose record was not stored, as
    Kafka's coordinator maps it: each one tells the client to retry, or to find the
    coordinator again."""
    code = code_of(exc)
    if code in (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
    ):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    return code


def code_of(exc: BaseException) -> ErrorCode:
    """The Kafka code a client should see for one of our errors."""
    for cls, code in _FROM_HEADRACE:
        if isinstance(exc, cls):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR
