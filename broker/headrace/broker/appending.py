"""Appending a produced batch on its leader: the step the native and the Kafka listener
share once each has validated the batch in its own format."""

from __future__ import annotations

from headrace.broker.ports import ConnectionHost
from headrace.broker.topics import Partition
from headrace.errors import NotEnoughReplicas
from headrace.records import batch as rb
from headrace.storage.log import AppendResult


def append_produced(
    host: ConnectionHost,
    partition: Partition,
    batch: bytes | memoryview,
    header: rb.BatchHeader,
    *,
    all_replicas: bool,
) -> AppendResult:
    """Append ``batch`` (validated, described by ``header``) at the partition's epoch.

    ``all_replicas`` (acks=all): fail fast with ``NotEnoughReplicas`` rather than
    acknowledge with fewer copies than promised. A retry the log answers as a duplicate
    appended nothing, so it is not counted as produced."""
    replica_set = partition.replica_set
    if all_replicas and replica_set is not None and len(replica_set.lrs) < partition.min_in_sync:
        raise NotEnoughReplicas(
            f"{partition.name}: live replica set {sorted(replica_set.lrs)} is smaller than"
            f" minInSync {partition.min_in_sync}"
        )
    result = partition.log.append(batch, header, partition.leader_epoch)
    if not result.duplicate:
        host.metrics.produced_records.inc(header.record_count)
        host.metrics.produced_bytes.inc(header.size)
    host.committer.appended(partition)
    partition.appended()
    return result
