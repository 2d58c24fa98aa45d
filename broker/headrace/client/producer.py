"""Async producer: per-partition batching, routing, pipelining, idempotent retries.

Records are collected per partition until ``batch_bytes`` or ``linger_ms``;
a full batch is encoded once (columnar, C-speed loops) and handed to that
partition's sender. Each sender keeps up to ``max_in_flight`` requests
pipelined. Every batch carries the producer id and a per-partition sequence,
so a retry after a lost response is recognised by the broker and answered
with the original offsets instead of being appended twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace.aio import cancel_and_wait
from headrace.client import retry_policy
from headrace.client.cluster import ClusterClient
from headrace.client.connection import ConnectOptions, RedirectReceived
from headrace.client.routing import canonical, partition_for_key
from headrace.clock import wall_ms
from headrace.errors import (
    BatchTooLarge,
    ConnectionClosed,
    HeadraceError,
    RequestTimedOut,
)
from headrace.protocol import messages as msg
from headrace.protocol.frames import Op
from headrace.records import batch as rb
from headrace.records import codecs

log = logging.getLogger(__name__)

_SEQ_MOD = 1 << 32
#: a produce request unanswered this long (seconds) makes its sender ask whether the
#: partition still has the leader it went to; if not, it stops waiting and resends there
LEADER_CHECK_S = 1.0


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback for a task nobody awaits to the end: its failure is no news."""
    if not task.cancelled():
        task.exception()


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class BatchResult:
    topic: str
    partition: int
    base_offset: int
    record_count: int
    #: set when a repartition re-routed the batch's records: where each one went
    records: tuple[RecordMetadata, ...] | None = None


async def _yield_to_senders() -> None:
    """Let the event loop run once, right after a batch was sealed.

    A caller awaiting ``send()`` in a loop otherwise never suspends (nothing on the
    accumulate path waits), so sealed batches would sit in the senders' queues until
    ``buffer_bytes`` is full, and the broker would idle while this process encodes,
    then this process idle while the broker appends. One yield per batch lets the
    sender write each batch as soon as it is sealed, so both sides work at once.
    """
    await asyncio.sleep(0)


class RecordReceipt:
    """Awaitable handle of one sent record; resolves to its RecordMetadata."""

    __slots__ = ("_future", "_index")

    def __init__(self, future: asyncio.Future[BatchResult], index: int) -> None:
        self._future = future
        self._index = index

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        result = yield from self._future.__await__()
        if result.records is not None:
            return result.records[self._index]
        return RecordMetadata(result.topic, result.partition, result.base_offset + self._index)

    def done(self) -> bool:
        return self._future.done()

    @property
    def batch(self) -> asyncio.Future[BatchResult]:
        """The future of the batch this record went into (shared by its records)."""
        return self._future


@dataclass(slots=True)
class _Accumulator:
    """Records waiting to become one batch for one partition."""

    values: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] | None = None
    headers: list[Sequence[tuple[str, bytes]]] | None = None
    timestamps: list[int] | None = None
    size: int = 0
    future: asyncio.Future[BatchResult] | None = None
    linger: asyncio.TimerHandle | None = None
    #: the partitioning version the records were routed under
    version: int = 0
    #: some record named its partition: a repartition re-sends it there, not by key
    explicit: bool = False
    #: set when the accumulator is taken out to become a batch; appends after that are lost
    sealed: bool = False


@dataclass(slots=True)
class _StickyTurn:
    """One turn of a topic's unkeyed records at one partition.

    A turn ends once ``bytes_left`` is spent (or the partition's batch is full);
    the next turn goes to the next partition. An ended turn is never restarted:
    a new one replaces it, so a cursor holding an ended turn sees
    ``bytes_left <= 0`` and takes the slow path.
    """

    partition: int
    #: bytes (values plus 8 per record, as accumulators count them) still to go here
    bytes_left: int


@dataclass(slots=True)
class _TopicCursor:
    """Per topic (as the caller spells it): where its next unkeyed record goes.

    Lets ``send`` skip name canonicalisation, the partition-count lookup and the
    sticky choice while nothing about them changed: ``routing`` is the routing
    entry the choice was made under (entries are immutable and replaced on any
    change, so identity says "unchanged"), ``accumulator`` the sticky partition's
    open accumulator, ``turn`` the sticky turn that chose it.
    """

    name: str
    routing: msg.TopicRouting | None = None
    partition: int = 0
    accumulator: _Accumulator | None = None
    turn: _StickyTurn | None = None


@dataclass(slots=True)
class _Batch:
    topic: str
    partition: int
    data: bytes
    record_count: int
    sequence: int
    future: asyncio.Future[BatchResult]
    deadline: float
    attempts: int = 0
    #: the partitioning version its records were routed under (sent with it: the fence)
    version: int = 0
    explicit: bool = False
    #: the broker its last attempt went to (None: not known from the routing)
    sent_to: int | None = None


class _PartitionSender:
    """Sends one partition's batches in order, pipelined, retrying from the first failure."""

    def __init__(self, producer: Producer, topic: str, partition: int) -> None:
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.queue: deque[_Batch] = deque()
        self.inflight: deque[tuple[_Batch, asyncio.Future[Any]]] = deque()
        self.wakeup = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"send-{topic}-{partition}"
        )

    def submit(self, batch: _Batch) -> None:
        self.queue.append(batch)
        self.wakeup.set()

    @property
    def idle(self) -> bool:
        return not self.queue and not self.inflight

    async def _run(self) -> None:
        while True:
            try:
                await self._run_loop()
            except Exception:
                # A bug must not leave receipts hanging silently: log, pause, carry on.
                log.exception("sender for %s/%s failed; resuming", self.topic, self.partition)
                await asyncio.sleep(0.5)

    async def _run_loop(self) -> None:
        p = self.producer
        while True:
            if self.idle:
                self.wakeup.clear()
                await self.wakeup.wait()
            while self.queue and len(self.inflight) < p.max_in_flight:
                batch = self.queue.popleft()
                try:
                    fut = await self._send(batch)
                except HeadraceError as exc:
                    fut = asyncio.get_running_loop().create_future()
                    fut.set_exception(exc)
                self.inflight.append((batch, fut))
            if not self.inflight:
                continue
            batch, fut = self.inflight[0]
            try:
                # A response that never comes (a half-dead connection) must not stall the
                # partition: time out and resend; the broker answers a resent batch it already
                # has with its original offset.
                frame = await self._answer(batch, fut)
            except retry_policy.LeaderMoved as exc:
                log.info("%s/%s: %s; resending there", self.topic, self.partition, exc)
                await self._on_error(batch, exc)
                continue
            except TimeoutError:
                log.warning(
                    "%s/%s: no produce response within the request timeout (%d ms) or the"
                    " batch's delivery timeout",
                    self.topic,
                    self.partition,
                    p.request_timeout_ms,
                )
                await self._on_error(batch, RequestTimedOut("no produce response in time"))
                continue
            except HeadraceError as exc:
                await self._on_error(batch, exc)
                continue
            self.inflight.popleft()
            if p.acks is msg.Acks.NONE:
                result = BatchResult(self.topic, self.partition, -1, batch.record_count)
            else:
                resp = msg.ProduceResponse.decode(frame.body)
                result = BatchResult(
                    self.topic, self.partition, resp.base_offset, batch.record_count
                )
            p._release(len(batch.data))
            if not batch.future.done():
                batch.future.set_result(result)

    async def _answer(self, batch: _Batch, fut: asyncio.Future[Any]) -> Any:
        """The response to the oldest batch in flight, within the request timeout
        and the batch's delivery deadline (``TimeoutError`` after either). Each ``LEADER_CHECK_S`` without it, this asks
        where the partition's leader is (the routing cache, refreshed at most once per
        ``LEADER_CHECK_S`` per producer): a new leader elsewhere raises ``retry_policy.LeaderMoved``.
        A leader that accepts connections and never answers (paused, or hung on its
        disk) otherwise held the partition for the whole timeout after it had failed
        over. An answer that arrives meanwhile always wins."""
        p = self.producer
        loop = asyncio.get_running_loop()
        # Never past the batch's delivery deadline (both on the monotonic clock): a batch in
        # flight to a broker that does not answer fails at its delivery timeout, as one still
        # queued does, however long the request timeout.
        deadline = min(
            loop.time() + p.request_timeout_ms / 1000,
            loop.time() + batch.deadline - time.monotonic(),
        )
        while True:
            wait = min(LEADER_CHECK_S, deadline - loop.time())
            done, _ = await asyncio.wait({fut}, timeout=max(wait, 0.0))
            if done:
                return fut.result()
            if loop.time() >= deadline:
                raise TimeoutError
            if self._owner_id() == batch.sent_to and p._may_refresh_for_leaders(loop.time()):
                # a topology push may have told the cache already; else ask the brokers,
                # while still listening for the answer
                refresh = asyncio.ensure_future(p.cluster.refresh())
                refresh.add_done_callback(_retrieve)
                await asyncio.wait(
                    {refresh, fut},
                    timeout=max(deadline - loop.time(), 0.0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                refresh.cancel()  # only this wait: the shared refresh goes on for others
                if fut.done():
                    return fut.result()
            now_at = self._owner_id()
            if batch.sent_to is not None and now_at is not None and now_at != batch.sent_to:
                raise retry_policy.LeaderMoved(
                    f"no answer from broker {batch.sent_to}, and broker {now_at} leads now"
                )

    def _routing_has_partition(self) -> bool:
        with contextlib.suppress(HeadraceError):
            return self.partition < self.producer.cluster.routing.topic(self.topic).partitions
        return False

    def _owner_id(self) -> int | None:
        with contextlib.suppress(HeadraceError):
            owner = self.producer.cluster.routing.owner(self.topic, self.partition)
            return owner.id if owner is not None else None
        return None

    async def _send(self, batch: _Batch) -> asyncio.Future[Any]:
        p = self.producer
        batch.attempts += 1
        batch.sent_to = self._owner_id()
        conn = await p.cluster.connection_for(self.topic, self.partition)
        # The version the records were routed under, never the current one: a batch routed
        # under an old version must be fenced (and re-routed), not accepted where it is.
        req = msg.ProduceRequest(
            self.topic, self.partition, batch.version, p.acks, p.request_timeout_ms, b""
        )
        if p.acks is msg.Acks.NONE:
            # No response will come: complete as soon as the bytes are handed to the socket.
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            conn.send_no_reply(Op.PRODUCE, req.encode_prefix(), batch.data)
            fut.set_result(None)
            return fut
        return conn.request(
            Op.PRODUCE, req.encode_prefix(), batch.data, timeout_s=p.request_timeout_ms / 1000
        )

    async def _on_error(self, batch: _Batch, exc: HeadraceError) -> None:
        """Carry out what ``retry_policy.decide`` makes of ``batch``'s failed attempt."""
        p = self.producer
        # Everything in flight behind the failed batch is resent after it, in order.
        pending = [b for b, _ in self.inflight]
        for _, f in self.inflight:
            if not f.done():
                f.cancel()
            else:
                f.exception() if not f.cancelled() else None
        self.inflight.clear()
        failure = retry_policy.Failure(
            exc,
            exc.redirect if isinstance(exc, RedirectReceived) else None,
            routing_has_partition=self._routing_has_partition(),
        )
        decision = self._decide(failure, batch, fence_checked=False)
        if isinstance(decision, retry_policy.Reroute):
            if await self._reroute(pending, decision.redirect):
                return
            # Routed under the version the cluster has, but this broker has not applied it
            # yet (pushes reach brokers one by one): retry shortly, as routed.
            await asyncio.sleep(decision.backoff_s)
            decision = self._decide(failure, batch, fence_checked=True)
        assert not isinstance(decision, retry_policy.Reroute)
        if decision.new_identity:
            self._continue_as_new_producer(pending)
        if isinstance(decision, retry_policy.Retry):
            r = decision.note_redirect
            if r is not None:
                p.cluster.routing.note_redirect(
                    r.topic, r.partition, r.owner, r.partitioning_version
                )
            if decision.refresh:
                with contextlib.suppress(HeadraceError):
                    await p.cluster.refresh()
            if decision.backoff_s is not None:
                await asyncio.sleep(decision.backoff_s)
            waited = decision.refresh or decision.backoff_s is not None
            if not waited or time.monotonic() < batch.deadline:
                self.queue.extendleft(reversed(pending))
                return
            # Out of time while refreshing or backing off: a resend could not be waited for
            # (the wait for an answer ends at the deadline), so decide as out of time now,
            # and the batch fails with this error rather than an unanswered resend's.
            decision = self._decide(failure, batch, fence_checked=True)
            assert isinstance(decision, retry_policy.Fail)
        self._fail(batch, decision, pending)

    def _decide(
        self, failure: retry_policy.Failure, batch: _Batch, *, fence_checked: bool
    ) -> retry_policy.Decision:
        attempt = retry_policy.Attempt(
            self.topic, self.partition, batch.version, batch.attempts, batch.deadline
        )
        return retry_policy.decide(
            failure,
            attempt,
            now=time.monotonic(),
            retry_backoff_ms=self.producer.retry_backoff_ms,
            fence_checked=fence_checked,
        )

    def _fail(self, batch: _Batch, decision: retry_policy.Fail, pending: list[_Batch]) -> None:
        """Fail ``batch`` (``pending[0]``); the batches behind it go on."""
        p = self.producer
        log.warning("batch for %s/%s failed: %s", self.topic, self.partition, decision.error)
        p._release(len(batch.data))
        if not batch.future.done():
            batch.future.set_exception(decision.error)
            batch.future.exception()
        rest = pending[1:] + list(self.queue)
        self.queue.clear()
        if decision.renumber_rest:
            self._renumber(rest, batch.sequence)
        # Otherwise the outcome is unknown (it may be in the log), so the rest keep their
        # numbers. If it was appended they follow it; if not, the broker reports the gap
        # and they move to a fresh producer identity.
        self.queue.extend(rest)

    def _renumber(self, batches: list[_Batch], seq: int) -> None:
        """Number ``batches`` on from ``seq``, in order; the partition's next batch follows."""
        for b in batches:
            b.data = rb.restamp_sequence(b.data, seq)
            b.sequence = seq
            seq = (seq + b.record_count) % _SEQ_MOD
        self.producer._sequences[(self.topic, self.partition)] = seq

    def _continue_as_new_producer(self, pending: list[_Batch]) -> None:
        """Go on under a new producer identity on this partition, which the broker has no
        sequence history for: every batch of the partition not yet acknowledged, in flight
        (``pending``) or queued, is renumbered from sequence 0 under it.

        All of them, and on this partition only: the broker checks a batch's sequence
        only against earlier batches of the same identity. A pipeline that mixed two
        identities would let a later batch be appended while an earlier one of the other
        identity was refused, and the earlier one's retry would land after it."""
        p = self.producer
        key = (self.topic, self.partition)
        producer_id = p._new_producer_id(key)
        log.warning(
            "%s/%s: sequence gap persists; continuing as producer %d",
            self.topic,
            self.partition,
            producer_id,
        )
        seq = 0
        for b in [*pending, *self.queue]:
            b.data = rb.restamp_producer(b.data, producer_id, seq)
            b.sequence = seq
            b.attempts = 0
            seq = (seq + b.record_count) % _SEQ_MOD
        p._sequences[key] = seq

    async def _reroute(self, pending: list[_Batch], redirect: msg.Redirect) -> bool:
        """A repartition's fence refused ``pending[0]``: route this partition's batches of
        another version again, under the cluster's. False (nothing done) when the cluster's
        version is the batch's own: only the answering broker is behind.

        The fence refuses every batch of an older version, so none of them was appended:
        they leave the queue, the batches that stay are renumbered from the first one's
        sequence (so the partition's sequence has no gap), and their records are routed
        again in order. ``Producer`` sends nothing under the new version while a batch of
        the old one is unfinished, so each key's old records still go first.
        """
        p = self.producer
        p.cluster.routing.note_redirect(
            redirect.topic, redirect.partition, redirect.owner, redirect.partitioning_version
        )
        with contextlib.suppress(HeadraceError):
            await p.cluster.refresh()
        current = p.cluster.routing.topic(self.topic).partitioning_version
        if current == pending[0].version:
            return False
        queued = pending + list(self.queue)
        self.queue.clear()
        stale = [b for b in queued if b.version != current and not b.explicit]
        kept = [b for b in queued if b.version == current or b.explicit]
        for b in kept:
            b.version = current  # explicit partitions stay where they were
        if stale:
            # from the first refused batch's sequence: nothing from it on was appended
            self._renumber(kept, queued[0].sequence)
        self.queue.extend(kept)
        for b in stale:
            p._release(len(b.data))
            p._resend(b)
        self.wakeup.set()
        return True

    async def close(self) -> None:
        await cancel_and_wait(self.task)


class Producer:
    def __init__(
        self,
        bootstrap: str | list[str],
        *,
        acks: msg.Acks | str = msg.Acks.LEADER,
        batch_bytes: int = 512 * 1024,
        sticky_bytes: int = 64 * 1024,
        linger_ms: float = 2.0,
        max_in_flight: int = 8,
        buffer_bytes: int = 64 * 1024 * 1024,
        retry_backoff_ms: int = 100,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        compression: int | str = rb.COMPRESSION_NONE,
        idempotent: bool = True,
        options: ConnectOptions | None = None,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        self.cluster = ClusterClient(bootstrap, options)
        #: record timestamps: milliseconds since the epoch (tests pass a fake clock)
        self._clock = clock
        self.acks = msg.Acks[acks.upper()] if isinstance(acks, str) else acks
        self.batch_bytes = batch_bytes
        #: bytes of unkeyed records sent to one partition before the next one takes over
        #: (at most ``batch_bytes``). Counted in bytes, not batches, so the spread does not
        #: depend on how fast records arrive: a batch sealed by ``linger_ms`` does not end
        #: the turn (a slow stream would otherwise stay on one partition, or hop per record).
        #: Smaller than a batch, so a megabyte of small records reaches every partition of
        #: a topic; a fast stream still fills whole batches, since each partition's
        #: accumulator stays open while the others take their turns. Kafka's uniform
        #: sticky partitioner (KIP-794) does the same with ``batch.size`` (16 KiB).
        self.sticky_bytes = max(1, min(sticky_bytes, batch_bytes))
        self.linger_s = linger_ms / 1000
        self.max_in_flight = max_in_flight
        self.buffer_bytes = buffer_bytes
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.request_timeout_ms = request_timeout_ms
        #: loop time of the last topology refresh a leader check started (``_answer``):
        #: every sender waiting on a slow cluster checks, the brokers get one a second
        self._leader_refresh_at = float("-inf")
        #: the batch codec id (records/codecs.py); a name ("lz4") or an id, checked here so
        #: a bad choice fails at construction with UnknownCodec, not on the first batch
        self.compression = (
            codecs.codec_id(compression) if isinstance(compression, str) else compression
        )
        codecs.check_known(self.compression)
        self.producer_id = (secrets.randbits(63) | 1) if idempotent else 0
        #: partitions that continue under an identity of their own (a sequence gap that
        #: resending could not close); every other partition uses ``producer_id``
        self._producer_ids: dict[tuple[str, int], int] = {}
        self._accumulators: dict[tuple[str, int], _Accumulator] = {}
        self._senders: dict[tuple[str, int], _PartitionSender] = {}
        self._sequences: dict[tuple[str, int], int] = {}
        #: topic -> the turn its unkeyed records are taking now
        self._turns: dict[str, _StickyTurn] = {}
        self._cursors: dict[str, _TopicCursor] = {}
        #: topic -> the partitioning version records are being routed under now
        self._routed: dict[str, int] = {}
        self._resends: set[asyncio.Task[None]] = set()
        #: every batch handed to a sender and not yet answered: what ``flush`` waits for. A
        #: sender's queue and in-flight list are not enough: between the two a batch waits
        #: for its connection to open, and is in neither.
        self._unanswered: set[asyncio.Future[BatchResult]] = set()
        #: the same, per topic: what ``_settle`` waits for before routing under a new version
        self._unanswered_by_topic: dict[str, set[asyncio.Future[BatchResult]]] = {}
        #: where a topic's first turn goes: a random start, so that many short-lived
        #: producers (one ``headrace produce`` per small file) do not all begin at partition 0
        self._round_robin = itertools.count(secrets.randbelow(1 << 16))
        self._buffered = 0
        self._space = asyncio.Event()
        self._space.set()
        self._closed = False

    async def start(self) -> Producer:
        await self.cluster.start()
        return self

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ routing

    async def _partitions(self, topic: str) -> int:
        """How many partitions to route over, once every batch routed under an older
        partitioning version of the topic is finished (acked or failed): a repartition
        moves keys, and a key's new-version records must not overtake its old ones."""
        routing = await self.cluster.topic_routing(topic)
        while self._routed.get(topic, routing.partitioning_version) != routing.partitioning_version:
            await self._settle(topic)
            self._routed[topic] = routing.partitioning_version
            routing = self.cluster.routing.topic(topic)
        self._routed[topic] = routing.partitioning_version
        return routing.route_count

    def _version(self, topic: str) -> int:
        return self._routed.get(topic, 0)

    async def _settle(self, topic: str) -> None:
        """Send what is accumulated for ``topic`` and wait until every batch of it is done."""
        for t, partition in list(self._accumulators):
            if t == topic:
                self._drain(t, partition)
        # Every batch handed to a sender and not answered, wherever it is: the senders'
        # queues and in-flight lists miss one whose connection is opening and the ones
        # set aside while a failure is handled (a refresh, a backoff). A key's old-version
        # batch missed here was overtaken by its new-version records when its leader had
        # just been killed (found by the chaos campaign's cutover target).
        futures = list(self._unanswered_by_topic.get(topic, ()))
        if futures:
            await asyncio.gather(*futures, return_exceptions=True)

    def _resend(self, batch: _Batch) -> None:
        """Route a refused batch's records again under the current version (see
        ``_PartitionSender._reroute``); its future resolves once all of them are acked."""
        records = rb.decode(batch.data).records()
        routing = self.cluster.routing.topic(batch.topic)
        count, version = routing.route_count, routing.partitioning_version
        parts: list[RecordReceipt] = []
        for r in records:
            p = self._choose(batch.topic, count, r.key, None, len(r.value) + 8)
            acc = self._accumulator(batch.topic, p, version)
            parts.append(self._append(acc, r.value, r.key, r.headers or None, r.timestamp_ms))
            if acc.size >= self.batch_bytes:
                self._drain(batch.topic, p)
        for t, p in list(self._accumulators):
            if t == batch.topic:
                self._drain(t, p)
        loop = asyncio.get_running_loop()

        async def gather() -> None:
            try:
                placed = [await receipt for receipt in parts]
            except HeadraceError as exc:
                if not batch.future.done():
                    batch.future.set_exception(exc)
                return
            if not batch.future.done():
                batch.future.set_result(
                    BatchResult(batch.topic, -1, -1, len(placed), tuple(placed))
                )

        task = loop.create_task(gather())
        self._resends.add(task)
        task.add_done_callback(self._resends.discard)

    def _choose(
        self, topic: str, count: int, key: bytes | None, partition: int | None, size: int
    ) -> int:
        """The partition of a record of ``size`` bytes (value plus 8); an unkeyed one is
        charged to the topic's sticky turn."""
        if partition is not None:
            return partition
        if key is not None:
            return partition_for_key(key, count)
        turn = self._turn(topic, count, size)
        turn.bytes_left -= size
        return turn.partition

    def _turn(self, topic: str, count: int, size: int) -> _StickyTurn:
        """The topic's sticky turn, a new one at the next partition if the current one is
        spent or its partition's batch has no room for ``size`` more bytes."""
        turn = self._turns.get(topic)
        if turn is not None and turn.partition < count and turn.bytes_left > 0:
            acc = self._accumulators.get((topic, turn.partition))
            if acc is None or acc.size + size <= self.batch_bytes:
                return turn
        if turn is not None:
            turn.bytes_left = 0  # a cursor still holding it must not append there
        if turn is None or turn.partition >= count:
            partition = next(self._round_robin) % count
        else:
            partition = (turn.partition + 1) % count
        turn = self._turns[topic] = _StickyTurn(partition, self.sticky_bytes)
        return turn

    # ------------------------------------------------------------------ sending

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordReceipt:
        """Queue one record; await the returned receipt for its offset."""
        # Fast path: an unkeyed, header-less record without its own timestamp
        # or partition, for a topic whose routing and sticky accumulator are unchanged since
        # the last such record, is one dict lookup, some identity checks and an append.
        cursor = self._cursors.get(topic)
        if (
            cursor is not None
            and key is None
            and partition is None
            and not headers
            and timestamp_ms is None
            and not self._closed
            and self._buffered < self.buffer_bytes
        ):
            acc = cursor.accumulator
            turn = cursor.turn
            topics = self.cluster.routing.topics
            if (
                acc is not None
                and turn is not None
                and turn.bytes_left > 0
                and not acc.sealed
                and acc.keys is None
                and acc.headers is None
                and acc.timestamps is None
                and topics is not None
                and topics.get(cursor.name) is cursor.routing
            ):
                size = len(value) + 8
                if acc.size + size <= self.batch_bytes:
                    values = acc.values
                    receipt = RecordReceipt(acc.future, len(values))  # type: ignore[arg-type]
                    values.append(value)
                    acc.size += size
                    turn.bytes_left -= size
                    if acc.size >= self.batch_bytes:
                        self._drain(cursor.name, cursor.partition)
                        await _yield_to_senders()
                    return receipt
        return await self._send_slow(
            topic, value, key=key, partition=partition, headers=headers, timestamp_ms=timestamp_ms
        )

    async def _send_slow(
        self,
        given_topic: str,
        value: bytes,
        *,
        key: bytes | None,
        partition: int | None,
        headers: Sequence[tuple[str, bytes]] | None,
        timestamp_ms: int | None,
    ) -> RecordReceipt:
        if self._closed:
            raise ConnectionClosed("producer is closed")
        topic = canonical(given_topic)
        if self._buffered >= self.buffer_bytes:
            await self._wait_space()
        # Last before routing (no await after it): the count and the version belong together.
        count = await self._partitions(topic)
        p = self._choose(topic, count, key, partition, len(value) + 8)
        acc = self._accumulator(topic, p)
        acc.explicit = acc.explicit or partition is not None
        receipt = self._append(acc, value, key, headers, timestamp_ms)
        if key is None and partition is None:
            # Where the next unkeyed record of this topic may go without the checks above:
            # the routing entry (so its version) this choice was made under, and the
            # sticky accumulator.
            cursor = self._cursors.get(given_topic)
            if cursor is None:
                cursor = self._cursors[given_topic] = _TopicCursor(topic)
            topics = self.cluster.routing.topics
            cursor.routing = topics.get(topic) if topics is not None else None
            cursor.partition = p
            cursor.accumulator = acc
            cursor.turn = self._turns[topic]
        if acc.size >= self.batch_bytes:
            self._drain(topic, p)
            await _yield_to_senders()
        return receipt

    def _append(
        self,
        acc: _Accumulator,
        value: bytes,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None,
        timestamp_ms: int | None,
    ) -> RecordReceipt:
        index = len(acc.values)
        if key is not None and acc.keys is None:
            acc.keys = [None] * index
        if headers and acc.headers is None:
            acc.headers = [()] * index
        if timestamp_ms is not None and acc.timestamps is None:
            now = self._clock()
            acc.timestamps = [now] * index
        acc.values.append(value)
        if acc.keys is not None:
            acc.keys.append(key)
        if acc.headers is not None:
            acc.headers.append(headers or ())
        if acc.timestamps is not None:
            acc.timestamps.append(timestamp_ms if timestamp_ms is not None else self._clock())
        acc.size += len(value) + (len(key) if key else 0) + 8
        assert acc.future is not None
        return RecordReceipt(acc.future, index)

    async def send_many(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        partition: int | None = None,
        key: bytes | None = None,
    ) -> list[asyncio.Future[BatchResult]]:
        """Queue many unkeyed (or same-key) records at once; no per-record Python work.

        Returns one future per batch the records went into.
        """
        if self._closed:
            raise ConnectionClosed("producer is closed")
        topic = canonical(topic)
        count = await self._partitions(topic)
        futures: list[asyncio.Future[BatchResult]] = []
        pos = 0
        total = len(values)
        while pos < total:
            if self._buffered >= self.buffer_bytes:
                await self._wait_space()
            count = await self._partitions(topic)
            # Unkeyed: the turn is charged below, for the whole slice.
            p = self._choose(topic, count, key, partition, 0)
            acc = self._accumulator(topic, p)
            acc.explicit = acc.explicit or partition is not None
            if acc.keys is not None or acc.headers is not None or acc.timestamps is not None:
                self._drain(topic, p)
                acc = self._accumulator(topic, p)
            room = max(1, self.batch_bytes - acc.size)
            # Estimate how many values fit from the first one's size; exactness is not needed.
            per = len(values[pos]) + 8
            take = max(1, min(total - pos, room // per))
            if partition is None and key is None:
                turn = self._turns[topic]
                take = max(1, min(take, -(-turn.bytes_left // per)))
                turn.bytes_left -= take * per
            chunk = values[pos : pos + take]
            if key is not None:
                acc.keys = acc.keys or [None] * len(acc.values)
                acc.keys.extend([key] * take)
            acc.values.extend(chunk)
            acc.size += take * per
            assert acc.future is not None
            if not futures or futures[-1] is not acc.future:
                futures.append(acc.future)
            pos += take
            if acc.size >= self.batch_bytes:
                self._drain(topic, p)
        return futures

    def _accumulator(self, topic: str, partition: int, version: int | None = None) -> _Accumulator:
        """The open accumulator of ``partition`` for records routed under ``version``
        (default: the version the producer routes under now)."""
        k = (topic, partition)
        acc = self._accumulators.get(k)
        version = self._version(topic) if version is None else version
        if acc is not None and acc.version != version:
            self._drain(topic, partition)  # routed under another version: a batch of its own
            acc = None
        if acc is None:
            acc = _Accumulator(future=asyncio.get_running_loop().create_future(), version=version)
            self._accumulators[k] = acc
            acc.linger = asyncio.get_running_loop().call_later(
                self.linger_s, self._drain, topic, partition
            )
        return acc

    def _drain(self, topic: str, partition: int) -> None:
        acc = self._accumulators.pop((topic, partition), None)
        if acc is None:
            return
        acc.sealed = True
        if not acc.values:
            return
        if acc.linger is not None:
            acc.linger.cancel()
        k = (topic, partition)
        seq = self._sequences.get(k, 0)
        count = len(acc.values)
        data = rb.encode(
            acc.values,
            keys=acc.keys,
            headers=acc.headers,
            timestamps=acc.timestamps,
            # without per-record timestamps, every record carries the time the batch is sealed
            timestamp_ms=None if acc.timestamps is not None else self._clock(),
            compression=self.compression,
            producer_id=self._producer_ids.get(k, self.producer_id),
            base_sequence=seq,
        )
        assert acc.future is not None
        if self.cluster.options.max_frame_bytes and len(data) > 16 * 1024 * 1024:
            acc.future.set_exception(BatchTooLarge(f"batch of {len(data)} bytes is too large"))
            return
        self._sequences[k] = (seq + count) % _SEQ_MOD
        self._buffered += len(data)
        if self._buffered >= self.buffer_bytes:
            self._space.clear()
        self._unanswered.add(acc.future)
        acc.future.add_done_callback(self._unanswered.discard)
        per_topic = self._unanswered_by_topic.setdefault(topic, set())
        per_topic.add(acc.future)
        acc.future.add_done_callback(per_topic.discard)
        sender = self._senders.get(k)
        if sender is None:
            sender = self._senders[k] = _PartitionSender(self, topic, partition)
        sender.submit(
            _Batch(
                topic,
                partition,
                data,
                count,
                seq,
                acc.future,
                time.monotonic() + self.delivery_timeout_s,
                version=acc.version,
                explicit=acc.explicit,
            )
        )

    def _new_producer_id(self, key: tuple[str, int]) -> int:
        """A fresh identity for one partition's batches from now on."""
        producer_id = secrets.randbits(63) | 1
        self._producer_ids[key] = producer_id
        return producer_id

    def _may_refresh_for_leaders(self, now: float) -> bool:
        """Whether a leader check may refresh the topology now (one a ``LEADER_CHECK_S``
        per producer, however many senders are waiting)."""
        if now - self._leader_refresh_at < LEADER_CHECK_S:
            return False
        self._leader_refresh_at = now
        return True

    def _release(self, nbytes: int) -> None:
        self._buffered -= nbytes
        if self._buffered < self.buffer_bytes:
            self._space.set()

    async def _wait_space(self) -> None:
        # Nothing drains while everything sits in accumulators: push them out first.
        for topic, partition in list(self._accumulators):
            self._drain(topic, partition)
        await self._space.wait()

    async def flush(self) -> None:
        """Send everything queued and wait until it is acknowledged (or failed)."""
        futures = [acc.future for acc in self._accumulators.values() if acc.future is not None]
        for topic, partition in list(self._accumulators):
            self._drain(topic, partition)
        futures += self._unanswered
        if futures:
            await asyncio.gather(*futures, return_exceptions=True)

    async def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(HeadraceError):
            await self.flush()
        self._closed = True
        for sender in self._senders.values():
            await sender.close()
        await self.cluster.close()
