"""``PartitionTier``: one partition's segment objects in an object store (adapter).

The blocking I/O around the pure rules of ``manifest`` (what the manifest
may become), ``index`` (what a segment object holds) and ``layout`` (where
things are). The broker calls it from worker threads (``asyncio.to_thread``);
every method is thread-safe.

Writing (``upload``): the batches are checked first and nothing is uploaded
if any is damaged. Then the index object, the segment object, and last the
manifest, with a conditional write (``put_if_version``: only if the manifest
is still the version read; else read and merge again). A range is durable when
``upload`` returns, not before: until the manifest lists it, no reader will
look at the objects.

Reading (``read``): the manifest says which object holds an offset, its index
object where in the object to start, and ranged GETs of ``readahead_bytes``
fetch the bytes in chunks. Recent chunks stay in a small cache, and a read
that reaches a chunk starts fetching the next ones in the background, so a
sequential catch-up reader mostly finds its bytes already there. Every batch
returned has had its header, CRC and offset continuity checked; a damaged or
truncated object raises ``CorruptSegmentObject`` and its bad bytes are never
returned.

See docs/tiered-storage.md.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass

from headrace.errors import CorruptBatch, CorruptSegmentObject, HeadraceError, OffsetOutOfRange
from headrace.objectstore.errors import ObjectNotFound, ObjectStoreError
from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered import index, layout, pins
from headrace.tiered.manifest import (
    InvalidManifest,
    Manifest,
    SealedState,
    SegmentObject,
)

log = logging.getLogger(__name__)

#: how many index objects a tier keeps parsed (about 1 KiB each)
INDEX_CACHE_ENTRIES = 256


class ManifestConflict(HeadraceError):
    """Other writers kept changing the manifest between this upload's read and its
    conditional put; the objects are uploaded but not listed, so the range is not
    durable yet. Retry."""

    CODE = 82
    retriable = True


@dataclass(slots=True)
class _Chunk:
    """A ``readahead_bytes`` piece of one segment object, fetched or on its way."""

    future: Future[bytes]


class PartitionTier:
    """The tiered storage of one partition: uploads, reads, the sealed state.

    Owns a manifest cache, an index cache and a chunk cache; does not own
    ``store`` (``close`` leaves it open: several tiers share one store).
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        readahead_bytes: int = 8 << 20,
        prefetch_chunks: int = 2,
        cache_chunks: int = 4,
        index_interval_bytes: int = index.DEFAULT_INTERVAL,
        manifest_attempts: int = 5,
        executor: Executor | None = None,
    ) -> None:
        """
        ``prefix``: the partition's prefix from ``layout.partition_prefix``.

        ``readahead_bytes``: size of one ranged GET, in bytes. 8 MiB keeps the
        per-request overhead of S3 (a round trip, signing, a new TCP window)
        under a few percent of the transfer, and a 16 MiB segment object in
        two requests.

        ``prefetch_chunks``: chunks fetched ahead of a reader, in the
        background. Two keep a GET in flight while the reader checks the CRCs
        of the chunk before.

        ``cache_chunks``: chunks kept, most recently used first; at least
        ``prefetch_chunks + 1`` so a prefetched chunk is not evicted before its
        reader gets there. With the defaults, at most 32 MiB per tier.

        ``index_interval_bytes``: spacing of the entries of the index objects
        this tier writes; a reader scans at most this many bytes of batch
        headers to find an offset.

        ``manifest_attempts``: how many times an upload reads the manifest and
        tries its conditional put when other writers keep changing it in between.

        ``executor``: where prefetches run; by default a pool of
        ``prefetch_chunks`` threads of this tier's own. A broker with many
        partitions passes one shared pool.
        """
        if readahead_bytes < rb.HEADER_SIZE:
            raise ValueError(f"readahead_bytes must be >= {rb.HEADER_SIZE}")
        if prefetch_chunks < 0 or cache_chunks < prefetch_chunks + 1:
            raise ValueError("need prefetch_chunks >= 0 and cache_chunks >= prefetch_chunks + 1")
        if manifest_attempts < 1:
            raise ValueError("manifest_attempts must be >= 1")
        self.store = store
        self.prefix = prefix
        self.readahead_bytes = readahead_bytes
        self.prefetch_chunks = prefetch_chunks
        self.cache_chunks = cache_chunks
        self.index_interval_bytes = index_interval_bytes
        self.manifest_attempts = manifest_attempts
        self._manifest_key = layout.manifest_key(prefix)
        self._sealed_key = layout.sealed_key(prefix)
        self._manifest = Manifest()
        self._manifest_loaded = False
        self._manifest_lock = threading.Lock()  # guards the cached manifest
        self._commit_lock = threading.Lock()  # one manifest read-and-conditional-put at a time
        self._cache_lock = threading.Lock()  # guards the chunk and index caches
        #: (object key, object size, chunk number) -> chunk; the size tells a replaced object apart
        self._chunks: OrderedDict[tuple[str, int, int], _Chunk] = OrderedDict()
        self._indexes: OrderedDict[str, index.SparseIndex] = OrderedDict()
        self._own_executor = executor is None
        self._executor = executor
        self._closed = False

    # ------------------------------------------------------------------ manifest

    def manifest(self, refresh: bool = False) -> Manifest:
        """The partition's manifest: cached, re-read from the store if ``refresh``
        or never read yet. A missing manifest is an empty one; a malformed one
        raises ``InvalidManifest`` (it is never mistaken for an empty one)."""
        with self._manifest_lock:
            if self._manifest_loaded and not refresh:
                return self._manifest
        return self._load_manifest()

    def _load_manifest(self) -> Manifest:
        try:
            raw = self.store.get(self._manifest_key)
        except ObjectNotFound:
            fresh = Manifest()
        else:
            try:
                fresh = Manifest.from_json(raw)
            except InvalidManifest as exc:
                raise InvalidManifest(f"{self._manifest_key}: {exc.message}") from exc
        self._remember(fresh)
        return fresh

    def _remember(self, fresh: Manifest) -> None:
        # The last load wins, even if an older copy: what is stored is the truth
        # (a manifest may also be rewritten from scratch), and a read that finds
        # no object in a stale copy loads again anyway.
        with self._manifest_lock:
            self._manifest = fresh
            self._manifest_loaded = True

    # ------------------------------------------------------------------ upload

    def upload(self, data: bytes, epoch: int) -> SegmentObject:
        """Upload whole stamped batches with contiguous offsets as one segment
        object, as the leader at ``epoch``; the range is durable when this returns.

        Raises ``CorruptBatch`` (nothing uploaded) for damaged input,
        ``FencedUploader`` if a newer leader has written the manifest,
        ``ManifestConflict`` if concurrent writers kept dropping the entry, and
        the store's errors. Idempotent: the same range gets the same key and
        bytes, and a range the manifest already lists is not uploaded again.
        """
        summary = index.summarize(data, self.index_interval_bytes)
        key = layout.segment_key(self.prefix, summary.base, summary.last)
        seg = SegmentObject(
            summary.base,
            summary.last,
            summary.size,
            key,
            epoch,
            max_timestamp=summary.max_timestamp,
        )
        stored = self.manifest(refresh=True)
        stored.check_fence(epoch)  # a deposed leader writes no objects at all
        listed = stored.find(key)
        if listed is not None and listed.size == seg.size:
            return listed
        self.store.put(layout.index_key_for(key), summary.index.encode())
        self.store.put(key, data)
        return self._commit(seg, epoch)

    def _commit(self, seg: SegmentObject, epoch: int) -> SegmentObject:
        """List ``seg`` in the manifest with a conditional write: put only if the
        manifest is still the version read (``put_if_version``), else read again.

        So no other writer's entry is ever overwritten (a compaction's swap, a newer
        leader's upload), and a newer leader's write fences this one for good: the
        next read shows its epoch and ``admitting`` raises ``FencedUploader``."""
        with self._commit_lock:
            for attempt in range(1, self.manifest_attempts + 1):
                stored, version = self._load_versioned()
                stored.check_fence(epoch)  # a newer leader wrote it: stop
                listed = stored.find(seg.key)
                if listed is not None and listed.size == seg.size:
                    return listed  # an earlier attempt's put landed, its answer was lost
                updated = stored.admitting(seg, epoch)
                if self.store.put_if_version(self._manifest_key, updated.to_json(), version):
                    self._remember(updated)
                    return seg
                log.info(
                    "%s: changed by another writer since it was read; merging %s again"
                    " (attempt %d of %d)",
                    self._manifest_key,
                    seg.key,
                    attempt,
                    self.manifest_attempts,
                )
        raise ManifestConflict(
            f"{self._manifest_key}: changed by other writers between each of"
            f" {self.manifest_attempts} reads and puts; {seg.key} is not listed yet"
        )

    def trim(
        self, start_of: Callable[[Manifest], int | None], epoch: int
    ) -> tuple[SegmentObject, ...]:
        """Retention: raise the manifest's start to ``start_of(stored manifest)``
        (None: nothing to remove) as the leader at ``epoch``, with the same
        conditional write as an upload. Returns the entries it removed; their
        objects are still in the store, for readers that hold the old manifest
        (``delete_unlisted`` removes them after a grace period).

        ``FencedUploader`` if a newer leader wrote the manifest, ``ManifestConflict``
        if other writers kept changing it."""
        with self._commit_lock:
            for _ in range(self.manifest_attempts):
                stored, version = self._load_versioned()
                stored.check_fence(epoch)
                start = start_of(stored)
                if start is None or start <= stored.retained_from:
                    return ()
                updated = stored.trimmed(start, epoch)
                if self.store.put_if_version(self._manifest_key, updated.to_json(), version):
                    self._remember(updated)
                    return stored.removed_by(updated)
        raise ManifestConflict(
            f"{self._manifest_key}: changed by other writers between each of"
            f" {self.manifest_attempts} reads and puts; retention did not trim it"
        )

    def delete_unlisted(self, segments: Iterable[SegmentObject]) -> list[str]:
        """Delete the objects (and index objects) of ``segments`` that the stored
        manifest does not list and no snapshot of the topic pins; returns the segment
        keys deleted. A key listed again (the same range uploaded anew) is kept, and so
        is a pinned one (deleting its snapshot makes it an orphan for the sweep)."""
        listed = {s.key for s in self.manifest(refresh=True).segments}
        pinned = pins.pinned_for_partition(self.store, self.prefix)
        doomed = [s.key for s in segments if s.key not in listed and s.key not in pinned]
        self.store.delete_many([*doomed, *map(layout.index_key_for, doomed)])
        return doomed

    def _load_versioned(self) -> tuple[Manifest, str | None]:
        """The stored manifest and its version for ``put_if_version`` (missing: empty, None)."""
        try:
            raw, version = self.store.get_versioned(self._manifest_key)
        except ObjectNotFound:
            fresh, found = Manifest(), None
        else:
            try:
                fresh = Manifest.from_json(raw)
            except InvalidManifest as exc:
                raise InvalidManifest(f"{self._manifest_key}: {exc.message}") from exc
            found = version
        self._remember(fresh)
        return fresh, found

    # ------------------------------------------------------------------ read

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``, about ``max_bytes`` of
        them (at least one batch, never beyond the end of the object holding
        ``offset``).

        ``OffsetOutOfRange`` if no object holds ``offset``;
        ``CorruptSegmentObject`` if the first batch is damaged or missing. A
        damaged batch after good ones ends the result before it, so the error
        is raised by the read that starts there.
        """
        seg = self._locate(offset)
        try:
            return self._read_from(seg, offset, max_bytes)
        except ObjectNotFound:
            # Listed in our copy of the manifest, gone from the store: replaced
            # (compaction) since we read it. One more try with a fresh manifest.
            fresh = self.manifest(refresh=True).covering(offset)
            if fresh is None or fresh.key == seg.key:
                raise CorruptSegmentObject(
                    f"{seg.key}: listed in the manifest for offset {offset} but missing"
                    " from the store"
                ) from None
            return self._read_from(fresh, offset, max_bytes)

    def _locate(self, offset: int) -> SegmentObject:
        manifest = self.manifest()
        seg = manifest.covering(offset)
        if seg is None:
            manifest = self.manifest(refresh=True)  # uploads may have landed since
            seg = manifest.covering(offset)
        if seg is None:
            if manifest.start_offset is None:
                stored = "the tier holds no offsets"
            else:
                stored = f"the tier holds {manifest.start_offset}..{manifest.checkpoint}"
                if manifest.gaps():
                    stored += f" (with gaps {list(manifest.gaps())}, up to {manifest.end_offset})"
            raise OffsetOutOfRange(f"offset {offset} is in no segment object: {stored}")
        return seg

    def _read_from(self, seg: SegmentObject, offset: int, max_bytes: int) -> bytes:
        found: list[memoryview] = []
        total = 0
        try:
            expected, pos = self._index(seg).floor(offset)
            while pos < seg.size:
                header = self._header(seg, pos, expected)
                end = pos + header.size
                if header.next_offset <= offset:  # before the wanted batch: skip it
                    pos, expected = end, header.next_offset
                    continue
                if found and total + header.size > max_bytes:
                    break
                body = self._bytes(seg, pos, header.size)
                if not rb.crc_ok(body, header):
                    raise self._corrupt(seg, pos, header.base_offset, "CRC mismatch")
                found.append(body)
                total += header.size
                pos, expected = end, header.next_offset
                if total >= max_bytes:
                    break
            if pos >= seg.size and expected != seg.last + 1 and not seg.compacted:
                raise self._corrupt(
                    seg, pos, expected, f"the object ends before offset {seg.last} it should hold"
                )
        except CorruptSegmentObject:
            self._forget(seg.key)
            if not found:
                raise
            # Return the good batches; the next read starts at the damage and fails.
        self._prefetch_after(seg, pos)
        if len(found) == 1:
            return bytes(found[0])
        return b"".join(found)

    def _header(self, seg: SegmentObject, pos: int, expected: int) -> rb.BatchHeader:
        """The checked header of the batch at ``pos``, which must start at ``expected``."""
        if seg.size - pos < rb.HEADER_SIZE:
            raise self._corrupt(seg, pos, expected, "a partial batch header ends the object")
        header = rb.read_header(self._bytes(seg, pos, rb.HEADER_SIZE))
        try:
            rb.check_header(header)
        except CorruptBatch as exc:
            raise self._corrupt(seg, pos, expected, exc.message) from exc
        # a key-compacted object skips the offsets compaction dropped; offsets still rise
        skipped = seg.compacted and header.base_offset > expected
        if header.base_offset != expected and not skipped:
            raise self._corrupt(seg, pos, expected, f"batch starts at offset {header.base_offset}")
        if header.last_offset > seg.last:
            raise self._corrupt(seg, pos, expected, f"batch runs to offset {header.last_offset}")
        if pos + header.size > seg.size:
            raise self._corrupt(seg, pos, expected, "batch runs past the end of the object")
        return header

    @staticmethod
    def _corrupt(seg: SegmentObject, pos: int, offset: int, what: str) -> CorruptSegmentObject:
        return CorruptSegmentObject(
            f"segment object {seg.key}, offset {offset} (byte {pos}): {what}"
        )

    def _bytes(self, seg: SegmentObject, start: int, length: int) -> memoryview:
        """Bytes ``start .. start + length`` of the object, from cached chunks."""
        size = self.readahead_bytes
        first, last = start // size, (start + length - 1) // size
        if first == last:
            chunk = self._chunk(seg, first)
            at = start - first * size
            return memoryview(chunk)[at : at + length]
        parts = []
        for c in range(first, last + 1):
            chunk = self._chunk(seg, c)
            lo = max(start, c * size) - c * size
            hi = min(start + length, (c + 1) * size) - c * size
            parts.append(memoryview(chunk)[lo:hi])
        return memoryview(b"".join(parts))

    # ------------------------------------------------------------------ chunk cache

    def _chunk(self, seg: SegmentObject, number: int) -> bytes:
        """Chunk ``number`` of the object: cached, being fetched (wait for it), or
        fetched now in this thread."""
        entry, mine = self._claim(seg, number)
        if mine:
            self._fill(seg, number, entry)
        return entry.future.result()

    def _claim(self, seg: SegmentObject, number: int) -> tuple[_Chunk, bool]:
        """The cache entry for a chunk, and whether the caller must fetch it."""
        ck = (seg.key, seg.size, number)
        with self._cache_lock:
            entry = self._chunks.get(ck)
            if entry is not None:
                self._chunks.move_to_end(ck)
                return entry, False
            entry = _Chunk(Future())
            self._chunks[ck] = entry
            while len(self._chunks) > self.cache_chunks:
                self._chunks.popitem(last=False)
            return entry, True

    def _fill(self, seg: SegmentObject, number: int, entry: _Chunk) -> None:
        start = number * self.readahead_bytes
        want = min(self.readahead_bytes, seg.size - start)
        try:
            data = self.store.get_range(seg.key, start, want)
            if len(data) != want:
                raise CorruptSegmentObject(
                    f"segment object {seg.key} is truncated: {start + len(data)} bytes,"
                    f" the manifest says {seg.size}"
                )
        except BaseException as exc:
            # A failed fetch is not cached: the next reader tries again.
            with self._cache_lock:
                ck = (seg.key, seg.size, number)
                if self._chunks.get(ck) is entry:
                    del self._chunks[ck]
            with contextlib.suppress(InvalidStateError):  # cancelled by close()
                entry.future.set_exception(exc)
            return
        with contextlib.suppress(InvalidStateError):
            entry.future.set_result(data)

    def _forget(self, key: str) -> None:
        """Drop an object's cached chunks and index (after finding it damaged: a
        repaired object must be fetched again)."""
        with self._cache_lock:
            for ck in [ck for ck in self._chunks if ck[0] == key]:
                del self._chunks[ck]
            self._indexes.pop(key, None)

    def _prefetch_after(self, seg: SegmentObject, pos: int) -> None:
        """Start fetching the chunks after the one ``pos`` falls in, continuing
        into the next object of the manifest at the end of this one."""
        if self.prefetch_chunks == 0 or self._closed:
            return
        number = min(pos, seg.size - 1) // self.readahead_bytes
        todo: list[tuple[SegmentObject, int]] = []
        for _ in range(self.prefetch_chunks):
            number += 1
            if number * self.readahead_bytes >= seg.size:
                nxt = self.manifest().covering(seg.last + 1)
                if nxt is None:
                    break
                seg, number = nxt, 0
            todo.append((seg, number))
        for target, n in todo:
            entry, mine = self._claim(target, n)
            if mine:
                try:
                    self._pool().submit(self._prefetch, target, n, entry)
                except RuntimeError:  # the pool is shut down: closing
                    entry.future.cancel()
                    self._forget(target.key)

    def _prefetch(self, seg: SegmentObject, number: int, entry: _Chunk) -> None:
        if number == 0:
            try:
                self._index(seg)  # a reader entering this object needs it next
            except ObjectStoreError as exc:
                log.debug("prefetching the index of %s failed: %s", seg.key, exc)
        self._fill(seg, number, entry)

    def _pool(self) -> Executor:
        with self._cache_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=max(1, self.prefetch_chunks), thread_name_prefix="tier-prefetch"
                )
            return self._executor

    # ------------------------------------------------------------------ index cache

    def _index(self, seg: SegmentObject) -> index.SparseIndex:
        with self._cache_lock:
            found = self._indexes.get(seg.key)
            if found is not None:
                self._indexes.move_to_end(seg.key)
                return found
        key = layout.index_key_for(seg.key)
        try:
            parsed = index.SparseIndex.decode(self.store.get(key), seg.base, seg.last, seg.size)
        except (ObjectNotFound, index.InvalidIndex) as exc:
            # Only a shortcut: without it a read scans from the object's start.
            log.warning("%s unusable (%s); reading %s from its start", key, exc, seg.key)
            parsed = index.SparseIndex.trivial(seg.base, seg.last, seg.size)
        with self._cache_lock:
            self._indexes[seg.key] = parsed
            while len(self._indexes) > INDEX_CACHE_ENTRIES:
                self._indexes.popitem(last=False)
        return parsed

    # ------------------------------------------------------------------ sealed state

    def write_sealed(self, state: SealedState) -> None:
        self.store.put(self._sealed_key, state.to_json())

    def read_sealed(self) -> SealedState | None:
        """The sealed state, or None if the partition is not sealed."""
        try:
            raw = self.store.get(self._sealed_key)
        except ObjectNotFound:
            return None
        try:
            return SealedState.from_json(raw)
        except InvalidManifest as exc:
            raise InvalidManifest(f"{self._sealed_key}: {exc.message}") from exc

    def delete_sealed(self) -> None:
        self.store.delete(self._sealed_key)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop prefetching and drop the caches; the store stays open."""
        self._closed = True
        with self._cache_lock:
            executor, self._executor = self._executor, None
            for entry in self._chunks.values():
                entry.future.cancel()  # a fetch that will never run must not be waited for
            self._chunks.clear()
            self._indexes.clear()
        if executor is not None and self._own_executor:
            executor.shutdown(wait=False, cancel_futures=True)
