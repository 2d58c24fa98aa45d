"""Compaction of one partition's stored segments (adapter: I/O through an ObjectStore).

Order of work, so that a reader never sees a gap or a duplicate:

1. **Plan** (``plan``, pure): walk the manifest's contiguous run from its start
   offset with ``covering`` (so overlapping leftovers of a leadership change are
   read once), and group consecutive objects up to ``target_bytes``. Only groups
   of two or more objects are rewritten: a lone object keeps its key.
2. **Write** each group as one new object ``<base>-<last>.log`` (and its index);
   a group's PUTs run on a background thread while the next group is fetched
   and checked, and all of them have finished before step 3.
   Delete policy: the groups' batches concatenated byte for byte, so offsets,
   epochs and CRCs are kept; ``index.summarize`` re-checks every header, CRC and
   offset before anything is written. Keep-last-per-key (``cleanupPolicy:
   compact``): the records whose key has a later record are dropped, as are
   tombstones (empty value) older than ``delete_retention_ms``; a batch that
   lost records becomes batches of its consecutive kept offsets, stamped with
   their first offset and the batch's epoch (``keyed``: vectorised, no Python
   per record). A group that would keep nothing is left as it is.
3. **Swap the manifest** with a conditional write, plus an epoch check: read it
   with its version (``get_versioned``); if its leader epoch differs from the
   one planned against (a leadership change is in progress) or an old object has
   left it (another compaction), give up (the new objects are deleted, nothing
   else changed). Otherwise put the manifest minus the old objects plus the new
   ones, at the same epoch, *only if it is still that version*
   (``put_if_version``, S3 ``If-Match``); if a leader's upload changed it in
   between, read and merge again. So a leader's entry is never dropped by the
   swap, and the leader's uploads and retention trims are conditional writes
   too, so they never drop ours. Retention that removed an old object first
   makes the swap give up (the object is gone from the manifest).
4. **Grace period**, then re-read the manifest: an old object listed again
   (only a writer that does not use conditional writes could do that) gets the
   swap applied again and another grace period. Only when the manifest
   lists none of them are the old objects (and their indexes) deleted, except
   those a topic snapshot lists (``tiered.pins``): they stay until it is. Readers
   holding the old manifest read the old objects until then; readers that
   re-read get the new ones (the broker's tier re-reads the manifest when an
   object is gone).

A manifest that does not parse raises ``InvalidManifest`` naming its key before
anything is written or deleted. The whole run holds the partition's lock object
(``compaction.lock``, created with a conditional put), so a second compaction of
the partition is refused (``CompactionRefused``) instead of racing this one.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from headrace.errors import CorruptBatch, HeadraceError
from headrace.jobs import keyed
from headrace.jobs.topics import TopicRef, read_manifest, read_manifest_versioned, read_sealed
from headrace.objectstore.errors import ObjectNotFound, ObjectStoreError
from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered import index, layout, pins
from headrace.tiered.manifest import Manifest, SegmentObject
from headrace.tiered.snapshots import InvalidSnapshot

DEFAULT_TARGET_BYTES = 64 << 20
#: concurrent GETs and DELETEs of one partition's task (small objects: round trips dominate)
IO_THREADS = 8
DEFAULT_DELETE_RETENTION_MS = 24 * 3600 * 1000
DEFAULT_GRACE_SECONDS = 30.0
DEFAULT_LOCK_TTL_MS = 3600 * 1000
#: beside the manifest: who compacts the partition now (created with If-None-Match)
LOCK_NAME = "compaction.lock"


@dataclass(frozen=True, slots=True)
class CompactSettings:
    #: merge objects up to this many bytes (the broker uploads at most 64 MiB objects)
    target_bytes: int = DEFAULT_TARGET_BYTES
    #: keep the last record per key (the Topic's ``cleanupPolicy: compact``)
    keep_last_per_key: bool = False
    #: tombstones (records with a key and an empty value) younger than this are kept
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    #: seconds between the manifest swap and deleting the old objects
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    #: times the swap is applied again when a concurrent writer undid it
    swap_attempts: int = 5
    #: a partition's compaction lock older than this is taken over (its holder died)
    lock_ttl_ms: int = DEFAULT_LOCK_TTL_MS


@dataclass(frozen=True, slots=True)
class Piece:
    """One object of a group, read from ``start`` (its base, or later where an
    earlier object already holds the first offsets)."""

    segment: SegmentObject
    start: int


@dataclass(frozen=True, slots=True)
class Group:
    pieces: tuple[Piece, ...]

    @property
    def base(self) -> int:
        return self.pieces[0].start

    @property
    def last(self) -> int:
        return self.pieces[-1].segment.last


@dataclass(slots=True)
class CompactResult:
    partition: int
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    bytes_read: int = 0
    objects_written: int = 0
    objects_deleted: int = 0
    records_removed: int = 0
    #: "compacted", "unchanged", "skipped: <why>" or "fenced: <why>"; "compacted; some of
    #: N unlisted objects were not deleted (...)" when deleting the old ones failed
    outcome: str = "unchanged"
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    #: replaced objects kept because a snapshot lists them (deleted with their snapshot)
    pinned: list[str] = field(default_factory=list)

    def to_doc(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "segmentsBefore": self.segments_before,
            "segmentsAfter": self.segments_after,
            "bytesBefore": self.bytes_before,
            "bytesAfter": self.bytes_after,
            "bytesReclaimed": max(0, self.bytes_before - self.bytes_after),
            "bytesRead": self.bytes_read,
            "objectsWritten": self.objects_written,
            "objectsDeleted": self.objects_deleted,
            "recordsRemoved": self.records_removed,
            "outcome": self.outcome,
            "written": self.written,
            "deleted": self.deleted,
            "pinned": self.pinned,
        }


class CompactionRefused(HeadraceError):
    """Another compaction holds the partition's lock: two at once would race on the manifest."""

    CODE = 90


class CompactionFenced(Exception):
    """The manifest changed under the compaction in a way it must not override."""


def plan(manifest: Manifest, target_bytes: int) -> list[Group]:
    """Groups of consecutive objects (two or more) to merge, pure.

    Only the contiguous run from the start offset to the checkpoint is
    considered; objects after a hole are left alone."""
    chain: list[Piece] = []
    offset = manifest.start_offset
    if offset is None:
        return []
    while offset <= manifest.checkpoint:
        seg = manifest.covering(offset)
        if seg is None:  # cannot happen below the checkpoint
            break
        chain.append(Piece(seg, offset))
        offset = seg.last + 1
    groups: list[Group] = []
    current: list[Piece] = []
    size = 0
    for piece in chain:
        if current and size + piece.segment.size > target_bytes:
            groups.append(Group(tuple(current)))
            current, size = [], 0
        current.append(piece)
        size += piece.segment.size
    if current:
        groups.append(Group(tuple(current)))
    return [g for g in groups if len(g.pieces) >= 2]


def _slice_from(piece: Piece, data: bytes) -> memoryview:
    """The piece's object ``data`` from the batch that starts at ``piece.start``
    (batches before it skipped). In a key-compacted object that offset may be a
    hole (its record dropped): then from the first batch after it."""
    view = memoryview(data)
    start = piece.start
    for pos, header in rb.scan(view):
        if header.last_offset >= start:
            in_hole = piece.segment.compacted and header.base_offset > start
            if header.base_offset != start and not in_hole:
                raise CorruptBatch(
                    f"offset {start} falls inside a batch at byte {pos}: the overlapping"
                    " objects were cut at different batch boundaries"
                )
            return view[pos:]
    return view[len(view) :]


def compact_partition(
    store: ObjectStore,
    ref: TopicRef,
    partition: int,
    settings: CompactSettings,
    *,
    now_ms: int,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda _: None,
) -> CompactResult:
    """Compact one partition; see the module docstring for the order of work.

    Holds the partition's compaction lock throughout; ``CompactionRefused`` if
    another compaction holds it."""
    prefix = ref.partition_prefix(partition)
    lock_key = prefix + LOCK_NAME
    _lock(store, lock_key, now_ms, settings.lock_ttl_ms)
    try:
        return _compact_locked(store, prefix, partition, settings, now_ms, sleep, log)
    finally:
        try:
            store.delete(lock_key)
        except ObjectStoreError as exc:  # must not hide the outcome (or the error) above
            log(
                f"partition {partition}: the lock {lock_key} was not released ({exc}); the"
                f" next compaction takes it over after {settings.lock_ttl_ms // 1000} s"
            )


def _lock(store: ObjectStore, key: str, now_ms: int, ttl_ms: int) -> None:
    """Create the lock object, only if there is none (or take over one older than
    ``ttl_ms``): a conditional create, so two jobs never both get it."""
    mine = json.dumps(
        {"owner": f"{socket.gethostname()}:{os.getpid()}", "startedMs": now_ms}
    ).encode()
    if store.put_if_version(key, mine, None):
        return
    try:
        raw, version = store.get_versioned(key)
    except ObjectNotFound:  # released in between: one more try
        if store.put_if_version(key, mine, None):
            return
        raise CompactionRefused(f"{key}: another compaction took the lock") from None
    try:
        held = json.loads(raw)
        owner, started = str(held["owner"]), int(held["startedMs"])
    except (ValueError, KeyError, TypeError):
        owner, started = "unknown", 0  # unreadable: treat as stale
    if now_ms - started < ttl_ms:
        raise CompactionRefused(
            f"{key}: another compaction ({owner}) holds this partition since {started} ms;"
            f" it is taken over after {ttl_ms // 1000} s"
        )
    if not store.put_if_version(key, mine, version):
        raise CompactionRefused(f"{key}: another compaction took the stale lock over first")


def _compact_locked(
    store: ObjectStore,
    prefix: str,
    partition: int,
    settings: CompactSettings,
    now_ms: int,
    sleep: Callable[[float], None],
    log: Callable[[str], None],
) -> CompactResult:
    manifest_key = layout.manifest_key(prefix)
    manifest = read_manifest(store, manifest_key)
    result = CompactResult(partition)
    result.segments_before = result.segments_after = len(manifest.segments)
    result.bytes_before = result.bytes_after = sum(s.size for s in manifest.segments)
    if read_sealed(store, layout.sealed_key(prefix)) is not None:
        result.outcome = "skipped: the partition is sealed for a move"
        return result
    groups = plan(manifest, settings.target_bytes)
    if not groups:
        return result
    replaced: dict[str, SegmentObject] = {}  # old key -> the old entry
    written: list[SegmentObject] = []
    latest_per_key: keyed.I64 | None = None
    if settings.keep_last_per_key:
        latest_per_key = _latest_offsets(store, groups, result)
    # a group's PUTs (MinIO hashing and writing up to 64 MiB: the slowest step)
    # run on one thread while the next group is fetched and checked; all have
    # finished before the manifest swap below
    with ThreadPoolExecutor(1, thread_name_prefix="compact-put") as uploads:
        pending: list[Future[None]] = []
        for group in groups:
            fetched = _fetch_all(store, [p.segment.key for p in group.pieces], result)
            data = b"".join(_slice_from(p, d) for d, p in zip(fetched, group.pieces, strict=True))
            del fetched
            holes, removed = False, 0
            if latest_per_key is not None:
                kept = _keep_last(
                    data, latest_per_key, now_ms - settings.delete_retention_ms, group
                )
                if kept is None:
                    continue  # nothing would be left: the group stays as it is
                data, removed = kept.data, kept.removed
                sparse = kept.sparse_index(group.base, group.last)
                holes = kept.records != group.last - group.base + 1
            else:
                sparse = index.summarize(data).index  # CorruptBatch: nothing written
            key = layout.segment_key(prefix, group.base, group.last)
            if manifest.find(key) is not None:
                continue  # the same range is already one object
            result.records_removed += removed
            epoch = max(p.segment.epoch for p in group.pieces)
            newest = max(p.segment.max_timestamp for p in group.pieces)
            if min(p.segment.max_timestamp for p in group.pieces) < 0:
                newest = -1  # one piece's age is unknown: so is the whole object's
            new = SegmentObject(
                group.base,
                group.last,
                len(data),
                key,
                epoch,
                compacted=holes,
                max_timestamp=newest,
            )
            pending.append(uploads.submit(_put_object, store, key, data, sparse))
            written.append(new)
            for p in group.pieces:
                replaced[p.segment.key] = p.segment
            log(f"partition {partition}: writing {key} from {len(group.pieces)} objects")
        for upload in pending:
            upload.result()  # an upload failed: raise before anything is swapped
    # leftovers the chain skipped (fully overlapped by objects it read) go too
    if not written:
        return result
    low, high = min(s.base for s in written), max(s.last for s in written)
    for seg in manifest.segments:
        if low <= seg.base and seg.last <= high and seg.key not in {w.key for w in written}:
            replaced.setdefault(seg.key, seg)
    result.written = [s.key for s in written]
    result.objects_written = len(written)
    try:
        final = _swap(
            store, manifest_key, manifest.epoch, replaced, written, settings.swap_attempts
        )
        for _ in range(settings.swap_attempts):
            sleep(settings.grace_seconds)
            again = read_manifest(store, manifest_key)
            listed = {s.key for s in again.segments}
            if not listed & set(replaced) and {w.key for w in written} <= listed:
                final = again
                break
            log(f"partition {partition}: old objects listed again; swapping again")
            final = _swap(
                store, manifest_key, manifest.epoch, replaced, written, settings.swap_attempts
            )
        else:
            raise CompactionFenced("old objects kept reappearing in the manifest")
    except CompactionFenced as exc:
        now_listed = read_manifest(store, manifest_key)
        unlisted = [seg.key for seg in written if now_listed.find(seg.key) is None]
        left = _delete_old(store, prefix, [*unlisted, *map(layout.index_key_for, unlisted)])
        result.outcome = f"fenced: {exc}{left}"
        result.written = []
        result.objects_written = 0
        return result
    keep = {s.key for s in final.segments}
    result.deleted = sorted(k for k in replaced if k not in keep)
    left = _delete_old(store, prefix, [*result.deleted, *map(layout.index_key_for, result.deleted)])
    result.pinned = sorted(k for k in result.deleted if k in _pinned_now(store, prefix))
    result.deleted = [k for k in result.deleted if k not in result.pinned]
    if left:
        log(f"partition {partition}: {left.removeprefix('; ')}")
        result.deleted = []  # which of them went is not known
    result.objects_deleted = len(result.deleted)
    result.segments_after = len(final.segments)
    result.bytes_after = sum(s.size for s in final.segments)
    result.outcome = f"compacted{left}"
    return result


def _delete_old(store: ObjectStore, prefix: str, keys: list[str]) -> str:
    """Delete objects no manifest lists any more and no snapshot pins: '' when all went,
    else what to add to the outcome. The manifest is swapped already, so a failure here
    loses nothing and must not fail the job: the objects stay as orphans, which the
    verify job reports by key. A pinned object stays until its snapshot is deleted."""
    try:
        store.delete_many(pins.unpinned(keys, pins.pinned_for_partition(store, prefix)))
    except (ObjectStoreError, InvalidSnapshot) as exc:
        return f"; some of {len(keys)} unlisted objects were not deleted ({exc}): orphans"
    return ""


def _pinned_now(store: ObjectStore, prefix: str) -> frozenset[str]:
    """The partition's keys snapshots pin, for the report (empty if unreadable: the
    delete above then deleted nothing and said so)."""
    try:
        return pins.pinned_for_partition(store, prefix)
    except (ObjectStoreError, InvalidSnapshot):
        return frozenset()


def _put_object(store: ObjectStore, key: str, data: bytes, sparse: index.SparseIndex) -> None:
    """A new object and its index (the index first, as the broker uploads them)."""
    store.put(layout.index_key_for(key), sparse.encode())
    store.put(key, data)


def _fetch_all(store: ObjectStore, keys: list[str], result: CompactResult) -> list[bytes]:
    """The objects, fetched a few at a time: small objects cost a round trip each."""
    with ThreadPoolExecutor(IO_THREADS) as pool:
        data = list(pool.map(store.get, keys))
    result.bytes_read += sum(map(len, data))
    return data


def _swap(
    store: ObjectStore,
    manifest_key: str,
    planned_epoch: int,
    replaced: dict[str, SegmentObject],
    written: list[SegmentObject],
    attempts: int,
) -> Manifest:
    """Put the manifest without ``replaced`` and with ``written``, conditionally on
    the version read, so that a leader's manifest put in between is never lost."""
    new_keys = {s.key for s in written}
    for _ in range(attempts):
        current, version = read_manifest_versioned(store, manifest_key)
        if current.epoch != planned_epoch:
            raise CompactionFenced(
                f"{manifest_key}: leader epoch changed from {planned_epoch} to {current.epoch}"
            )
        listed = {s.key for s in current.segments}
        if not listed & set(replaced) and new_keys <= listed:
            return current  # applied already (a retried put whose answer was lost)
        if not set(replaced) <= listed | new_keys:
            gone = sorted(set(replaced) - listed)
            raise CompactionFenced(f"{manifest_key}: {gone[0]} was removed by another writer")
        kept = tuple(s for s in current.segments if s.key not in replaced and s.key not in new_keys)
        swapped = Manifest(
            (*kept, *written), current.epoch, current.version + 1, current.retained_from
        )
        if store.put_if_version(manifest_key, swapped.to_json(), version):
            return swapped
        # a leader's upload changed the manifest since our read: merge again
    raise CompactionFenced(f"{manifest_key}: the manifest kept changing ({attempts} attempts)")


# --- keep the last record per key ---


def _latest_offsets(store: ObjectStore, groups: list[Group], result: CompactResult) -> keyed.I64:
    """The offset of the last record of each key across every group (one partition),
    sorted (``keyed.latest_offsets`` over the keys of all of them at once)."""
    keys: list[pa.Array] = []
    offsets: list[keyed.I64] = []
    for group in groups:
        fetched = _fetch_all(store, [p.segment.key for p in group.pieces], result)
        for data, p in zip(fetched, group.pieces, strict=True):
            records = keyed.parse(_slice_from(p, data))
            keys.append(records.keys())
            offsets.append(records.offsets)
        del fetched
    if not keys:
        return np.zeros(0, dtype=np.int64)
    return keyed.latest_offsets(pa.concat_arrays(keys), np.concatenate(offsets))


def _keep_last(
    data: bytes, latest: keyed.I64, tombstone_cutoff_ms: int, group: Group
) -> keyed.Rebuilt | None:
    """The group's batches with only the records to keep (``keyed``: vectorised),
    or None when none would be left."""
    records = keyed.parse(data)
    offsets = records.offsets
    if len(offsets) and (
        offsets[0] < group.base or offsets[-1] > group.last or (np.diff(offsets) <= 0).any()
    ):
        raise CorruptBatch(
            f"the group's objects do not hold rising offsets within {group.base}-{group.last}"
        )
    kept = keyed.rebuild(records, keyed.keep_mask(records, latest, tombstone_cutoff_ms))
    if not kept.data:
        return None
    if kept.batch_offsets[0] < group.base or kept.batch_offsets[-1] > group.last:
        raise CorruptBatch(f"records outside {group.base}-{group.last} in the group's objects")
    return kept
