"""The ``headrace`` data source on real Spark over real MinIO."""

from __future__ import annotations

from typing import Any

from headrace.objectstore.interface import ObjectStore
from tests.integration.jobs.topicdata import checksum, write_partition

TOPIC = "default/orders"


def _load(spark: Any, url: str, cluster_id: str, **options: str) -> Any:
    reader = spark.read.format("headrace").option("store", url).option("topic", TOPIC)
    reader = reader.option("cluster", cluster_id)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_reads_every_record_of_every_partition(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    ends = [
        write_partition(store, cluster_id, TOPIC, p, objects=3, keys=[b"a", b"b"]) for p in range(3)
    ]
    df = _load(spark, store_url, cluster_id)
    rows = [(r.partition, r.offset, r.key, r.value) for r in df.collect()]
    expected = [
        (p, o, b"ab"[o % 2 : o % 2 + 1], f"p{p}-o{o}".encode())
        for p in range(3)
        for o in range(ends[p])
    ]
    assert len(rows) == len(expected)
    assert checksum(rows) == checksum(expected)
    first = df.filter("partition = 0 and offset = 0").collect()[0]
    assert first.timestamp.year == 2023 and first.headers is None  # as Spark's Kafka source


def test_pushes_down_partition_and_offset_filters(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    for p in range(2):
        write_partition(store, cluster_id, TOPIC, p, objects=4)  # offsets 0..39
    df = _load(spark, store_url, cluster_id).filter(
        "partition = 1 and offset >= 13 and offset < 27"
    )
    plan = df._jdf.queryExecution().executedPlan().toString()
    rows = sorted((r.partition, r.offset) for r in df.collect())
    assert rows == [(1, o) for o in range(13, 27)]
    # pruned at the source: one topic partition, only the objects holding 13..26
    from headrace.jobs.source import HeadraceReader

    reader = HeadraceReader({"store": store_url, "topic": TOPIC, "cluster": cluster_id})
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan

    left = list(
        reader.pushFilters(
            [
                EqualTo(("partition",), 1),
                GreaterThanOrEqual(("offset",), 13),
                LessThan(("offset",), 27),
            ]
        )
    )
    assert left == []
    splits = reader.partitions()
    assert [(s.partition, s.start, s.end) for s in splits] == [(1, 13, 20), (1, 20, 27)]
    assert plan  # the query ran through the pushdown path (it raises when pushdown is off)


def test_empty_topic_is_an_empty_frame(spark: Any, store_url: str, cluster_id: str) -> None:
    assert _load(spark, store_url, cluster_id).count() == 0


def test_headers_and_compressed_batches_and_the_include_headers_option(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    from headrace.records import batch as rb
    from headrace.tiered import layout
    from headrace.tiered.tier import PartitionTier
    from tests.integration.jobs.topicdata import stamped

    plain = stamped(
        rb.encode([b"v0", b"v1"], keys=[b"k", None], headers=[[("h", b"1")], []], timestamp_ms=5),
        0,
    )
    zipped = stamped(rb.encode([b"v2"] * 3, timestamp_ms=7, compression=rb.COMPRESSION_ZLIB), 2)
    tier = PartitionTier(store, layout.partition_prefix(cluster_id, TOPIC, 0))
    tier.upload(plain + zipped, 0)
    tier.close()
    rows = _load(spark, store_url, cluster_id).orderBy("offset").collect()
    assert [(r.offset, r.key, r.value) for r in rows] == [
        (0, b"k", b"v0"),
        (1, None, b"v1"),
        (2, None, b"v2"),
        (3, None, b"v2"),
        (4, None, b"v2"),
    ]
    # a record without headers (the second, and the compressed batch without any) has null
    headers = [None if r.headers is None else [(h.key, h.value) for h in r.headers] for r in rows]
    assert headers == [[("h", b"1")], None, None, None, None]
    lean = _load(spark, store_url, cluster_id, includeHeaders="false")
    assert lean.columns == ["partition", "offset", "timestamp", "key", "value"]
    assert lean.count() == 5


def test_reads_the_incarnation_its_creation_id_names_and_the_legacy_layout_without_one(
    spark: Any, store: ObjectStore, store_url: str, cluster_id: str
) -> None:
    # the same name twice: a topic from before creation ids, deleted (its objects left
    # behind) and created again under creation id "second"
    write_partition(store, cluster_id, TOPIC, 0, objects=2)
    write_partition(store, cluster_id, TOPIC, 0, objects=1, creation_id="second")
    write_partition(store, cluster_id, TOPIC, 1, objects=1, creation_id="second")
    legacy = _load(spark, store_url, cluster_id).collect()
    assert sorted((r.partition, r.offset) for r in legacy) == [(0, o) for o in range(20)]
    second = _load(spark, store_url, cluster_id, creationId="second").collect()
    assert sorted((r.partition, r.offset) for r in second) == [
        (p, o) for p in (0, 1) for o in range(10)
    ]
