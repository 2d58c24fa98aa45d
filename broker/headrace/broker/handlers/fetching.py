"""Fetch: answer from the local log at once, from a long poll once data arrives, or from
the object store below the local log's start.

The hot read path: a read from the local log is answered synchronously on the loop
(the bytes go to the transport as they lie in the log); a long poll leaves a
listener behind, and a tiered read a task, which ``close`` cancels.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from headrace.broker.ports import FrameLink, Routes
from headrace.errors import HeadraceError, OffsetOutOfRange
from headrace.protocol import messages as msg
from headrace.protocol.frames import FLAG_RESPONSE, Frame, Op, frame_header
from headrace.security.acl import Operation

if TYPE_CHECKING:
    from headrace.broker.topics import Partition

log = logging.getLogger(__name__)


class Fetching:
    def __init__(self, conn: FrameLink) -> None:
        self.conn = conn
        # both fixed for the connection's life: read once, not per frame
        self.broker = conn.broker
        self.access = conn.access
        #: tiered reads in progress (object-store calls run off the loop)
        self._tasks: set[asyncio.Task[None]] = set()

    def routes(self) -> Routes:
        return {Op.FETCH: self.on_fetch}

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()

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
            self.conn.send_error(frame.correlation_id, exc)
            return
        except Exception:
            log.exception("tiered read of %s at %d failed", partition.name, req.offset)
            self.conn.send_error(frame.correlation_id, HeadraceError("internal broker error"))
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
        self.conn.writelines(
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
