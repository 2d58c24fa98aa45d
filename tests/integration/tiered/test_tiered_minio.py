"""PartitionTier against a real MinIO: round trips, damaged objects, an outage."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from headrace.errors import CorruptSegmentObject
from headrace.objectstore import minio_store, retrying
from headrace.objectstore.errors import ObjectStoreUnavailable
from headrace.testing.minio import MinioServer
from headrace.tiered import layout
from headrace.tiered.manifest import FencedUploader
from headrace.tiered.tier import PartitionTier
from tests.integration.objectstore.servers import new_bucket
from tests.integration.tiered.batches import boundaries, run

PREFIX = layout.partition_prefix("it", "ns/orders", 3)
KIB = 1 << 10


@pytest.fixture
def store(minio: MinioServer) -> Iterator[minio_store.MinioStore]:
    s = minio_store.MinioStore(minio.settings(new_bucket()))
    yield s
    s.close()


def objects(sizes: list[int], value_bytes: int, seed: int = 1) -> list[bytes]:
    """Contiguous segment objects of about ``sizes`` bytes each, batches of mixed sizes."""
    rng = random.Random(seed)
    out, base = [], 0
    for size in sizes:
        counts: list[int] = []
        while sum(counts) * value_bytes < size:
            counts.append(rng.choice([1, 3, 16, 64, 400]))
        out.append(run(base, counts, value_bytes))
        base += sum(counts)
    return out


def test_a_partition_round_trips_through_minio(store: minio_store.MinioStore) -> None:
    tier = PartitionTier(store, PREFIX, readahead_bytes=256 * KIB, index_interval_bytes=32 * KIB)
    segs = objects([900 * KIB, 1500 * KIB, 300 * KIB], value_bytes=500)
    for data in segs:
        tier.upload(data, epoch=4)
    # a new tier (a new leader, or a reader on another broker) sees what was stored
    reader = PartitionTier(store, PREFIX, readahead_bytes=256 * KIB)
    m = reader.manifest()
    assert [s.size for s in m.segments] == [len(d) for d in segs]
    assert m.checkpoint == boundaries(segs[-1])[-1][2] - 1 and m.gaps() == ()
    # sequential catch-up: chunk borders, object borders, prefetching
    got, offset = [], 0
    while offset <= m.checkpoint:
        part = reader.read(offset, 100 * KIB)
        got.append(part)
        offset = boundaries(part)[-1][2]
    assert b"".join(got) == b"".join(segs)
    # random access, mid-batch offsets included
    rng = random.Random(7)
    for data in segs:
        for pos, first, nxt in rng.sample(boundaries(data), min(10, len(boundaries(data)))):
            offset = rng.randrange(first, nxt)
            part = reader.read(offset, 64 * KIB)
            assert part == data[pos : pos + len(part)]
            assert boundaries(part)[0][1] == first
    reader.close()
    tier.close()


def damage_and_read(
    store: minio_store.MinioStore, damage: Callable[[bytes, list[tuple[int, int, int]]], bytes]
) -> tuple[bytes, list[tuple[int, int, int]], str, PartitionTier]:
    data = run(0, [50] * 40, value_bytes=1000)  # 40 batches of ~50 KB
    tier = PartitionTier(store, PREFIX, readahead_bytes=512 * KIB)
    seg = tier.upload(data, epoch=1)
    spans = boundaries(data)
    store.put(seg.key, damage(data, spans))
    return data, spans, seg.key, PartitionTier(store, PREFIX, readahead_bytes=512 * KIB)


def test_a_flipped_byte_in_minio_is_caught_and_named(store: minio_store.MinioStore) -> None:
    def flip(data: bytes, spans: list[tuple[int, int, int]]) -> bytes:
        out = bytearray(data)
        out[spans[25][0] + 4000] ^= 0x01
        return bytes(out)

    data, spans, key, reader = damage_and_read(store, flip)
    bad_pos, bad_offset, _ = spans[25]
    # everything before the damaged batch is served, the damaged batch never is
    got, offset = b"", 0
    while offset < bad_offset:
        part = reader.read(offset, 300 * KIB)
        got += part
        offset = boundaries(part)[-1][2]
    assert got == data[:bad_pos]
    with pytest.raises(CorruptSegmentObject) as info:
        reader.read(bad_offset + 10, 1 << 20)
    assert key in info.value.message and f"offset {bad_offset}" in info.value.message
    # after the damaged batch the object is readable again (the index skips over it)
    after_pos, after_offset, _ = spans[30]
    assert reader.read(after_offset, 1 << 30) == data[after_pos:]
    reader.close()


def test_a_truncated_object_in_minio_is_caught(store: minio_store.MinioStore) -> None:
    data, spans, key, reader = damage_and_read(store, lambda d, s: d[: len(d) - 70_000])
    last_whole = spans[-3]
    with pytest.raises(CorruptSegmentObject, match="truncated") as info:
        reader.read(last_whole[1], 1 << 30)
    assert key in info.value.message
    part = reader.read(0, 300 * KIB)  # the start of the object is intact and still served
    assert part == data[: len(part)] and len(part) > 0
    reader.close()


class InterruptibleStore(minio_store.MinioStore):
    """A real MinioStore that runs a hook before putting a chosen key (to stop the
    server at an exact step of an upload)."""

    hooks: dict[str, Callable[[], None]]

    def put(self, key: str, data: bytes) -> None:
        hook = self.hooks.pop(key, None)
        if hook is not None:
            hook()
        super().put(key, data)

    def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        hook = self.hooks.pop(key, None)
        if hook is not None:
            hook()
        return super().put_if_version(key, data, version)


@pytest.mark.parametrize("stop_before", ["index", "segment", "manifest", "upload"])
def test_minio_stopped_during_uploads_loses_nothing_and_leaves_no_gap(
    private_minio: MinioServer, stop_before: str
) -> None:
    inner = InterruptibleStore(private_minio.settings(new_bucket()))
    inner.hooks = {}
    store = retrying.RetryingStore(
        inner,
        retrying.Retrier(
            retrying.RetrySettings(attempts=3, initial_backoff=0.05, max_backoff=0.2, deadline=2.0)
        ),
    )
    tier = PartitionTier(store, PREFIX)
    segs = objects([200 * KIB] * 5, value_bytes=300, seed=3)
    for data in segs[:2]:
        tier.upload(data, epoch=2)
    third = segs[2]
    base = boundaries(third)[0][1]
    last = boundaries(third)[-1][2] - 1
    step_key = {
        "index": layout.index_key(PREFIX, base, last),
        "segment": layout.segment_key(PREFIX, base, last),
        "manifest": layout.manifest_key(PREFIX),
    }
    if stop_before == "upload":
        private_minio.stop()
    else:
        inner.hooks[step_key[stop_before]] = private_minio.stop
    with pytest.raises(ObjectStoreUnavailable) as info:
        tier.upload(third, epoch=2)
    assert info.value.retriable
    private_minio.start()
    listed = tier.manifest(refresh=True)
    assert [s.base for s in listed.segments] == [boundaries(d)[0][1] for d in segs[:2]]
    assert listed.checkpoint == base - 1  # the failed range is not durable
    # the uploader retries the failed range and carries on
    for data in segs[2:]:
        tier.upload(data, epoch=2)
    final = tier.manifest(refresh=True)
    assert final.gaps() == ()
    assert final.checkpoint == boundaries(segs[-1])[-1][2] - 1
    assert len(final.segments) == 5
    assert tier.read(0, 1 << 30) == segs[0]
    assert tier.read(base, 1 << 30) == third
    tier.close()
    store.close()


class InterleavingStore(minio_store.MinioStore):
    """A real MinioStore that runs ``hook`` once, right after the ``at``-th read of
    the manifest: a newer leader's write lands exactly between an uploader's read
    of the manifest and its put."""

    def __init__(self, settings: minio_store.MinioSettings, at: int) -> None:
        super().__init__(settings)
        self.at = at
        self.reads = 0
        self.hook: Callable[[], None] = lambda: None

    def _after_manifest_read(self, key: str) -> None:
        if key == layout.manifest_key(PREFIX):
            self.reads += 1
            if self.reads == self.at:
                self.hook()

    def get(self, key: str) -> bytes:
        try:
            return super().get(key)
        finally:
            self._after_manifest_read(key)

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        try:
            return super().get_versioned(key)
        finally:
            self._after_manifest_read(key)


def test_a_stale_epoch_uploader_loses_the_race_with_a_typed_error_in_minio(
    minio: MinioServer,
) -> None:
    bucket = new_bucket()
    first, second, third = objects([40 * KIB] * 3, value_bytes=200, seed=3)
    leader = PartitionTier(minio_store.MinioStore(minio.settings(bucket)), PREFIX)
    leader.upload(first, epoch=3)
    # the deposed leader (epoch 3) reads the manifest to list its next object (its
    # second manifest read: the first is upload's fence check); the new leader
    # (epoch 4) lists its own object right then
    racing = InterleavingStore(minio.settings(bucket), at=2)
    deposed = PartitionTier(racing, PREFIX)
    new_leader = PartitionTier(minio_store.MinioStore(minio.settings(bucket)), PREFIX)
    landed = []
    racing.hook = lambda: landed.append(new_leader.upload(second, epoch=4))
    with pytest.raises(FencedUploader) as info:
        deposed.upload(third, epoch=3)
    assert not info.value.retriable and landed
    stored = PartitionTier(minio_store.MinioStore(minio.settings(bucket)), PREFIX)
    m = stored.manifest(refresh=True)  # parses: not corrupt
    assert m.epoch == 4 and m.gaps() == ()
    assert [s.key for s in m.segments] == [
        layout.segment_key(PREFIX, 0, boundaries(first)[-1][2] - 1),
        landed[0].key,
    ]
    assert all(s.epoch in (3, 4) for s in m.segments) and m.segments[1].epoch == 4
    # the new leader keeps writing: nothing the deposed one did stands in its way
    assert new_leader.upload(third, epoch=4).epoch == 4
    assert stored.manifest(refresh=True).checkpoint == boundaries(third)[-1][2] - 1
    for t in (leader, deposed, new_leader, stored):
        t.close()
