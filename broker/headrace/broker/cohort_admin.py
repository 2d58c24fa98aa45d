"""Cohort admin on one broker: describe cohorts, reset their cursors (ops 56 and 58).

A cohort's state is spread over the brokers: each partition's cursor and
delivery gate live with the partition's leader, and its members join every
leader they read from. So each broker answers for the partitions it leads, and
the CLI (``headrace cohorts``) asks every broker in the topology and merges.

Resetting cursors is refused while the cohort has members here (``CohortActive``),
as Kafka refuses to reset a group that is not empty: a live member holds a
delivery position and in-flight records that a cursor moved under it would
contradict. ``dry_run`` checks without changing anything, so the CLI can check
every broker before it changes any.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from headrace.broker.cohorting import CohortRuntime
from headrace.broker.topics import Partition, Role, TopicRegistry
from headrace.cohorts.gates import validate_cohort_name
from headrace.errors import CohortActive, InvalidRequest, OffsetOutOfRange
from headrace.protocol import messages as msg
from headrace.records import batch as rb
from headrace.storage.segment import Segment

#: how much of a segment one timestamp scan reads at a time (batch headers only are parsed)
_SCAN_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CohortAdminView:
    """What cohort admin reads of its broker (``cohort_runtimes.CohortRuntimes`` builds one per request)."""

    broker_id: int
    registry: TopicRegistry
    runtimes: Mapping[tuple[str, str], CohortRuntime]
    #: the lowest offset a reader can get (the object store's, when it holds older ones)
    earliest: Callable[[Partition], int]


def _led(p: Partition) -> bool:
    return p.role is Role.LEADER


def describe_cohorts(broker: CohortAdminView, request: msg.DescribeCohorts) -> dict[str, Any]:
    """Every (topic, cohort) with a cursor or a live runtime on a partition led here."""
    if request.cohort is not None:
        validate_cohort_name(request.cohort)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for name in sorted(broker.registry.topics):
        topic = broker.registry.topics[name]
        led = sorted((p for p in topic.partitions.values() if _led(p)), key=lambda p: p.index)
        cohorts = {c for p in led for c in p.cursors.all()}
        cohorts |= {c for (t, c) in broker.runtimes if t == topic.name}
        for cohort in sorted(cohorts):
            if request.cohort is not None and cohort != request.cohort:
                continue
            runtime = broker.runtimes.get((topic.name, cohort))
            gates = runtime.gates.gates if runtime is not None else {}
            entry = found.setdefault(
                (topic.name, cohort),
                {
                    "topic": topic.name,
                    "cohort": cohort,
                    "members": sorted(runtime.gates.members) if runtime is not None else [],
                    "generation": runtime.gates.generation if runtime is not None else 0,
                    "partitions": [],
                },
            )
            for p in led:
                gate = gates.get(p.index)
                entry["partitions"].append(
                    {
                        "partition": p.index,
                        "cursor": p.cursors.get(cohort),
                        "log_start_offset": broker.earliest(p),
                        "log_end_offset": p.log.next_offset,
                        "high_watermark": p.high_watermark,
                        "holder": gate.holder if gate is not None else None,
                        "gate_state": gate.state.value if gate is not None else "free",
                        "gate_epoch": gate.epoch if gate is not None else 0,
                    }
                )
    return {"broker_id": broker.broker_id, "cohorts": list(found.values())}


def reset_cursors(broker: CohortAdminView, request: msg.ResetCursors) -> dict[str, Any]:
    """Move ``request.cohort``'s cursors on the partitions of ``request.topic`` led here."""
    validate_cohort_name(request.cohort)
    topic = broker.registry.get(request.topic)
    runtime = broker.runtimes.get((topic.name, request.cohort))
    if runtime is not None and runtime.gates.members:
        members = ", ".join(sorted(runtime.gates.members))
        raise CohortActive(
            f"cohort {request.cohort} has live members on broker {broker.broker_id}"
            f" ({members}); stop them before seeking"
        )
    wanted = set(request.partitions) if request.partitions is not None else None
    if wanted is not None:
        unknown = sorted(p for p in wanted if p not in topic.partitions)
        if unknown:
            raise InvalidRequest(f"topic {topic.name} has no partition {unknown[0]}")
    moves: list[tuple[Partition, int | None, int]] = []
    for p in sorted(topic.partitions.values(), key=lambda p: p.index):
        if not _led(p) or (wanted is not None and p.index not in wanted):
            continue
        target = _target_offset(broker, p, request.to, request.value)
        moves.append((p, p.cursors.get(request.cohort), target))
    if not request.dry_run:
        for p, _, target in moves:
            p.cursors.set(request.cohort, target)
    return {
        "broker_id": broker.broker_id,
        "dry_run": request.dry_run,
        "partitions": [
            {"partition": p.index, "previous": previous, "offset": target}
            for p, previous, target in moves
        ],
    }


def _target_offset(broker: CohortAdminView, p: Partition, to: str, value: int | None) -> int:
    earliest = broker.earliest(p)
    if to == "earliest":
        return earliest
    if to == "latest":
        return p.high_watermark
    assert value is not None  # ResetCursors.decode checks it
    if to == "offset":
        if not earliest <= value <= p.log.next_offset:
            raise OffsetOutOfRange(
                f"offset {value} outside [{earliest}, {p.log.next_offset}] of {p.name}"
            )
        return value
    return offset_for_timestamp(p, value, earliest)


def offset_for_timestamp(p: Partition, timestamp_ms: int, earliest: int) -> int:
    """The base offset of the first local batch holding a record at or after ``timestamp_ms``.

    Batch granularity, from batch headers only (no record is decoded). Segments whose
    newest record is older are skipped by their stats. A time before every local record
    gives ``earliest``: the object store may hold records at or after it, and reading a
    few older ones again is better than skipping newer ones. A time after every record
    gives the log end, so the cohort reads only what comes next.
    """
    log = p.log
    for segment in log.segments:
        if 0 <= segment.stats.max_timestamp < timestamp_ms:  # -1: unknown, scan it
            continue
        offset = max(segment.base_offset, log.log_start_offset)
        end = segment.stats.next_offset
        while offset < end:
            data, hint = log.read(offset, _SCAN_CHUNK_BYTES, end)
            if not data or hint is None:
                break
            for _, header in rb.scan(data):
                if header.max_timestamp >= timestamp_ms:
                    before_all = header.first_timestamp > timestamp_ms
                    if before_all and header.base_offset <= log.log_start_offset:
                        return earliest
                    return header.base_offset
            offset = hint.offset
    return log.next_offset


@dataclass(frozen=True, slots=True)
class TimestampedOffset:
    offset: int
    timestamp: int
    #: the epoch of the leader that appended the record's batch
    leader_epoch: int


def offset_of_max_timestamp(p: Partition, below: int) -> TimestampedOffset | None:
    """The first record below offset ``below`` with the largest timestamp in the local log
    (Kafka's ``MAX_TIMESTAMP``, which Kafka also answers from its local log); None when
    there is no record below it.

    Segments are visited largest bound first (their stats' newest timestamp; an unknown
    one is scanned), batches by their headers, and a segment that cannot beat the best
    batch found is skipped. Only that batch is decoded, for its record's exact offset.
    """
    log = p.log
    start = log.log_start_offset
    unknown = 2**63 - 1

    def bound(segment: Segment) -> int:
        newest = segment.stats.max_timestamp
        return newest if newest >= 0 else unknown

    best: tuple[int, int] | None = None  # (max timestamp, base offset) of the best batch
    best_batch = b""
    for segment in sorted(log.segments, key=lambda s: (-bound(s), s.base_offset)):
        if best is not None and (bound(segment), -segment.base_offset) < (best[0], -best[1]):
            continue  # every record in it is older, or as old and later
        offset = max(segment.base_offset, start)
        end = min(segment.stats.next_offset, below)
        while offset < end:
            data, hint = log.read(offset, _SCAN_CHUNK_BYTES, end)
            if not data or hint is None:
                break
            for pos, header in rb.scan(data):
                if header.base_offset >= end:
                    break
                if best is None or (header.max_timestamp, -header.base_offset) > (
                    best[0],
                    -best[1],
                ):
                    best = (header.max_timestamp, header.base_offset)
                    best_batch = bytes(data[pos : pos + header.size])
            offset = hint.offset
    if best is None:
        return None
    decoded = rb.decode(best_batch)
    # the records of the batch below ``below`` (a batch is appended whole, but be exact)
    timestamps = decoded.timestamps[: below - decoded.base_offset]
    newest = max(timestamps)
    return TimestampedOffset(
        decoded.base_offset + timestamps.index(newest), newest, decoded.header.leader_epoch
    )
