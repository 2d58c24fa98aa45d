"""A cohort member's frames: join, credit, acks, releases, seeks, heartbeats and leave.

One connection joins at most one cohort, as one member; the membership ends when
the member leaves, its session expires (``ended``) or the connection closes
(``disconnect``).
"""

from __future__ import annotations

from headrace.broker.ports import Cohort, FrameLink, Routes
from headrace.errors import (
    AlreadyJoined,
    HeadraceError,
    InvalidRequest,
    MalformedFrame,
    UnknownMember,
)
from headrace.protocol import messages as msg
from headrace.protocol.frames import Frame, Op


class Membership:
    def __init__(self, conn: FrameLink) -> None:
        self.conn = conn
        self.member_id: str | None = None
        self.cohort: Cohort | None = None
        #: (topic, cohort) as the join named them: what the member's later frames re-check
        self._joined: tuple[str, str] | None = None

    def routes(self) -> Routes:
        return {
            Op.COHORT_JOIN: self.on_cohort_join,
            Op.COHORT_LEAVE: self.on_cohort_leave,
            Op.COHORT_HEARTBEAT: self.on_cohort_heartbeat,
            Op.CREDIT: self.on_credit,
            Op.ACK: self.on_ack,
            Op.RELEASE: self.on_release,
            Op.SEEK: self.on_seek,
            Op.IDENTITY: self.on_identity,
        }

    def ended(self) -> None:
        """The member left the cohort (leave completed, or its session expired)."""
        self.cohort = None
        self.member_id = None
        self._joined = None

    def wake(self) -> None:
        """The connection can take more deliveries."""
        if self.cohort is not None:
            self.cohort.wake()

    def disconnect(self) -> None:
        """The connection closed: the member is gone."""
        if self.cohort is not None and self.member_id is not None:
            self.cohort.disconnect(self.member_id, self.conn)
            self.conn.broker.maybe_drop_cohort(self.cohort)

    def _member(self) -> tuple[Cohort, str]:
        if self.cohort is None or self.member_id is None:
            raise UnknownMember("this connection has not joined a cohort")
        if self.conn.access.stale and self._joined is not None:
            # Credentials reloaded since the last check: a joined member's credit, acks and
            # heartbeats are all it sends to keep consuming, so they authenticate again
            # too (a revoked token or consume grant must not keep an open consumer fed).
            # A refusal closes the connection, which ends the membership (the session
            # stays stale and would refuse every later frame too, but the member must go).
            try:
                self.conn.access.require_cohort(*self._joined)
            except HeadraceError:
                self.conn.close_after_error()
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
        self.conn.access.require_cohort(join.topic, join.cohort)
        self.conn.access.verify_member(join.member_id, join.identity)
        cohort = self.conn.broker.cohort(join.topic, join.cohort)
        try:
            assignment = cohort.join(
                join.member_id,
                self.conn,
                start=join.start,
                session_timeout_ms=join.session_timeout_ms,
                isolation=isolation,
            )
        except HeadraceError:
            self.conn.broker.maybe_drop_cohort(cohort)
            raise
        self.cohort = cohort
        self.member_id = join.member_id
        self._joined = (join.topic, join.cohort)
        self.conn.respond(frame, Op.COHORT_JOIN_OK, assignment.encode())

    def on_identity(self, frame: Frame) -> None:
        request = msg.IdentityRequest.decode(frame.body)
        member_id, token = self.conn.access.issue_identity(request.hint)
        self.conn.respond(frame, Op.IDENTITY_OK, msg.IdentityOk(member_id, token).encode())

    def on_cohort_leave(self, frame: Frame) -> None:
        cohort, member = self._member()
        cohort.leave(member)
        self.conn.respond(frame, Op.COHORT_LEAVE_OK, b"{}")

    def on_cohort_heartbeat(self, frame: Frame) -> None:
        cohort, member = self._member()
        cohort.heartbeat(member)
        self.conn.respond(frame, Op.COHORT_HEARTBEAT_OK, b"{}")

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
        self.conn.respond(frame, Op.ACK_OK, msg.ACK_OK.pack(ack.partition, cursor - 1))

    def on_release(self, frame: Frame) -> None:
        cohort, member = self._member()
        release = msg.Release.decode(frame.body)
        cohort.release(member, release.partitions)
        self.conn.respond(frame, Op.RELEASE_OK, b"{}")

    def on_seek(self, frame: Frame) -> None:
        cohort, member = self._member()
        seek = msg.Seek.decode(frame.body)
        epoch = cohort.seek(member, seek.partition, seek.offset)
        self.conn.respond(
            frame, Op.SEEK_OK, msg.encode_json({"partition": seek.partition, "epoch": epoch})
        )
