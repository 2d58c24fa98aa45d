"""Kafka groups' committed offsets as records of a replicated topic (pure).

In a cluster, a group's coordinator is the leader of one partition of the offsets
topic, ``coordinator_partition(group, N)``, as Kafka places groups on
``__consumer_offsets``. Every commit appends one batch to that partition (one
record per committed partition) and is answered once the high watermark passes
it, so a commit survives the loss of any replica but the last in-sync one, as any
``acks=all`` record does. A new leader of the partition rebuilds its groups'
offsets by replaying it from the start: the last record of a (group, topic,
partition) wins, and a deletion record forgets the group's earlier ones.

Records: the key is the group id (UTF-8); the value a JSON object, either
``{"v": 1, "group", "topic", "partition", "offset", "leaderEpoch", "metadata"}``,
``{"v": 1, "group", "topic", "partition", "deleted": true}`` (OffsetDelete) or
``{"v": 1, "group", "deleted": true}``. A record in another shape is skipped
(``replay`` counts it), never guessed at.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.kafka.groups import Committed
from headrace.records import batch as rb

#: the offsets topic's name (in the default namespace) unless the broker is told another
DEFAULT_OFFSETS_TOPIC: Final = "kafka.group-offsets"
_VERSION: Final = 1

GroupOffsets = dict[tuple[str, int], Committed]


def coordinator_partition(group_id: str, partitions: int) -> int:
    """The partition of the offsets topic that holds ``group_id``'s offsets; its leader
    coordinates the group. CRC-32 of the id, so every broker and release agrees."""
    if partitions <= 0:
        raise ValueError(f"the offsets topic has {partitions} partitions")
    return zlib.crc32(group_id.encode()) % partitions


def commit_batch(group_id: str, offsets: Mapping[tuple[str, int], Committed], now_ms: int) -> bytes:
    """One batch of ``offsets`` (one record per partition, in a stable order)."""
    values = [
        _dump(
            {
                "v": _VERSION,
                "group": group_id,
                "topic": topic,
                "partition": partition,
                "offset": c.offset,
                "leaderEpoch": c.leader_epoch,
                "metadata": c.metadata,
            }
        )
        for (topic, partition), c in sorted(offsets.items())
    ]
    key = group_id.encode()
    return rb.encode(values, keys=[key] * len(values), timestamp_ms=now_ms)


def deletion_batch(group_id: str, now_ms: int) -> bytes:
    """A batch saying ``group_id`` was deleted: replay forgets its earlier offsets."""
    value = _dump({"v": _VERSION, "group": group_id, "deleted": True})
    return rb.encode([value], keys=[group_id.encode()], timestamp_ms=now_ms)


def offsets_deletion_batch(
    group_id: str, partitions: Iterable[tuple[str, int]], now_ms: int
) -> bytes:
    """A batch saying ``group_id``'s offsets of ``partitions`` were deleted (OffsetDelete):
    replay forgets those, and keeps the group's others."""
    values = [
        _dump({"v": _VERSION, "group": group_id, "topic": t, "partition": p, "deleted": True})
        for t, p in sorted(partitions)
    ]
    return rb.encode(values, keys=[group_id.encode()] * len(values), timestamp_ms=now_ms)


@dataclass(slots=True)
class Replayed:
    """Groups rebuilt from a partition of the offsets topic."""

    groups: dict[str, GroupOffsets] = field(default_factory=dict)
    #: records in a shape this release does not read (skipped)
    skipped: int = 0

    def apply(self, values: Iterable[bytes]) -> None:
        """Apply records in log order."""
        for value in values:
            doc = _load(value)
            if doc is None:
                self.skipped += 1
                continue
            group = doc["group"]
            if doc.get("deleted") is True and "topic" in doc:
                try:
                    where = (str(doc["topic"]), int(doc["partition"]))
                except (KeyError, TypeError, ValueError):
                    self.skipped += 1
                    continue
                self.groups.get(group, {}).pop(where, None)
                continue
            if doc.get("deleted") is True:
                self.groups.pop(group, None)
                continue
            try:
                committed = Committed(
                    int(doc["offset"]), int(doc["leaderEpoch"]), str(doc["metadata"])
                )
                where = (str(doc["topic"]), int(doc["partition"]))
            except (KeyError, TypeError, ValueError):
                self.skipped += 1
                continue
            self.groups.setdefault(group, {})[where] = committed


def _dump(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _load(value: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("v") != _VERSION:
        return None
    if not isinstance(doc.get("group"), str):
        return None
    return doc
