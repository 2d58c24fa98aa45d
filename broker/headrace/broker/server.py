"""The data port: one ``Connection`` (an asyncio BufferedProtocol) per client socket.

Frames are decoded incrementally and dispatched by op code. Produce and fetch
handlers run synchronously on the loop (validate, append or read, respond);
only durability waits and long polls leave a callback behind. Responses may
complete out of order; the correlation id pairs them with requests, so a
client can pipeline as many requests as it likes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from headrace import transports
from headrace.broker import appending, certificates
from headrace.broker.fetch_sessions import FetchSession
from headrace.broker.ports import Cohort, ConnectionHost
from headrace.errors import (
    AlreadyJoined,
    AuthenticationFailed,
    FrameTooLarge,
    HeadraceError,
    InvalidRequest,
    MalformedFrame,
    NotAuthenticated,
    NotEnoughReplicas,
    OffsetOutOfRange,
    RequestTimedOut,
    UnknownMember,
    UnknownOperation,
)
from headrace.protocol import messages as msg
from headrace.protocol import replication as rp
from headrace.protocol.endpoints import DEFAULT_LISTENER
from headrace.protocol.frames import (
    FLAG_NO_REPLY,
    FLAG_PUSH,
    FLAG_RESPONSE,
    Frame,
    FrameDecoder,
    Op,
    encode_frame,
    frame_header,
)
from headrace.records import batch as rb
from headrace.security.acl import Operation
from headrace.storage.bookkeeping import FsyncPolicy, SequenceVerdict

if TYPE_CHECKING:
    from headrace.broker.topics import Partition

log = logging.getLogger(__name__)

#: asyncio's socket transports send a list of buffers without joining them from 3.12 on
_WRITELINES_JOINS = sys.version_info < (3, 12)
#: on 3.11, parts at least this big are written alone: a send call costs less than the copy
_WRITE_ALONE_BYTES = 64 * 1024


class RedirectRequired(Exception):
    """Raised by routing checks; the connection answers with a Redirect frame."""

    def __init__(self, redirect: msg.Redirect) -> None:
        super().__init__(redirect.reason)
        self.redirect = redirect


Handler = Callable[["Connection", Frame], None]


class Connection(asyncio.BufferedProtocol):
    """One client's (or a peer broker's) socket. A ``BufferedProtocol``: the socket is
    read straight into the frame decoder's buffer (``get_buffer``), one copy fewer of
    every produced and replicated byte than ``data_received`` would take."""

    def __init__(self, broker: ConnectionHost, listener: str = DEFAULT_LISTENER) -> None:
        #: the broker, seen through the port a connection needs (``ports.ConnectionHost``)
        self.broker = broker
        #: the listener that accepted it: the addresses its topology and redirects name
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(
            broker.access.max_frame_bytes_before_handshake(broker.settings.max_frame_bytes)
        )
        self.peer = "?"
        self.client_id = ""
        self.authenticated = False
        #: who this connection is and what it may do (``access.ConnectionAccess``)
        self.access = broker.access.session()
        self.member_id: str | None = None
        self.cohort: Cohort | None = None
        #: (topic, cohort) as the join named them: what the member's later frames re-check
        self._joined: tuple[str, str] | None = None
        #: an error that ends the connection (a joined member refused after a reload)
        self._close_after_error = False
        self._writable = True
        self.closed = False
        #: highest topology generation this connection acked (op 102); None until it acks
        self.acked_generation: int | None = None
        #: routing content last sent, so pushes go out only when it changes
        self.sent_routing: object = None
        self.wants_topology = False
        #: tiered reads in progress (object-store calls run off the loop)
        self._tasks: set[asyncio.Task[None]] = set()
        #: a follower broker's replica fetch session on this connection (the leader side)
        self.fetch_session: FetchSession | None = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transports.adopt(transport)
        peer = self.transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.transport.set_write_buffer_limits(high=8 * 1024 * 1024, low=2 * 1024 * 1024)
        self.broker.connection_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fetch_session is not None:
            self.fetch_session.close()
            self.fetch_session = None
        for task in self._tasks:
            task.cancel()
        if self.cohort is not None and self.member_id is not None:
            self.cohort.disconnect(self.member_id, self)
            self.broker.maybe_drop_cohort(self.cohort)
        self.broker.connection_closed(self)

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        if self.cohort is not None:
            self.cohort.wake()

    @property
    def writable(self) -> bool:
        return self._writable and not self.closed

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.decoder.buffer_updated(nbytes)
        self._dispatch_frames()

    def data_received(self, data: bytes) -> None:
        """Bytes from a caller that read them itself (tests drive a connection so)."""
        self.decoder.feed(data)
        self._dispatch_frames()

    def _dispatch_frames(self) -> None:
        while True:
            try:
                frame = self.decoder.next_frame()
            except (FrameTooLarge, MalformedFrame) as exc:
                # The stream has lost its framing: say why, then hang up.
                self.broker.metrics.errors.labels(type(exc).__name__).inc()
                self._send_error(0, exc)
                self.close()
                return
            if frame is None:
                return
            self._dispatch(frame)

    # ------------------------------------------------------------------ sending

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def respond(self, frame: Frame, op: Op, body: bytes = b"") -> None:
        if frame.flags & FLAG_NO_REPLY:
            return
        self._write(encode_frame(op, frame.correlation_id, body, FLAG_RESPONSE))

    def _send_error(self, correlation_id: int, exc: HeadraceError) -> None:
        body = msg.ErrorBody(exc.CODE, exc.message).encode()
        self._write(encode_frame(Op.ERROR, correlation_id, body, FLAG_RESPONSE))

    def push(self, op: Op, body: bytes) -> None:
        self._write(encode_frame(op, 0, body, FLAG_PUSH))

    def membership_ended(self) -> None:
        self.cohort = None
        self.member_id = None
        self._joined = None

    def push_assignment(self, assignment: msg.Assignment) -> None:
        self.push(Op.ASSIGNMENT, assignment.encode())

    def push_delivery(
        self, partition: int, epoch: int, hw: int, first_offset: int, data: bytes | memoryview
    ) -> None:
        if self.transport is None or self.closed:
            return
        head = msg.DELIVERY_HEADER.pack(partition, epoch, hw, first_offset)
        self.transport.writelines(
            [frame_header(Op.DELIVERY, 0, len(head) + len(data), FLAG_PUSH), head, data]
        )

    def push_topology(self, snapshot: msg.TopologySnapshot, routing: object) -> None:
        if self.wants_topology and routing != self.sent_routing:
            self.sent_routing = routing
            self.push(Op.TOPOLOGY_UPDATE, snapshot.encode())

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, frame: Frame) -> None:
        try:
            if not self.authenticated and frame.op not in (Op.HANDSHAKE, Op.PING):
                raise NotAuthenticated("send a handshake first")
            handler = HANDLERS.get(frame.op)
            if handler is None:
                raise UnknownOperation(f"unknown op {frame.op}")
            handler(self, frame)
        except RedirectRequired as redirect:
            self.broker.metrics.redirects.inc()
            answer = redirect.redirect
            if answer.owner is not None:
                answer = dataclasses.replace(answer, owner=answer.owner.on(self.listener))
            self.respond(frame, Op.REDIRECT, answer.encode())
        except HeadraceError as exc:
            self.broker.metrics.errors.labels(type(exc).__name__).inc()
            if not frame.flags & FLAG_NO_REPLY:
                self._send_error(frame.correlation_id, exc)
            if isinstance(exc, AuthenticationFailed) or self._close_after_error:
                self.close()
        except Exception:
            log.exception("internal error handling op %s from %s", frame.op, self.peer)
            self.broker.metrics.errors.labels("internal").inc()
            self._send_error(frame.correlation_id, HeadraceError("internal broker error"))

    # ------------------------------------------------------------------ handlers

    def on_handshake(self, frame: Frame) -> None:
        hello = msg.Handshake.decode(frame.body)
        version = msg.negotiate(hello.lowest_version, hello.protocol_version)
        peercert = self.transport.get_extra_info("peercert") if self.transport else None
        # only the client CA's certificates name principals, not the brokers' own CA's
        peercert = certificates.client_certificate(peercert, self.broker.client_issuers)
        self.access.authenticate(hello.auth_token, peercert)
        if len(hello.client_id) > 256:
            raise InvalidRequest("client_id longer than 256 characters")
        self.client_id = hello.client_id
        self.authenticated = True
        self.decoder.max_frame_bytes = self.broker.settings.max_frame_bytes
        s = self.broker.settings
        ok = msg.HandshakeOk(
            version,
            s.broker_id,
            s.cluster_id,
            s.max_frame_bytes,
            s.log.max_batch_bytes,
            self.access.member_identities,
        )
        self.respond(frame, Op.HANDSHAKE_OK, ok.encode())

    def on_ping(self, frame: Frame) -> None:
        self.respond(frame, Op.PONG, frame.body[:64])

    def on_topology(self, frame: Frame) -> None:
        snapshot, routing = self.broker.topology(self.listener)
        self.wants_topology = True
        self.sent_routing = routing
        self.respond(frame, Op.TOPOLOGY_OK, snapshot.encode())

    def on_topology_ack(self, frame: Frame) -> None:
        ack = msg.TopologyUpdateAck.decode(frame.body)
        if self.acked_generation is None or ack.generation > self.acked_generation:
            self.acked_generation = ack.generation

    def on_produce(self, frame: Frame) -> None:
        req = msg.ProduceRequest.decode(frame.body)
        self.access.require(Operation.PRODUCE, req.topic)
        try:
            partition = self.broker.partition_for_write(
                req.topic, req.partition, req.partitioning_version
            )
        except RedirectRequired:
            stored = self._stored_before_the_fence(req)
            if stored is None:
                raise
            partition = stored  # answered below with the offset it got the first time
        header = rb.validate(req.batch, max_batch_bytes=partition.log.config.max_batch_bytes)
        result = appending.append_produced(
            self.broker, partition, req.batch, header, all_replicas=req.acks is msg.Acks.ALL
        )
        end = result.base_offset + header.record_count
        if req.acks is msg.Acks.NONE or frame.flags & FLAG_NO_REPLY:
            return
        fut: asyncio.Future[None] | None = None
        if req.acks is msg.Acks.ALL:
            # Every LRS member has it once the HW passes it (the HW also waits for fsync=always,
            # so ask for that sync round now rather than at the next timer tick).
            if partition.log.config.fsync is FsyncPolicy.ALWAYS:
                self.broker.committer.wait_durable(partition, end)
            fut = partition.wait_for_high_watermark(end)
        elif partition.log.config.fsync is FsyncPolicy.ALWAYS:
            fut = self.broker.committer.wait_durable(partition, end)
        if fut is None or (fut.done() and fut.exception() is None):
            body = msg.ProduceResponse(
                result.base_offset, partition.leader_epoch, partition.high_watermark
            ).encode()
            self._write(encode_frame(Op.PRODUCE_OK, frame.correlation_id, body, FLAG_RESPONSE))
            return
        timer = asyncio.get_running_loop().call_later(
            req.timeout_ms / 1000,
            _expire,
            fut,
            f"{partition.name}: not replicated within {req.timeout_ms} ms",
        )
        fut.add_done_callback(lambda f: timer.cancel())
        all_replicas = req.acks is msg.Acks.ALL
        fut.add_done_callback(
            lambda f: self._produce_done(frame, partition, result.base_offset, f, all_replicas)
        )

    def _stored_before_the_fence(self, req: msg.ProduceRequest) -> Partition | None:
        """The partition, if the version fence refused a retry of a batch it already stored.

        A batch appended under the old partitioning version whose answer was lost (its
        leader killed mid-cutover, say) comes back as a retry under that version. A
        Redirect would tell the producer nothing was stored, and it would route the
        records again, under the new version, to another partition: stored twice, and
        the sequence numbers it renumbers from would be taken here. Idempotence beats the
        fence: the retry gets its original offset. (Only the redirect path pays this.)"""
        try:
            partition = self.broker.partition_for_read(req.topic, req.partition)
        except HeadraceError:
            return None  # not the leader: the redirect stands
        header = rb.validate(req.batch, max_batch_bytes=partition.log.config.max_batch_bytes)
        verdict, _ = partition.log.producers.check(
            header.producer_id, header.base_sequence, header.record_count
        )
        return partition if verdict is SequenceVerdict.DUPLICATE else None

    def _produce_done(
        self,
        frame: Frame,
        partition: Partition,
        base: int,
        fut: asyncio.Future[None],
        all_replicas: bool = False,
    ) -> None:
        exc = fut.exception()
        replica_set = partition.replica_set
        if (
            exc is None
            and all_replicas
            and replica_set is not None
            and len(replica_set.lrs) < partition.min_in_sync
        ):
            # The HW passed this batch only because the LRS shrank below minInSync while we
            # waited: it has fewer copies than promised. Retriable; the idempotent retry is
            # answered once the LRS has recovered.
            exc = NotEnoughReplicas(
                f"{partition.name}: live replica set shrank to {sorted(replica_set.lrs)} before"
                f" the batch reached minInSync {partition.min_in_sync}"
            )
        if exc is not None:
            err = exc if isinstance(exc, HeadraceError) else HeadraceError(str(exc))
            self._send_error(frame.correlation_id, err)
            return
        body = msg.ProduceResponse(base, partition.leader_epoch, partition.high_watermark).encode()
        self._write(encode_frame(Op.PRODUCE_OK, frame.correlation_id, body, FLAG_RESPONSE))

    def on_fetch(self, frame: Frame) -> None:
        req = msg.FetchRequest.decode(frame.body)
        self.access.require(Operation.CONSUME, req.topic)
        partition = self.broker.partition_for_read(req.topic, req.partition)
        plog = partition.log
        if partition.tiering is not None and req.offset < plog.log_start_offset:
            # Older than the local log: the object store has it (or says what it has).
            task = asyncio.get_running_loop().create_task(self._tiered_fetch(frame, req, partition))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if not plog.log_start_offset <= req.offset <= plog.next_offset:
            raise OffsetOutOfRange(
                f"offset {req.offset} outside [{plog.log_start_offset}, {plog.next_offset}] of {partition.name}"
            )
        if self._answer_fetch(frame, req, partition, force=req.max_wait_ms == 0):
            return
        self._long_poll(frame, req, partition)

    async def _tiered_fetch(
        self, frame: Frame, req: msg.FetchRequest, partition: Partition
    ) -> None:
        try:
            data = await self.broker.tiering.read(partition, req.offset, max(req.max_bytes, 1))
        except HeadraceError as exc:
            self.broker.metrics.errors.labels(type(exc).__name__).inc()
            self._send_error(frame.correlation_id, exc)
            return
        except Exception:
            log.exception("tiered read of %s at %d failed", partition.name, req.offset)
            self._send_error(frame.correlation_id, HeadraceError("internal broker error"))
            return
        self._send_fetched(frame, partition, data)

    def _answer_fetch(
        self, frame: Frame, req: msg.FetchRequest, partition: Partition, *, force: bool = False
    ) -> bool:
        committed = req.isolation is msg.Isolation.COMMITTED
        bound = partition.high_watermark if committed else partition.log.next_offset
        data, _ = partition.log.read(req.offset, max(req.max_bytes, 1), bound)
        if not data and not force:
            return False
        self._send_fetched(frame, partition, data)
        return True

    def _send_fetched(self, frame: Frame, partition: Partition, data: bytes | memoryview) -> None:
        head = msg.FetchResponseHeader(
            partition.high_watermark,
            self.broker.tiering.earliest(partition),
            partition.log.next_offset,
        ).encode()
        self.broker.metrics.fetched_bytes.inc(len(data))
        if self.transport is not None and not self.closed:
            self.transport.writelines(
                [
                    frame_header(
                        Op.FETCH_OK, frame.correlation_id, len(head) + len(data), FLAG_RESPONSE
                    ),
                    head,
                    data,
                ]
            )

    def _long_poll(self, frame: Frame, req: msg.FetchRequest, partition: Partition) -> None:
        loop = asyncio.get_running_loop()
        done = False
        # A committed read can only gain data when the HW moves; an uncommitted one gains
        # it as soon as the log end moves, which may be long before (followers lagging).
        uncommitted = req.isolation is not msg.Isolation.COMMITTED

        def finish(_: object = None) -> None:
            nonlocal done
            if done:
                return
            if self._answer_fetch(frame, req, partition, force=timer_fired):
                done = True
                partition.remove_listener(finish)
                if uncommitted:
                    partition.remove_append_listener(finish)
                handle.cancel()

        timer_fired = False

        def on_timeout() -> None:
            nonlocal timer_fired
            timer_fired = True
            finish()

        partition.add_listener(finish)
        if uncommitted:
            partition.add_append_listener(finish)
        handle = loop.call_later(min(req.max_wait_ms, 60_000) / 1000, on_timeout)

    # ------------------------------------------------------------------ cohorts

    def _member(self) -> tuple[Cohort, str]:
        if self.cohort is None or self.member_id is None:
            raise UnknownMember("this connection has not joined a cohort")
        if self.access.stale and self._joined is not None:
            # Credentials reloaded since the last check: a joined member's credit, acks and
            # heartbeats are all it sends to keep consuming, so they authenticate again
            # too (a revoked token or consume grant must not keep an open consumer fed).
            # A refusal closes the connection, which ends the membership (the session
            # stays stale and would refuse every later frame too, but the member must go).
            try:
                self.access.require_cohort(*self._joined)
            except HeadraceError:
                self._close_after_error = True
                raise
        return self.cohort, self.member_id

    def on_cohort_join(self, frame: Frame) -> None:
        join = msg.CohortJoin.decode(frame.body)
        if self.member_id is not None:
            raise AlreadyJoined(f"this connection already joined as {self.member_id!r}")
        try:
            isolation = msg.Isolation(join.isolation)
        except ValueError as exc:
            raise InvalidRequest(f"unknown isolation {join.isolation}") from exc
        if not 1000 <= join.session_timeout_ms <= 300_000:
            raise InvalidRequest("session_timeout_ms must be between 1000 and 300000")
        self.access.require_cohort(join.topic, join.cohort)
        self.access.verify_member(join.member_id, join.identity)
        cohort = self.broker.cohort(join.topic, join.cohort)
        try:
            assignment = cohort.join(
                join.member_id,
                self,
                start=join.start,
                session_timeout_ms=join.session_timeout_ms,
                isolation=isolation,
            )
        except HeadraceError:
            self.broker.maybe_drop_cohort(cohort)
            raise
        self.cohort = cohort
        self.member_id = join.member_id
        self._joined = (join.topic, join.cohort)
        self.respond(frame, Op.COHORT_JOIN_OK, assignment.encode())

    def on_identity(self, frame: Frame) -> None:
        request = msg.IdentityRequest.decode(frame.body)
        member_id, token = self.access.issue_identity(request.hint)
        self.respond(frame, Op.IDENTITY_OK, msg.IdentityOk(member_id, token).encode())

    def on_cohort_leave(self, frame: Frame) -> None:
        cohort, member = self._member()
        cohort.leave(member)
        self.respond(frame, Op.COHORT_LEAVE_OK, b"{}")

    def on_cohort_heartbeat(self, frame: Frame) -> None:
        cohort, member = self._member()
        cohort.heartbeat(member)
        self.respond(frame, Op.COHORT_HEARTBEAT_OK, b"{}")

    def on_credit(self, frame: Frame) -> None:
        cohort, member = self._member()
        if len(frame.body) != msg.CREDIT.size:
            raise MalformedFrame("credit body must be 4 bytes")
        (amount,) = msg.CREDIT.unpack(frame.body)
        cohort.credit(member, amount)

    def on_ack(self, frame: Frame) -> None:
        cohort, member = self._member()
        ack = msg.Ack.decode(frame.body)
        cursor = cohort.ack(member, ack.partition, ack.gate_epoch, ack.offset)
        self.respond(frame, Op.ACK_OK, msg.ACK_OK.pack(ack.partition, cursor - 1))

    def on_release(self, frame: Frame) -> None:
        cohort, member = self._member()
        release = msg.Release.decode(frame.body)
        cohort.release(member, release.partitions)
        self.respond(frame, Op.RELEASE_OK, b"{}")

    def on_seek(self, frame: Frame) -> None:
        cohort, member = self._member()
        seek = msg.Seek.decode(frame.body)
        epoch = cohort.seek(member, seek.partition, seek.offset)
        self.respond(
            frame, Op.SEEK_OK, msg.encode_json({"partition": seek.partition, "epoch": epoch})
        )

    # ------------------------------------------------------------------ replication (broker to broker)

    def on_replica_fetch(self, frame: Frame) -> None:
        """A follower's fetch over this connection's session (``protocol.replication``)."""
        self.access.require_cluster()
        request = rp.ReplicaFetch.decode(frame.body)
        replication = self.broker.replication
        if request.incremental and self.fetch_session is None:
            self._send_replica_fetch(frame, rp.ReplicaFetchOk(session_reset=True))
            return
        session = replication.open_session(request, self.fetch_session)
        self.fetch_session = session
        asked = [(p.topic, p.partition) for p in request.positions]
        response = replication.serve_session(session, asked)
        # Records and cursors are news that cannot wait (cursors are marked sent); the rest
        # (a moved high watermark, an error) may ride on the end of the long poll.
        news = any(len(p.data) or p.cursors is not None for p in response.partitions)
        if news or request.max_wait_ms <= 0:
            self._send_replica_fetch(frame, response)
            return
        # Hold the fetch until a partition of the session moves or the wait expires; then
        # answer again for what it asked and what moved.
        loop = asyncio.get_running_loop()
        state = {"done": False}

        def finish() -> None:
            if state["done"]:
                return
            state["done"] = True
            handle.cancel()
            if session.wake is finish:
                session.wake = None
            if self.fetch_session is session:
                self._send_replica_fetch(frame, replication.serve_session(session, asked))

        session.wake = finish
        handle = loop.call_later(min(request.max_wait_ms, 5000) / 1000, finish)

    def _send_replica_fetch(self, frame: Frame, response: rp.ReplicaFetchOk) -> None:
        if self.transport is None or self.closed:
            return
        parts = response.encode_parts()
        length = sum(len(p) for p in parts)
        head = frame_header(Op.REPLICA_FETCH_OK, frame.correlation_id, length, FLAG_RESPONSE)
        if not _WRITELINES_JOINS:
            self.transport.writelines([head, *parts])
            return
        # Python 3.11's writelines joins its parts: a copy of every replicated byte into a
        # fresh buffer. Send each large part from its own buffer instead (a send call
        # each), joining only the small ones.
        small: list[bytes | memoryview] = [head]
        for part in parts:
            if len(part) < _WRITE_ALONE_BYTES:
                small.append(part)
                continue
            self.transport.write(b"".join(small))
            small = []
            self.transport.write(part)
        if small:
            self.transport.write(b"".join(small))

    def on_offset_for_epoch(self, frame: Frame) -> None:
        self.access.require_cluster()
        answers = self.broker.replication.answer_epochs(rp.decode_epoch_queries(frame.body))
        self.respond(frame, Op.OFFSET_FOR_EPOCH_OK, rp.encode_epoch_answers(answers))

    # ------------------------------------------------------------------ topic admin

    def on_create_topic(self, frame: Frame) -> None:
        req = msg.CreateTopic.decode(frame.body)
        self.access.require(Operation.ADMIN, req.name)
        topic = self.broker.create_topic(req.name, req.partitions, req.config)
        self.respond(
            frame, Op.CREATE_TOPIC_OK, msg.encode_json(self.broker.describe_topic(topic.name))
        )

    def on_delete_topic(self, frame: Frame) -> None:
        req = msg.TopicName.decode(frame.body)
        self.access.require(Operation.ADMIN, req.name)
        self.broker.delete_topic(req.name)
        self.respond(frame, Op.DELETE_TOPIC_OK, b"{}")

    def on_describe_topics(self, frame: Frame) -> None:
        obj = msg.decode_json(frame.body) if frame.body else {}
        name = obj.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise MalformedFrame("field 'name' must be a string")
            topics = [self.broker.describe_topic(name)]
        else:
            topics = [self.broker.describe_topic(n) for n in sorted(self.broker.registry.topics)]
        self.respond(frame, Op.DESCRIBE_TOPICS_OK, msg.encode_json({"topics": topics}))

    # ------------------------------------------------------------------ cohort admin

    def on_describe_cohorts(self, frame: Frame) -> None:
        request = msg.DescribeCohorts.decode(frame.body)
        answer = self.broker.describe_cohorts(request)
        if self.access.principal is not None:
            # Only the cohorts of topics this principal may consume or administer.
            answer["cohorts"] = [c for c in answer["cohorts"] if self.access.may_see(c["topic"])]
        self.respond(frame, Op.DESCRIBE_COHORTS_OK, msg.encode_json(answer))

    def on_reset_cursors(self, frame: Frame) -> None:
        request = msg.ResetCursors.decode(frame.body)
        self.access.require(Operation.ADMIN, request.topic)
        answer = self.broker.reset_cursors(request)
        self.respond(frame, Op.RESET_CURSORS_OK, msg.encode_json(answer))


def _expire(fut: asyncio.Future[None], message: str) -> None:
    if not fut.done():
        fut.set_exception(RequestTimedOut(message))


HANDLERS: dict[int, Handler] = {
    Op.HANDSHAKE: Connection.on_handshake,
    Op.PING: Connection.on_ping,
    Op.TOPOLOGY: Connection.on_topology,
    Op.TOPOLOGY_UPDATE_ACK: Connection.on_topology_ack,
    Op.PRODUCE: Connection.on_produce,
    Op.FETCH: Connection.on_fetch,
    Op.COHORT_JOIN: Connection.on_cohort_join,
    Op.COHORT_LEAVE: Connection.on_cohort_leave,
    Op.COHORT_HEARTBEAT: Connection.on_cohort_heartbeat,
    Op.CREDIT: Connection.on_credit,
    Op.ACK: Connection.on_ack,
    Op.RELEASE: Connection.on_release,
    Op.SEEK: Connection.on_seek,
    Op.IDENTITY: Connection.on_identity,
    Op.REPLICA_FETCH: Connection.on_replica_fetch,
    Op.OFFSET_FOR_EPOCH: Connection.on_offset_for_epoch,
    Op.CREATE_TOPIC: Connection.on_create_topic,
    Op.DELETE_TOPIC: Connection.on_delete_topic,
    Op.DESCRIBE_TOPICS: Connection.on_describe_topics,
    Op.DESCRIBE_COHORTS: Connection.on_describe_cohorts,
    Op.RESET_CURSORS: Connection.on_reset_cursors,
}
