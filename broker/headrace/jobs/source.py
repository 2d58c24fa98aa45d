"""The PySpark data source ``headrace``: a topic's stored segment objects as a DataFrame.

::

    spark.dataSource.register(HeadraceDataSource)
    df = (spark.read.format("headrace")
          .option("store", "s3://127.0.0.1:9000/headrace")
          .option("topic", "default/orders")
          .load())

The driver reads the manifests (``partitions``); each Spark input partition is
one segment object of one topic partition with an offset range, read on an
executor and turned into Arrow record batches by ``arrow.to_record_batch``.
Filters on ``partition`` and ``offset`` are pushed down (they need
``spark.sql.python.filterPushdown.enabled``, which ``session()`` sets): they
prune topic partitions and objects and cut offset ranges.

Options: ``store`` (object store URL, required; S3 credentials from
``HEADRACE_OBJECT_STORE_ACCESS_KEY``/``_SECRET_KEY`` in the executors'
environment), ``topic`` (``namespace/name``, required), ``cluster`` (default
``local``), ``creationId`` (the topic's ``status.creationId``; leave it out for a
topic without one, whose objects keep the legacy layout), ``partitions`` (comma-separated, default all), ``startingOffset``
and ``endingOffset`` (inclusive start, exclusive end, per partition), ``checkCrc``
(default ``true``), ``includeHeaders`` (default ``true``; ``false`` drops the
``headers`` column, which Spark's side pays for on every row even when null).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from headrace.errors import CorruptBatch
from headrace.jobs import arrow
from headrace.jobs.brokers import fetch_range, high_watermarks
from headrace.jobs.topics import TopicRef, read_manifest, stored_partitions
from headrace.objectstore.interface import ObjectStore
from headrace.objectstore.urls import open_store
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest

_stores: dict[str, ObjectStore] = {}
_stores_lock = threading.Lock()


def shared_store(url: str) -> ObjectStore:
    """One store per URL per process (executors reuse their connection pool)."""
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = open_store(url)
        return store


class InvalidSourceOption(ValueError):
    """An option of the ``headrace`` data source is missing or malformed."""


class ObjectSplit(InputPartition):
    """Offsets ``[start, end)`` of topic partition ``partition`` from one object."""

    def __init__(self, partition: int, key: str, start: int, end: int) -> None:
        super().__init__((partition, key, start, end))
        self.partition = partition
        self.key = key
        self.start = start
        self.end = end


@dataclass
class Bounds:
    """What the options and pushed filters leave to read: partitions and offsets."""

    partitions: set[int] | None = None
    start: int = 0
    end: int = arrow.NO_END

    def allow_partitions(self, values: Iterable[int]) -> None:
        wanted = set(values)
        self.partitions = wanted if self.partitions is None else self.partitions & wanted


def splits(manifest: Manifest, partition: int, start: int, end: int) -> list[ObjectSplit]:
    """One split per object that holds offsets in ``[start, end)``, following
    ``covering`` so that overlapping objects are read once and holes skipped."""
    out: list[ObjectSplit] = []
    offset = max(start, manifest.start_offset or 0)
    while offset < end and offset <= manifest.end_offset:
        seg = manifest.covering(offset)
        if seg is None:
            later = [s.base for s in manifest.segments if s.base > offset]
            if not later:
                break
            offset = min(later)
            continue
        stop = min(end, seg.last + 1)
        out.append(ObjectSplit(partition, seg.key, offset, stop))
        offset = stop
    return out


class HeadraceDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "headrace"

    def schema(self) -> str:
        return (
            arrow.SPARK_SCHEMA
            if _include_headers(dict(self.options))
            else arrow.SPARK_SCHEMA_NO_HEADERS
        )

    def reader(self, schema: Any) -> HeadraceReader:
        return HeadraceReader(dict(self.options))

    def streamReader(self, schema: Any) -> HeadraceStreamReader:
        return HeadraceStreamReader(dict(self.options))


def _include_headers(options: dict[str, str]) -> bool:
    lowered = {k.lower(): v for k, v in options.items()}
    return lowered.get("includeheaders", "true").lower() not in ("0", "false", "no")


def _option_int(options: dict[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidSourceOption(f"option {name}={raw!r} is not an integer") from None
    if value < 0:
        raise InvalidSourceOption(f"option {name}={value} is negative")
    return value


class HeadraceReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        lowered = {k.lower(): v for k, v in options.items()}
        for required in ("store", "topic"):
            if not lowered.get(required):
                raise InvalidSourceOption(f"the headrace data source needs option {required!r}")
        self.url = lowered["store"]
        try:
            self.ref = TopicRef(
                lowered.get("cluster", "local"), lowered["topic"], lowered.get("creationid", "")
            )
        except ValueError as exc:
            raise InvalidSourceOption(str(exc)) from exc
        self.check_crc = lowered.get("checkcrc", "true").lower() not in ("0", "false", "no")
        self.include_headers = _include_headers(options)
        self.bounds = Bounds(
            start=_option_int(lowered, "startingoffset", 0),
            end=_option_int(lowered, "endingoffset", arrow.NO_END),
        )
        if lowered.get("partitions"):
            try:
                self.bounds.allow_partitions(int(p) for p in lowered["partitions"].split(","))
            except ValueError:
                raise InvalidSourceOption(
                    f"option partitions={lowered['partitions']!r} is not a list of integers"
                ) from None

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            column = getattr(f, "attribute", ())
            if column == ("partition",) and isinstance(f, EqualTo):
                self.bounds.allow_partitions([int(f.value)])
            elif column == ("partition",) and isinstance(f, In):
                self.bounds.allow_partitions(int(v) for v in f.value)
            elif column == ("offset",) and isinstance(f, EqualTo):
                self.bounds.start = max(self.bounds.start, int(f.value))
                self.bounds.end = min(self.bounds.end, int(f.value) + 1)
            elif column == ("offset",) and isinstance(f, GreaterThan):
                self.bounds.start = max(self.bounds.start, int(f.value) + 1)
            elif column == ("offset",) and isinstance(f, GreaterThanOrEqual):
                self.bounds.start = max(self.bounds.start, int(f.value))
            elif column == ("offset",) and isinstance(f, LessThan):
                self.bounds.end = min(self.bounds.end, int(f.value))
            elif column == ("offset",) and isinstance(f, LessThanOrEqual):
                self.bounds.end = min(self.bounds.end, int(f.value) + 1)
            else:
                yield f

    def partitions(self) -> Sequence[ObjectSplit]:
        store = shared_store(self.url)
        out: list[ObjectSplit] = []
        for p in stored_partitions(store, self.ref):
            if self.bounds.partitions is not None and p not in self.bounds.partitions:
                continue
            manifest = read_manifest(store, layout.manifest_key(self.ref.partition_prefix(p)))
            out.extend(splits(manifest, p, self.bounds.start, self.bounds.end))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_split(self.url, partition, self.check_crc, self.include_headers)


class BrokerSplit(InputPartition):
    """Offsets ``[start, end)`` of topic partition ``partition`` from its leader (the
    tail not uploaded yet)."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__(("broker", partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def _read_split(
    url: str, split: InputPartition, check_crc: bool, include_headers: bool
) -> Iterator[pa.RecordBatch]:
    if not isinstance(split, ObjectSplit):
        return  # Spark asks for one plain partition when ``partitions`` found none
    data = shared_store(url).get(split.key)
    try:
        yield arrow.to_record_batch(
            data,
            split.partition,
            split.start,
            split.end,
            check_crc=check_crc,
            include_headers=include_headers,
        )
    except CorruptBatch as exc:
        raise CorruptBatch(f"segment object {split.key}, {exc.message}") from exc


class HeadraceStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("headrace")``: follows a topic live.

    A Spark offset is ``{"<partition>": <next offset>, ...}``; Spark checkpoints it,
    so a restarted query continues where the last committed micro-batch ended.
    Each micro-batch reads, per partition, what the object store holds without a
    hole (up to the manifest's checkpoint) from the stored objects, and, with the
    ``bootstrap`` option, the rest up to the high watermark from the partition's
    leader (committed records, plain Fetch requests). Without ``bootstrap`` a
    record reaches the stream when its leader uploads it.

    Options as the batch reader, plus ``bootstrap`` (``host:port`` of any broker)
    and ``startingOffsets``: ``earliest`` (default) or ``latest``.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.batch = HeadraceReader(options)
        lowered = {k.lower(): v for k, v in options.items()}
        self.bootstrap = lowered.get("bootstrap") or None
        self.starting = lowered.get("startingoffsets", "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise InvalidSourceOption(
                f"option startingOffsets={self.starting!r} is not earliest or latest"
            )

    def _wanted(self, partition: int) -> bool:
        wanted = self.batch.bounds.partitions
        return wanted is None or partition in wanted

    def _manifests(self) -> dict[int, Manifest]:
        store = shared_store(self.batch.url)
        ref = self.batch.ref
        return {
            p: read_manifest(store, layout.manifest_key(ref.partition_prefix(p)))
            for p in stored_partitions(store, ref)
            if self._wanted(p)
        }

    def _ends(self, positions: dict[int, int]) -> dict[int, int]:
        """Per partition, the next offset available: stored, or from the brokers."""
        ends = {p: m.checkpoint + 1 for p, m in self._manifests().items()}
        if self.bootstrap is not None:
            asked = {p: max(positions.get(p, 0), ends.get(p, 0)) for p in {*positions, *ends}}
            for p, hw in high_watermarks(self.bootstrap, self.batch.ref.topic, asked).items():
                if self._wanted(p):
                    ends[p] = max(ends.get(p, 0), hw)
        return ends

    def initialOffset(self) -> dict[str, int]:
        if self.starting == "latest":
            return {str(p): end for p, end in self._ends({}).items()}
        # a manifest retention trimmed empty starts after what it removed
        starts = {
            p: m.checkpoint + 1 if m.start_offset is None else m.start_offset
            for p, m in self._manifests().items()
        }
        return {str(p): starts.get(p, 0) for p in self._ends({})}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        positions = {int(p): o for p, o in start.items()}
        latest = dict(start)
        for p, end in self._ends(positions).items():
            latest[str(p)] = max(positions.get(p, 0), end)
        return latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        manifests = self._manifests()
        out: list[InputPartition] = []
        for key, stop in end.items():
            p = int(key)
            begin = start.get(key, 0)
            if stop <= begin:
                continue
            stored_end = manifests[p].checkpoint + 1 if p in manifests else 0
            if p in manifests and begin < stored_end:
                out.extend(splits(manifests[p], p, begin, min(stop, stored_end)))
            tail = max(begin, stored_end)
            if stop > tail:
                if self.bootstrap is None:
                    raise InvalidSourceOption(
                        f"partition {p}: offsets {tail}..{stop - 1} are not in the object store"
                        " and no bootstrap option names the brokers"
                    )
                out.append(BrokerSplit(p, tail, stop))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, BrokerSplit):
            assert self.bootstrap is not None
            data = fetch_range(
                self.bootstrap,
                self.batch.ref.topic,
                partition.partition,
                partition.start,
                partition.end,
            )
            return iter(
                [
                    arrow.to_record_batch(
                        data,
                        partition.partition,
                        partition.start,
                        partition.end,
                        check_crc=self.batch.check_crc,
                        include_headers=self.batch.include_headers,
                    )
                ]
            )
        return _read_split(
            self.batch.url, partition, self.batch.check_crc, self.batch.include_headers
        )

    def commit(self, end: dict[str, int]) -> None:
        pass  # nothing to acknowledge: the objects stay until compaction or deletion


def session(app_name: str = "headrace", master: str | None = None) -> Any:
    """A SparkSession with the ``headrace`` source registered and filter pushdown on.

    Python workers run this interpreter unless ``PYSPARK_PYTHON`` says otherwise
    (a bare ``python3`` may not have headrace installed)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config(
        "spark.sql.python.filterPushdown.enabled", "true"
    )
    if master is not None:
        builder = builder.master(master)
    spark = builder.getOrCreate()
    spark.dataSource.register(HeadraceDataSource)
    return spark
