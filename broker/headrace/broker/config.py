"""Broker settings: one typed object, read from flags/env once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from headrace.kafka.offsets_log import DEFAULT_OFFSETS_TOPIC
from headrace.security.settings import AccessSettings, AdminReadAccess, TlsSettings
from headrace.storage.bookkeeping import LogConfig


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """One data listener besides the default (``host``/``port``): the same protocol on
    another address, whose clients are told every broker's address on this listener
    (``--listener``, ``--advertised-listener``)."""

    #: what the brokers' heartbeats and pushes name it by; every broker of a cluster
    #: names the same listener the same
    name: str
    #: the address it binds to; port 0 picks a free one
    host: str
    port: int
    #: what clients that came in through it are told to dial (None: the bind host)
    advertised_host: str | None = None
    #: None: the bound port
    advertised_port: int | None = None
    #: the certificate this listener serves (the names its clients dial, say a load
    #: balancer's); client certificates are checked as on the data port. None: the data
    #: port's TLS (``BrokerSettings.tls``), if any
    tls: TlsSettings | None = None


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    data_dir: Path
    #: address the data port binds to; loopback by default so nothing listens unasked
    host: str = "127.0.0.1"
    port: int = 9092
    admin_host: str = "127.0.0.1"
    #: admin HTTP port (health, metrics, topic admin); 0 picks a free one; -1 disables
    admin_port: int = 9644
    #: the host:port clients are told to use (defaults to host:port)
    advertised_host: str | None = None
    #: more data listeners (``protocol.endpoints.DEFAULT_LISTENER`` is the one above, which
    #: brokers replicate through); empty: the default listener alone
    listeners: tuple[ListenerSettings, ...] = ()
    #: the Kafka listener (docs/kafka.md): its own port, -1 = off; 0 picks a free one
    kafka_port: int = -1
    #: the address the Kafka listener binds to (None: ``host``)
    kafka_host: str | None = None
    #: where Kafka clients are told to connect in Metadata (None: ``advertised_host``, then
    #: the bind address; the bound port)
    kafka_advertised_host: str | None = None
    kafka_advertised_port: int | None = None
    #: cluster mode: the topic Kafka groups' committed offsets are kept in, whose partition
    #: leaders coordinate the groups (``kafka.offsets_log``; docs/kafka.md)
    kafka_offsets_topic: str = DEFAULT_OFFSETS_TOPIC
    broker_id: int = 0
    #: the rack (zone) this broker runs in, reported in heartbeats; the controller spreads
    #: a partition's replicas over racks (Kafka's ``broker.rack``). None: not in a rack
    rack: str | None = None
    cluster_id: str = "standalone"
    log: LogConfig = field(default_factory=LogConfig)
    #: frames larger than this close the connection (16 MiB fits the largest batch plus headers)
    max_frame_bytes: int = 16 * 1024 * 1024
    #: tokens accepted in the handshake; empty = no authentication
    auth_tokens: frozenset[str] = frozenset()
    #: more accepted tokens, one per line, re-read on change (docs/security.md §9); with
    #: ``auth_tokens`` or alone, it turns the shared-token mode on
    auth_token_file: Path | None = None
    tls: TlsSettings | None = None
    #: principals, their credentials and grants (docs/security.md); None = no ACLs
    acl_file: Path | None = None
    #: how often the credential files (ACL, token files, cluster key) are checked for changes
    #: (a stat each) and reloaded; 0 = only on SIGHUP.
    #: 2 s: a revoked token stops working within seconds, and a stat costs microseconds
    acl_reload_interval_ms: int = 2000
    #: who may read admin HTTP (metrics, topics, status, heartbeat; never /healthz, /readyz):
    #: "open", or "authenticated" (a bearer token that authenticates on the data port)
    admin_read_access: AdminReadAccess = AdminReadAccess.OPEN
    #: serve admin HTTP over TLS with this certificate and key (None: plain HTTP)
    admin_tls: TlsSettings | None = None
    #: the HMAC keys signing member identities, shared by the cluster's brokers, one per line
    #: (the first signs, any verifies), re-read on change; None with an ACL file =
    #: ``<data_dir>/cluster.key``, made on first start (standalone only)
    cluster_key_file: Path | None = None
    #: cursor changes reach disk within this many ms; bounds redelivery after a crash
    cursor_flush_interval_ms: int = 200
    #: how long a revoked partition's holder may finish in-flight records before the gate moves
    cohort_grace_ms: int = 10_000
    #: bytes per delivery frame; large frames amortise per-frame cost during catch-up
    delivery_chunk_bytes: int = 1024 * 1024
    #: how often retention runs
    retention_check_interval_ms: int = 30_000
    #: cluster mode: partitions, roles and epochs come from a controller's pushed topology
    cluster_mode: bool = False
    #: a follower not caught up with the leader for this long leaves the live replica set
    replica_lag_max_ms: int = 10_000
    #: a follower that has not fetched for this long leaves the live replica set (it is dead:
    #: a live one fetches once per replica_fetch_wait_ms); the controller's liveness TTL
    replica_fetch_silence_max_ms: int = 3_000
    #: how long a leader holds an empty replica fetch open (bounds replication latency when idle)
    replica_fetch_wait_ms: int = 500
    #: token this broker presents to other brokers' data ports (when they require auth)
    replication_token: str | None = None
    #: the replication tokens in a file, one per line, re-read on change: the first is
    #: presented, every one is accepted as the brokers' (rotation, docs/security.md §9);
    #: replaces ``replication_token`` when given
    replication_token_file: Path | None = None
    #: where tiered topics upload segments (``file:///dir`` or ``s3://host:port/bucket``);
    #: None turns tiered storage off on this broker
    object_store_url: str | None = None
    #: largest segment object one upload writes (an object never spans local segments)
    tier_object_max_bytes: int = 64 * 1024 * 1024
    #: upload the active segment's tail early once this much is pending, before the interval
    tier_upload_threshold_bytes: int = 16 * 1024 * 1024
    #: objects retention removed from the manifest are deleted this long after, ms: a reader
    #: that holds the manifest from before reads them until then (compaction's 30 s)
    tier_delete_grace_ms: int = 30_000
    #: a sealing partition waits this long for cohort members to ack in-flight records
    #: before it snapshots the cursors (acks after it may be redelivered by the new owner)
    seal_ack_wait_ms: int = 1000

    def access_settings(self) -> AccessSettings:
        """What this broker's access control reads (``headrace.security.access``); the
        cluster key is made in the data directory unless ``cluster_key_file`` is given."""
        return AccessSettings(
            cluster_id=self.cluster_id,
            auth_tokens=self.auth_tokens,
            auth_token_file=self.auth_token_file,
            acl_file=self.acl_file,
            cluster_key_file=self.cluster_key_file,
            cluster_key_dir=self.data_dir,
            replication_token=self.replication_token,
            replication_token_file=self.replication_token_file,
            cluster_mode=self.cluster_mode,
        )
