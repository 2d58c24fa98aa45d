"""Topic snapshots and restores in an object store (adapter: I/O through the store).

**Take** (``take_snapshot``): for every partition, read the manifest and the
uploader's copy of the cursors, cut at the offset asked for (by default the
stored checkpoint; ``SnapshotNotReady`` if the store does not hold it yet), and
create the snapshot document only if none of that name exists. From then on
its objects are pinned (``tiered.pins``). Last, every listed object is
``stat``'ed: one a deleter removed between the manifest read and the document's
write fails the snapshot (its document is deleted again), so a snapshot that
exists lists only objects that exist.

A consistent cut: the caller asks the brokers for every partition's high
watermark at one moment and passes ``high watermark - 1`` as the cuts, then
retries ``SnapshotNotReady`` until the uploaders have stored that far (at most
one upload interval). Produce never stops. The cursors are the uploader's copy
(``cursors.json``, refreshed at most every 5 s), clamped to the cut: a restored
cohort may see up to those seconds again, never a gap.

**Restore** (``restore_snapshot``): copy the objects into the new incarnation's
prefix (every batch checked: headers, CRCs, offsets; the last object cut to the
snapshot's cut), write its
manifest (only where none exists) and a sealed state that says where the log
continues and the cohorts' cursors: the state an Unload leaves for a partition's
next owner, which reopens it at ``cut + 1`` reading everything below from the
store. Objects are copied, not referenced: see docs/decisions.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from headrace.errors import CorruptBatch, CorruptSegmentObject, HeadraceError
from headrace.jobs.topics import TopicRef, read_manifest, read_sealed
from headrace.objectstore.errors import ObjectNotFound
from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered import index, layout, pins
from headrace.tiered.manifest import InvalidManifest, Manifest, SealedState, SegmentObject
from headrace.tiered.snapshots import (
    SNAPSHOT_SUFFIX,
    SNAPSHOTS_DIR,
    InvalidSnapshot,
    PartitionCut,
    Snapshot,
    SnapshotExists,
    SnapshotNotReady,
    cut_partition,
    refuse_another_snapshot,
    where_stored,
)

#: the uploader's copy of the cursors (``broker.tier_upload.CURSORS_NAME``)
CURSORS_NAME = "cursors.json"


class RestoreRefused(HeadraceError):
    """The restore's target already holds a manifest: a restore only creates."""

    CODE = 86
    retriable = False


class SnapshotNotFound(HeadraceError):
    """No snapshot of that name (in that namespace, or of that topic) is in the store."""

    CODE = 87
    retriable = False


class RestoreNotVerified(HeadraceError):
    """The restore's copy failed the verify job's checks: its topic must not be placed."""

    CODE = 88
    retriable = False

    def __init__(self, message: str, problems: Sequence[str]) -> None:
        super().__init__(message)
        self.problems = list(problems)


#: at the root of a restore's target incarnation: the key of the snapshot it restores,
#: written before anything else, so a restore of another snapshot is refused there
RESTORE_CLAIM_NAME = "restore.json"

#: how long ``take_when_stored`` retries while the uploaders have not stored the cut, s
STORED_TIMEOUT_S = 120.0
#: between two tries: about an upload round's share, s
STORED_RETRY_S = 0.5


def read_cursors(store: ObjectStore, partition_prefix: str) -> dict[str, int]:
    """The uploader's copy of a partition's cursors (none: empty)."""
    try:
        raw = json.loads(store.get(partition_prefix + CURSORS_NAME))
    except ObjectNotFound:
        return {}
    cursors = raw.get("cursors", {}) if isinstance(raw, dict) else {}
    return {str(k): int(v) for k, v in cursors.items() if isinstance(v, int) and v >= 0}


def take_snapshot(
    store: ObjectStore,
    ref: TopicRef,
    name: str,
    partitions: Sequence[int],
    *,
    now_ms: int,
    cuts: Mapping[int, int] | None = None,
) -> Snapshot:
    """Cut every partition of ``partitions`` (at ``cuts[p]``, else the stored checkpoint),
    write the snapshot document and check its objects exist; see the module docstring.

    ``SnapshotNotReady`` (retriable) if a partition's store is behind its cut or an
    object vanished before the pin; ``SnapshotExists`` if the name is taken."""
    parts: list[PartitionCut] = []
    for partition in sorted(set(partitions)):
        prefix = ref.partition_prefix(partition)
        manifest = read_manifest(store, layout.manifest_key(prefix))
        cut = manifest.checkpoint if cuts is None else cuts[partition]
        parts.append(cut_partition(partition, manifest, cut, read_cursors(store, prefix)))
    snap = Snapshot(name, ref.cluster_id, ref.topic, ref.creation_id, now_ms, tuple(parts))
    pins.write_snapshot(store, snap)
    missing = check_objects(store, snap)
    if missing:
        pins.delete_snapshot(store, snap.topic_prefix, name)
        raise SnapshotNotReady(
            f"snapshot {name}: {len(missing)} objects went before they were pinned"
            f" ({missing[0]}...): take it again"
        )
    return snap


def take_when_stored(
    store: ObjectStore,
    ref: TopicRef,
    name: str,
    cuts: Mapping[int, int],
    *,
    timeout_s: float = STORED_TIMEOUT_S,
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    wait: Callable[[float], None] = time.sleep,
) -> Snapshot:
    """``take_snapshot`` at ``cuts`` (``tiered.snapshots.cuts_at`` of one round of high
    watermarks), retried while the uploaders have not stored that far yet (at most an
    upload interval): what ``tier snapshot`` runs, in local mode and in a Job."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return take_snapshot(store, ref, name, sorted(cuts), now_ms=now_ms(), cuts=cuts)
        except SnapshotNotReady:
            if time.monotonic() > deadline:
                raise
            wait(STORED_RETRY_S)  # the next upload round stores more


def take_once(
    store: ObjectStore, ref: TopicRef, name: str, cuts: Mapping[int, int], **options: Any
) -> Snapshot:
    """``take_when_stored``, or the snapshot already written under ``name`` for this
    incarnation: a rerun (a Job's pod retried after the document was written) reports the
    one snapshot instead of failing, and never takes a second."""
    try:
        return take_when_stored(store, ref, name, cuts, **options)
    except SnapshotExists:
        return pins.read_snapshot(store, ref.prefix, name)


def find_snapshot(store: ObjectStore, cluster_id: str, namespace: str, name: str) -> TopicRef:
    """The topic incarnation of the one snapshot called ``name`` in ``namespace`` (a
    TopicRestore names only the snapshot); ``SnapshotNotFound`` if none or several."""
    suffix = f"/{SNAPSHOTS_DIR}{name}{SNAPSHOT_SUFFIX}"
    found = [o.key for o in store.list(f"{cluster_id}/{namespace}/") if o.key.endswith(suffix)]
    if len(found) != 1:
        where = ", ".join(found) if found else "none"
        raise SnapshotNotFound(
            f"snapshot {namespace}/{name}: expected one in the object store, found {where}"
        )
    cluster, topic, creation_id, _ = where_stored(found[0])
    return TopicRef(cluster, topic, creation_id)


def check_objects(store: ObjectStore, snap: Snapshot) -> list[str]:
    """The problems with a snapshot's segment objects in the store: each one missing or
    of another size than listed, by key (empty: every object is there)."""
    problems: list[str] = []
    for part in snap.partitions:
        for seg in part.objects:
            try:
                size = store.stat(seg.key).size
            except ObjectNotFound:
                problems.append(f"{seg.key}: missing")
                continue
            if size != seg.size:
                problems.append(f"{seg.key}: {size} bytes, the snapshot says {seg.size}")
    return problems


@dataclass(slots=True)
class RestoreResult:
    snapshot: str
    target: str
    #: partition -> the offset its log continues at (cut + 1)
    next_offsets: dict[int, int] = field(default_factory=dict)
    objects: int = 0
    bytes: int = 0


def restore_snapshot(
    store: ObjectStore, snap: Snapshot, target: TopicRef, *, now_ms: int
) -> RestoreResult:
    """Copy ``snap`` into the incarnation ``target`` (a new creation id): the same
    offsets, the same cursors. Per partition: objects first, then the manifest (created
    only where none exists), then the sealed state.

    Idempotent: a rerun of a restore that died anywhere (a killed process, a retried
    Job's pod) finishes it with the same objects, manifests, offsets and cursors. A
    partition whose manifest is the one this restore writes (``_written_by_restore``)
    is not copied again, and a sealed state this restore wrote is kept (its time
    too). ``RestoreRefused``, before anything is written, if some partition of the
    target holds any other manifest: a leader has written it, or another restore.

    Before anything else the target is claimed for ``snap`` (``RESTORE_CLAIM_NAME``, a
    conditional create): a target claimed for another snapshot refuses the restore with
    ``RestoreOfAnotherSnapshot`` naming both, before anything is written, even where a
    partition's manifest would pass for this snapshot's."""
    result = RestoreResult(snap.name, target.prefix)
    claim_key = target.prefix + RESTORE_CLAIM_NAME
    claimed = _claimed_by(store, claim_key)
    if claimed is not None:
        refuse_another_snapshot(target.prefix, claimed, snap.key)
    done: dict[int, Manifest] = {}
    for part in snap.partitions:
        prefix = target.partition_prefix(part.partition)
        existing = _existing_manifest(store, prefix)
        if existing is None:
            continue
        if not _written_by_restore(existing, part, prefix):
            raise RestoreRefused(f"{layout.manifest_key(prefix)} exists: restore into a new topic")
        done[part.partition] = existing
    if claimed is None and not store.put_if_version(claim_key, _claim(snap), None):
        # a twin run (a second pod of the Job) claimed it first: fine if for this snapshot
        refuse_another_snapshot(target.prefix, _claimed_by(store, claim_key) or "", snap.key)
    for part in snap.partitions:
        prefix = target.partition_prefix(part.partition)
        manifest = done.get(part.partition)
        if manifest is None:
            copied = [_copy(store, seg, prefix, part.cut) for seg in part.objects]
            manifest = Manifest(tuple(copied), epoch=-1, version=1, retained_from=part.start)
            if not store.put_if_version(layout.manifest_key(prefix), manifest.to_json(), None):
                # a twin run (a second pod of the Job) got there first: fine if it wrote this
                raced = _existing_manifest(store, prefix)
                if raced is None or not _written_by_restore(raced, part, prefix):
                    raise RestoreRefused(
                        f"{layout.manifest_key(prefix)} appeared during the restore"
                    )
                manifest = raced
        _seal(store, snap, part, prefix, now_ms)
        result.next_offsets[part.partition] = part.cut + 1
        result.objects += len(manifest.segments)
        result.bytes += sum(s.size for s in manifest.segments)
    return result


def _claim(snap: Snapshot) -> bytes:
    return json.dumps({"format": 1, "snapshot": snap.key}).encode()


def _claimed_by(store: ObjectStore, claim_key: str) -> str | None:
    """The key of the snapshot whose restore holds the target (None: no claim yet);
    ``InvalidSnapshot`` for a claim that does not parse (no restore writes one)."""
    try:
        raw = store.get(claim_key)
    except ObjectNotFound:
        return None
    try:
        doc = json.loads(raw)
        key = doc["snapshot"] if isinstance(doc, dict) else None
    except (ValueError, KeyError):
        key = None
    if not isinstance(key, str):
        raise InvalidSnapshot(f"{claim_key}: not a restore's claim")
    return key


def _existing_manifest(store: ObjectStore, prefix: str) -> Manifest | None:
    """The target partition's manifest; None if it has none. One that does not parse
    is returned as an empty manifest at epoch 0: it is not a restore's, so it refuses."""
    try:
        raw = store.get(layout.manifest_key(prefix))
    except ObjectNotFound:
        return None
    try:
        return Manifest.from_json(raw)
    except InvalidManifest:
        return Manifest(epoch=0)


def _written_by_restore(manifest: Manifest, part: PartitionCut, prefix: str) -> bool:
    """Whether ``manifest`` is the one a restore of ``part`` writes under ``prefix``:
    untouched since (epoch -1 and version 1: a leader's first write makes them its own),
    from the snapshot's start, listing the snapshot's objects under their restored keys
    (the last one cut at the cut). Sizes are left to the verification that follows."""
    ranges = [(seg.base, min(seg.last, part.cut), seg.compacted) for seg in part.objects]
    expected = [(b, last, layout.segment_key(prefix, b, last), c) for b, last, c in ranges]
    listed = [(s.base, s.last, s.key, s.compacted) for s in manifest.segments]
    stamp = (manifest.epoch, manifest.version, manifest.retained_from)
    return stamp == (-1, 1, part.start) and listed == expected


def _seal(store: ObjectStore, snap: Snapshot, part: PartitionCut, prefix: str, now_ms: int) -> None:
    """Write the restored partition's sealed state, unless this restore wrote it already."""
    sealed = SealedState(
        last_committed_offset=part.cut,
        broker=0,
        epoch=-1,
        time_ms=now_ms,
        moves=1,
        cursors=dict(part.cursors),
        verified=True,
        message=f"restored from snapshot {snap.name} of {snap.topic} ({snap.creation_id})",
    )
    try:
        existing = read_sealed(store, layout.sealed_key(prefix))
    except InvalidManifest:
        existing = None  # torn or foreign: the manifest is this restore's, so is the seal
    if existing is None or replace(existing, time_ms=now_ms) != sealed:
        store.put(layout.sealed_key(prefix), sealed.to_json())


def verify_restore(store: ObjectStore, target: TopicRef, partitions: Sequence[int]) -> list[str]:
    """The verify job's checks (``jobs.verify.verify_partition``: every object there at
    its size, every batch's header and CRC, offsets without gap, the sealed state covered)
    over a restore, run here before its topic is placed: one line per error, [] if none."""
    from headrace.jobs.verify import verify_partition

    problems: list[str] = []
    for partition in partitions:
        result = verify_partition(store, target, partition)
        problems.extend(
            f"partition {partition}: {f.kind} at {f.key}: {f.message}"
            for f in result.findings
            if f.severity == "error"
        )
    return problems


def restore_verified(
    store: ObjectStore, snap: Snapshot, target: TopicRef, *, now_ms: int
) -> RestoreResult:
    """``restore_snapshot``, then ``verify_restore``: ``RestoreNotVerified`` (naming the
    first problems) if the copy is not sound, and its topic must stay unplaced."""
    result = restore_snapshot(store, snap, target, now_ms=now_ms)
    problems = verify_restore(store, target, [p.partition for p in snap.partitions])
    if problems:
        raise RestoreNotVerified(
            f"the restore into {target.prefix} failed verification: {'; '.join(problems[:5])}",
            problems,
        )
    return result


def _copy(store: ObjectStore, seg: SegmentObject, prefix: str, cut: int) -> SegmentObject:
    """Copy one object under ``prefix``, without the batches past ``cut``, checking every
    batch on the way (``CorruptSegmentObject`` naming the key: nothing is copied)."""
    data = store.get(seg.key)
    last = seg.last
    if seg.last > cut:
        kept = [(pos + h.size, h.last_offset) for pos, h in rb.scan(data) if h.last_offset <= cut]
        # a key-compacted object may lack the cut's record itself (compaction dropped it)
        if not kept or (kept[-1][1] != cut and not seg.compacted):
            raise InvalidSnapshot(f"{seg.key}: no batch ends at the cut {cut}")
        data, last = data[: kept[-1][0]], cut
    index_bytes = _checked_index(store, seg, data, last)
    key = layout.segment_key(prefix, seg.base, last)
    store.put(layout.index_key_for(key), index_bytes)
    store.put(key, data)
    return SegmentObject(
        seg.base, last, len(data), key, 0, compacted=seg.compacted, max_timestamp=seg.max_timestamp
    )


def _checked_index(store: ObjectStore, seg: SegmentObject, data: bytes, last: int) -> bytes:
    """Check every batch of ``data`` (headers, CRCs, offsets within ``seg.base..last``,
    contiguous unless key-compacted) and return the index object to store with it."""
    try:
        if not seg.compacted:
            summary = index.summarize(data)
            if (summary.base, summary.last) != (seg.base, last):
                raise CorruptBatch(f"holds offsets {summary.base}..{summary.last}")
            return summary.index.encode()
        expected, end = seg.base, 0
        for pos, header in rb.scan(data):
            rb.check_header(header)
            if header.base_offset < expected or header.last_offset > last:
                raise CorruptBatch(f"batch at byte {pos} holds offset {header.base_offset}")
            if not rb.crc_ok(data, header, pos):
                raise CorruptBatch(f"CRC mismatch in the batch at byte {pos}")
            expected, end = header.next_offset, pos + header.size
        if end != len(data) or end == 0:
            raise CorruptBatch(f"{len(data) - end} bytes at byte {end} are not a whole batch")
    except CorruptBatch as exc:
        raise CorruptSegmentObject(
            f"snapshot object {seg.key}: {exc.message}; the restore copied nothing of it"
        ) from exc
    if last == seg.last:  # offsets with holes: keep the compaction's index, a shortcut
        try:
            return store.get(layout.index_key_for(seg.key))
        except ObjectNotFound:
            pass
    return index.SparseIndex.trivial(seg.base, last, len(data)).encode()
