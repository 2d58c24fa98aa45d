"""The orphan sweep of one topic's objects (adapter: I/O through an ObjectStore).

Order of work, so that a listed object is never deleted:

1. **List** everything under the topic's prefix, with each object's last write.
2. **Read** each partition's manifest, after the listing: an object an upload
   or compaction listed in between counts as listed.
3. **Classify** (``tiered.orphans``, pure): unlisted segment and index objects
   older than the grace period are orphans, unless a snapshot of the topic lists
   them (its documents are read after the listing too): those are pinned.
4. With ``apply`` only: per partition, read the manifest again and ``stat``
   each orphan; one listed again (the same range uploaded anew) or written
   again since step 1 is kept, and so are a cursors' copy or lock whose
   partition has a manifest by now, and any object a snapshot taken since
   pins. Then delete the rest.

A dry run (the default) only reports. The grace period must exceed the
longest upload round (objects put, manifest not yet) and a compaction's run
(new objects written before its swap): an hour by default.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from headrace.jobs.topics import TopicRef, read_manifest
from headrace.objectstore.errors import ObjectNotFound
from headrace.objectstore.interface import ObjectStore
from headrace.tiered import layout, pins
from headrace.tiered.orphans import (
    PartitionSweep,
    StoredObject,
    Verdict,
    classify,
    is_swept_kind,
    listed_keys,
)

#: unlisted objects younger than this are never orphans, ms
DEFAULT_GRACE_MS = 3600 * 1000


@dataclass(slots=True)
class SweepReport:
    topic: str
    applied: bool
    grace_ms: int
    partitions: list[PartitionSweep] = field(default_factory=list)
    #: orphans deleted (with ``apply``)
    deleted: list[str] = field(default_factory=list)
    #: orphans found, then kept because step 4 saw them listed or rewritten
    spared: list[str] = field(default_factory=list)

    @property
    def orphans(self) -> list[StoredObject]:
        return [o for p in self.partitions for o in p.orphans]

    def to_doc(self) -> dict[str, Any]:
        def total(verdict: Verdict) -> int:
            return sum(p.counts[verdict] for p in self.partitions)

        return {
            "topic": self.topic,
            "applied": self.applied,
            "graceMs": self.grace_ms,
            "objects": {v.value: total(v) for v in Verdict},
            "orphanBytes": sum(o.size for o in self.orphans),
            "deleted": self.deleted,
            "spared": self.spared,
            "partitions": [p.to_doc() for p in self.partitions],
        }


def sweep_topic(
    store: ObjectStore,
    ref: TopicRef,
    *,
    now_ms: int,
    grace_ms: int = DEFAULT_GRACE_MS,
    apply: bool = False,
) -> SweepReport:
    """Find (and with ``apply``, delete) the orphans under the topic's prefix."""
    by_partition: dict[int, list[StoredObject]] = defaultdict(list)
    for info in store.list(ref.prefix):
        head = info.key[len(ref.prefix) :].partition("/")[0]
        if head.isdigit():
            by_partition[int(head)].append(StoredObject(info.key, info.size, info.modified_ms))
    report = SweepReport(ref.topic, apply, grace_ms)
    pinned = pins.pinned_in(store, ref.prefix)
    for partition in sorted(by_partition):
        prefix = ref.partition_prefix(partition)
        manifest_key = layout.manifest_key(prefix)
        manifest = read_manifest(store, manifest_key) if store.exists(manifest_key) else None
        report.partitions.append(
            classify(prefix, by_partition[partition], manifest, now_ms, grace_ms, pinned)
        )
    if apply:
        for found in report.partitions:
            if found.orphans:
                _delete(store, found, now_ms, grace_ms, report)
    return report


def _delete(
    store: ObjectStore, found: PartitionSweep, now_ms: int, grace_ms: int, report: SweepReport
) -> None:
    manifest_key = layout.manifest_key(found.prefix)
    has_manifest = store.exists(manifest_key)
    listed = listed_keys(read_manifest(store, manifest_key))
    pinned = pins.pinned_for_partition(store, found.prefix)
    doomed: list[str] = []
    for orphan in found.orphans:
        try:
            now = store.stat(orphan.key)
        except ObjectNotFound:
            continue  # gone already
        rewritten = now.modified_ms is None or now_ms - now.modified_ms < grace_ms
        # a first upload landed since: the cursors' copy means something again
        revived = has_manifest and not is_swept_kind(orphan.key[len(found.prefix) :])
        if orphan.key in listed or orphan.key in pinned or rewritten or revived:
            report.spared.append(orphan.key)
        else:
            doomed.append(orphan.key)
    store.delete_many(doomed)
    report.deleted.extend(doomed)
