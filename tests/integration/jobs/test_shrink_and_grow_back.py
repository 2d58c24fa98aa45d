"""A shrink and a grow back under keyed acks=all load, on a local cluster tiering to MinIO,
then the whole topic read three ways: a fresh cohort, ``spark.read.format("headrace")``
and the brokers' tiered reads of offsets local retention has removed from their disks.

Each way must return every acknowledged record once, at the (partition, offset) where it
was acknowledged. Partition 2 is retired by the shrink 3 -> 2 and routed to again by the
grow 2 -> 4: its log, and its objects and manifest in the bucket, continue.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from minio.credentials import StaticProvider
from minio.minioadmin import MinioAdmin

from headrace.broker.tier_upload import CURSORS_NAME
from headrace.testing.minio import MinioServer
from headrace.testing.reading import read_partition
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest
from tests.integration.keyed import Delivery
from tests.integration.localcluster import (
    LocalCluster,
    manifest_of,
    minio_cluster,
    store_of,
    topic_manifest,
)
from tests.integration.test_repartition import (
    keyed_load_through,
    read_with_a_fresh_cohort,
    wait_async,
)

SHORT = "regrown"
TOPIC = f"default/{SHORT}"
COUNTS = (3, 2, 4)
RETIRED = 2  # retired by the shrink to 2, routed to again by the grow to 4
#: small segments, and none kept on disk once uploaded: every partition's oldest records
#: leave the disks (few objects still: Spark reads one object a task)
SEGMENT_BYTES = 2 * 1024
LOCAL_RETENTION_BYTES = 0

#: (partition, offset) -> (key, sequence number)
Placed = dict[tuple[int, int], tuple[str, int]]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with minio_cluster(tmp_path / "local") as c:
        yield c


def grant_reads(c: LocalCluster, access_key: str, secret_key: str) -> None:
    """Let ``access_key`` list and get (nothing else) in the cluster's MinIO: the Spark
    session's executors hold those credentials, from the environment they started with."""
    m = c.record["minio"]
    admin = MinioAdmin(
        endpoint=f"{m['host']}:{m['port']}",
        credentials=StaticProvider(m["access_key"], m["secret_key"]),
        secure=False,
    )
    reads = ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"]
    statement = {"Effect": "Allow", "Action": reads, "Resource": ["arn:aws:s3:::*"]}
    admin.policy_add("reads", policy={"Version": "2012-10-17", "Statement": [statement]})
    admin.user_add(access_key, secret_key)
    admin.attach_policy(["reads"], user=access_key)


def leaders_view(c: LocalCluster) -> dict[int, dict[str, Any]]:
    """Partition -> its leader's description of it (log start and end, uploads)."""
    view: dict[int, dict[str, Any]] = {}
    for b in c.record["brokers"]:
        url = f"http://{b['host']}:{b['admin_port']}/v1/topics/{TOPIC}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc = json.loads(resp.read())
        for p in doc["partition_details"]:
            if p["role"] == "leader":
                view[int(p["partition"])] = p
    return view


def stored_objects(c: LocalCluster, partition: int) -> dict[str, str]:
    """Every object under a partition's prefix: key -> digest of its bytes."""
    store = store_of(c)
    prefix = layout.partition_prefix("local", TOPIC, partition, c.creation_id(TOPIC))
    return {
        info.key: hashlib.sha256(store.get(info.key)).hexdigest() for info in store.list(prefix)
    }


def uploaded_through(c: LocalCluster, partition: int, last: int) -> bool:
    return manifest_of(c, TOPIC, partition).checkpoint >= last


def wrong_reads(acked: Iterable[Delivery], read: Iterable[Delivery]) -> list[str]:
    """What a read got wrong: a (partition, offset) read twice, an acknowledged record
    missing or read elsewhere, a record read that nobody acknowledged."""
    read = list(read)
    twice = [at for at, n in Counter((p, o) for _, _, p, o in read).items() if n > 1]
    at: Placed = {(p, o): (key, seq) for key, seq, p, o in read}
    wanted: Placed = {(p, o): (key, seq) for key, seq, p, o in acked}
    wrong = [
        f"{at.get(where)} at {where}, acked {rec}"
        for where, rec in wanted.items()
        if at.get(where) != rec
    ]
    extra = [f"{rec} at {where}, never acked" for where, rec in at.items() if where not in wanted]
    return [f"{where} read twice" for where in twice] + wrong + extra


def spark_rows(spark: Any, c: LocalCluster) -> list[Delivery]:
    m = c.record["minio"]
    df = (
        spark.read.format("headrace")
        .option("store", f"s3://{m['host']}:{m['port']}/{m['bucket']}")
        .option("cluster", "local")
        .option("topic", TOPIC)
        .option("creationId", c.creation_id(TOPIC))
        .option("includeHeaders", "false")
        .load()
    )
    return [
        (r.key.decode(), int(r.value), r.partition, r.offset)
        for r in df.select("key", "value", "partition", "offset").collect()
    ]


async def tiered_reads(c: LocalCluster) -> list[Delivery]:
    """Every partition fetched from offset 0: below each leader's log start the broker
    reads the object store, then its own disk."""
    out: list[Delivery] = []
    for p in range(max(COUNTS)):
        for r in await read_partition(c.bootstrap, TOPIC, p):
            assert r.key is not None
            out.append((r.key.decode(), int(r.value), p, r.offset))
    return out


@pytest.mark.slow  # a cluster, a retention round (brokers check every 30 s) and a Spark read
async def test_a_shrink_and_a_grow_back_read_three_ways_return_each_acked_record_once(
    cluster: LocalCluster, spark: Any, jobs_minio: MinioServer
) -> None:
    first_life: dict[str, str] = {}
    first_manifest = Manifest()

    async def keep_the_first_life(count: int) -> None:
        """After the shrink: partition 2 takes no more records; once all of them are
        uploaded, note its objects and its manifest."""
        nonlocal first_life, first_manifest
        if count != 2:
            return

        def all_uploaded() -> bool:
            leader = leaders_view(cluster).get(RETIRED)
            return leader is not None and uploaded_through(
                cluster, RETIRED, leader["high_watermark"] - 1
            )

        await wait_async(all_uploaded, "the retired partition uploaded")
        first_manifest = await asyncio.to_thread(manifest_of, cluster, TOPIC, RETIRED)
        first_life = await asyncio.to_thread(stored_objects, cluster, RETIRED)

    manifest = topic_manifest(
        SHORT,
        COUNTS[0],
        upload_interval_s=1,
        local_retention_bytes=LOCAL_RETENTION_BYTES,
        segment_bytes=SEGMENT_BYTES,
    )
    acked = await keyed_load_through(
        cluster, SHORT, COUNTS, manifest=manifest, after_step=keep_the_first_life
    )
    twice = [at for at, n in Counter((p, o) for _, _, p, o in acked).items() if n > 1]
    assert not twice, f"(partition, offset) pairs acknowledged twice: {twice[:5]}"
    first_end = first_manifest.checkpoint + 1
    assert first_end > 0 and first_manifest.start_offset == 0
    per_partition = Counter(p for _, _, p, _ in acked)
    assert sorted(per_partition) == [0, 1, 2, 3]
    assert any(p == RETIRED and o >= first_end for _, _, p, o in acked), "no second life"

    # Everything is uploaded, and the oldest records are off the leaders' disks.
    last = {p: max(o for _, _, q, o in acked if q == p) for p in per_partition}
    await wait_async(
        lambda: all(uploaded_through(cluster, p, o) for p, o in last.items()),
        "every acknowledged record uploaded",
    )
    await wait_async(
        lambda: all(v["log_start_offset"] > 0 for v in leaders_view(cluster).values()),
        "local retention past the oldest segments",
        timeout=90,  # brokers check retention every 30 s
    )

    # The retired partition's objects: the first life's are all still there, unchanged
    # and listed; the second life's continue after them; nothing unlisted.
    regrown = await asyncio.to_thread(manifest_of, cluster, TOPIC, RETIRED)
    objects = await asyncio.to_thread(stored_objects, cluster, RETIRED)
    assert regrown.start_offset == 0 and regrown.gaps() == ()
    assert regrown.checkpoint >= last[RETIRED]
    prefix = layout.partition_prefix("local", TOPIC, RETIRED, cluster.creation_id(TOPIC))
    rewritten = {layout.manifest_key(prefix), prefix + CURSORS_NAME}  # in place, by design
    kept = {k: digest for k, digest in first_life.items() if k not in rewritten}
    changed = [k for k, digest in kept.items() if objects.get(k) != digest]
    assert kept and not changed, f"first-life objects overwritten or gone: {changed}"
    listed = {s.key for s in regrown.segments}
    assert {s.key for s in first_manifest.segments} <= listed
    assert any(s.base == first_end for s in regrown.segments), regrown.segments
    expected = listed | {layout.index_key_for(k) for k in listed} | rewritten
    assert set(objects) <= expected, f"unlisted objects: {sorted(set(objects) - expected)}"

    # (a) a cohort created now, from the earliest offsets
    cohort = await read_with_a_fresh_cohort(cluster, TOPIC, "after-regrow", acked)
    # (b) Spark, over the objects in the bucket
    await asyncio.to_thread(grant_reads, cluster, jobs_minio.access_key, jobs_minio.secret_key)
    spark_read = await asyncio.to_thread(spark_rows, spark, cluster)
    # (c) the brokers, reading the oldest offsets from the object store
    tiered = await tiered_reads(cluster)

    starts = {p: v["log_start_offset"] for p, v in sorted(leaders_view(cluster).items())}
    print(
        f"\nacked {len(acked)} ({dict(sorted(per_partition.items()))}); partition {RETIRED}"
        f" first life 0..{first_end - 1}, leaders' log start {starts}; read: cohort"
        f" {len(cohort)}, spark {len(spark_read)}, tiered {len(tiered)}"
    )
    for way, read in (("a fresh cohort", cohort), ("spark", spark_read), ("tiered", tiered)):
        wrong = wrong_reads(acked, read)
        assert not wrong, f"{way}: {len(wrong)} wrong of {len(acked)}: {wrong[:5]}"
