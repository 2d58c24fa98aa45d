"""Async cohort consumer: joins, receives pushed batches, acks cumulatively.

The broker pushes each held partition's committed batches, bounded by the
credit this member grants; handing a batch to the application returns its
bytes as credit. Acks are cumulative per partition and coalesced (one ACK per
partition per loop iteration). When the broker revokes a partition, queued
records of it are dropped (never handed out) and the partition is released
as soon as everything already handed out is acked: a rebalance without a
crash delivers nothing twice.

Records handed out and not yet acked are *in flight*: a revoked partition, and
``close``, wait for them (within the grace period). ``getmany(max_records=N)``
hands out no more than N records, splitting a batch if it must, so that an
application that stops after N records has nothing in flight it will not ack.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from headrace.client.cluster import TOPIC_WAIT_S, ClusterClient
from headrace.client.connection import ClientConnection, ConnectOptions
from headrace.client.routing import canonical
from headrace.errors import (
    AccessDenied,
    AuthenticationFailed,
    ConnectionClosed,
    HeadraceError,
    InvalidMemberIdentity,
    InvalidRequest,
    NotAuthenticated,
    UnknownMember,
    UnknownTopic,
    UnsupportedVersion,
)
from headrace.protocol import messages as msg
from headrace.protocol.frames import Frame, Op
from headrace.records import batch as rb

log = logging.getLogger(__name__)

#: What no rejoin can get past: the brokers refuse this consumer's credentials (its token
#: removed, and its token source has no other: a source with a new one gets the
#: retriable ``TokenRotated`` and rejoins with it) or its protocol version, or its
#: principal may no longer consume the topic. Only a new consumer, made with other
#: credentials or after an operator's change, can go on; retrying would leave
#: ``getmany`` returning nothing for ever. These end the
#: consumer: ``getmany`` and ``batches`` raise them. (Other errors a rejoin meets, such
#: as ``UnknownTopic`` while a topic is re-created, pass and are retried.)
ENDS_THE_CONSUMER: tuple[type[HeadraceError], ...] = (
    AuthenticationFailed,
    NotAuthenticated,
    AccessDenied,
    UnsupportedVersion,
)


#: the longest wait between two tries to join the leaders this member is not a member on
MAX_REJOIN_BACKOFF_S = 2.0


@dataclass(slots=True)
class ConsumedBatch:
    """One record batch as delivered, or a piece of one (``getmany(max_records=...)``);
    decoding is lazy and skips records below ``first_offset`` and from ``end_offset`` on."""

    topic: str
    partition: int
    epoch: int
    first_offset: int
    data: bytes
    header: rb.BatchHeader
    #: which broker session delivered it: gate epochs are per broker, so an epoch alone
    #: cannot tell a batch from an old owner apart from the new owner's
    session_id: int = 0
    #: one past the last record of this piece; None: the batch's end
    end_offset: int | None = None
    #: the incarnation of the topic it was delivered from (``Consumer._new_incarnation``)
    creation_id: str = ""
    _decoded: rb.DecodedBatch | None = field(default=None, repr=False)
    #: the batch's bytes were given back as credit (once, whichever piece is admitted first)
    _credited: bool = field(default=False, repr=False)

    @property
    def next_offset(self) -> int:
        return self.header.next_offset if self.end_offset is None else self.end_offset

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1

    @property
    def start(self) -> int:
        return max(self.first_offset, self.header.base_offset)

    @property
    def record_count(self) -> int:
        return self.next_offset - self.start

    def decoded(self) -> rb.DecodedBatch:
        if self._decoded is None:
            self._decoded = rb.decode(self.data)
        return self._decoded

    def values(self) -> list[bytes]:
        skip = self.start - self.header.base_offset
        values = self.decoded().values
        if self.end_offset is not None:
            return values[skip : self.end_offset - self.header.base_offset]
        return values[skip:] if skip else values

    def offsets(self) -> range:
        return range(self.start, self.next_offset)

    def records(self) -> list[rb.Record]:
        records = self.decoded().records(self.start)
        return records if self.end_offset is None else records[: self.record_count]

    def split(self, count: int) -> tuple[ConsumedBatch, ConsumedBatch]:
        """The first ``count`` records (fewer than ``record_count``) and the rest."""
        cut = self.start + count
        return (
            dataclasses.replace(self, end_offset=cut),
            dataclasses.replace(self, first_offset=cut),
        )


@dataclass(slots=True)
class _Session:
    """This member's membership on one broker (the owner of some partitions)."""

    conn: ClientConnection
    held: dict[int, int] = field(default_factory=dict)
    revoking: set[int] = field(default_factory=set)
    generation: int = 0
    #: the newest view applied (Assignment.sequence); older views arriving late are ignored
    sequence: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: releases sent and not yet answered: ``close`` waits for them, so that when it
    #: returns the broker has freed the gates and moved them to other members
    releasing: set[asyncio.Future[Frame]] = field(default_factory=set)


class Consumer:
    def __init__(
        self,
        bootstrap: str | list[str],
        topic: str,
        cohort: str,
        *,
        member_id: str | None = None,
        start: str = "latest",
        credit_bytes: int = 8 * 1024 * 1024,
        isolation: msg.Isolation = msg.Isolation.COMMITTED,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 2_000,
        options: ConnectOptions | None = None,
    ) -> None:
        self.cluster = ClusterClient(bootstrap, options)
        self.topic = canonical(topic)
        self.cohort = cohort
        self.member_id = member_id or f"member-{uuid.uuid4().hex[:12]}"
        #: the readable start of an issued member id (what ``member_id`` was given as)
        self._member_hint = self.member_id
        #: the signed identity token, once a broker that requires one issued it (then
        #: ``member_id`` is the id it issued: the id given above is only its readable start)
        self.identity: str | None = None
        self.start_from = start
        self.credit_bytes = credit_bytes
        self.isolation = isolation
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_s = heartbeat_interval_ms / 1000
        self._sessions: dict[int, _Session] = {}
        self._session_of: dict[int, _Session] = {}
        self._queue: asyncio.Queue[ConsumedBatch | None] = asyncio.Queue()
        #: the rest of a batch ``getmany(max_records=...)`` split: handed out before the queue
        self._leftovers: deque[ConsumedBatch] = deque()
        self._handed: dict[int, int] = {}
        self._acked: dict[int, int] = {}
        self._pending_acks: dict[int, int] = {}
        self._ack_scheduled = False
        self._unreturned: dict[int, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        #: the error that ended this consumer (one of ``ENDS_THE_CONSUMER``), raised to the
        #: application by ``getmany`` and ``batches``
        self._failure: HeadraceError | None = None
        self._topology_changed = asyncio.Event()
        #: last epoch this member held each partition under (acks of a revoking partition use it)
        self._epochs: dict[int, int] = {}
        #: the incarnation of the topic this member consumes (``TopicRouting.creation_id``;
        #: None until the routing is first read)
        self._creation_id: str | None = None
        #: where a join starts on partitions the cohort has no cursor for: ``start``, until
        #: the topic is created again, whose records are all new to this member
        self._join_start = start

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Consumer:
        self.cluster.on_push(Op.ASSIGNMENT, self._on_assignment)
        self.cluster.on_push(Op.DELIVERY, self._on_delivery)
        await self.cluster.start()
        await self.cluster.topic_routing(self.topic)  # UnknownTopic now, not in the background
        await self._first_sync()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._heartbeat_forever()))
        self._tasks.append(loop.create_task(self._follow_topology()))
        self.cluster.topology_listeners.append(self._topology_changed.set)
        return self

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _first_sync(self) -> None:
        """Join every leader of the topic before ``start`` returns.

        A join that fails for a while is asked again, with the topology refreshed, for up
        to ``TOPIC_WAIT_S`` (the wait ``topic_routing`` allows a topic the client has not
        seen yet): the controller publishes a new topic to the brokers one by one, so a
        leader the routing names may answer ``UnknownTopic`` for a moment, and a leader
        that died a moment ago refuses connections (``ConnectionClosed``) until its
        partitions fail over. What no rejoin can get past (``ENDS_THE_CONSUMER``), and
        any other refusal, is raised at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TOPIC_WAIT_S
        backoff = 0.05
        while True:
            try:
                await self._sync_sessions()
                return
            except HeadraceError as exc:
                passing = isinstance(exc, UnknownTopic) or (
                    exc.retriable and not isinstance(exc, ENDS_THE_CONSUMER)
                )
                if not passing or loop.time() + backoff >= deadline:
                    raise
                log.info("cohort %s: joining the leaders of %s: %s; retrying", self.cohort,
                         self.topic, exc)  # fmt: skip
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_REJOIN_BACKOFF_S)
            with contextlib.suppress(HeadraceError):
                await self.cluster.refresh()
            self.cluster.routing.topic(self.topic)  # gone from the routing: UnknownTopic now

    async def _sync_sessions(self) -> None:
        """Be a member on every broker that leads a partition of the topic, and only there."""
        routing = self.cluster.routing.topic(self.topic)
        if self._creation_id is None:
            self._creation_id = routing.creation_id
        elif routing.creation_id and routing.creation_id != self._creation_id:
            self._new_incarnation(routing.creation_id)
        owners = {o for o in routing.owners if o >= 0}
        for owner_id in list(self._sessions):
            session = self._sessions[owner_id]
            if owner_id not in owners or session.conn.is_closed:
                self._drop_session(owner_id)
        failed: HeadraceError | None = None
        for owner_id in sorted(owners - set(self._sessions)):
            addr = (self.cluster.routing.brokers or {}).get(owner_id)
            if addr is None:
                # Retried at the next topology change, which should name it.
                log.warning(
                    "cohort %s: the topology names broker %s as the leader of partitions %s"
                    " of %s but gives no address for it",
                    self.cohort,
                    owner_id,
                    self.unjoined_partitions.get(owner_id, []),
                    self.topic,
                )
                continue
            try:
                conn = await self.cluster.connect(addr.host, addr.port)
                await self._join(owner_id, conn)
            except HeadraceError as exc:
                if isinstance(exc, ENDS_THE_CONSUMER):
                    raise  # the other owners will not differ
                failed = failed or exc  # an unreachable owner must not keep us off the others
        if failed is not None:
            raise failed

    def _new_incarnation(self, creation_id: str) -> None:
        """The topic was deleted and created again under its name: what this member held,
        was handed and acked belongs to the old one. Join the new one from its start."""
        log.warning(
            "cohort %s: topic %s was deleted and created again (creation id %s, was %s);"
            " joining it from its start",
            self.cohort,
            self.topic,
            creation_id,
            self._creation_id,
        )
        for owner_id in list(self._sessions):
            # the broker ended these memberships with the old topic; a leave has nowhere to go
            self._drop_session(owner_id, leave=False)
        self._handed.clear()
        self._acked.clear()
        self._pending_acks.clear()
        self._epochs.clear()
        self._leftovers.clear()  # queued batches are dropped as their sessions are gone
        self._creation_id = creation_id
        self._join_start = "earliest"

    def _drop_session(self, owner_id: int, *, leave: bool = True) -> None:
        session = self._sessions.pop(owner_id)
        for p in list(session.held) + list(session.revoking):
            if self._session_of.get(p) is session:
                del self._session_of[p]
        session.held.clear()
        session.revoking.clear()
        if leave and not session.conn.is_closed:
            # Leaving the broker's cohort: it no longer leads anything of ours.
            session.conn.request(Op.COHORT_LEAVE, b"{}").add_done_callback(_log_failure("leave"))

    async def _follow_topology(self) -> None:
        """Rejoin where leadership moved; reconnect after a broker dies (failover)."""
        backoff = 0.1
        # what the last warning about failing joins named: logged again only if it changes
        warned: tuple[dict[int, list[int]], type[HeadraceError]] | None = None
        while True:
            closed = [s for s in self._sessions.values() if s.conn.is_closed]
            if not closed and not self._topology_changed.is_set():
                waiters = [asyncio.ensure_future(self._topology_changed.wait())]
                waiters += [
                    asyncio.ensure_future(s.conn.closed.wait()) for s in self._sessions.values()
                ]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
            if self._closed:
                return
            # Consumed here, before the routing is read: a change pushed while the sync
            # below runs (it awaits connects and joins) sets it again and is not lost.
            self._topology_changed.clear()
            try:
                if any(s.conn.is_closed for s in self._sessions.values()):
                    await self.cluster.refresh()
                await self._sync_sessions()
                backoff = 0.1
                warned = None
            except HeadraceError as exc:
                if isinstance(exc, ENDS_THE_CONSUMER):
                    self._fail(exc)
                    return
                unjoined = self.unjoined_partitions
                if backoff < MAX_REJOIN_BACKOFF_S or warned == (unjoined, type(exc)):
                    log.info(
                        "rejoining cohort %s after a topology change failed: %s", self.cohort, exc
                    )
                else:
                    # Failing for seconds: nothing of these partitions reaches this member.
                    # Said once (again if what is missing or why changes), not every retry.
                    warned = (unjoined, type(exc))
                    log.warning(
                        "cohort %s: no membership on the leaders of %s (leader broker:"
                        " partitions %s); the join keeps failing, retried every %g s: %s",
                        self.cohort,
                        self.topic,
                        unjoined,
                        MAX_REJOIN_BACKOFF_S,
                        exc,
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_REJOIN_BACKOFF_S)
                # Try again even if no further change comes: the owner we could not reach
                # (a broker still starting) may be the last change there is.
                with contextlib.suppress(HeadraceError):
                    await self.cluster.refresh()
                self._topology_changed.set()

    def _fail(self, exc: HeadraceError) -> None:
        """End the consumer with ``exc``: the application's next ``getmany`` (or its
        ``batches`` loop) raises it, once what was queued before is handed out."""
        if self._closed or self._failure is not None:
            return
        log.error("cohort %s: consumer ended, it cannot join again: %s", self.cohort, exc)
        self._failure = exc
        self._queue.put_nowait(None)  # wakes a waiting getmany

    def _end_of_deliveries(self) -> None:
        """The queue's end was reached: raise what ended the consumer, if anything did
        (else it was closed). The marker stays queued for the next caller."""
        self._queue.put_nowait(None)
        if self._failure is not None and not self._closed:
            failure = self._failure
            raise type(failure)(failure.message) from failure

    async def _join(self, owner_id: int, conn: ClientConnection) -> None:
        if (
            self.identity is None
            and conn.handshake is not None
            and conn.handshake.member_identities
        ):
            # Signed identities (docs/security.md): one id for the whole cluster, issued once.
            frame = await conn.request(Op.IDENTITY, msg.IdentityRequest(self.member_id).encode())
            issued = msg.IdentityOk.decode(frame.body)
            self.member_id, self.identity = issued.member_id, issued.token
        session = _Session(conn)
        self._sessions[owner_id] = session
        join = msg.CohortJoin(
            self.cohort,
            self.topic,
            self.member_id,
            self._join_start,
            self.session_timeout_ms,
            int(self.isolation),
            self.identity,
        )
        try:
            frame = await conn.request(Op.COHORT_JOIN, join.encode())
        except HeadraceError as exc:
            # Registered early so pushes racing the response land; a failed join must
            # not look like a membership (the next topology change retries it).
            if self._sessions.get(owner_id) is session:
                del self._sessions[owner_id]
            if isinstance(exc, InvalidMemberIdentity) and self.identity is not None:
                # The key that signed our identity left the cluster key file (a rotation,
                # docs/security.md §9): the retry asks for a fresh identity. Memberships
                # joined with the old one go on under their id.
                log.warning(
                    "cohort %s: identity refused (%s); asking for a new one", self.cohort, exc
                )
                self.identity, self.member_id = None, self._member_hint
            raise
        self._apply_assignment(session, msg.Assignment.decode(frame.body))
        conn.send_no_reply(Op.CREDIT, msg.CREDIT.pack(self.credit_bytes))

    async def close(self, *, grace_s: float = 10.0) -> None:
        """Leave politely: send the pending acks, leave, release each partition once the
        records handed out of it are acked, then disconnect.

        Returns as soon as nothing is in flight and every broker answered the releases
        (the member is out of the cohort there, its partitions already given to other
        members where the broker assigns them itself), or after ``grace_s`` seconds of
        waiting for acks of records still in flight; the broker frees those partitions
        when the connection closes, and their unacked records go to the next holder.
        """
        if self._closed:
            return
        self._closed = True
        self._flush_acks()
        for session in self._sessions.values():
            with contextlib.suppress(HeadraceError):
                await session.conn.request(Op.COHORT_LEAVE, b"{}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        for session in self._sessions.values():
            while (
                (session.held or session.revoking or session.releasing)
                and loop.time() < deadline
                and not session.conn.is_closed
            ):
                session.changed.clear()
                self._release_ready(session)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        session.changed.wait(), max(0.01, deadline - loop.time())
                    )
        for task in self._tasks:
            task.cancel()
        self._queue.put_nowait(None)
        await self.cluster.close()

    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            for session in list(self._sessions.values()):
                if session.conn.is_closed:
                    continue
                fut = session.conn.request(Op.COHORT_HEARTBEAT, b"{}")
                fut.add_done_callback(self._heartbeat_answered(session))

    def _heartbeat_answered(self, session: _Session) -> Callable[[asyncio.Future[Frame]], None]:
        def done(fut: asyncio.Future[Frame]) -> None:
            if fut.cancelled():
                return
            exc = fut.exception()
            if isinstance(exc, UnknownMember) and not self._closed:
                # Our session expired on that broker (a long pause): forget it and join again.
                log.warning("cohort %s: membership on a broker expired; rejoining", self.cohort)
                for owner_id, s in list(self._sessions.items()):
                    if s is session:
                        self._drop_session(owner_id, leave=False)
                self._topology_changed.set()
            elif exc is not None and not isinstance(exc, ConnectionClosed) and not self._closed:
                # While closing, a broker that already processed our leave answers
                # UnknownMember: expected, not worth a warning.
                log.warning("heartbeat failed: %s", exc)

        return done

    # ------------------------------------------------------------------ pushes

    def _session_for(self, conn: ClientConnection) -> _Session | None:
        for session in self._sessions.values():
            if session.conn is conn:
                return session
        return None

    def _on_assignment(self, conn: ClientConnection, frame: Frame) -> None:
        session = self._session_for(conn)
        if session is None:
            return
        self._apply_assignment(session, msg.Assignment.decode(frame.body))

    def _apply_assignment(self, session: _Session, assignment: msg.Assignment) -> None:
        if assignment.sequence <= session.sequence:
            return
        session.sequence = assignment.sequence
        for p, epoch in assignment.partitions.items():
            if session.held.get(p) != epoch:
                # A new tenure: nothing handed out yet in it.
                self._handed.pop(p, None)
                self._acked.pop(p, None)
            self._session_of[p] = session
            self._epochs[p] = epoch
        session.held = dict(assignment.partitions)
        session.revoking = set(assignment.revoked)
        session.generation = assignment.generation
        for p in [p for p, s in self._session_of.items() if s is session]:
            if p not in session.held and p not in session.revoking:
                # Gone from this broker (moved, or leadership changed): if another broker's
                # view came first and holds it, acks and deliveries belong there now.
                other = next((o for o in self._sessions.values() if p in o.held), None)
                if other is None:
                    del self._session_of[p]
                else:
                    self._session_of[p] = other
                    self._epochs[p] = other.held[p]
        session.changed.set()
        self._release_ready(session)

    def _on_delivery(self, conn: ClientConnection, frame: Frame) -> None:
        delivery = msg.Delivery.decode(frame.body)
        session = self._session_for(conn)
        data = bytes(delivery.batches)
        if session is None or session.held.get(delivery.partition) != delivery.gate_epoch:
            # A delivery from a tenure we no longer have: give its credit back.
            conn.send_no_reply(Op.CREDIT, msg.CREDIT.pack(len(data)))
            return
        remaining = len(data)
        for pos, header in rb.scan(data):
            size = header.size
            remaining -= size
            chunk = data[pos : pos + size]
            self._queue.put_nowait(
                ConsumedBatch(
                    self.topic,
                    delivery.partition,
                    delivery.gate_epoch,
                    delivery.first_offset,
                    chunk,
                    header,
                    id(session),
                    creation_id=self._creation_id or "",
                )
            )
        if remaining:
            log.warning(
                "delivery for partition %s had %d trailing bytes", delivery.partition, remaining
            )

    # ------------------------------------------------------------------ consuming

    async def batches(self) -> AsyncIterator[ConsumedBatch]:
        """Yield delivered batches in per-partition offset order until closed; raises
        the error that ended the consumer (``ENDS_THE_CONSUMER``), if one did."""
        while True:
            item = self._leftovers.popleft() if self._leftovers else await self._queue.get()
            if item is None:
                self._end_of_deliveries()
                return
            admitted = self._admit(item)
            if admitted is not None:
                yield admitted

    def _admit(self, item: ConsumedBatch, limit: int | None = None) -> ConsumedBatch | None:
        """Hand a dequeued batch (its first ``limit`` records at most) to the application,
        or drop it if it may not be.

        Dropped: batches of a tenure this member no longer has (revoked or
        re-seated while queued) and records it has already handed out. The rest of
        a batch cut at ``limit`` waits in ``_leftovers``, not handed out.
        """
        # The session that delivered it, not whichever one last claimed the partition: while
        # a partition moves, the old and the new owner's views may arrive in either order.
        session = next((s for s in self._sessions.values() if id(s) == item.session_id), None)
        if not item._credited:
            self._return_credit(session, item.header.size)
            item._credited = True
        if session is None or session.held.get(item.partition) != item.epoch:
            return None
        handed = self._handed.get(item.partition)
        if handed is not None and item.last_offset <= handed:
            return None
        if handed is not None and item.start <= handed:
            item.first_offset = handed + 1
        if limit is not None and item.record_count > limit:
            item, rest = item.split(limit)
            self._leftovers.appendleft(rest)
        self._handed[item.partition] = item.last_offset
        if self._session_of.get(item.partition) is not session:
            self._session_of[item.partition] = session  # acks go where the records came from
            self._epochs[item.partition] = item.epoch
        return item

    def __aiter__(self) -> AsyncIterator[rb.Record]:
        return self._records()

    async def _records(self) -> AsyncIterator[rb.Record]:
        async for batch in self.batches():
            for record in batch.records():
                yield record

    async def getmany(
        self, max_batches: int = 100, timeout_s: float = 1.0, *, max_records: int | None = None
    ) -> list[ConsumedBatch]:
        """Up to ``max_batches`` batches, waiting at most ``timeout_s`` for the first.

        Only the first wait blocks; the rest is taken from what is already
        queued. (A blocking wait after batches were taken could hold them back
        forever if the queued items turned out to be revoked, and a held-back
        batch is never acked.)

        ``max_records`` (Kafka's ``max.poll.records``): at most that many records in
        all; a batch that would pass it is cut, and its rest comes first next time.
        What is handed out is in flight until acked, so an application that will stop
        after N records asks for no more, and ``close`` need not wait for the others.

        Raises the error that ended the consumer, once it cannot join again
        (``ENDS_THE_CONSUMER``: its token removed, say); every later call raises it too.
        """
        if max_records is not None and max_records < 1:
            raise InvalidRequest(f"max_records must be at least 1, got {max_records}")
        left = max_records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        out: list[ConsumedBatch] = []
        while not out:
            if self._leftovers:
                item: ConsumedBatch | None = self._leftovers.popleft()
            elif self._queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return out
                getter = asyncio.ensure_future(self._queue.get())
                finished, _ = await asyncio.wait({getter}, timeout=remaining)
                if not finished:
                    getter.cancel()  # a cancelled Queue.get leaves its item queued
                    return out
                item = getter.result()
            else:
                item = self._queue.get_nowait()
            if item is None:
                self._end_of_deliveries()
                return out
            admitted = self._admit(item, left)
            if admitted is not None:
                out.append(admitted)
                left = None if left is None else left - admitted.record_count
        while len(out) < max_batches and (left is None or left > 0):
            if self._leftovers:
                item = self._leftovers.popleft()
            else:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
            if item is None:
                self._queue.put_nowait(None)
                break
            admitted = self._admit(item, left)
            if admitted is not None:
                out.append(admitted)
                left = None if left is None else left - admitted.record_count
        return out

    def _return_credit(self, session: _Session | None, nbytes: int) -> None:
        if session is None:
            return
        key = id(session)
        owed = self._unreturned.get(key, 0) + nbytes
        # Return credit in chunks: one small frame per quarter of the window.
        if owed >= self.credit_bytes // 4:
            session.conn.send_no_reply(Op.CREDIT, msg.CREDIT.pack(owed))
            owed = 0
        self._unreturned[key] = owed

    # ------------------------------------------------------------------ acking

    def ack(self, partition: int, offset: int) -> None:
        """Acknowledge every record of ``partition`` up to and including ``offset``."""
        if offset > self._pending_acks.get(partition, -1):
            self._pending_acks[partition] = offset
        if not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def ack_batch(self, batch: ConsumedBatch) -> None:
        if batch.creation_id != (self._creation_id or ""):
            return  # a record of the deleted topic: its offsets mean nothing in the new one
        self.ack(batch.partition, batch.last_offset)

    def ack_record(self, record: rb.Record, partition: int) -> None:
        self.ack(partition, record.offset)

    def _flush_acks(self) -> None:
        self._ack_scheduled = False
        pending, self._pending_acks = self._pending_acks, {}
        touched: set[int] = set()
        for partition, offset in pending.items():
            session = self._session_of.get(partition)
            if session is None or (
                partition not in session.held and partition not in session.revoking
            ):
                continue
            epoch = session.held.get(partition, self._epochs.get(partition))
            if epoch is None:
                continue
            body = msg.Ack(partition, epoch, offset).encode()
            session.conn.request(Op.ACK, body).add_done_callback(
                _log_failure(f"ack of partition {partition}")
            )
            self._acked[partition] = max(offset, self._acked.get(partition, -1))
            touched.add(id(session))
        for session in self._sessions.values():
            if id(session) in touched:
                self._release_ready(session)

    def _release_ready(self, session: _Session) -> None:
        """Release revoked partitions whose handed-out records are all acked."""
        ready = [
            p
            for p in session.revoking
            if self._acked.get(p, -1) >= self._handed.get(p, -1) and p not in self._pending_acks
        ]
        if ready and not session.conn.is_closed:
            session.revoking -= set(ready)
            fut = session.conn.request(Op.RELEASE, msg.Release(sorted(ready)).encode())
            fut.add_done_callback(_log_failure("release"))
            session.releasing.add(fut)
            fut.add_done_callback(functools.partial(_answered, session))

    async def seek(self, partition: int, offset: int) -> None:
        """Restart delivery of a held partition at ``offset``."""
        session = self._session_of.get(partition)
        if session is None or partition not in session.held:
            raise HeadraceError(f"partition {partition} is not held by this member")
        frame = await session.conn.request(Op.SEEK, msg.Seek(partition, offset).encode())
        epoch = int(msg.decode_json(frame.body)["epoch"])
        session.held[partition] = epoch
        self._handed.pop(partition, None)
        self._acked.pop(partition, None)

    @property
    def unjoined_partitions(self) -> dict[int, list[int]]:
        """Leader broker -> the partitions it leads (as this member's routing says) on
        which this member has no membership: nothing of them is delivered to it, and its
        cohort gets them from no one unless another member joined there. Empty while
        every leader has this member's membership (or the topic's routing is unknown)."""
        try:
            routing = self.cluster.routing.topic(self.topic)
        except HeadraceError:
            return {}
        out: dict[int, list[int]] = {}
        for partition, owner in enumerate(routing.owners):
            if owner >= 0 and owner not in self._sessions:
                out.setdefault(owner, []).append(partition)
        return out

    @property
    def assignment(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for session in self._sessions.values():
            out.update(session.held)
        return out


def _answered(session: _Session, release: asyncio.Future[Frame]) -> None:
    session.releasing.discard(release)
    session.changed.set()


def _log_failure(what: str):  # type: ignore[no-untyped-def]
    def callback(fut: asyncio.Future[Frame]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None and not isinstance(exc, ConnectionClosed):
            log.warning("%s failed: %s", what, exc)

    return callback
