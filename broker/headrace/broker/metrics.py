"""Prometheus metrics of one broker (own registry, so tests can run many brokers)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.broker.topics import Partition


class PartitionCollector(Collector):
    """Per-partition gauges read at scrape time (not updated on the hot path)."""

    def __init__(self, partitions: Callable[[], list[Partition]]) -> None:
        self._partitions = partitions

    def collect(self) -> Iterable[Metric]:
        leo = GaugeMetricFamily(
            "headrace_partition_log_end_offset", "Log end offset", labels=["topic", "partition"]
        )
        hw = GaugeMetricFamily(
            "headrace_partition_high_watermark", "High watermark", labels=["topic", "partition"]
        )
        start = GaugeMetricFamily(
            "headrace_partition_log_start_offset", "Log start offset", labels=["topic", "partition"]
        )
        size = GaugeMetricFamily(
            "headrace_partition_size_bytes", "Bytes on local disk", labels=["topic", "partition"]
        )
        lrs_size = GaugeMetricFamily(
            "headrace_partition_lrs_size",
            "Live replica set size (leaders only)",
            labels=["topic", "partition"],
        )
        follower_lag = GaugeMetricFamily(
            "headrace_follower_lag_records",
            "Records a follower is behind the leader",
            labels=["topic", "partition", "follower"],
        )
        segs = GaugeMetricFamily(
            "headrace_partition_segments", "Segment files", labels=["topic", "partition"]
        )
        stored = GaugeMetricFamily(
            "headrace_partition_uploaded_through",
            "Last offset stored contiguously in the object store (tiered partitions)",
            labels=["topic", "partition"],
        )
        lag = GaugeMetricFamily(
            "headrace_cohort_lag_records",
            "Records between a cohort's cursor and the high watermark",
            labels=["topic", "partition", "cohort"],
        )
        for p in self._partitions():
            labels = [p.topic.name, str(p.index)]
            leo.add_metric(labels, p.log.next_offset)
            hw.add_metric(labels, p.high_watermark)
            start.add_metric(labels, p.log.log_start_offset)
            size.add_metric(labels, p.log.size_bytes)
            segs.add_metric(labels, len(p.log.segments))
            if p.tiering is not None:
                stored.add_metric(labels, p.tiering.uploaded_through)
            if p.replica_set is not None:
                lrs_size.add_metric(labels, len(p.replica_set.lrs))
                for follower, progress in p.replica_set.followers.items():
                    follower_lag.add_metric(
                        [*labels, str(follower)], max(0, p.log.next_offset - progress.leo)
                    )
            for cohort, cursor in p.cursors.all().items():
                lag.add_metric([*labels, cohort], max(0, p.high_watermark - cursor))
        yield from (leo, hw, start, size, segs, lag, lrs_size, follower_lag, stored)


class BrokerMetrics:
    def __init__(self, partitions: Callable[[], list[Partition]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.produced_records = Counter("headrace_produced_records", "Records appended", registry=r)
        self.produced_bytes = Counter("headrace_produced_bytes", "Batch bytes appended", registry=r)
        self.fetched_bytes = Counter(
            "headrace_fetched_bytes", "Bytes returned by fetch", registry=r
        )
        self.delivered_bytes = Counter(
            "headrace_delivered_bytes", "Bytes pushed to cohort members", registry=r
        )
        self.cohort_skipped_records = Counter(
            "headrace_cohort_skipped_records",
            "Records a cohort never received because retention deleted them first (its"
            " delivery position was below the log start)",
            ["topic", "partition", "cohort"],
            registry=r,
        )
        self.refused_documents = Counter(
            "headrace_admin_documents_refused",
            "Controller documents refused because their format is newer than this broker"
            " reads (the controller runs a newer release: upgrade the brokers first)",
            ["document"],
            registry=r,
        )
        self.errors = Counter("headrace_errors", "Errors answered, by type", ["type"], registry=r)
        self.redirects = Counter("headrace_redirects", "Redirects answered", registry=r)
        self.acl_denials = Counter(
            "headrace_acl_denials",
            "Requests refused by access control: authenticate, identity, produce, consume,"
            " admin or cluster",
            ["operation"],
            registry=r,
        )
        self.acl_reloads = Counter(
            "headrace_acl_reloads",
            "Credential file reloads (SIGHUP or the file watch) by source (acl, auth_tokens,"
            " replication_token, cluster_key) and result: ok, or error (what was in force stays)",
            ["source", "result"],
            registry=r,
        )
        self.connections = Gauge("headrace_connections", "Open client connections", registry=r)
        self.fsync_seconds = Histogram(
            "headrace_fsync_round_seconds",
            "Duration of one group-commit round",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.log_sync_failures = Counter(
            "headrace_log_sync_failures",
            "Partition logs whose data fdatasync failed (sticky: the broker halts)",
            registry=r,
        )
        self.recovery_seconds = Gauge(
            "headrace_recovery_seconds", "Time spent recovering logs at start", registry=r
        )
        self.truncations = Counter(
            "headrace_replica_truncations",
            "Follower logs cut back to the leader's prefix",
            registry=r,
        )
        self.leadership_changes = Counter(
            "headrace_leadership_changes",
            "Partitions this broker started or stopped leading",
            registry=r,
        )
        self.lrs_changes = Counter(
            "headrace_lrs_changes", "Live replica set changes led here", registry=r
        )
        self.topology_generation = Gauge(
            "headrace_topology_generation", "Current topology generation", registry=r
        )
        self.tier_uploaded_bytes = Counter(
            "headrace_tier_uploaded_bytes",
            "Bytes of segments uploaded to the object store",
            registry=r,
        )
        self.tier_uploaded_objects = Counter(
            "headrace_tier_uploaded_objects", "Segment objects uploaded", registry=r
        )
        self.tier_retention_deleted_objects = Counter(
            "headrace_tier_retention_deleted_objects",
            "Segment objects retention removed from the tier and deleted",
            registry=r,
        )
        self.tier_upload_errors = Counter(
            "headrace_tier_upload_errors", "Upload rounds that failed (retried)", registry=r
        )
        self.tier_delete_errors = Counter(
            "headrace_tier_delete_errors",
            "Deletes of objects retention removed that the store refused or failed (retried)",
            registry=r,
        )
        self.tier_read_bytes = Counter(
            "headrace_tier_read_bytes", "Bytes read from the object store for readers", registry=r
        )
        self.replica_fetches = Counter(
            "headrace_replica_fetches",
            "Replica fetch session answers sent (leader side)",
            registry=r,
        )
        self.replica_fetch_partitions = Counter(
            "headrace_replica_fetch_partitions",
            "Partitions looked at to answer replica fetches (leader side): named or moved only",
            registry=r,
        )
        self.heartbeat_reports = Counter(
            "headrace_heartbeat_reports_built",
            "Partition reports rebuilt to answer heartbeat polls: marked or swept only",
            registry=r,
        )
        self.seals = Counter("headrace_seals", "Partitions sealed here for a move", registry=r)
        self.reopens = Counter(
            "headrace_reopens", "Partitions reopened here after a move", registry=r
        )
        r.register(PartitionCollector(partitions))
