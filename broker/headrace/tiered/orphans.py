"""Orphans in the tier (pure): segment objects under a partition's prefix that no manifest lists.

Every way a segment object can lose its manifest entry leaves the same thing
behind, an unlisted ``.log`` (and its ``.index``):

- a failed upload: the objects were put, the manifest put failed or never came;
- a fenced upload: a deposed leader put its objects, then lost the conditional
  manifest write to the new leader;
- a compaction's leftovers: the job died between its manifest swap and deleting
  the old objects, or before deleting its new ones when it gave up;
- retention's leftovers: the leader died during the grace period;
- a deleted topic's remains: the broker died while deleting them (no manifest).

An object a topic snapshot lists is *pinned*, never an orphan, until the
snapshot is deleted (``tiered.snapshots``).

An unlisted object is an orphan only once it is older than a grace period: an
upload in flight puts its objects before the manifest, and a compaction writes
its new objects before its swap. Segment and index objects are the orphans;
in a partition with no manifest (a deleted topic's remains) so are the
uploader's copy of the cursors and a compaction lock, which mean nothing
without one: the cursors' copy is clamped to the stored checkpoint on restore,
and that is -1 with no manifest. The manifest and the sealed state are never
swept, nor anything this module does not know.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from headrace.objectstore.keys import validate_key
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest

#: what else a partition's prefix holds (``broker.tier_upload.CURSORS_NAME``,
#: ``jobs.compact.LOCK_NAME``): orphans only where there is no manifest
WITHOUT_MANIFEST_ORPHANS = frozenset({"cursors.json", "compaction.lock"})


class Verdict(enum.Enum):
    #: listed in the manifest (a segment object or the index of one)
    LISTED = "listed"
    #: not a segment or index object: never swept
    OTHER = "other"
    #: unlisted but younger than the grace period (or of unknown age): an upload or
    #: compaction may still list it
    YOUNG = "young"
    #: unlisted by the manifest but listed by a topic snapshot: kept until it is deleted
    PINNED = "pinned"
    #: unlisted and older than the grace period: to be deleted
    ORPHAN = "orphan"


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object of a listing; ``modified_ms`` None when the store does not say."""

    key: str
    size: int
    modified_ms: int | None


@dataclass(slots=True)
class PartitionSweep:
    """What a sweep found under one partition's prefix."""

    prefix: str
    #: whether the partition has a manifest at all (none: a deleted topic's remains, or
    #: a partition whose first upload is in flight)
    has_manifest: bool
    counts: dict[Verdict, int] = field(default_factory=lambda: dict.fromkeys(Verdict, 0))
    sizes: dict[Verdict, int] = field(default_factory=lambda: dict.fromkeys(Verdict, 0))
    orphans: list[StoredObject] = field(default_factory=list)

    def to_doc(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "hasManifest": self.has_manifest,
            "objects": {v.value: self.counts[v] for v in Verdict},
            "bytes": {v.value: self.sizes[v] for v in Verdict},
            "orphans": [o.key for o in self.orphans],
        }


def is_swept_kind(key: str) -> bool:
    """Whether ``key`` names a segment object or a segment's index object."""
    if layout.parse_segment_key(key) is not None:
        return True
    if not key.endswith(layout.INDEX_SUFFIX):
        return False
    stem = key[: -len(layout.INDEX_SUFFIX)] + layout.SEGMENT_SUFFIX
    return layout.parse_segment_key(stem) is not None


def listed_keys(manifest: Manifest) -> frozenset[str]:
    """Every object key the manifest vouches for: its segments and their indexes."""
    keys = {s.key for s in manifest.segments}
    return frozenset(keys | {layout.index_key_for(k) for k in keys})


def classify(
    prefix: str,
    objects: Iterable[StoredObject],
    manifest: Manifest | None,
    now_ms: int,
    grace_ms: int,
    pinned: frozenset[str] = frozenset(),
) -> PartitionSweep:
    """Sort one partition's objects into listed, other, pinned, young and orphan.

    ``manifest``: the partition's manifest, read *after* the listing (so an object
    listed by then is never an orphan); None if it has none. ``pinned``: the keys the
    topic's snapshots list (``tiered.snapshots.pinned_keys``), read after the listing
    too."""
    validate_key(prefix + layout.MANIFEST_NAME)
    if grace_ms < 0:
        raise ValueError(f"grace_ms must be >= 0, not {grace_ms}")
    listed = listed_keys(manifest) if manifest is not None else frozenset()
    found = PartitionSweep(prefix, manifest is not None)
    for obj in objects:
        if not obj.key.startswith(prefix):
            raise ValueError(f"{obj.key!r} is not under {prefix!r}")
        name = obj.key[len(prefix) :]
        if obj.key in listed:
            verdict = Verdict.LISTED
        elif obj.key in pinned:
            verdict = Verdict.PINNED
        elif not (is_swept_kind(name) or (manifest is None and name in WITHOUT_MANIFEST_ORPHANS)):
            verdict = Verdict.OTHER
        elif obj.modified_ms is None or now_ms - obj.modified_ms < grace_ms:
            verdict = Verdict.YOUNG
        else:
            verdict = Verdict.ORPHAN
            found.orphans.append(obj)
        found.counts[verdict] += 1
        found.sizes[verdict] += obj.size
    return found
