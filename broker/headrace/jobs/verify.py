"""Verification of one partition's stored segments (adapter: reads through an ObjectStore).

Checks, each finding naming the object key and the offset (and the byte
position where there is one):

- the manifest parses (``manifest-invalid``);
- every listed object exists (``missing-object``) with the listed size
  (``size-mismatch``) and a key that names the listed range (``key-mismatch``);
- inside each object: every batch header (``corrupt-header``), every CRC
  (``crc-mismatch``), offsets contiguous from the object's base
  (``offset-discontinuity``), nothing past the listed last offset
  (``beyond-range``), whole batches to the end (``truncated``) and the object
  reaching its last offset (``short-object``);
- across objects: no overlap (``overlap``) and no hole (``offset-gap``);
- no object without a manifest entry (``orphan-object``, a *warning*: an upload
  in flight puts its object before its manifest entry, and a deposed leader's
  late upload leaves one, see docs/tiered-storage.md);
- a sealed state's last committed offset is covered by the manifest (``sealed-ahead``);
- with ``bootstrap`` (the brokers reachable): the store holds nothing at or past
  the leader's high watermark (``beyond-high-watermark``), and nothing is lost
  between the stored range and the leader's log start (``log-start-gap``); a
  broker that cannot answer is a warning (``broker-unreachable``).

Key-compacted objects (written by ``compact`` with ``keep_last_per_key``) have
holes inside them by design; their manifest entry says ``compacted`` and forward
jumps inside them are accepted (``compacted=True``: in every object).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from headrace.errors import CorruptBatch, HeadraceError, OffsetOutOfRange
from headrace.jobs import brokers
from headrace.jobs.topics import TopicRef, read_manifest, read_sealed
from headrace.objectstore.errors import ObjectNotFound
from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered import layout
from headrace.tiered.manifest import InvalidManifest, Manifest

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    partition: int
    #: the object (or manifest/sealed document) the finding is about
    key: str
    #: the offset it is about; None only for a document with no offset at all
    offset: int | None
    message: str
    #: byte position inside the object, where there is one
    position: int | None = None
    severity: Severity = "error"

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class PartitionResult:
    partition: int
    objects: int = 0
    bytes: int = 0
    batches: int = 0
    records: int = 0
    start_offset: int | None = None
    end_offset: int = -1
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_doc(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "objects": self.objects,
            "bytes": self.bytes,
            "batches": self.batches,
            "records": self.records,
            "startOffset": self.start_offset,
            "endOffset": self.end_offset,
            "ok": self.ok,
            "findings": [f.to_doc() for f in self.findings],
        }


def verify_partition(
    store: ObjectStore,
    ref: TopicRef,
    partition: int,
    *,
    compacted: bool = False,
    bootstrap: str | None = None,
) -> PartitionResult:
    result = PartitionResult(partition)
    prefix = ref.partition_prefix(partition)
    manifest_key = layout.manifest_key(prefix)

    def find(kind: str, key: str, offset: int | None, message: str, **extra: Any) -> None:
        result.findings.append(Finding(kind, partition, key, offset, message, **extra))

    try:
        manifest = read_manifest(store, manifest_key)
    except InvalidManifest as exc:
        find("manifest-invalid", manifest_key, None, exc.message)
        return result
    stored = {
        info.key: info.size
        for info in store.list(prefix)
        if layout.parse_segment_key(info.key) is not None
    }
    result.start_offset = manifest.start_offset
    result.end_offset = manifest.end_offset
    reached: int | None = None
    for seg in manifest.segments:
        if reached is not None and seg.base <= reached:
            find(
                "overlap",
                seg.key,
                seg.base,
                f"offsets {seg.base}..{min(reached, seg.last)} are also in an earlier object",
            )
        elif reached is not None and seg.base > reached + 1:
            find(
                "offset-gap",
                seg.key,
                reached + 1,
                f"offsets {reached + 1}..{seg.base - 1} are in no object (before this one)",
            )
        reached = seg.last if reached is None else max(reached, seg.last)
        named = layout.parse_segment_key(seg.key)
        if named is None or (named.base, named.last) != (seg.base, seg.last):
            find("key-mismatch", seg.key, seg.base, f"listed as {seg.base}..{seg.last}")
        size = stored.get(seg.key)
        if size is None:
            find("missing-object", seg.key, seg.base, "listed in the manifest, not in the store")
            continue
        if size != seg.size:
            find("size-mismatch", seg.key, seg.base, f"listed as {seg.size} bytes, holds {size}")
            continue
        try:
            data = store.get(seg.key)
        except ObjectNotFound:
            find("missing-object", seg.key, seg.base, "deleted while being verified")
            continue
        result.objects += 1
        result.bytes += len(data)
        _check_object(data, seg.key, seg.base, seg.last, compacted or seg.compacted, result, find)
    for key in sorted(set(stored) - {s.key for s in manifest.segments}):
        named = layout.parse_segment_key(key)
        assert named is not None
        find(
            "orphan-object",
            key,
            named.base,
            "in the store, not in the manifest",
            severity="warning",
        )
    _check_sealed(store, prefix, manifest, find)
    if bootstrap is not None:
        _check_brokers(bootstrap, ref.topic, partition, manifest, manifest_key, find)
    return result


def _check_brokers(
    bootstrap: str, topic: str, partition: int, manifest: Manifest, manifest_key: str, find: Any
) -> None:
    """The stored range against the leader's log: start and high watermark."""
    # a Fetch must ask for an offset inside the leader's log: after the stored range
    # (where the leader continues), else at the stored start (the store ran ahead)
    asked = max(0, manifest.checkpoint + 1)
    candidates = dict.fromkeys([asked, manifest.start_offset or 0])
    errors: list[str] = []
    for offset in candidates:
        try:
            log_start, high_watermark = brokers.log_range(bootstrap, topic, partition, offset)
            break
        except OffsetOutOfRange as exc:
            errors.append(f"at {offset}: {exc.message}")
        except HeadraceError as exc:
            find(
                "broker-unreachable",
                manifest_key,
                asked,
                f"{type(exc).__name__}: {exc.message}",
                severity="warning",
            )
            return
    else:
        find(
            "log-start-gap",
            manifest_key,
            asked,
            f"the store holds {manifest.start_offset}..{manifest.checkpoint}, outside the"
            f" leader's log ({'; '.join(errors)})",
        )
        return
    if manifest.end_offset >= high_watermark:
        last = manifest.segments[-1]
        beyond = max(high_watermark, last.base)
        holder = manifest.covering(beyond) or last
        find(
            "beyond-high-watermark",
            holder.key,
            high_watermark,
            f"the store holds up to {manifest.end_offset}, the leader's high watermark is"
            f" {high_watermark}",
        )
    if manifest.checkpoint + 1 < log_start:
        find(
            "log-start-gap",
            manifest_key,
            manifest.checkpoint + 1,
            f"offsets {manifest.checkpoint + 1}..{log_start - 1} are neither stored nor on the"
            f" leader (log start {log_start})",
        )


def _check_object(
    data: bytes,
    key: str,
    base: int,
    last: int,
    compacted: bool,
    result: PartitionResult,
    find: Any,
) -> None:
    view = memoryview(data)
    expected = base
    consumed = 0
    for pos, header in rb.scan(view):
        try:
            rb.check_header(header)
        except CorruptBatch as exc:
            find("corrupt-header", key, expected, exc.message, position=pos)
            return
        jumped = compacted and header.base_offset > expected
        if header.base_offset != expected and not jumped:
            find(
                "offset-discontinuity",
                key,
                expected,
                f"batch at byte {pos} starts at offset {header.base_offset}",
                position=pos,
            )
            return
        if header.last_offset > last:
            find(
                "beyond-range",
                key,
                header.base_offset,
                f"batch runs to offset {header.last_offset}, past the object's last {last}",
                position=pos,
            )
            return
        if not rb.crc_ok(view, header, pos):
            find("crc-mismatch", key, header.base_offset, "batch CRC mismatch", position=pos)
        result.batches += 1
        result.records += header.record_count
        expected = header.next_offset
        consumed = pos + header.size
    if consumed != len(view):
        find(
            "truncated",
            key,
            expected,
            f"{len(view) - consumed} bytes at byte {consumed} are not a whole batch",
            position=consumed,
        )
    elif expected != last + 1 and not (compacted and expected <= last + 1 and consumed):
        find("short-object", key, expected, f"the object ends before its last offset {last}")


def _check_sealed(store: ObjectStore, prefix: str, manifest: Manifest, find: Any) -> None:
    key = layout.sealed_key(prefix)
    try:
        sealed = read_sealed(store, key)
    except InvalidManifest as exc:
        find("sealed-invalid", key, None, exc.message)
        return
    if sealed is not None and sealed.last_committed_offset > manifest.checkpoint:
        find(
            "sealed-ahead",
            key,
            manifest.checkpoint + 1,
            f"sealed at offset {sealed.last_committed_offset}, the manifest holds through"
            f" {manifest.checkpoint}",
        )
