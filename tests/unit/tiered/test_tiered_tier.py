"""PartitionTier against a real DirectoryStore: uploads, reads, fencing, damage."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tiered_batches import boundaries, run

from headrace.errors import CorruptBatch, CorruptSegmentObject, OffsetOutOfRange
from headrace.objectstore.directory import DirectoryStore
from headrace.records import batch as rb
from headrace.tiered import layout
from headrace.tiered.manifest import (
    FencedUploader,
    InvalidManifest,
    Manifest,
    SealedState,
    SegmentObject,
)
from headrace.tiered.tier import ManifestConflict, PartitionTier

PREFIX = layout.partition_prefix("test", "ns/topic", 0)


@pytest.fixture
def store(tmp_path: Path) -> DirectoryStore:
    return DirectoryStore(tmp_path / "objects", fsync=False)


@pytest.fixture
def tier(store: DirectoryStore) -> Iterator[PartitionTier]:
    # Small chunks and index spacing so that a few KiB exercise every path:
    # batches across chunk borders, several index entries, prefetching.
    t = PartitionTier(store, PREFIX, readahead_bytes=4096, index_interval_bytes=2048)
    yield t
    t.close()


def keys(store: DirectoryStore) -> list[str]:
    return [i.key for i in store.list()]


def log_of(counts_per_object: list[list[int]], value_bytes: int = 120) -> list[bytes]:
    """Contiguous objects' worth of batches, offsets continuing from one to the next."""
    out, base = [], 0
    for counts in counts_per_object:
        out.append(run(base, counts, value_bytes))
        base += sum(counts)
    return out


# --------------------------------------------------------------------------- round trips


def test_upload_lists_the_object_and_writes_object_and_index(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    data = run(0, [10, 20, 5])
    seg = tier.upload(data, epoch=1)
    newest = max(h.max_timestamp for _, h in rb.scan(data))
    assert seg == SegmentObject(
        0, 34, len(data), layout.segment_key(PREFIX, 0, 34), 1, max_timestamp=newest
    )
    assert store.get(seg.key) == data
    assert store.exists(layout.index_key(PREFIX, 0, 34))
    stored = Manifest.from_json(store.get(layout.manifest_key(PREFIX)))
    assert stored.segments == (seg,) and stored.epoch == 1
    assert tier.manifest() == stored


def test_reads_from_every_batch_start_and_inside_every_batch_are_exact(
    tier: PartitionTier,
) -> None:
    # batches of very different sizes, one larger than a readahead chunk
    objects = log_of([[3, 1, 40, 7, 2], [90, 1, 1, 12], [5] * 20])
    for data in objects:
        tier.upload(data, epoch=1)
    base = 0
    for data in objects:
        spans = boundaries(data)
        end_of_object = base + sum(n - b for _, b, n in spans)
        for pos, first, nxt in spans:
            for offset in sorted({first, (first + nxt - 1) // 2, nxt - 1}):
                for max_bytes in (1, 700, 5000, 1 << 30):
                    got = tier.read(offset, max_bytes)
                    got_spans = boundaries(got)
                    # starts with the batch holding the offset, byte-identical to the input
                    assert got_spans[0][1] == first
                    assert got == data[pos : pos + len(got)]
                    # never past the object holding the offset
                    assert got_spans[-1][2] <= end_of_object
                    # at least one batch; more only within max_bytes
                    assert len(got_spans) == 1 or len(got) <= max_bytes
                    if max_bytes == 1 << 30:
                        assert got == data[pos:]
        base = end_of_object


def test_a_sequential_reader_gets_the_log_back_byte_for_byte(tier: PartitionTier) -> None:
    objects = log_of([[7] * 30, [13] * 25, [2] * 60])
    for data in objects:
        tier.upload(data, epoch=2)
    everything = b"".join(objects)
    got, offset = [], 0
    while offset <= tier.manifest().checkpoint:
        chunk = tier.read(offset, 1500)
        got.append(chunk)
        offset = boundaries(chunk)[-1][2]
    assert b"".join(got) == everything


def test_a_read_never_spans_two_objects(tier: PartitionTier) -> None:
    a, b = log_of([[5, 5], [5, 5]])
    tier.upload(a, epoch=1)
    tier.upload(b, epoch=1)
    assert tier.read(0, 1 << 30) == a
    assert tier.read(7, 1 << 30) == a[len(a) // 2 :]
    assert tier.read(10, 1 << 30) == b


def test_offsets_outside_the_tier_are_out_of_range(tier: PartitionTier) -> None:
    with pytest.raises(OffsetOutOfRange, match="holds no offsets"):
        tier.read(0, 100)
    tier.upload(run(100, [10, 10]), epoch=1)
    tier.upload(run(150, [10]), epoch=1)  # leaves a gap at 120..149
    for offset in (0, 99, 120, 149, 160, -1):
        with pytest.raises(OffsetOutOfRange, match=r"holds 100\.\.119") as info:
            tier.read(offset, 100)
        assert f"offset {offset} " in info.value.message
    assert "gaps [(120, 149)]" in info.value.message


def test_a_read_above_the_cached_checkpoint_refreshes_the_manifest(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    first, second = log_of([[10], [10]])
    tier.upload(first, epoch=1)
    other = PartitionTier(store, PREFIX)  # another broker, or a restarted one
    assert other.read(0, 1 << 20) == first
    tier.upload(second, epoch=1)
    assert other.manifest().checkpoint == 9  # cached
    assert other.read(10, 1 << 20) == second  # refreshed because 10 was not in it
    assert other.manifest().checkpoint == 19
    other.close()


# --------------------------------------------------------------------------- idempotence


def test_uploading_the_same_range_twice_changes_nothing(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    data = run(0, [10, 10])
    first = tier.upload(data, epoch=1)
    before = store.get(layout.manifest_key(PREFIX))
    again = tier.upload(data, epoch=1)
    assert again == first
    assert store.get(layout.manifest_key(PREFIX)) == before
    # a fresh tier (a restarted uploader, a new leader) gets the same key and bytes
    fresh = PartitionTier(store, PREFIX)
    assert fresh.upload(data, epoch=2) == first
    assert store.get(first.key) == data
    assert len(fresh.manifest(refresh=True).segments) == 1
    fresh.close()


def test_an_upload_whose_manifest_put_failed_can_be_repeated(
    store: DirectoryStore, tmp_path: Path
) -> None:
    flaky = FaultyStore(tmp_path / "objects")
    tier = PartitionTier(flaky, PREFIX)
    data = run(0, [10])

    def fail_before_manifest_put(key: str) -> None:
        raise OSError("disk went away")

    flaky.after_read[layout.manifest_key(PREFIX)] = fail_before_manifest_put
    with pytest.raises(OSError, match="disk went away"):
        tier.upload(data, epoch=1)
    assert tier.manifest(refresh=True).segments == ()  # objects there, range not durable
    flaky.after_read.clear()
    seg = tier.upload(data, epoch=1)
    assert tier.manifest(refresh=True).segments == (seg,)
    tier.close()


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:-5],  # truncated
        lambda d: d[:60] + bytes([d[60] ^ 1]) + d[61:],  # CRC
        lambda d: d + run(100, [3]),  # offsets jump
    ],
    ids=["truncated", "crc", "gap"],
)
def test_damaged_input_is_refused_and_nothing_is_uploaded(
    tier: PartitionTier, store: DirectoryStore, damage: Callable[[bytes], bytes]
) -> None:
    with pytest.raises(CorruptBatch):
        tier.upload(damage(run(0, [10, 10])), epoch=1)
    assert keys(store) == []


def test_a_deposed_leader_is_fenced_and_writes_nothing(store: DirectoryStore) -> None:
    old = PartitionTier(store, PREFIX)
    new = PartitionTier(store, PREFIX)
    a, b, c = log_of([[10], [10], [10]])
    old.upload(a, epoch=5)
    new.upload(b, epoch=6)
    before = keys(store)
    with pytest.raises(FencedUploader, match="epoch 6"):
        old.upload(c, epoch=5)
    assert keys(store) == before
    assert new.manifest(refresh=True).checkpoint == 19
    old.close()
    new.close()


def test_a_malformed_manifest_is_never_overwritten(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    store.put(layout.manifest_key(PREFIX), b'{"format": 1, "segments": "oops"}')
    with pytest.raises(InvalidManifest, match=r"manifest\.json"):
        tier.upload(run(0, [5]), epoch=1)
    assert store.get(layout.manifest_key(PREFIX)) == b'{"format": 1, "segments": "oops"}'


# --------------------------------------------------------------------------- damaged objects


def flip(store: DirectoryStore, key: str, at: int) -> None:
    raw = bytearray(store.get(key))
    raw[at] ^= 0x40
    store.put(key, bytes(raw))


def test_a_flipped_byte_raises_naming_the_object_and_returns_no_bad_records(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    data = run(0, [10, 10, 10, 10])
    seg = tier.upload(data, epoch=1)
    spans = boundaries(data)
    third_pos, third_base, _ = spans[2]
    flip(store, seg.key, third_pos + 100)  # inside the third batch's records
    # Reading before the damage returns only the good batches ...
    got = tier.read(0, 1 << 20)
    assert got == data[:third_pos]
    # ... and the read that starts at the damage fails, naming object and offset.
    for offset in (third_base, third_base + 5):
        with pytest.raises(CorruptSegmentObject) as info:
            tier.read(offset, 1 << 20)
        assert seg.key in info.value.message
        assert f"offset {third_base}" in info.value.message
        assert "CRC mismatch" in info.value.message


def test_a_damaged_header_raises(tier: PartitionTier, store: DirectoryStore) -> None:
    data = run(0, [10, 10])
    seg = tier.upload(data, epoch=1)
    second = boundaries(data)[1][0]
    flip(store, seg.key, second + 16)  # magic of the second batch
    with pytest.raises(CorruptSegmentObject, match="magic"):
        tier.read(10, 1 << 20)
    flip(store, seg.key, second + 16)
    flip(store, seg.key, second + 3)  # its base offset: continuity breaks
    with pytest.raises(CorruptSegmentObject, match="starts at offset"):
        tier.read(10, 1 << 20)


def test_a_truncated_object_raises(tier: PartitionTier, store: DirectoryStore) -> None:
    data = run(0, [10] * 8)
    seg = tier.upload(data, epoch=1)
    store.put(seg.key, data[: len(data) - 500])
    with pytest.raises(CorruptSegmentObject, match="truncated") as info:
        tier.read(79, 1 << 20)
    assert seg.key in info.value.message
    # a cut at a batch border is caught too (the object ends before its last offset)
    cut = boundaries(data)[-1][0]
    store.put(seg.key, data[:cut])
    fresh = PartitionTier(store, PREFIX, readahead_bytes=1 << 20)
    with pytest.raises(CorruptSegmentObject, match="truncated"):
        fresh.read(75, 1 << 20)
    fresh.close()
    # a manifest whose size matches the cut object but whose range does not
    lying = SegmentObject(0, 79, cut, seg.key, 1)
    store.put(layout.manifest_key(PREFIX), Manifest((lying,), 1, 9).to_json())
    store.delete(layout.index_key_for(seg.key))
    fresh = PartitionTier(store, PREFIX)
    with pytest.raises(CorruptSegmentObject, match="ends before offset 79"):
        fresh.read(75, 1 << 20)
    assert fresh.read(0, 1 << 20) == data[:cut]  # what is there is still served
    fresh.close()


def test_a_repaired_object_is_read_again(tier: PartitionTier, store: DirectoryStore) -> None:
    data = run(0, [10, 10])
    seg = tier.upload(data, epoch=1)
    flip(store, seg.key, 100)
    with pytest.raises(CorruptSegmentObject):
        tier.read(0, 1 << 20)
    store.put(seg.key, data)  # e.g. re-uploaded from a replica
    assert tier.read(0, 1 << 20) == data


@pytest.mark.parametrize("index_damage", ["missing", "garbage", "stale"])
def test_reads_work_without_a_usable_index(
    tier: PartitionTier, store: DirectoryStore, index_damage: str
) -> None:
    data = run(0, [10] * 30)
    seg = tier.upload(data, epoch=1)
    index_key = layout.index_key_for(seg.key)
    if index_damage == "missing":
        store.delete(index_key)
    elif index_damage == "garbage":
        store.put(index_key, b"not an index at all, but long enough for a header..")
    else:  # an index of another object under this key
        other = PartitionTier(store, layout.partition_prefix("test", "ns/other", 0))
        store.put(index_key, store.get(layout.index_key_for(other.upload(run(0, [5]), 1).key)))
    pos, first, _ = boundaries(data)[17]
    assert tier.read(first + 3, 1 << 20) == data[pos:]


def test_an_object_replaced_since_the_manifest_was_cached_is_found_again(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    a, b = log_of([[10], [10]])
    seg_a = tier.upload(a, epoch=1)
    seg_b = tier.upload(b, epoch=1)
    assert tier.read(0, 100) == a  # caches the manifest
    # a compaction merges both into one object, swaps the manifest, deletes the old ones
    merged = PartitionTier(store, PREFIX).upload(a + b, epoch=1)
    store.put(layout.manifest_key(PREFIX), Manifest((merged,), 1, 9).to_json())
    for old in (seg_a, seg_b):
        store.delete(old.key)
        store.delete(layout.index_key_for(old.key))
    assert tier.read(10, 1 << 20) == (a + b)[len(a) :]


# --------------------------------------------------------------------------- concurrency


def test_concurrent_uploads_from_one_tier_are_all_listed(tier: PartitionTier) -> None:
    objects = log_of([[4, 4]] * 16)
    errors: list[BaseException] = []

    def upload(data: bytes) -> None:
        try:
            tier.upload(data, epoch=1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(d,)) for d in objects]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    m = tier.manifest(refresh=True)
    assert len(m.segments) == 16 and m.checkpoint == 127 and m.gaps() == ()


class FaultyStore(DirectoryStore):
    """A real DirectoryStore with hooks that run right after a versioned read of a
    given key: a way to interleave another writer between an uploader's read of the
    manifest and its conditional put."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.after_read: dict[str, Callable[[str], None]] = {}

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        try:
            return super().get_versioned(key)
        finally:  # a missing manifest was read too
            hook = self.after_read.get(key)
            if hook is not None:
                hook(key)


def test_a_write_between_read_and_put_is_merged_not_overwritten(tmp_path: Path) -> None:
    store = FaultyStore(tmp_path / "objects")
    tier = PartitionTier(store, PREFIX)
    a, b, c = log_of([[10], [10], [10]])
    seg_a = tier.upload(a, epoch=1)
    manifest_key = layout.manifest_key(PREFIX)
    other = PartitionTier(store, PREFIX)  # another writer at the same epoch
    rounds = []

    def other_writes_once(key: str) -> None:
        if not rounds:
            rounds.append(1)
            rounds.append(other.upload(c, epoch=1))  # lands between our read and our put

    store.after_read[manifest_key] = other_writes_once
    seg_b = tier.upload(b, epoch=1)
    m = tier.manifest(refresh=True)
    assert m.segments == (seg_a, seg_b, rounds[1])


def test_a_newer_leader_writing_between_read_and_put_fences_the_commit(tmp_path: Path) -> None:
    store = FaultyStore(tmp_path / "objects")
    tier = PartitionTier(store, PREFIX)
    a, b, c = log_of([[10], [10], [10]])
    seg_a = tier.upload(a, epoch=1)
    manifest_key = layout.manifest_key(PREFIX)
    newer = PartitionTier(store, PREFIX)
    landed = []

    def newer_leader(key: str) -> None:
        if not landed:
            landed.append(None)  # once: the newer leader's own reads come here too
            landed[0] = newer.upload(b, epoch=2)

    store.after_read[manifest_key] = newer_leader
    with pytest.raises(FencedUploader):
        tier.upload(c, epoch=1)
    stored = tier.manifest(refresh=True)
    assert stored.segments == (seg_a, landed[0]) and stored.epoch == 2
    tier.close()
    newer.close()


def test_endless_interference_ends_in_a_retriable_conflict(tmp_path: Path) -> None:
    store = FaultyStore(tmp_path / "objects")
    tier = PartitionTier(store, PREFIX, manifest_attempts=3)
    tier.upload(run(0, [10]), epoch=1)
    manifest_key = layout.manifest_key(PREFIX)
    other = PartitionTier(store, PREFIX)
    touched = []

    def another_write(key: str) -> None:
        touched.append(1)
        stored = other.manifest(refresh=True)
        store.put(key, stored.merged(Manifest((), 1, stored.version)).to_json())

    store.after_read[manifest_key] = another_write
    with pytest.raises(ManifestConflict, match="3 reads and puts") as info:
        tier.upload(run(10, [10]), epoch=1)
    assert info.value.retriable and len(touched) == 3


# --------------------------------------------------------------------------- sealed state


def test_sealed_state_is_written_read_and_deleted(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    assert tier.read_sealed() is None
    state = SealedState(41, broker=2, epoch=7, time_ms=123, moves=1, cursors={"g": 30})
    tier.write_sealed(state)
    assert store.exists(layout.sealed_key(PREFIX))
    assert tier.read_sealed() == state
    tier.delete_sealed()
    assert tier.read_sealed() is None
    tier.delete_sealed()  # idempotent


def test_a_malformed_sealed_state_names_its_key(tier: PartitionTier, store: DirectoryStore) -> None:
    store.put(layout.sealed_key(PREFIX), b'{"format": 1}')
    with pytest.raises(InvalidManifest, match=r"sealed\.json: lastCommittedOffset: missing"):
        tier.read_sealed()


def test_closing_stops_prefetching_and_leaves_the_store_usable(
    tier: PartitionTier, store: DirectoryStore
) -> None:
    tier.upload(run(0, [10] * 50), epoch=1)
    tier.read(0, 100)  # starts prefetches
    tier.close()
    assert store.exists(layout.manifest_key(PREFIX))
    assert rb.read_header(store.get(layout.segment_key(PREFIX, 0, 499))).base_offset == 0
