"""PartitionTier against a real MinIO that misbehaves: throttling (503 SlowDown), reset
connections and lost answers, a server that hangs, a policy that refuses deletes, and the
server killed with SIGKILL in the middle of uploads.

The faults the server cannot make itself come from ``bench.chaos.faultproxy`` between the
store and MinIO. Every check of the stored state reads straight from the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from bench.chaos.faultproxy import FaultProxy, Faults
from bench.chaos.minio_policy import TierUser
from bench.chaos.tiercheck import check_partition
from headrace.jobs.sweep import sweep_topic
from headrace.jobs.topics import TopicRef
from headrace.objectstore import minio_store, retrying
from headrace.objectstore.errors import (
    ObjectStoreAccessDenied,
    ObjectStoreError,
    ObjectStoreUnavailable,
)
from headrace.testing.minio import MinioServer
from headrace.tiered import layout
from headrace.tiered.tier import PartitionTier
from tests.integration.objectstore.servers import new_bucket
from tests.integration.tiered.batches import boundaries
from tests.integration.tiered.test_tiered_minio import objects

TOPIC = TopicRef("it", "ns/orders")
PARTITION = 3
PREFIX = TOPIC.partition_prefix(PARTITION)
KIB = 1 << 10


def retried(
    store: minio_store.MinioStore, slept: list[float] | None = None
) -> retrying.RetryingStore:
    """``store`` behind the retry policy a broker uses, with short backoffs; ``slept``
    collects every backoff taken."""

    def sleep(seconds: float) -> None:
        if slept is not None:
            slept.append(seconds)
        time.sleep(seconds)

    settings = retrying.RetrySettings(
        attempts=8, initial_backoff=0.02, max_backoff=0.3, deadline=10.0
    )
    return retrying.RetryingStore(store, retrying.Retrier(settings, sleep=sleep))


def upload_until_durable(tier: PartitionTier, data: bytes, epoch: int, tries: int = 20) -> None:
    """What the broker's uploader does: retry a failed round (retriable errors only)."""
    for attempt in range(tries):
        try:
            tier.upload(data, epoch)
            return
        except ObjectStoreError as exc:
            if not exc.retriable or attempt == tries - 1:
                raise


def read_until_served(tier: PartitionTier, offset: int, tries: int = 10) -> bytes:
    """What a fetching client does: ask again after a retriable error."""
    for attempt in range(tries):
        try:
            return tier.read(offset, 1 << 30)
        except ObjectStoreError as exc:
            if not exc.retriable or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def assert_whole(direct: minio_store.MinioStore, expected_segments: int) -> None:
    found = check_partition(direct, PREFIX)
    assert found.ok, found.to_doc()
    assert found.manifest is not None and len(found.manifest.segments) == expected_segments
    assert found.missing_indexes == []


@pytest.fixture
def bucket(minio: MinioServer) -> Iterator[tuple[str, minio_store.MinioStore]]:
    name = new_bucket()
    direct = minio_store.MinioStore(minio.settings(name, create_bucket=True))
    direct.ensure_bucket()
    yield name, direct
    direct.close()


def test_throttled_reset_and_unanswered_requests_are_retried_and_the_manifest_stays_whole(
    minio: MinioServer, bucket: tuple[str, minio_store.MinioStore]
) -> None:
    name, direct = bucket
    slept: list[float] = []
    with FaultProxy(minio.endpoint, seed=5) as proxy:
        store = retried(
            minio_store.MinioStore(minio.settings(name, endpoint=proxy.endpoint)), slept
        )
        tier = PartitionTier(store, PREFIX)
        segs = objects([64 * KIB] * 12, value_bytes=200, seed=7)
        proxy.faults = Faults(slowdown=0.3, reset=0.1, lost_answer=0.1)
        for data in segs:
            upload_until_durable(tier, data, epoch=1)
        # reads under the same faults get every record back (a read that fails says so
        # with a retriable error, and the client asks again)
        reader = PartitionTier(store, PREFIX, readahead_bytes=16 * KIB)
        for data in segs:
            assert read_until_served(reader, boundaries(data)[0][1]) == data
        proxy.faults = Faults()
        tier.close()
        reader.close()
        store.close()
    assert proxy.counts["slowdown"] > 0 and proxy.counts["reset"] > 0
    assert proxy.counts["lost-answer"] > 0
    assert slept and max(slept) > 0  # failed calls were retried after a backoff
    assert_whole(direct, len(segs))


def test_a_hung_or_dead_store_fails_reads_with_a_typed_retriable_error(
    private_minio: MinioServer,
) -> None:
    name = new_bucket()
    direct = minio_store.MinioStore(private_minio.settings(name, create_bucket=True))
    segs = objects([32 * KIB] * 3, value_bytes=200, seed=8)
    writer = PartitionTier(direct, PREFIX)
    for data in segs:
        writer.upload(data, epoch=1)
    with FaultProxy(private_minio.endpoint) as proxy:
        store = retrying.RetryingStore(
            minio_store.MinioStore(
                private_minio.settings(name, endpoint=proxy.endpoint, read_timeout=0.5)
            ),
            retrying.Retrier(
                retrying.RetrySettings(attempts=3, initial_backoff=0.02, deadline=5.0)
            ),
        )
        reader = PartitionTier(store, PREFIX)
        reader.manifest(refresh=True)
        # a server that takes longer than the read timeout to answer
        proxy.faults = Faults(delay=1.0, delay_s=3.0)
        with pytest.raises(ObjectStoreUnavailable) as hung:
            reader.read(0, 1 << 20)
        assert hung.value.retriable and "timed out" in str(hung.value)
        proxy.faults = Faults()
        # a server that is gone
        private_minio.kill()
        with pytest.raises(ObjectStoreUnavailable) as dead:
            reader.read(0, 1 << 20)
        assert dead.value.retriable
        private_minio.start()
        assert reader.read(0, 1 << 20) == segs[0]
        reader.close()
        store.close()
    writer.close()
    direct.close()


def test_refused_deletes_keep_every_object_and_succeed_once_the_policy_is_lifted(
    minio: MinioServer, bucket: tuple[str, minio_store.MinioStore]
) -> None:
    name, direct = bucket
    user = TierUser(minio.endpoint, minio.access_key, minio.secret_key, name).create()
    store = retried(
        minio_store.MinioStore(
            minio.settings(name, access_key=user.access_key, secret_key=user.secret_key)
        )
    )
    tier = PartitionTier(store, PREFIX)
    segs = objects([16 * KIB] * 6, value_bytes=100, seed=9)
    for data in segs[:5]:
        tier.upload(data, epoch=1)
    # an orphan: a failed upload's objects (put, never listed)
    orphan = segs[5]
    orphan_key = layout.segment_key(PREFIX, boundaries(orphan)[0][1], boundaries(orphan)[-1][2] - 1)
    store.put(orphan_key, orphan)
    everything = {info.key for info in direct.list(PREFIX)}

    user.refuse_deletes(True)
    third = boundaries(segs[3])[0][1]
    removed = tier.trim(lambda _stored: third, epoch=1)  # retention: the manifest put is allowed
    assert len(removed) == 3
    with pytest.raises(ObjectStoreAccessDenied) as denied:
        tier.delete_unlisted(removed)
    assert not denied.value.retriable
    later = int(time.time() * 1000) + 10_000
    with pytest.raises(ObjectStoreAccessDenied):
        sweep_topic(store, TOPIC, now_ms=later, grace_ms=0, apply=True)
    assert {info.key for info in direct.list(PREFIX)} == everything  # nothing went
    assert_whole(direct, 2)

    user.refuse_deletes(False)
    assert sorted(tier.delete_unlisted(removed)) == sorted(s.key for s in removed)
    report = sweep_topic(store, TOPIC, now_ms=later, grace_ms=0, apply=True)
    assert report.deleted == [orphan_key]
    assert_whole(direct, 2)
    left = {info.key for info in direct.list(PREFIX)}
    listed = tier.manifest(refresh=True).segments
    assert left == {
        layout.manifest_key(PREFIX),
        *(s.key for s in listed),
        *(layout.index_key_for(s.key) for s in listed),
    }
    # the checker the chaos campaign trusts sees a listed object gone and a damaged manifest
    direct.delete(listed[0].key)
    assert check_partition(direct, PREFIX).missing == [listed[0].key]
    direct.put(layout.manifest_key(PREFIX), b'{"format": 1, "segments": [')
    damaged = check_partition(direct, PREFIX)
    assert damaged.corrupt is not None and not damaged.ok
    tier.close()
    store.close()


def test_minio_killed_mid_upload_loses_no_acknowledged_upload(
    private_minio: MinioServer,
) -> None:
    name = new_bucket()
    direct = minio_store.MinioStore(private_minio.settings(name, create_bucket=True))
    direct.ensure_bucket()
    store = retrying.RetryingStore(
        minio_store.MinioStore(private_minio.settings(name)),
        retrying.Retrier(
            retrying.RetrySettings(attempts=3, initial_backoff=0.02, max_backoff=0.1, deadline=1)
        ),
    )
    tier = PartitionTier(store, PREFIX)
    segs = objects([512 * KIB] * 24, value_bytes=1000, seed=10)
    acknowledged: list[bytes] = []
    failures: list[ObjectStoreError] = []
    done = threading.Event()

    def uploader() -> None:
        try:
            for data in segs:
                while True:  # the broker's uploader: the same range again until it is durable
                    try:
                        tier.upload(data, epoch=1)
                        break
                    except ObjectStoreError as exc:
                        failures.append(exc)
                        if not exc.retriable:
                            return
                        time.sleep(0.05)
                acknowledged.append(data)
        finally:
            done.set()

    thread = threading.Thread(target=uploader, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while len(acknowledged) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    private_minio.kill()  # SIGKILL, with uploads in flight
    while not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    assert failures, "the uploader never noticed the dead server"
    killed_at = len(acknowledged)
    private_minio.start()
    assert done.wait(60)
    thread.join()
    assert killed_at < len(segs)
    assert all(f.retriable for f in failures), failures
    assert acknowledged == segs
    assert_whole(direct, len(segs))
    reader = PartitionTier(direct, PREFIX)
    for data in segs:
        assert reader.read(boundaries(data)[0][1], 1 << 30) == data
    reader.close()
    tier.close()
    store.close()
    direct.close()
