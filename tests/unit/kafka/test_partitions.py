"""CreatePartitions' checks of a new partition count, in Kafka's order and words."""

from __future__ import annotations

from headrace.kafka.errors import ErrorCode
from headrace.kafka.partitions import Refused, check_new_count


def test_a_grow_within_the_limit_is_valid() -> None:
    assert check_new_count("t", 3, 5, assigned=False, limit=100) is None


def test_fewer_partitions_are_invalid_as_kafka_never_shrinks() -> None:
    refused = check_new_count("t", 3, 2, assigned=False, limit=100)
    assert refused is not None and refused.code == ErrorCode.INVALID_PARTITIONS
    assert "currently has 3 partition(s); 2 would not be an increase" in refused.message


def test_the_same_count_is_invalid_with_kafkas_message() -> None:
    assert check_new_count("t", 3, 3, assigned=False, limit=100) == Refused(
        ErrorCode.INVALID_PARTITIONS, "Topic already has 3 partition(s)."
    )


def test_a_count_over_the_limit_is_invalid() -> None:
    refused = check_new_count("t", 3, 101, assigned=False, limit=100)
    assert refused is not None and refused.code == ErrorCode.INVALID_PARTITIONS


def test_replica_assignments_are_refused() -> None:
    refused = check_new_count("t", 3, 4, assigned=True, limit=100)
    assert refused is not None and refused.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
