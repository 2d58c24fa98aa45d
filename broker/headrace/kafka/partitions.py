"""CreatePartitions' checks of a new partition count, as Kafka's controller makes them (pure).

Kafka only grows a topic: a count below the current one, or equal to it, is
``INVALID_PARTITIONS`` with Kafka's own wording, and explicit replica
assignments are refused because placement here is the controller's. Whether a
valid grow is then carried out is the broker's decision (``Broker.add_partitions``).
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.kafka.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Refused:
    code: ErrorCode
    message: str


def check_new_count(
    topic: str, current: int, asked: int, *, assigned: bool, limit: int
) -> Refused | None:
    """None when growing ``topic`` from ``current`` to ``asked`` partitions is a valid
    request; ``assigned``: the request names replicas for the new partitions."""
    if asked < current:
        return Refused(
            ErrorCode.INVALID_PARTITIONS,
            f"The topic {topic} currently has {current} partition(s); {asked} would not be an"
            " increase (a Kafka topic never shrinks; headrace shrinks topics as a live"
            " repartition through its controller)",
        )
    if asked == current:
        return Refused(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
    if asked > limit:
        return Refused(
            ErrorCode.INVALID_PARTITIONS, f"{asked} partitions is more than the limit of {limit}"
        )
    if assigned:
        return Refused(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "replica assignments are not supported: the controller places replicas",
        )
    return None
