"""Topic snapshots (pure): a consistent cut of one topic incarnation's tier, and the pins.

A snapshot names, for every partition, the last offset it keeps (the *cut*), the
segment objects a reader reads from the partition's stored start up to the cut
(the manifest's ``chain``; the last one may hold offsets past the cut, which a
restore leaves out), and the cohorts' cursors, clamped to the cut. The cuts are
taken at one point: every cut is at or below the partition's stored checkpoint,
so the objects already hold every offset of the snapshot and nothing is uploaded
for it (produce never stalls).

The document is immutable and lives next to the partitions it cuts::

    <cluster>/<namespace>/<topic>/<creation id>/snapshots/<name>.json

Its objects are *pinned*: retention in the tier, compaction's deletes and the
orphan sweep keep every object (and its index) that any snapshot of the topic
lists, until the snapshot is deleted. ``pinned_keys`` is what they check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.errors import HeadraceError, InvalidRequest
from headrace.tiered import layout
from headrace.tiered.manifest import FORMAT, InvalidManifest, Manifest, SegmentObject

#: the folder, under a topic incarnation's prefix, that holds its snapshot documents
SNAPSHOTS_DIR: Final = "snapshots/"
SNAPSHOT_SUFFIX: Final = ".json"
#: a Kubernetes object name (RFC 1123 subdomain): a snapshot is named after its resource
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class InvalidSnapshot(InvalidRequest):
    """A snapshot document, name or cut is malformed; the message names the field."""

    CODE = 83


class SnapshotNotReady(HeadraceError):
    """A partition's store does not hold every offset up to the cut yet (its uploader
    has not stored them): retry after an upload round."""

    CODE = 84
    retriable = True


class SnapshotExists(HeadraceError):
    """A snapshot of that name exists already; snapshots are immutable."""

    CODE = 85
    retriable = False


class RestoreOfAnotherSnapshot(HeadraceError):
    """The restore's target is held for a restore of another snapshot: finishing it from
    this one would mix the two. ``holds`` and ``asked`` are the snapshots' keys."""

    CODE = 104
    retriable = False

    def __init__(self, message: str, holds: str = "", asked: str = "") -> None:
        super().__init__(message)
        self.holds = holds
        self.asked = asked


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidSnapshot(
            f"name: {name!r} is not a lower-case RFC 1123 name (a-z, 0-9, '-', '.')"
        )
    return name


def topic_prefix_of(partition_prefix: str) -> str:
    """The topic incarnation's prefix a partition's prefix is under."""
    head, slash, _ = partition_prefix.rstrip("/").rpartition("/")
    if not slash:
        raise ValueError(f"{partition_prefix!r} is not a partition prefix")
    return head + "/"


def snapshots_prefix(topic_prefix: str) -> str:
    return topic_prefix + SNAPSHOTS_DIR


def snapshot_key(topic_prefix: str, name: str) -> str:
    return snapshots_prefix(topic_prefix) + check_name(name) + SNAPSHOT_SUFFIX


def where_stored(key: str) -> tuple[str, str, str, str]:
    """(cluster id, "namespace/topic", creation id, name) of a snapshot document's key
    (``snapshot_key``); the creation id is "" in the legacy layout."""
    head, dirname, tail = key.rpartition("/" + SNAPSHOTS_DIR)
    parts = head.split("/")
    if not dirname or not tail.endswith(SNAPSHOT_SUFFIX) or len(parts) not in (3, 4):
        raise InvalidSnapshot(f"key: {key!r} is not a snapshot document's key")
    creation_id = parts[3] if len(parts) == 4 else ""
    return parts[0], f"{parts[1]}/{parts[2]}", creation_id, tail.removesuffix(SNAPSHOT_SUFFIX)


def refuse_another_snapshot(target: str, holds: str, asked: str) -> None:
    """``RestoreOfAnotherSnapshot`` naming both unless the restore held at ``target``
    (the key of its snapshot, ``holds``) is of the snapshot ``asked``: a rerun."""
    if holds == asked:
        return
    raise RestoreOfAnotherSnapshot(
        f"{target} is held for the restore of snapshot {snapshot_named(holds)}, not of"
        f" snapshot {snapshot_named(asked)}: writing that one would mix the two; finish"
        " the first (run it again), or delete the topic and restore into a new one",
        holds,
        asked,
    )


def snapshot_named(key: str) -> str:
    """``nightly of ns/orders (creation id)`` for a snapshot document's key."""
    try:
        _, topic, creation_id, name = where_stored(key)
    except InvalidSnapshot:
        return repr(key)
    return f"{name} of {topic}" + (f" ({creation_id})" if creation_id else "")


def cuts_at(high_watermarks: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Per partition, the cut of a consistent snapshot from (partition, high watermark)
    reports of one round (any replica's: each is committed): the highest one, less one."""
    cuts: dict[int, int] = {}
    for partition, high_watermark in high_watermarks:
        cuts[partition] = max(cuts.get(partition, -1), high_watermark - 1)
    return cuts


@dataclass(frozen=True, slots=True)
class PartitionCut:
    """One partition of a snapshot: offsets ``start..cut`` (none when ``cut < start``),
    read from ``objects`` in order, and each cohort's next offset to deliver."""

    partition: int
    #: the lowest offset kept (the manifest's start when the cut was taken)
    start: int
    #: the last offset kept; ``start - 1`` for a partition that kept none
    cut: int
    objects: tuple[SegmentObject, ...] = ()
    cursors: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.partition < 0 or self.start < 0 or self.cut < self.start - 1:
            raise InvalidSnapshot(
                f"partition {self.partition}: start {self.start} and cut {self.cut} do not"
                " make a range"
            )
        expected = self.start
        for seg in self.objects:
            if not seg.base <= expected <= seg.last:
                raise InvalidSnapshot(
                    f"partition {self.partition}: {seg.key} does not hold offset {expected}"
                )
            expected = seg.last + 1
        if self.objects and not self.objects[-1].base <= self.cut <= self.objects[-1].last:
            raise InvalidSnapshot(f"partition {self.partition}: the objects do not end at the cut")
        if not self.objects and self.cut >= self.start:
            raise InvalidSnapshot(f"partition {self.partition}: offsets but no objects")
        for name, cursor in self.cursors.items():
            if not name or not 0 <= cursor <= self.cut + 1:
                raise InvalidSnapshot(
                    f"partition {self.partition}: cursor {name!r} = {cursor} is past the cut"
                )

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.objects)

    def to_doc(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "start": self.start,
            "cut": self.cut,
            "objects": [s.to_doc() for s in self.objects],
            "cursors": dict(self.cursors),
        }

    @classmethod
    def from_doc(cls, doc: object) -> PartitionCut:
        if not isinstance(doc, dict):
            raise InvalidSnapshot(f"partition: expected an object, got {type(doc).__name__}")
        try:
            objects = tuple(SegmentObject.from_doc(o) for o in doc["objects"])
            cursors = doc.get("cursors", {})
            if not isinstance(cursors, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in cursors.values()
            ):
                raise InvalidSnapshot(f"cursors: expected name -> offset, got {cursors!r}")
            return cls(int(doc["partition"]), int(doc["start"]), int(doc["cut"]), objects, cursors)
        except KeyError as exc:
            raise InvalidSnapshot(f"partition: {exc.args[0]} is missing") from None
        except (InvalidManifest, TypeError, ValueError) as exc:
            raise InvalidSnapshot(f"partition: {exc}") from exc


def cut_partition(
    partition: int, manifest: Manifest, cut: int, cursors: Mapping[str, int]
) -> PartitionCut:
    """The snapshot of one partition at ``cut`` (its last offset kept).

    ``SnapshotNotReady`` if the manifest's checkpoint is below the cut: the store
    does not hold it all yet. A cut below the stored start keeps no offsets.
    Cursors past the cut come back to ``cut + 1``: the records after it are not
    in the snapshot, so a restored cohort resumes where the restored log ends."""
    if cut > manifest.checkpoint:
        raise SnapshotNotReady(
            f"partition {partition}: the store holds up to offset {manifest.checkpoint},"
            f" not yet up to the cut {cut}"
        )
    start = manifest.start_offset
    if start is None:
        start = manifest.retained_from
    cut = max(cut, start - 1)
    objects = tuple(s for s in manifest.chain() if s.base <= cut)
    clamped = {name: min(cursor, cut + 1) for name, cursor in cursors.items()}
    return PartitionCut(partition, start, cut, objects, clamped)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A sealed, consistent cut of one topic incarnation (immutable once written)."""

    name: str
    cluster_id: str
    topic: str  # "namespace/name"
    creation_id: str
    time_ms: int
    partitions: tuple[PartitionCut, ...]

    def __post_init__(self) -> None:
        check_name(self.name)
        try:
            layout.topic_prefix(self.cluster_id, self.topic, self.creation_id)
        except ValueError as exc:
            raise InvalidSnapshot(f"topic: {exc}") from exc
        numbers = [p.partition for p in self.partitions]
        if numbers != sorted(set(numbers)):
            raise InvalidSnapshot(f"partitions: {numbers} are not distinct and ascending")

    @property
    def topic_prefix(self) -> str:
        return layout.topic_prefix(self.cluster_id, self.topic, self.creation_id)

    @property
    def key(self) -> str:
        return snapshot_key(self.topic_prefix, self.name)

    @property
    def objects(self) -> int:
        return sum(len(p.objects) for p in self.partitions)

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes for p in self.partitions)

    def pinned(self) -> frozenset[str]:
        """Every key this snapshot needs: its segment objects and their indexes."""
        keys = {s.key for p in self.partitions for s in p.objects}
        return frozenset(keys | {layout.index_key_for(k) for k in keys})

    def to_doc(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "clusterId": self.cluster_id,
            "topic": self.topic,
            "creationId": self.creation_id,
            "timeMs": self.time_ms,
            "partitions": [p.to_doc() for p in self.partitions],
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_doc(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> Snapshot:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidSnapshot(f"snapshot is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidSnapshot(f"snapshot: expected an object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT:
            raise InvalidSnapshot(f"format: {doc.get('format')!r} is not {FORMAT}")
        try:
            return cls(
                name=str(doc["name"]),
                cluster_id=str(doc["clusterId"]),
                topic=str(doc["topic"]),
                creation_id=str(doc["creationId"]),
                time_ms=int(doc["timeMs"]),
                partitions=tuple(PartitionCut.from_doc(p) for p in doc["partitions"]),
            )
        except KeyError as exc:
            raise InvalidSnapshot(f"{exc.args[0]}: missing from the snapshot") from None
        except (TypeError, ValueError) as exc:
            raise InvalidSnapshot(f"snapshot: {exc}") from exc


def pinned_keys(snapshots: Iterable[Snapshot]) -> frozenset[str]:
    """Every object key (segment or index) some snapshot lists: never to be deleted."""
    keys: set[str] = set()
    for snap in snapshots:
        keys |= snap.pinned()
    return frozenset(keys)
