"""``compact_partition`` with keep-last-per-key over a DirectoryStore (no Spark): the
objects, their sparse indexes and the manifest it writes, compacting twice."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from headrace.jobs import compact, verify
from headrace.jobs.topics import TopicRef
from headrace.objectstore.directory import DirectoryStore
from headrace.objectstore.errors import ObjectStoreUnavailable
from headrace.records import batch as rb
from headrace.tiered import index, layout
from headrace.tiered.tier import PartitionTier

NOW_MS = 1_800_000_000_000
REF = TopicRef("c1", "default/keyed")
SETTINGS = compact.CompactSettings(
    keep_last_per_key=True, grace_seconds=0, delete_retention_ms=1000
)

Written = list[tuple[int, bytes, bytes, int]]  # offset, key, value, timestamp


def upload(tier: PartitionTier, start: int, keys: list[bytes], values: list[bytes]) -> Written:
    """One object of batches of 4 records from offset ``start``, as a leader uploads it."""
    frames, written = [], []
    for at in range(0, len(keys), 4):
        ks, vs = keys[at : at + 4], values[at : at + 4]
        stamps = [NOW_MS - 5000 + at + i for i in range(len(ks))]  # old: past the retention
        frame = bytearray(rb.encode(vs, keys=ks, timestamps=stamps))
        rb.stamp(frame, start + at, 0)
        frames.append(bytes(frame))
        written.extend(zip(range(start + at, start + at + len(ks)), ks, vs, stamps, strict=True))
    tier.upload(b"".join(frames), 0)
    return written


def kept_by_model(written: Written) -> list[tuple[int, bytes, bytes]]:
    last = {k: o for o, k, _, _ in written}
    return [(o, k, v) for o, k, v, _ in written if last[k] == o and v != b""]


def stored(tier: PartitionTier, start: int) -> list[tuple[int, bytes, bytes]]:
    """What a consumer reading the tier from ``start`` gets."""
    out: list[tuple[int, bytes, bytes]] = []
    offset = start
    while offset <= tier.manifest(refresh=True).checkpoint:
        data = tier.read(offset, 1 << 20)
        for pos, h in rb.scan(data):
            for r in rb.decode(data[pos : pos + h.size]).records(offset):
                assert r.key is not None
                out.append((r.offset, r.key, r.value))
            offset = max(offset, h.next_offset)
    return out


def test_compacting_twice_keeps_the_last_per_key_with_a_usable_index(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "objects")
    tier = PartitionTier(store, REF.partition_prefix(0))
    written: Written = []
    for n in range(4):
        keys = [b"k%d" % ((n * 16 + i) % 7) for i in range(16)]
        values = [b"" if i == 5 else b"v%d" % (n * 16 + i) for i in range(16)]
        written += upload(tier, n * 16, keys, values)
    first = compact.compact_partition(store, REF, 0, SETTINGS, now_ms=NOW_MS)
    assert first.outcome == "compacted" and first.segments_after == 1
    assert first.records_removed == len(written) - len(kept_by_model(written))
    assert stored(tier, 0) == kept_by_model(written)
    # new objects with keys never seen: the second run removes nothing, but its
    # input has the first run's holes, and its output keeps them
    for n in range(4, 6):
        keys = [b"new%d" % (n * 16 + i) for i in range(16)]
        written += upload(tier, n * 16, keys, [b"w"] * 16)
    second = compact.compact_partition(store, REF, 0, SETTINGS, now_ms=NOW_MS)
    assert second.outcome == "compacted" and second.records_removed == 0
    [seg] = tier.manifest(refresh=True).segments
    assert seg.compacted and (seg.base, seg.last) == (0, 95)
    expected = kept_by_model(written)
    for start in range(96):
        assert stored(tier, start) == [r for r in expected if r[0] >= start]
    raw = store.get(layout.index_key_for(seg.key))
    sparse = index.SparseIndex.decode(raw, seg.base, seg.last, seg.size)
    assert (sparse.base, sparse.last, sparse.offsets[0], sparse.positions[0]) == (0, 95, 0, 0)
    report = verify.verify_partition(store, REF, 0, compacted=True)
    assert report.ok, report.to_doc()
    tier.close()


class _StoreThatCannotDelete(DirectoryStore):
    """A store whose deletes fail: it went away right after the manifest swap."""

    def delete_many(self, object_keys: Iterable[str]) -> None:
        raise ObjectStoreUnavailable("the store is down")

    def delete(self, key: str) -> None:
        raise ObjectStoreUnavailable(f"{key}: the store is down")


def test_old_objects_that_cannot_be_deleted_are_left_as_orphans_and_the_job_succeeds(
    tmp_path: Path,
) -> None:
    store = _StoreThatCannotDelete(tmp_path / "objects")
    tier = PartitionTier(store, REF.partition_prefix(0))
    written: Written = []
    for n in range(3):
        written += upload(tier, n * 8, [b"k%d" % i for i in range(8)], [b"v%d" % n] * 8)
    result = compact.compact_partition(
        store, REF, 0, compact.CompactSettings(grace_seconds=0), now_ms=NOW_MS
    )
    # the manifest was swapped: readers get everything from the merged object
    assert result.outcome.startswith("compacted; some of 6 unlisted objects were not deleted")
    assert result.objects_deleted == 0 and result.deleted == []
    assert len(tier.manifest(refresh=True).segments) == 1
    assert [(o, k, v) for o, k, v, _ in written] == stored(tier, 0)
    # and the old objects are still there, which verification reports as orphans
    report = verify.verify_partition(store, REF, 0)
    orphans = {f.key for f in report.findings if f.kind == "orphan-object"}
    assert len(orphans) == 3, report.findings  # the three old segments (indexes not listed)
