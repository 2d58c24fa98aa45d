"""The leader's side of replication on a follower broker's connection: its fetch session's
long polls, and its epoch queries (``protocol.replication``)."""

from __future__ import annotations

import asyncio
import sys

from headrace.broker.fetch_sessions import FetchSession
from headrace.broker.ports import FrameLink, Routes
from headrace.protocol import replication as rp
from headrace.protocol.frames import FLAG_RESPONSE, Frame, Op, frame_header

#: asyncio's socket transports send a list of buffers without joining them from 3.12 on
_WRITELINES_JOINS = sys.version_info < (3, 12)
#: on 3.11, parts at least this big are written alone: a send call costs less than the copy
_WRITE_ALONE_BYTES = 64 * 1024


class ReplicaServing:
    def __init__(self, conn: FrameLink) -> None:
        self.conn = conn
        #: a follower broker's replica fetch session on this connection (the leader side)
        self.fetch_session: FetchSession | None = None

    def routes(self) -> Routes:
        return {
            Op.REPLICA_FETCH: self.on_replica_fetch,
            Op.OFFSET_FOR_EPOCH: self.on_offset_for_epoch,
        }

    def close(self) -> None:
        if self.fetch_session is not None:
            self.fetch_session.close()
            self.fetch_session = None

    def on_replica_fetch(self, frame: Frame) -> None:
        """A follower's fetch over this connection's session (``protocol.replication``)."""
        self.conn.access.require_cluster()
        request = rp.ReplicaFetch.decode(frame.body)
        replication = self.conn.broker.replication
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
        conn = self.conn
        if conn.closed:
            return
        parts = response.encode_parts()
        length = sum(len(p) for p in parts)
        head = frame_header(Op.REPLICA_FETCH_OK, frame.correlation_id, length, FLAG_RESPONSE)
        if not _WRITELINES_JOINS:
            conn.writelines([head, *parts])
            return
        # Python 3.11's writelines joins its parts: a copy of every replicated byte into a
        # fresh buffer. Send each large part from its own buffer instead (a send call
        # each), joining only the small ones.
        small: list[bytes | memoryview] = [head]
        for part in parts:
            if len(part) < _WRITE_ALONE_BYTES:
                small.append(part)
                continue
            conn.write(b"".join(small))
            small = []
            conn.write(part)
        if small:
            conn.write(b"".join(small))

    def on_offset_for_epoch(self, frame: Frame) -> None:
        self.conn.access.require_cluster()
        answers = self.conn.broker.replication.answer_epochs(rp.decode_epoch_queries(frame.body))
        self.conn.respond(frame, Op.OFFSET_FOR_EPOCH_OK, rp.encode_epoch_answers(answers))
