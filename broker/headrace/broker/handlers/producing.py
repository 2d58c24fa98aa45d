"""Produce: validate a batch, append it, and answer once it is as durable as asked.

The hot write path: the append runs synchronously on the loop; only a wait for the
high watermark (acks=all) or for fsync (fsync=always) leaves a callback behind.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from headrace.broker import appending
from headrace.broker.ports import FrameLink, RedirectRequired, Routes
from headrace.errors import HeadraceError, NotEnoughReplicas, RequestTimedOut
from headrace.protocol import messages as msg
from headrace.protocol.frames import FLAG_NO_REPLY, FLAG_RESPONSE, Frame, Op, encode_frame
from headrace.records import batch as rb
from headrace.security.acl import Operation
from headrace.storage.bookkeeping import FsyncPolicy, SequenceVerdict

if TYPE_CHECKING:
    from headrace.broker.topics import Partition


class Producing:
    def __init__(self, conn: FrameLink) -> None:
        self.conn = conn
        # both fixed for the connection's life: read once, not per frame
        self.broker = conn.broker
        self.access = conn.access

    def routes(self) -> Routes:
        return {Op.PRODUCE: self.on_produce}

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
            self.conn.write(encode_frame(Op.PRODUCE_OK, frame.correlation_id, body, FLAG_RESPONSE))
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
            self.conn.send_error(frame.correlation_id, err)
            return
        body = msg.ProduceResponse(base, partition.leader_epoch, partition.high_watermark).encode()
        self.conn.write(encode_frame(Op.PRODUCE_OK, frame.correlation_id, body, FLAG_RESPONSE))


def _expire(fut: asyncio.Future[None], message: str) -> None:
    if not fut.done():
        fut.set_exception(RequestTimedOut(message))
