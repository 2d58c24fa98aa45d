"""Writing a tiered topic's objects as brokers do (``PartitionTier.upload``), and reading
them back, for the jobs' tests."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered import layout
from headrace.tiered.manifest import Manifest
from headrace.tiered.tier import PartitionTier


def stamped(batch: bytes, base_offset: int, epoch: int = 0) -> bytes:
    frame = bytearray(batch)
    rb.stamp(frame, base_offset, epoch)
    return bytes(frame)


def write_partition(
    store: ObjectStore,
    cluster_id: str,
    topic: str,
    partition: int,
    *,
    objects: int,
    batches_per_object: int = 2,
    records_per_batch: int = 5,
    keys: Sequence[bytes] | None = None,
    epoch: int = 0,
    creation_id: str = "",
) -> int:
    """Upload ``objects`` segment objects of consecutive offsets; returns the next offset.

    Values are ``p<partition>-o<offset>``; keys cycle through ``keys`` when given. Stored
    under ``creation_id`` (default none: the legacy layout)."""
    prefix = layout.partition_prefix(cluster_id, topic, partition, creation_id)
    tier = PartitionTier(store, prefix)
    offset = 0
    try:
        for _ in range(objects):
            frames = []
            for _ in range(batches_per_object):
                offsets = range(offset, offset + records_per_batch)
                values = [f"p{partition}-o{o}".encode() for o in offsets]
                batch_keys = [keys[o % len(keys)] for o in offsets] if keys else None
                frames.append(
                    stamped(
                        rb.encode(values, keys=batch_keys, timestamp_ms=1_700_000_000_000 + offset),
                        offset,
                        epoch,
                    )
                )
                offset += records_per_batch
            tier.upload(b"".join(frames), epoch)
    finally:
        tier.close()
    return offset


def manifest(store: ObjectStore, cluster_id: str, topic: str, partition: int) -> Manifest:
    key = layout.manifest_key(layout.partition_prefix(cluster_id, topic, partition))
    return Manifest.from_json(store.get(key))


def checksum(rows: Sequence[tuple[int, int, bytes | None, bytes]]) -> str:
    """Order-independent digest over (partition, offset, key, value)."""
    digest = hashlib.sha256()
    for p, o, k, v in sorted(rows, key=lambda r: (r[0], r[1])):
        digest.update(f"{p}:{o}:".encode() + (k or b"<null>") + b"\0" + v + b"\n")
    return digest.hexdigest()
