"""The ports between the broker's parts: what each one needs of the others.

``app.Broker`` composes the parts; none of them reaches back through it. A
client ``Connection`` sees its broker as a ``ConnectionHost`` (and its op handlers,
``broker.handlers``, see the connection as a ``FrameLink``), ``Replication``
as a ``ReplicationHost``, tiered storage's parts as a ``TieringHost``, the admin
server as an ``AdminHost``, and a cohort runtime reads the object store through
``TieredReads``. The broker implements these structurally; a unit test passes
a fake instead of a whole broker.

Collaborators report what happened to a partition as *lifecycle events*
(``PartitionEvent``), published to a sink they are given; they do not know who
listens. The broker subscribes and re-plans (``replication.assigning``).

This module imports none of the implementations (server, replicating,
tiering and its tier_* parts, cohorting, admin, app), which is what keeps the
broker's modules free of import cycles (the "No import cycles in any headrace package"
contract in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.broker.certificates import DistinguishedName
from headrace.broker.config import BrokerSettings
from headrace.broker.fetch_sessions import FetchSession
from headrace.broker.metrics import BrokerMetrics
from headrace.broker.topics import Partition, Topic, TopicRegistry
from headrace.cohorts.gates import CohortGates
from headrace.errors import HeadraceError, StorageError
from headrace.protocol import messages as msg
from headrace.protocol import replication as rp
from headrace.protocol.coordination import ClusterTopology, Heartbeat
from headrace.protocol.endpoints import DEFAULT_LISTENER, BrokerEndpoint
from headrace.protocol.frames import Frame, Op
from headrace.security.access import Access, ConnectionAccess

# --------------------------------------------------------------------------- lifecycle events


@dataclass(frozen=True, slots=True)
class PartitionReopened:
    """A move's reopen finished (``tier_moves``): the partition may take its role now."""

    partition: Partition


@dataclass(frozen=True, slots=True)
class LiveReplicasChanged:
    """A leader's live replica set grew or shrank (``Replication``)."""

    partition: Partition


@dataclass(frozen=True, slots=True)
class LogSyncFailed:
    """An fdatasync of the partition's data failed (``GroupCommitter``), once per log.

    The failure is sticky (``PartitionLog.sync_failure``): the log takes no more
    writes and counts nothing durable again, so the broker must not go on serving
    the partition. It halts, and the controller elects an in-sync replica.
    """

    partition: Partition
    error: StorageError


PartitionEvent = PartitionReopened | LiveReplicasChanged | LogSyncFailed
#: where collaborators publish partition lifecycle events
Publish = Callable[[PartitionEvent], None]


# --------------------------------------------------------------------------- shared parts


class Durability(Protocol):
    """The group committer as the parts that append see it (``syncing.GroupCommitter``)."""

    def appended(self, partition: Partition) -> None: ...

    def wait_durable(self, partition: Partition, offset: int) -> asyncio.Future[None]: ...


class TieredReads(Protocol):
    """Reads below a partition's local log start, from the object store (``tier_reads``)."""

    def earliest(self, p: Partition) -> int:
        """The lowest offset a reader can get, stored or local."""

    async def read(self, p: Partition, offset: int, max_bytes: int) -> bytes: ...


class LeaderSide(Protocol):
    """Replication's leader side, which a follower's connection calls (``Replication``)."""

    def serve_fetch(self, request: rp.ReplicaFetch) -> rp.ReplicaFetchOk: ...

    def open_session(
        self, request: rp.ReplicaFetch, session: FetchSession | None
    ) -> FetchSession: ...

    def serve_session(
        self, session: FetchSession, asked: Iterable[tuple[str, int]]
    ) -> rp.ReplicaFetchOk: ...

    def answer_epochs(self, queries: list[rp.EpochQuery]) -> list[rp.EpochAnswer]: ...


# --------------------------------------------------------------------------- cohorts


class MemberLink(Protocol):
    """What a cohort runtime needs from a member's connection."""

    @property
    def writable(self) -> bool: ...

    def push_assignment(self, assignment: msg.Assignment) -> None: ...

    def push_delivery(
        self, partition: int, epoch: int, hw: int, first_offset: int, data: bytes | memoryview
    ) -> None: ...

    def membership_ended(self) -> None:
        """The member left the cohort (leave completed, or its session expired)."""


class Cohort(Protocol):
    """One cohort as a member's connection drives it (``cohorting.CohortRuntime``)."""

    @property
    def topic(self) -> Topic: ...

    @property
    def name(self) -> str: ...

    def join(
        self,
        member_id: str,
        link: MemberLink,
        *,
        start: str,
        session_timeout_ms: int,
        isolation: msg.Isolation,
    ) -> msg.Assignment: ...

    def leave(self, member_id: str) -> None: ...

    def heartbeat(self, member_id: str) -> None: ...

    def disconnect(self, member_id: str, link: MemberLink | None = None) -> None: ...

    def release(self, member_id: str, partitions: list[int]) -> None: ...

    def credit(self, member_id: str, amount: int) -> None: ...

    def ack(self, member_id: str, partition: int, epoch: int, offset: int) -> int: ...

    def seek(self, member_id: str, partition: int, offset: int) -> int: ...

    def wake(self) -> None: ...


class CohortDelivery(Protocol):
    """What sealing needs of a cohort: whether deliveries await acks, and a nudge."""

    def in_flight(self, partition: int) -> bool: ...

    def wake(self) -> None: ...


class CohortStatus(Protocol):
    """A cohort as the admin status page shows it."""

    @property
    def gates(self) -> CohortGates: ...


# --------------------------------------------------------------------------- hosts


class RedirectRequired(Exception):
    """Raised by routing checks (``ConnectionHost.partition_for_write`` and
    ``partition_for_read``); a connection answers with a Redirect frame."""

    def __init__(self, redirect: msg.Redirect) -> None:
        super().__init__(redirect.reason)
        self.redirect = redirect


class ClientLink(Protocol):
    """A client connection as its broker sees it (``server.Connection``)."""

    @property
    def acked_generation(self) -> int | None: ...

    @property
    def listener(self) -> str: ...

    def push_topology(self, snapshot: msg.TopologySnapshot, routing: object) -> None: ...

    def close(self) -> None: ...


class BrokerCore(Protocol):
    """What every collaborator sees of its broker: settings, metrics and the topics."""

    @property
    def settings(self) -> BrokerSettings: ...

    @property
    def metrics(self) -> BrokerMetrics: ...

    @property
    def registry(self) -> TopicRegistry: ...


class ConnectionHost(BrokerCore, Protocol):
    """What a client connection needs of its broker (``app.Broker``)."""

    @property
    def access(self) -> Access: ...

    @property
    def client_issuers(self) -> frozenset[DistinguishedName]:
        """The issuers whose client certificates name principals (``certificates``)."""
        ...

    @property
    def committer(self) -> Durability: ...

    @property
    def replication(self) -> LeaderSide: ...

    @property
    def tiering(self) -> TieredReads: ...

    def connection_opened(self, conn: ClientLink) -> None: ...

    def connection_closed(self, conn: ClientLink) -> None: ...

    @property
    def cluster(self) -> ClusterTopology | None:
        """Cluster mode: the last topology the controller pushed (None: standalone, or
        before the first push)."""

    def topology(self, listener: str = DEFAULT_LISTENER) -> tuple[msg.TopologySnapshot, object]: ...

    def partition_for_write(self, topic: str, partition: int, version: int) -> Partition: ...

    def partition_for_read(self, topic: str, partition: int) -> Partition: ...

    def cohort(self, topic_name: str, name: str) -> Cohort: ...

    def maybe_drop_cohort(self, cohort: Cohort) -> None: ...

    def create_topic(
        self, name: str, partitions: int, config: dict[str, Any] | None = None
    ) -> Topic: ...

    def delete_topic(self, name: str) -> None: ...

    def add_partitions(self, name: str, count: int) -> None: ...

    def reconfigure_topic(
        self,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        validate_only: bool = False,
    ) -> None: ...

    def describe_topic(self, name: str) -> dict[str, Any]: ...

    def describe_cohorts(self, request: msg.DescribeCohorts) -> dict[str, Any]: ...

    def reset_cursors(self, request: msg.ResetCursors) -> dict[str, Any]: ...


class ReplicationHost(BrokerCore, Protocol):
    """What replication needs of its broker (``app.Broker``)."""

    @property
    def committer(self) -> Durability: ...

    def endpoint(self, broker_id: int) -> BrokerEndpoint | None:
        """Where broker ``broker_id`` is in the pushed topology (None: unknown, or no push yet)."""

    def client_ssl_context(self) -> ssl.SSLContext | None: ...

    @property
    def replication_token(self) -> str | None:
        """The token to present to other brokers now (it changes when its file rotates)."""


class TieringHost(BrokerCore, Protocol):
    """What tiered storage needs of its broker (``app.Broker``)."""

    @property
    def committer(self) -> Durability: ...

    @property
    def cluster_id(self) -> str:
        """The cluster the pushed topology names (the configured one before any push)."""

    @property
    def awaiting_topology(self) -> bool:
        """A cluster broker before the controller's first push: roles are unknown."""

    def cohorts_of(self, topic: str) -> Sequence[CohortDelivery]: ...


class AdminHost(BrokerCore, Protocol):
    """What the admin HTTP server needs of its broker (``app.Broker``)."""

    @property
    def access(self) -> Access: ...

    @property
    def ready(self) -> bool: ...

    @property
    def admin_ssl(self) -> ssl.SSLContext | None:
        """The admin listener's TLS context (None: plain HTTP); certificates reload into it."""
        ...

    @property
    def recovery_seconds(self) -> float: ...

    draining: bool

    def drain_report(self) -> dict[str, Any]: ...

    @property
    def connections(self) -> Sized: ...

    @property
    def cohorts(self) -> Mapping[tuple[str, str], CohortStatus]: ...

    @property
    def cluster_generation(self) -> int | None:
        """The generation of the topology applied last (None before the first push)."""

    def adoption_floor(self) -> int | None: ...

    def heartbeat(self, since: str | None = None) -> Heartbeat: ...

    def apply_topology(self, doc: dict[str, Any]) -> bool: ...

    async def receive_topology(self, doc: dict[str, Any]) -> bool: ...

    def create_topic(
        self, name: str, partitions: int, config: dict[str, Any] | None = None
    ) -> Topic: ...

    def delete_topic(self, name: str) -> None: ...

    def describe_topic(self, name: str) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- op handlers

#: one op's handler, bound to its connection's handler object (``broker.handlers``)
Handler = Callable[[Frame], None]
#: the ops one handler object answers, each to its handler
Routes = Mapping[Op, Handler]


class FrameLink(MemberLink, Protocol):
    """A client connection as its op handlers see it (``server.Connection``): who is
    asking, and where the answers go. Handlers never touch its transport directly."""

    @property
    def broker(self) -> ConnectionHost: ...

    @property
    def access(self) -> ConnectionAccess: ...

    @property
    def peer(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def listener(self) -> str:
        """The listener that accepted it: the addresses its topology snapshots name."""

    def peercert(self) -> object:
        """The peer's TLS certificate (``getpeercert()``), None without one."""

    def authenticated_as(self, client_id: str) -> None:
        """The handshake succeeded: take every op, and frames up to the full size."""

    def close_after_error(self) -> None:
        """The error the current frame is answered with ends the connection."""

    def respond(self, frame: Frame, op: Op, body: bytes = b"") -> None: ...

    def write(self, data: bytes | memoryview) -> None: ...

    def writelines(self, parts: Sequence[bytes | memoryview]) -> None: ...

    def send_error(self, correlation_id: int, exc: HeadraceError) -> None: ...

    def push(self, op: Op, body: bytes) -> None: ...
