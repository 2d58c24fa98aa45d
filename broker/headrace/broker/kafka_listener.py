"""The Kafka listener: Kafka's wire protocol over the same partitions, logs and replication.

One ``KafkaConnection`` per client socket. Frames (a big-endian int32 size, then
the request) are cut from the stream here; ``headrace.kafka`` decodes and
encodes them. Handlers reuse what the native port uses (``partition_for_write``,
``PartitionLog.append``, the HW waiters, the group committer) and answer with
Kafka's error codes. Kafka clients expect the responses of one connection in
request order, so each request takes a slot and slots are written in order as
they complete (a long-polling fetch holds back the answers behind it, as in Kafka).

What this slice serves is ``kafka.messages.SUPPORTED``; anything else gets
``UNSUPPORTED_VERSION``, a request that does not parse gets ``INVALID_REQUEST``,
and the connection stays open unless its framing is lost. ``docs/kafka.md`` says
what differs from Kafka.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from headrace import transports
from headrace.broker import appending, certificates, kafka_consumer_groups
from headrace.broker.cohort_admin import offset_for_timestamp, offset_of_max_timestamp
from headrace.broker.ports import RedirectRequired
from headrace.broker.topics import MAX_PARTITIONS, Role, topic_log_config
from headrace.errors import (
    AuthenticationFailed,
    CorruptBatch,
    HeadraceError,
    InvalidRecordBatch,
    InvalidTopicSpec,
    OffsetOutOfRange,
    RequestTimedOut,
    UnknownPartition,
    UnknownTopic,
)
from headrace.kafka import configs, groups, topic_ids
from headrace.kafka import messages as km
from headrace.kafka import partitions as partition_counts
from headrace.kafka.convert import to_kafka
from headrace.kafka.errors import ErrorCode, code_of, commit_code_of
from headrace.kafka.topic_ids import kafka_topic_name, topic_id
from headrace.kafka.wire import MalformedKafkaRequest, Reader, Writer
from headrace.protocol.endpoints import KafkaAddress
from headrace.records import batch as rb
from headrace.records.topic_names import canonical_topic_name
from headrace.security.acl import Operation
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig

if TYPE_CHECKING:
    from headrace.broker.kafka_groups import KafkaGroups
    from headrace.broker.ports import ConnectionHost
    from headrace.broker.topics import Partition
    from headrace.protocol.coordination import ClusterTopology

log = logging.getLogger(__name__)

Parts = list[bytes | bytearray | memoryview]

#: what a connection may ask before it has authenticated (as Kafka's SASL listeners)
_BEFORE_AUTHENTICATION: Final = frozenset(
    {km.ApiKey.API_VERSIONS, km.ApiKey.SASL_HANDSHAKE, km.ApiKey.SASL_AUTHENTICATE}
)
_PLAIN: Final = "PLAIN"
#: fresh object-store reads one fetch may make when retention overtakes it
_TIERED_RETRIES: Final = 3


class _Pass(enum.Enum):
    OK = "ok"
    ERROR = "error"
    TIERED = "tiered"


#: Kafka's acks: none, the leader, every live replica (then minInSync applies)
_ACKS_NONE, _ACKS_LEADER, _ACKS_ALL = 0, 1, -1
#: a fetch never parks longer than this, whatever it asks
_MAX_WAIT_MS = 60_000


class _Slot:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: Parts | None = None


class KafkaConnection(asyncio.Protocol):
    def __init__(
        self,
        broker: ConnectionHost,
        advertised: Callable[[], tuple[str, int]],
        connections: set[KafkaConnection],
        groups: KafkaGroups,
    ) -> None:
        self.broker = broker
        self.groups = groups
        self.connections = connections
        self.advertised = advertised
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._buffer = bytearray()
        self._slots: deque[_Slot] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.access = broker.access.session()
        #: until a credential is accepted (SASL, or a client certificate) only
        #: ``_BEFORE_AUTHENTICATION`` is served; without credentials to check, at once
        self.authenticated = not broker.access.asks_credentials
        self.sasl_mechanism: str | None = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transports.adopt(transport)
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.connections.add(self)
        certificate = self._client_certificate()
        if not self.authenticated and certificate is not None:
            # a client certificate names a principal as Kafka's SSL listeners take it
            try:
                self.access.authenticate(None, certificate)
                self.authenticated = True
            except AuthenticationFailed:
                pass  # SASL may still name one

    def _client_certificate(self) -> object:
        assert self.transport is not None
        peercert = self.transport.get_extra_info("peercert")
        # only the client CA's certificates name principals, not the brokers' own CA's
        return certificates.client_certificate(peercert, self.broker.client_issuers)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        for task in list(self._tasks):
            task.cancel()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        limit = self.broker.settings.max_frame_bytes
        if not self.authenticated:
            limit = self.broker.access.max_frame_bytes_before_handshake(limit)
        while len(self._buffer) >= 4:
            size = int.from_bytes(self._buffer[:4], "big", signed=True)
            if size < 8 or size > limit:
                # The framing is lost or hostile: answer what can be answered, then close.
                if len(self._buffer) >= 12:
                    self._send_error_only(self._buffer[8:12], ErrorCode.MESSAGE_TOO_LARGE)
                log.warning("kafka: %s sent a frame of %d bytes; closing", self.peer, size)
                self.close()
                return
            if len(self._buffer) < 4 + size:
                return
            frame = bytes(self._buffer[4 : 4 + size])
            del self._buffer[: 4 + size]
            self._handle(frame)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    # ------------------------------------------------------------------ requests

    def _handle(self, frame: bytes) -> None:
        r = Reader(frame)
        try:
            header = km.decode_request_header(r)
        except MalformedKafkaRequest:
            self._send_error_only(frame[4:8], ErrorCode.INVALID_REQUEST)
            return
        api = km.SUPPORTED.get(header.api_key)
        if api is None or not api.supports(header.api_version):
            self._unsupported(header)
            return
        try:
            if api.flexible(header.api_version):
                km.skip_header_tags(r)
            body = km.decode_request(api, header.api_version, r)
        except MalformedKafkaRequest as exc:
            log.info(
                "kafka: malformed %s v%d from %s: %s (frame starts %s)",
                api.key.name,
                header.api_version,
                self.peer,
                exc,
                frame[:64].hex(),
            )
            self._send_error_only(frame[4:8], ErrorCode.INVALID_REQUEST)
            return
        if not self.authenticated and api.key not in _BEFORE_AUTHENTICATION:
            log.info("kafka: %s sent %s before authenticating; closing", self.peer, api.key.name)
            self._send_error_only(frame[4:8], ErrorCode.ILLEGAL_SASL_STATE)
            self.close()
            return
        if isinstance(body, km.ProduceRequest) and body.acks == _ACKS_NONE:
            try:
                self._produce(header, body, None)  # Kafka sends no answer to acks=0
            except Exception:
                log.exception("kafka: acks=0 produce from %s failed", self.peer)
            return
        slot = _Slot()
        self._slots.append(slot)
        try:
            if isinstance(body, km.ApiVersionsRequest):
                answer = km.ApiVersionsResponse(0, km.advertised_versions())
                self._complete(slot, api, header, answer)
            elif isinstance(body, km.MetadataRequest):
                self._complete(slot, api, header, self._metadata(header, body))
            elif isinstance(body, km.ProduceRequest):
                self._produce(header, body, slot)
            elif isinstance(body, km.ListOffsetsRequest):
                self._complete(slot, api, header, self._list_offsets(header.api_version, body))
            elif isinstance(body, km.FetchRequest):
                self._spawn(self._fetch(slot, api, header, body))
            elif isinstance(body, km.SaslHandshakeRequest):
                self._complete(slot, api, header, self._sasl_handshake(body))
            elif isinstance(body, km.SaslAuthenticateRequest):
                outcome = self._sasl_authenticate(body)
                self._complete(slot, api, header, outcome)
                if outcome.error_code != ErrorCode.NONE:
                    self.close()  # as Kafka: a failed authentication ends the connection
            elif isinstance(body, km.JoinGroupRequest):
                self._spawn(self._join_group(slot, api, header, body))
            elif isinstance(body, km.SyncGroupRequest):
                self._spawn(self._sync_group(slot, api, header, body))
            elif isinstance(body, km.OffsetCommitRequest):
                self._spawn(self._offset_commit(slot, api, header, body))
            elif isinstance(body, km.ConsumerGroupHeartbeatRequest):
                client, host = header.client_id, self.peer.rpartition(":")[0]
                topics = kafka_consumer_groups.topics_of(self.broker, self.access, body.group_id)
                beat = kafka_consumer_groups.heartbeat(
                    self.groups, topics, self.access, client, host, body
                )
                self._complete(slot, api, header, beat)
            elif isinstance(body, km.ConsumerGroupDescribeRequest):
                described = kafka_consumer_groups.describe(self.groups, self.broker, body)
                self._complete(slot, api, header, described)
            elif isinstance(body, km.DeleteGroupsRequest):
                self._spawn(self._delete_groups(slot, api, header, body))
            elif isinstance(body, km.OffsetDeleteRequest):
                self._spawn(self._offset_delete(slot, api, header, body))
            else:
                self._complete(slot, api, header, self._answer_at_once(body))
        except Exception:
            log.exception(
                "kafka: %s v%d from %s failed", api.key.name, header.api_version, self.peer
            )
            slot.parts = _error_only(header.correlation_id, ErrorCode.UNKNOWN_SERVER_ERROR)
            self._flush()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _unsupported(self, header: km.RequestHeader) -> None:
        if header.api_key == km.ApiKey.API_VERSIONS:
            # KIP-511: answer in v0 with the error and our table; the client retries with it.
            api = km.SUPPORTED[km.ApiKey.API_VERSIONS]
            answer = km.ApiVersionsResponse(ErrorCode.UNSUPPORTED_VERSION, km.advertised_versions())
            slot = _Slot()
            self._slots.append(slot)
            self._complete(
                slot, api, km.RequestHeader(header.api_key, 0, header.correlation_id, None), answer
            )
            return
        log.info(
            "kafka: %s asked for api %d v%d, not served",
            self.peer,
            header.api_key,
            header.api_version,
        )
        self._send_error_only(
            header.correlation_id.to_bytes(4, "big", signed=True), ErrorCode.UNSUPPORTED_VERSION
        )

    def _send_error_only(self, correlation_id: bytes | bytearray, code: ErrorCode) -> None:
        """Header v0 and an int16 error code: the answer to a request we cannot parse or do not
        serve. Its body is no schema's, so a client raises on it rather than hanging."""
        slot = _Slot()
        slot.parts = _error_only(int.from_bytes(correlation_id, "big", signed=True), code)
        self._slots.append(slot)
        self._flush()

    def _complete(self, slot: _Slot, api: km.Api, header: km.RequestHeader, body: Any) -> None:
        slot.parts = km.encode_response(api, header.api_version, header.correlation_id, body)
        self._flush()

    def _flush(self) -> None:
        while self._slots and self._slots[0].parts is not None:
            parts = self._slots.popleft().parts
            if self.transport is not None and not self.closed and parts:
                self.transport.writelines(parts)

    # ------------------------------------------------------------------ Metadata

    def _metadata(self, header: km.RequestHeader, req: km.MetadataRequest) -> km.MetadataResponse:
        if self.broker.cluster is not None:
            return self._cluster_metadata(header, req, self.broker.cluster)
        settings = self.broker.settings
        me = settings.broker_id
        host, port = self.advertised()
        registry = self.broker.registry
        if req.topics is None or (header.api_version == 0 and not req.topics):
            names = sorted(kafka_topic_name(name) for name in registry.topics)
        else:
            known = [kafka_topic_name(name) for name in registry.topics]
            names = [topic_ids.named(t.name, t.topic_id, known) for t in req.topics]
        topics = []
        for name in names:
            try:
                topic = registry.get(name)
            except HeadraceError as exc:
                topics.append(km.MetadataResponseTopic(code_of(exc), name, bytes(16)))
                continue
            try:
                self.access.require(Operation.CONSUME, name)
            except HeadraceError as exc:
                topics.append(km.MetadataResponseTopic(code_of(exc), name, topic_id(name)))
                continue
            partitions = []
            for index in range(topic.partition_count):
                part = topic.partitions.get(index)
                leader = -1 if part is None else me if part.role is Role.LEADER else part.leader_id
                if part is None or leader < 0:
                    partitions.append(
                        km.MetadataResponsePartition(ErrorCode.LEADER_NOT_AVAILABLE, index, -1)
                    )
                    continue
                partitions.append(
                    km.MetadataResponsePartition(
                        ErrorCode.NONE,
                        index,
                        leader,
                        part.leader_epoch,
                        list(part.replicas) or [leader],
                        # Kafka's ISR is our live replica set (a lone leader has none)
                        part.lrs if part.replica_set is not None else [leader],
                        [],
                    )
                )
            topics.append(
                km.MetadataResponseTopic(ErrorCode.NONE, name, topic_id(name), False, partitions)
            )
        return km.MetadataResponse(
            brokers=[km.MetadataResponseBroker(me, host, port)],
            cluster_id=settings.cluster_id,
            controller_id=me,
            topics=topics,
        )

    def _cluster_metadata(
        self, header: km.RequestHeader, req: km.MetadataRequest, cluster: ClusterTopology
    ) -> km.MetadataResponse:
        """Metadata from the pushed topology: every broker with a Kafka listener, and each
        partition's leader, epoch, replicas and ISR (the controller's live replica set,
        or this leader's own when it leads the partition). A topic lists its active
        partitions only: a shrink's retired partitions take no produce, and a Kafka
        producer spreads keys over every partition Metadata gives (docs/kafka.md)."""
        me = self.broker.settings.broker_id
        kafka_brokers = {b.id: b.kafka for b in cluster.brokers if b.kafka is not None}
        placements = {kafka_topic_name(t.name): t for t in cluster.topics}
        if req.topics is None or (header.api_version == 0 and not req.topics):
            names = sorted(placements)
        else:
            names = [topic_ids.named(t.name, t.topic_id, placements) for t in req.topics]
        internal = kafka_topic_name(canonical_topic_name(self.broker.settings.kafka_offsets_topic))
        topics = []
        for name in names:
            placement = placements.get(name)
            if placement is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                topics.append(km.MetadataResponseTopic(code, name, bytes(16)))
                continue
            try:
                self.access.require(Operation.CONSUME, name)
            except HeadraceError as exc:
                topics.append(km.MetadataResponseTopic(code_of(exc), name, topic_id(name)))
                continue
            local = self.broker.registry.topics.get(placement.name)
            partitions = []
            for a in sorted(placement.assignments, key=lambda a: a.partition):
                if a.partition >= placement.routing_partitions:
                    continue
                if a.leader is None or a.leader not in kafka_brokers:
                    partitions.append(
                        km.MetadataResponsePartition(
                            ErrorCode.LEADER_NOT_AVAILABLE,
                            a.partition,
                            -1,
                            a.epoch,
                            list(a.replicas),
                            list(a.lrs),
                            [],
                        )
                    )
                    continue
                isr = list(a.lrs)
                part = None if local is None else local.partitions.get(a.partition)
                if a.leader == me and part is not None and part.replica_set is not None:
                    isr = sorted(part.lrs)
                partitions.append(
                    km.MetadataResponsePartition(
                        ErrorCode.NONE, a.partition, a.leader, a.epoch, list(a.replicas), isr, []
                    )
                )
            topics.append(
                km.MetadataResponseTopic(
                    ErrorCode.NONE, name, topic_id(name), name == internal, partitions
                )
            )
        return km.MetadataResponse(
            brokers=[
                km.MetadataResponseBroker(b, address.host, address.port)
                for b, address in sorted(kafka_brokers.items())
            ],
            cluster_id=cluster.cluster_id,
            # admin requests go to the controller id: any broker answers them alike
            controller_id=me if me in kafka_brokers else min(kafka_brokers, default=-1),
            topics=topics,
        )

    # ------------------------------------------------------------------ SASL

    def _sasl_handshake(self, req: km.SaslHandshakeRequest) -> km.SaslHandshakeResponse:
        if req.mechanism != _PLAIN:
            return km.SaslHandshakeResponse(ErrorCode.UNSUPPORTED_SASL_MECHANISM, [_PLAIN])
        self.sasl_mechanism = _PLAIN
        return km.SaslHandshakeResponse(ErrorCode.NONE, [_PLAIN])

    def _sasl_authenticate(self, req: km.SaslAuthenticateRequest) -> km.SaslAuthenticateResponse:
        """PLAIN (RFC 4616): the password is one of our tokens. With an ACL file the user
        name must be the token's principal; with shared tokens it is not checked."""

        def refused(code: ErrorCode, why: str) -> km.SaslAuthenticateResponse:
            log.info("kafka: %s: authentication refused: %s", self.peer, why)
            return km.SaslAuthenticateResponse(code, why)

        if self.sasl_mechanism is None:
            return refused(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake")
        fields = bytes(req.auth_bytes).split(b"\0")
        if len(fields) != 3:
            return refused(ErrorCode.SASL_AUTHENTICATION_FAILED, "malformed PLAIN credentials")
        try:
            authzid, user, password = (f.decode() for f in fields)
        except UnicodeDecodeError:
            return refused(ErrorCode.SASL_AUTHENTICATION_FAILED, "malformed PLAIN credentials")
        if authzid and authzid != user:
            return refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED, "acting as another user is not supported"
            )
        try:
            self.access.authenticate(password, self._client_certificate())
        except AuthenticationFailed as exc:
            return refused(ErrorCode.SASL_AUTHENTICATION_FAILED, exc.message)
        principal = self.access.principal
        if principal is not None and principal.name != user:
            self.access.principal = None
            return refused(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                f"the password is not a token of user {user!r}",
            )
        self.authenticated = True
        return km.SaslAuthenticateResponse(ErrorCode.NONE, None, b"", 0)

    # ------------------------------------------------------------------ groups

    async def _join_group(
        self, slot: _Slot, api: km.Api, header: km.RequestHeader, req: km.JoinGroupRequest
    ) -> None:
        owner = self.groups.owner_error(req.group_id)
        if owner != ErrorCode.NONE:
            body = km.JoinGroupResponse(0, owner, -1, "", "", req.member_id, [])
            self._complete(slot, api, header, body)
            return
        ask = groups.JoinAsk(
            req.group_id,
            req.member_id,
            header.client_id or "",
            self.peer.rpartition(":")[0],
            req.session_timeout_ms,
            # v0 has no rebalance timeout: Kafka takes the session timeout
            req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms,
            req.protocol_type,
            tuple((p.name, p.metadata) for p in req.protocols),
        )
        answer = await self.groups.join(ask)
        members = [km.JoinGroupResponseMember(m, None, meta) for m, meta in answer.members]
        body = km.JoinGroupResponse(
            0,
            answer.error,
            answer.generation,
            answer.protocol_name,
            answer.leader,
            answer.member_id,
            members,
        )
        self._complete(slot, api, header, body)

    async def _sync_group(
        self, slot: _Slot, api: km.Api, header: km.RequestHeader, req: km.SyncGroupRequest
    ) -> None:
        owner = self.groups.owner_error(req.group_id)
        if owner != ErrorCode.NONE:
            self._complete(slot, api, header, km.SyncGroupResponse(0, owner, b""))
            return
        assignments = {a.member_id: a.assignment for a in req.assignments}
        answer = await self.groups.sync(req.group_id, req.generation_id, req.member_id, assignments)
        self._complete(slot, api, header, km.SyncGroupResponse(0, answer.error, answer.assignment))

    def _answer_at_once(self, req: Any) -> Any:
        """The requests answered at once: most of the group APIs, and InitProducerId."""
        if isinstance(req, km.FindCoordinatorRequest):
            if req.key_type != 0:  # transactions have no coordinator here
                return km.FindCoordinatorResponse(
                    0, ErrorCode.COORDINATOR_NOT_AVAILABLE, "transactions are not supported", -1
                )
            mine = (self.broker.settings.broker_id, KafkaAddress(*self.advertised()))
            found, why, node, address = self.groups.find(req.key, mine)
            if address is None:
                return km.FindCoordinatorResponse(0, found, why, -1)
            return km.FindCoordinatorResponse(0, found, why, node, address.host, address.port)
        if isinstance(req, km.HeartbeatRequest):
            code: int = self.groups.owner_error(req.group_id)
            if code == ErrorCode.NONE:
                code = self.groups.heartbeat(req.group_id, req.generation_id, req.member_id)
            return km.HeartbeatResponse(0, code)
        if isinstance(req, km.LeaveGroupRequest):
            code = self.groups.owner_error(req.group_id)
            if code == ErrorCode.NONE:
                code = self.groups.leave(req.group_id, req.member_id)
            return km.LeaveGroupResponse(0, code)
        if isinstance(req, km.OffsetFetchRequest):
            return self._offset_fetch(req)
        if isinstance(req, km.ListGroupsRequest):
            listed = [km.ListedGroup(group, kind) for group, kind in self.groups.listed()]
            return km.ListGroupsResponse(0, ErrorCode.NONE, listed)
        if isinstance(req, km.DescribeGroupsRequest):
            return km.DescribeGroupsResponse(0, [self._describe(g) for g in req.groups])
        if isinstance(req, km.InitProducerIdRequest):
            return _init_producer_id(req)
        if isinstance(req, km.OffsetForLeaderEpochRequest):
            return km.OffsetForLeaderEpochResponse(
                0,
                [
                    km.OffsetForLeaderTopicResult(
                        t.topic, [self._epoch_end(t.topic, p) for p in t.partitions]
                    )
                    for t in req.topics
                ],
            )
        if isinstance(req, km.CreateTopicsRequest):
            return km.CreateTopicsResponse(0, [self._create_topic(t, req) for t in req.topics])
        if isinstance(req, km.DeleteTopicsRequest):
            return km.DeleteTopicsResponse(0, [self._delete_topic(n) for n in req.topic_names])
        if isinstance(req, km.DescribeConfigsRequest):
            return km.DescribeConfigsResponse(0, [self._describe_configs(r) for r in req.resources])
        if isinstance(req, km.CreatePartitionsRequest):
            return km.CreatePartitionsResponse(0, self._create_partitions(req))
        if isinstance(req, km.IncrementalAlterConfigsRequest):
            return km.AlterConfigsResponse(
                0, [self._alter_incrementally(r, req.validate_only) for r in req.resources]
            )
        if isinstance(req, km.AlterConfigsRequest):
            return km.AlterConfigsResponse(
                0, [self._alter_whole(r, req.validate_only) for r in req.resources]
            )
        if isinstance(req, km.DescribeClusterRequest):
            host, port = self.advertised()
            me = self.broker.settings.broker_id
            described = [km.DescribeClusterBroker(me, host, port)]
            cluster = self.broker.cluster
            if cluster is not None:
                described = [
                    km.DescribeClusterBroker(b.id, b.kafka.host, b.kafka.port)
                    for b in cluster.brokers
                    if b.kafka is not None
                ]
            return km.DescribeClusterResponse(
                0,
                ErrorCode.NONE,
                None,
                cluster.cluster_id
                if cluster is not None
                else self.broker.settings.cluster_id or "",
                me,
                described,
            )
        raise AssertionError(f"no handler for {type(req).__name__}")

    def _epoch_end(self, topic: str, asked: km.OffsetForLeaderPartition) -> km.EpochEndOffset:
        """Where ``asked.leader_epoch`` ended in this leader's log: the start of the next
        epoch, or the log end for the current one (what a consumer checks its position
        against after a leader change, KIP-320)."""
        try:
            self.access.require(Operation.CONSUME, topic)
            part = self.broker.partition_for_read(topic, asked.partition)
        except RedirectRequired:
            return km.EpochEndOffset(ErrorCode.NOT_LEADER_OR_FOLLOWER, asked.partition)
        except HeadraceError as exc:
            return km.EpochEndOffset(code_of(exc), asked.partition)
        current = part.leader_epoch
        if asked.current_leader_epoch > current:
            return km.EpochEndOffset(ErrorCode.UNKNOWN_LEADER_EPOCH, asked.partition)
        if 0 <= asked.current_leader_epoch < current:
            return km.EpochEndOffset(ErrorCode.FENCED_LEADER_EPOCH, asked.partition)
        if asked.leader_epoch < 0 or asked.leader_epoch > current:
            return km.EpochEndOffset(ErrorCode.NONE, asked.partition)  # undefined: -1, -1
        if part.log.epochs is None:  # a standalone log has one epoch, its leader's
            return km.EpochEndOffset(ErrorCode.NONE, asked.partition, current, part.log.next_offset)
        epoch, end = part.log.epochs.end_offset_for(asked.leader_epoch, part.log.next_offset)
        return km.EpochEndOffset(ErrorCode.NONE, asked.partition, epoch, end)

    # ------------------------------------------------------------------ topic admin

    def _create_topic(
        self, topic: km.CreatableTopic, req: km.CreateTopicsRequest
    ) -> km.CreatableTopicResult:
        def refused(code: ErrorCode, why: str) -> km.CreatableTopicResult:
            return km.CreatableTopicResult(topic.name, code, why)

        partitions = 1 if topic.num_partitions == -1 else topic.num_partitions
        if not 1 <= partitions <= MAX_PARTITIONS:
            return refused(
                ErrorCode.INVALID_PARTITIONS, f"partitions must be between 1 and {MAX_PARTITIONS}"
            )
        if topic.replication_factor not in (-1, 1):
            return refused(
                ErrorCode.INVALID_REPLICATION_FACTOR, "a standalone broker keeps one replica"
            )
        if topic.assignments:
            return refused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT, "replica assignments are not supported"
            )
        try:
            canonical_topic_name(topic.name)
            self.access.require(Operation.ADMIN, topic.name)
        except HeadraceError as exc:
            return refused(code_of(exc), exc.message)
        try:
            settings = configs.topic_settings((c.name, c.value) for c in topic.configs)
            topic_log_config(LogConfig(), dict(settings))
        except InvalidTopicSpec as exc:
            return refused(ErrorCode.INVALID_CONFIG, exc.message)
        if req.validate_only:
            if kafka_topic_name(canonical_topic_name(topic.name)) in self._topic_names():
                return refused(ErrorCode.TOPIC_ALREADY_EXISTS, f"{topic.name} exists")
            return km.CreatableTopicResult(topic.name, ErrorCode.NONE)
        try:
            self.broker.create_topic(topic.name, partitions, dict(settings))
        except HeadraceError as exc:
            return refused(code_of(exc), exc.message)
        return km.CreatableTopicResult(topic.name, ErrorCode.NONE)

    def _create_partitions(
        self, req: km.CreatePartitionsRequest
    ) -> list[km.CreatePartitionsTopicResult]:
        """Kafka's checks, then the broker's answer to a valid grow (``add_partitions``).
        ``validate_only`` gets the same answer and changes nothing, as in Kafka."""
        names = [t.name for t in req.topics]
        results = []
        for asked in req.topics:
            if names.count(asked.name) > 1:
                results.append(
                    km.CreatePartitionsTopicResult(
                        asked.name, ErrorCode.INVALID_REQUEST, "Duplicate topic name."
                    )
                )
                continue
            try:
                self.access.require(Operation.ADMIN, asked.name)
                current = self._partition_count(asked.name)
            except HeadraceError as exc:
                results.append(
                    km.CreatePartitionsTopicResult(asked.name, code_of(exc), exc.message)
                )
                continue
            refused = partition_counts.check_new_count(
                asked.name,
                current,
                asked.count,
                assigned=asked.assignments is not None,
                limit=MAX_PARTITIONS,
            )
            if refused is not None:
                results.append(
                    km.CreatePartitionsTopicResult(asked.name, refused.code, refused.message)
                )
                continue
            try:
                self.broker.add_partitions(asked.name, asked.count)
            except HeadraceError as exc:
                results.append(
                    km.CreatePartitionsTopicResult(asked.name, code_of(exc), exc.message)
                )
                continue
            results.append(km.CreatePartitionsTopicResult(asked.name, ErrorCode.NONE))
        return results

    def _partition_count(self, name: str) -> int:
        """The partition count a Kafka client sees in ``Metadata``: in a cluster the
        topology's active partitions, which this broker knows whether or not it hosts
        a copy of the topic."""
        cluster = self.broker.cluster
        if cluster is None:
            return self.broker.registry.get(name).partition_count
        try:
            canonical = canonical_topic_name(name)
        except InvalidTopicSpec as exc:
            raise UnknownTopic(exc.message) from exc
        placement = next((t for t in cluster.topics if t.name == canonical), None)
        if placement is None:
            raise UnknownTopic(f"unknown topic {canonical!r}")
        return placement.routing_partitions

    def _topic_names(self) -> set[str]:
        return {kafka_topic_name(name) for name in self.broker.registry.topics}

    def _delete_topic(self, name: str) -> km.DeletableTopicResult:
        try:
            self.access.require(Operation.ADMIN, name)
            self.broker.delete_topic(name)
        except HeadraceError as exc:
            return km.DeletableTopicResult(name, code_of(exc))
        return km.DeletableTopicResult(name, ErrorCode.NONE)

    def _describe_configs(self, asked: km.DescribeConfigsResource) -> km.DescribeConfigsResult:
        result = km.DescribeConfigsResult(
            ErrorCode.NONE, None, asked.resource_type, asked.resource_name
        )
        if asked.resource_type == km.RESOURCE_BROKER:
            return result  # no broker setting is described: an empty, truthful list
        if asked.resource_type != km.RESOURCE_TOPIC:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"resource type {asked.resource_type} is not described"
            return result
        try:
            self.access.require(Operation.CONSUME, asked.resource_name)
            topic = self.broker.registry.get(asked.resource_name)
        except HeadraceError as exc:
            result.error_code = code_of(exc)
            result.error_message = exc.message
            return result
        log_config = next(iter(topic.partitions.values())).log.config
        effective = {ours: getattr(log_config, ours) for ours in configs.KAFKA_TO_OURS.values()}
        for entry in configs.describe(effective, topic.config, asked.configuration_keys):
            source = km.SOURCE_DEFAULT if entry.is_default else km.SOURCE_TOPIC
            result.configs.append(
                km.DescribeConfigsResourceResult(
                    entry.name,
                    entry.value,
                    # in a cluster they are the controller's Topic's (reconfigure_topic)
                    read_only=self.broker.settings.cluster_mode,
                    is_default=entry.is_default,
                    config_source=source,
                    is_sensitive=False,
                    synonyms=[km.DescribeConfigsSynonym(entry.name, entry.value, source)],
                )
            )
        return result

    def _alter_incrementally(
        self, asked: km.IncrementalAlterConfigsResource, validate_only: bool
    ) -> km.AlterConfigsResourceResponse:
        changes = [configs.Change(c.name, c.config_operation, c.value) for c in asked.configs]
        return self._alter_topic_config(
            asked.resource_type,
            asked.resource_name,
            validate_only,
            lambda config: configs.incrementally_altered(config, changes),
        )

    def _alter_whole(
        self, asked: km.AlterConfigsResource, validate_only: bool
    ) -> km.AlterConfigsResourceResponse:
        pairs = [(c.name, c.value) for c in asked.configs]
        return self._alter_topic_config(
            asked.resource_type,
            asked.resource_name,
            validate_only,
            lambda config: configs.altered(config, pairs),
        )

    def _alter_topic_config(
        self,
        resource_type: int,
        name: str,
        validate_only: bool,
        new_config: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> km.AlterConfigsResourceResponse:
        """One resource of an (Incremental)AlterConfigs: every change checked, then all
        of them in force at once, or none (``validate_only``: none, with the same answer)."""
        result = km.AlterConfigsResourceResponse(ErrorCode.NONE, None, resource_type, name)
        if resource_type == km.RESOURCE_BROKER:
            result.error_code = ErrorCode.POLICY_VIOLATION
            result.error_message = (
                "broker settings are the broker's command-line flags, not changed through"
                " the Kafka API"
            )
            return result
        if resource_type != km.RESOURCE_TOPIC:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = f"resource type {resource_type} has no configs here"
            return result
        try:
            self.access.require(Operation.ADMIN, name)
            self.broker.reconfigure_topic(name, new_config, validate_only=validate_only)
        except InvalidTopicSpec as exc:
            result.error_code = ErrorCode.INVALID_CONFIG
            result.error_message = exc.message
        except HeadraceError as exc:
            result.error_code = code_of(exc)
            result.error_message = exc.message
        return result

    def _may_delete_group(self, group_id: str) -> int:
        """Deleting a group forgets its committed offsets: it needs what committing them
        needs, on every topic it has offsets for."""
        for topic in sorted({t for t, _ in self.groups.core.committed(group_id)}):
            try:
                self.access.require_cohort(topic, group_id)
            except HeadraceError:
                return ErrorCode.GROUP_AUTHORIZATION_FAILED
        return ErrorCode.NONE

    async def _offset_commit(
        self, slot: _Slot, api: km.Api, header: km.RequestHeader, req: km.OffsetCommitRequest
    ) -> None:
        allowed = self.groups.owner_error(req.group_id)
        if allowed == ErrorCode.NONE:
            allowed = self.groups.may_commit(
                req.group_id, req.generation_id, req.member_id, header.api_version
            )
        accepted: dict[tuple[str, int], groups.Committed] = {}
        topics = []
        for topic in req.topics:
            answer = km.OffsetCommitResponseTopic(topic.name)
            topics.append(answer)
            code = allowed
            if code == ErrorCode.NONE:
                try:
                    # a group's offsets are a cohort's: the grant must cover the group's name
                    self.access.require_cohort(topic.name, req.group_id)
                    self._known_topic(topic.name)
                except HeadraceError as exc:
                    code = code_of(exc)
            for part in topic.partitions:
                answer.partitions.append(
                    km.OffsetCommitResponsePartition(part.partition_index, code)
                )
                if code == ErrorCode.NONE:
                    accepted[(topic.name, part.partition_index)] = groups.Committed(
                        part.committed_offset,
                        part.committed_leader_epoch,
                        part.committed_metadata or "",
                    )
        if accepted:
            try:
                await self.groups.commit(req.group_id, accepted)
            except (OSError, HeadraceError) as exc:
                log.error("kafka: committing offsets of group %r: %s", req.group_id, exc)
                failed = commit_code_of(exc) if isinstance(exc, HeadraceError) else None
                for answer in topics:
                    for part_answer in answer.partitions:
                        part_answer.error_code = failed or ErrorCode.KAFKA_STORAGE_ERROR
        self._complete(slot, api, header, km.OffsetCommitResponse(0, topics))

    def _known_topic(self, name: str) -> None:
        """Raises ``UnknownTopic`` unless the topic exists (in a cluster: in the pushed
        topology; this broker need not host it)."""
        cluster = self.broker.cluster
        if cluster is None:
            self.broker.registry.get(name)
            return
        canonical = canonical_topic_name(name)
        if not any(t.name == canonical for t in cluster.topics):
            raise UnknownTopic(f"no topic {canonical!r}")

    async def _delete_groups(
        self, slot: _Slot, api: km.Api, header: km.RequestHeader, req: km.DeleteGroupsRequest
    ) -> None:
        results = []
        for group_id in req.groups_names:
            code: int = self.groups.owner_error(group_id)
            if code == ErrorCode.NONE:
                code = self._may_delete_group(group_id)
            if code == ErrorCode.NONE:
                code = await self.groups.delete(group_id)
            results.append(km.DeletableGroupResult(group_id, code))
        self._complete(slot, api, header, km.DeleteGroupsResponse(0, results))

    async def _offset_delete(
        self, slot: _Slot, api: km.Api, header: km.RequestHeader, req: km.OffsetDeleteRequest
    ) -> None:
        self._complete(slot, api, header, await self._delete_offsets(req))

    async def _delete_offsets(self, req: km.OffsetDeleteRequest) -> km.OffsetDeleteResponse:
        owner = self.groups.owner_error(req.group_id)
        if owner != ErrorCode.NONE:
            return km.OffsetDeleteResponse(owner, 0)
        refused: dict[tuple[str, int], ErrorCode] = {}
        asked: list[tuple[str, int]] = []
        for topic in req.topics:
            try:
                # as for commits: the grant must cover the group's name
                self.access.require_cohort(topic.name, req.group_id)
                self._known_topic(topic.name)
                code = ErrorCode.NONE
            except HeadraceError as exc:
                code = code_of(exc)
            for part in topic.partitions:
                if code == ErrorCode.NONE:
                    asked.append((topic.name, part.partition_index))
                else:
                    refused[(topic.name, part.partition_index)] = code
        try:
            code, deleted = await self.groups.delete_offsets(req.group_id, asked)
        except (OSError, HeadraceError) as exc:
            log.error("kafka: deleting offsets of group %r: %s", req.group_id, exc)
            return km.OffsetDeleteResponse(ErrorCode.KAFKA_STORAGE_ERROR, 0)
        if code != ErrorCode.NONE:
            return km.OffsetDeleteResponse(code, 0)
        topics: dict[str, km.OffsetDeleteResponseTopic] = {}
        for (name, index), result in {**deleted, **refused}.items():
            answer = topics.setdefault(name, km.OffsetDeleteResponseTopic(name))
            answer.partitions.append(km.OffsetDeleteResponsePartition(index, result))
        return km.OffsetDeleteResponse(ErrorCode.NONE, 0, list(topics.values()))

    def _offset_fetch(self, req: km.OffsetFetchRequest) -> km.OffsetFetchResponse:
        owner = self.groups.owner_error(req.group_id)
        if owner != ErrorCode.NONE:
            # v1 has no group-level code: every partition carries it too
            refused = [
                km.OffsetFetchResponseTopic(
                    t.name,
                    [
                        km.OffsetFetchResponsePartition(i, -1, -1, "", owner)
                        for i in t.partition_indexes
                    ],
                )
                for t in req.topics or []
            ]
            return km.OffsetFetchResponse(0, refused, owner)
        committed = self.groups.core.committed(req.group_id)
        if req.topics is None:
            asked: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                asked.setdefault(topic, []).append(partition)
        else:
            asked = {t.name: list(t.partition_indexes) for t in req.topics}
        topics = []
        for name, partitions in asked.items():
            answer = km.OffsetFetchResponseTopic(name)
            topics.append(answer)
            try:
                self.access.require_cohort(name, req.group_id)
                denied = ErrorCode.NONE
            except HeadraceError as exc:
                denied = code_of(exc)
            for index in partitions:
                found = committed.get((name, index))
                if denied != ErrorCode.NONE or found is None:
                    answer.partitions.append(
                        km.OffsetFetchResponsePartition(index, -1, -1, "", denied)
                    )
                else:
                    answer.partitions.append(
                        km.OffsetFetchResponsePartition(
                            index, found.offset, found.leader_epoch, found.metadata, ErrorCode.NONE
                        )
                    )
        return km.OffsetFetchResponse(0, topics, ErrorCode.NONE)

    def _describe(self, group_id: str) -> km.DescribedGroup:
        owner = self.groups.owner_error(group_id)
        if owner != ErrorCode.NONE:
            return km.DescribedGroup(owner, group_id, "", "", "", [])
        group = self.groups.core.groups.get(group_id)
        if group is None:
            return km.DescribedGroup(ErrorCode.NONE, group_id, "Dead", "", "", [])
        members = [
            km.DescribedGroupMember(
                m.member_id,
                None,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if group.protocol_name else b"",
                m.assignment,
            )
            for m in group.members.values()
        ]
        return km.DescribedGroup(
            ErrorCode.NONE,
            group_id,
            group.state.value,
            group.protocol_type,
            group.protocol_name,
            members,
        )

    # ------------------------------------------------------------------ Produce

    def _produce(
        self, header: km.RequestHeader, req: km.ProduceRequest, slot: _Slot | None
    ) -> None:
        api = km.SUPPORTED[km.ApiKey.PRODUCE]
        responses: list[km.TopicProduceResponse] = []
        waits: list[asyncio.Future[None]] = []
        for topic in req.topic_data:
            topic_answer = km.TopicProduceResponse(topic.name)
            for data in topic.partition_data:
                answer = km.PartitionProduceResponse(data.index, ErrorCode.NONE, -1)
                topic_answer.partition_responses.append(answer)
                try:
                    fut = self._append(topic.name, data, req, answer)
                except RedirectRequired:
                    answer.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                except HeadraceError as exc:
                    answer.error_code = code_of(exc)
                    answer.error_message = exc.message
                else:
                    if fut is not None:
                        waits.append(fut)
            responses.append(topic_answer)
        if slot is None:
            return
        body = km.ProduceResponse(responses)
        if not waits:
            self._complete(slot, api, header, body)
            return
        gathered = asyncio.gather(*waits)
        gathered.add_done_callback(lambda _: self._complete(slot, api, header, body))

    def _append(
        self,
        topic_name: str,
        data: km.PartitionProduceData,
        req: km.ProduceRequest,
        answer: km.PartitionProduceResponse,
    ) -> asyncio.Future[None] | None:
        """Validate and append one partition's batch; a future when the answer must wait."""
        if req.transactional_id is not None:
            raise InvalidRecordBatch("transactions are not supported (docs/kafka.md)")
        if req.acks not in (_ACKS_NONE, _ACKS_LEADER, _ACKS_ALL):
            answer.error_code = ErrorCode.INVALID_REQUIRED_ACKS
            return None
        self.access.require(Operation.PRODUCE, topic_name)
        topic = self.broker.registry.get(topic_name)
        placement = None
        if self.broker.cluster is not None:
            placement = next((t for t in self.broker.cluster.topics if t.name == topic.name), None)
        if placement is not None and data.index >= placement.routing_partitions:
            # Retired by a shrink (readable, never written again); Metadata no longer lists
            # it, so the producer's refreshed metadata routes its next records elsewhere.
            raise UnknownPartition(
                f"{topic.name}/{data.index} is retired: the topic takes records on"
                f" {placement.routing_partitions} partitions"
            )
        # Kafka producers route by the partition count in Metadata and know no partitioning
        # version: the current one is theirs (docs/kafka.md, repartitions).
        partition = self.broker.partition_for_write(
            topic_name, data.index, topic.partitioning_version
        )
        if data.records is None:
            raise CorruptBatch("no records")
        header = rb.validate_kafka(
            data.records, max_batch_bytes=partition.log.config.max_batch_bytes
        )
        result = appending.append_produced(
            self.broker, partition, data.records, header, all_replicas=req.acks == _ACKS_ALL
        )
        answer.base_offset = result.base_offset
        answer.log_start_offset = partition.log.log_start_offset
        end = result.base_offset + header.record_count
        fut: asyncio.Future[None] | None = None
        if req.acks == _ACKS_ALL:
            if partition.log.config.fsync is FsyncPolicy.ALWAYS:
                self.broker.committer.wait_durable(partition, end)
            fut = partition.wait_for_high_watermark(end)
        elif req.acks == _ACKS_LEADER and partition.log.config.fsync is FsyncPolicy.ALWAYS:
            fut = self.broker.committer.wait_durable(partition, end)
        if fut is None or req.acks == _ACKS_NONE:
            return None
        return self._settle(fut, partition, answer, req)

    def _settle(
        self,
        fut: asyncio.Future[None],
        partition: Partition,
        answer: km.PartitionProduceResponse,
        req: km.ProduceRequest,
    ) -> asyncio.Future[None]:
        """A future that completes (never fails) once ``answer`` holds the outcome."""
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(max(req.timeout_ms, 0) / 1000, _expire, fut)

        def done(f: asyncio.Future[None]) -> None:
            timer.cancel()
            exc = None if f.cancelled() else f.exception()
            replica_set = partition.replica_set
            if exc is not None:
                answer.error_code = code_of(exc)
                answer.error_message = str(exc)
            elif (
                req.acks == _ACKS_ALL
                and replica_set is not None
                and len(replica_set.lrs) < partition.min_in_sync
            ):
                answer.error_code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            if not settled.done():
                settled.set_result(None)

        fut.add_done_callback(done)
        return settled

    # ------------------------------------------------------------------ ListOffsets

    def _list_offsets(self, version: int, req: km.ListOffsetsRequest) -> km.ListOffsetsResponse:
        topics = []
        for topic in req.topics:
            answer = km.ListOffsetsTopicResponse(topic.name)
            topics.append(answer)
            for asked in topic.partitions:
                result = km.ListOffsetsPartitionResponse(asked.partition_index, ErrorCode.NONE)
                answer.partitions.append(result)
                try:
                    self.access.require(Operation.CONSUME, topic.name)
                    part = self.broker.partition_for_read(topic.name, asked.partition_index)
                except RedirectRequired:
                    result.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    continue
                except HeadraceError as exc:
                    result.error_code = code_of(exc)
                    continue
                result.leader_epoch = part.leader_epoch
                # the object store's first offset when it holds older records than the disk
                earliest = self.broker.tiering.earliest(part)
                if asked.timestamp == km.EARLIEST_TIMESTAMP:
                    result.offset = earliest
                elif asked.timestamp == km.LATEST_TIMESTAMP:
                    result.offset = part.high_watermark
                elif asked.timestamp == km.MAX_TIMESTAMP and version >= 7:
                    # exact: the record's own offset and timestamp, committed records only
                    try:
                        found = offset_of_max_timestamp(part, part.high_watermark)
                    except HeadraceError as exc:  # its batch could not be decoded
                        log.warning("kafka: max timestamp of %s: %s", part.name, exc)
                        result.error_code = code_of(exc)
                        continue
                    if found is None:
                        result.leader_epoch = -1  # no record: offset, timestamp, epoch all -1
                    else:
                        result.offset, result.timestamp = found.offset, found.timestamp
                        result.leader_epoch = found.leader_epoch
                elif asked.timestamp < 0:
                    result.error_code = ErrorCode.UNSUPPORTED_VERSION
                else:
                    # Batch granularity: the first batch holding a record at or after it.
                    offset = offset_for_timestamp(part, asked.timestamp, earliest)
                    if offset < part.high_watermark:
                        result.offset = offset
                        result.timestamp = asked.timestamp
        return km.ListOffsetsResponse(0, topics)

    # ------------------------------------------------------------------ Fetch

    async def _fetch(
        self, slot: _Slot, api: km.Api, header: km.RequestHeader, req: km.FetchRequest
    ) -> None:
        try:
            body = await self._long_poll(req)
        except Exception:
            log.exception("kafka: fetch from %s failed", self.peer)
            slot.parts = _error_only(header.correlation_id, ErrorCode.UNKNOWN_SERVER_ERROR)
            self._flush()
            return
        self._complete(slot, api, header, body)

    async def _long_poll(self, req: km.FetchRequest) -> km.FetchResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(req.max_wait_ms, 0), _MAX_WAIT_MS) / 1000
        wake = asyncio.Event()

        def on_change(_: object = None) -> None:
            wake.set()

        watched: list[Partition] = []
        # Offsets below a local log are read from the object store once, before the first
        # pass: they exist, so nothing about them waits.
        tiered = await self._read_tiered(req)
        retries = _TIERED_RETRIES
        try:
            while True:
                wake.clear()
                body, size, found = self._read_all(req, watched, tiered, retries > 0)
                if found is _Pass.TIERED:
                    # retention moved a local log start past an asked offset since the
                    # object store was read: read it there again
                    retries -= 1
                    watched.clear()
                    tiered = await self._read_tiered(req)
                    continue
                if found is _Pass.ERROR or size >= max(req.min_bytes, 1) or loop.time() >= deadline:
                    return body
                for part in watched:
                    part.add_listener(on_change)
                try:
                    await asyncio.wait_for(wake.wait(), deadline - loop.time())
                except TimeoutError:
                    pass
                finally:
                    for part in watched:
                        part.remove_listener(on_change)
                watched.clear()
        finally:
            for part in watched:
                part.remove_listener(on_change)

    async def _read_tiered(self, req: km.FetchRequest) -> dict[tuple[str, int], bytes]:
        """The object store's batches for each asked offset older than its local log (an
        error is left for ``_read_all`` to answer, as for any offset out of range)."""
        out: dict[tuple[str, int], bytes] = {}
        for topic in req.topics:
            for asked in topic.partitions:
                try:
                    self.access.require(Operation.CONSUME, topic.topic)
                    part = self.broker.partition_for_read(topic.topic, asked.partition)
                except (RedirectRequired, HeadraceError):
                    continue
                if part.tiering is None or asked.fetch_offset >= part.log.log_start_offset:
                    continue
                try:
                    out[(topic.topic, asked.partition)] = await self.broker.tiering.read(
                        part, asked.fetch_offset, max(asked.partition_max_bytes, 1)
                    )
                except HeadraceError as exc:
                    log.info(
                        "kafka: tiered read of %s at %d: %s", part.name, asked.fetch_offset, exc
                    )
        return out

    def _read_all(
        self,
        req: km.FetchRequest,
        watched: list[Partition],
        tiered: dict[tuple[str, int], bytes],
        may_retier: bool,
    ) -> tuple[km.FetchResponse, int, _Pass]:
        """One pass over the asked partitions: (response, record bytes, what the pass found:
        an error to report, an offset to read from the object store first, or neither)."""
        budget = req.max_bytes if req.max_bytes > 0 else 0x7FFFFFFF
        total = 0
        errored = False
        responses = []
        for topic in req.topics:
            answer = km.FetchableTopicResponse(topic.topic)
            responses.append(answer)
            for asked in topic.partitions:
                data = km.FetchPartitionData(asked.partition, ErrorCode.NONE, -1, records=b"")
                answer.partitions.append(data)
                try:
                    self.access.require(Operation.CONSUME, topic.topic)
                    part = self.broker.partition_for_read(topic.topic, asked.partition)
                except RedirectRequired:
                    data.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    errored = True
                    continue
                except HeadraceError as exc:
                    data.error_code = code_of(exc)
                    errored = True
                    continue
                watched.append(part)
                hw = part.high_watermark
                data.high_watermark = hw
                data.last_stable_offset = hw
                data.log_start_offset = self.broker.tiering.earliest(part)
                offset = asked.fetch_offset
                stored = tiered.get((topic.topic, asked.partition))
                below = offset < part.log.log_start_offset
                if stored is None and below and part.tiering is not None and may_retier:
                    return km.FetchResponse(0, 0, 0, []), 0, _Pass.TIERED
                if (
                    stored is None
                    and not part.log.log_start_offset <= offset <= part.log.next_offset
                ):
                    # Below every copy, or past the log end; between the HW and the end it
                    # waits, as against Kafka.
                    data.error_code = code_of(OffsetOutOfRange())
                    errored = True
                    continue
                limit = min(asked.partition_max_bytes, budget - total)
                if limit <= 0 and total > 0:
                    continue
                if stored is not None:
                    raw: bytes | memoryview = stored  # below the local log: the object store's
                else:
                    # Both isolation levels read up to the HW, as in Kafka: there are no
                    # transactions, so the last stable offset is the HW.
                    raw, _ = part.log.read(offset, max(limit, 1), hw)
                try:
                    parts, size = _as_kafka_batches(raw)
                except CorruptBatch as exc:
                    log.error("%s/%d at %d: %s", topic.topic, asked.partition, offset, exc)
                    data.error_code = ErrorCode.CORRUPT_MESSAGE
                    errored = True
                    continue
                data.records = parts
                total += size
        self.broker.metrics.fetched_bytes.inc(total)
        return km.FetchResponse(0, 0, 0, responses), total, _Pass.ERROR if errored else _Pass.OK


def _as_kafka_batches(raw: bytes | memoryview) -> tuple[Parts, int]:
    """The batches of ``raw`` as Kafka's: a Kafka batch is served as stored, with Kafka's
    prefix (no body copy); one of ours is converted (``kafka.convert``: column by column)."""
    view = memoryview(raw)
    parts: Parts = []
    size = 0
    for pos, header in rb.scan(view):
        if header.magic == rb.KAFKA_MAGIC:
            parts.append(rb.kafka_prefix(header))
            parts.append(view[pos + 16 : pos + header.size])
            size += header.size
        else:
            converted = to_kafka(view[pos : pos + header.size])
            parts.append(converted)
            size += len(converted)
    return parts, size


def _init_producer_id(req: km.InitProducerIdRequest) -> km.InitProducerIdResponse:
    """A fresh producer id, epoch 0, for an idempotent producer. Our producer state is per
    producer id, as for our own producers (random, never 0); a producer that asks again
    (KIP-360, after a sequence error) gets a new id and starts again at sequence 0."""
    if req.transactional_id is not None:
        return km.InitProducerIdResponse(0, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    return km.InitProducerIdResponse(0, ErrorCode.NONE, secrets.randbits(62) | 1, 0)


def _error_only(correlation_id: int, code: ErrorCode) -> Parts:
    w = Writer()
    w.int32(6)
    w.int32(correlation_id)
    w.int16(code)
    return w.parts()


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(RequestTimedOut("not replicated in time"))
