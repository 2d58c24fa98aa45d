"""Retention in the tier (pure): where a topic's retention moves the stored log's start.

A topic's ``retention_ms`` and ``retention_bytes`` bound its whole log, the
objects in the store and the local segments not yet stored, as in Kafka's
tiered storage; ``tieredStorage.localRetention*`` bound only the local part
(``broker.topics.topic_log_config``). The rule mirrors local retention
(``storage.bookkeeping.segments_to_delete``): whole objects go, oldest first,
while the log is over its size bound or the object's newest record is older
than the time bound; an object whose age is unknown (``max_timestamp`` -1,
written before it was recorded) stops retention by age there.

The leader applies the answer with ``Manifest.trimmed`` (a conditional write,
fenced at its epoch) and deletes the removed objects after a grace period.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.tiered.manifest import Manifest


@dataclass(frozen=True, slots=True)
class Bounds:
    """A topic's whole-log retention; -1 for either means unbounded."""

    #: records older than this (by their batch's largest timestamp) may go, ms
    retention_ms: int = -1
    #: the log (stored objects plus local bytes not stored yet) may hold this many bytes
    retention_bytes: int = -1


def retained_start(
    manifest: Manifest, bounds: Bounds, now_ms: int, unstored_bytes: int = 0
) -> int | None:
    """The new lowest offset to keep, or None when retention removes nothing.

    ``unstored_bytes``: the local log's bytes above the stored checkpoint (they
    count towards ``retention_bytes`` but are not the tier's to delete). Only
    the chain from the start to the checkpoint is looked at, so the answer is
    always an object boundary at or below ``checkpoint + 1``.
    """
    chain = manifest.chain()
    total = sum(s.size for s in chain) + unstored_bytes
    start: int | None = None
    for seg in chain:
        over_size = bounds.retention_bytes >= 0 and total > bounds.retention_bytes
        too_old = (
            bounds.retention_ms >= 0
            and seg.max_timestamp >= 0
            and now_ms - seg.max_timestamp > bounds.retention_ms
        )
        if not (over_size or too_old):
            break
        start = seg.last + 1
        total -= seg.size
    return start
