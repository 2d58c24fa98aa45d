"""Cohort delivery on this broker: the adapter around ``cohorts.gates``.

One ``CohortRuntime`` per (topic, cohort). It owns the gates, the members'
connections and credits, and one pump task that sends each held partition's
committed batches to its gate holder. The pump reads raw batches from the log
and writes them as they are: no per-record work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from headrace import clock
from headrace.aio import cancel_and_wait
from headrace.broker.ports import MemberLink, TieredReads
from headrace.broker.topics import Partition, Role, Topic
from headrace.cohorts.gates import CohortGates, GateState
from headrace.errors import InvalidRequest, NotGateHolder, OffsetOutOfRange
from headrace.protocol.messages import Assignment, Isolation
from headrace.records import batch as rb
from headrace.storage.log import ReadPosition
from headrace.tiered.manifest import Manifest

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DeliveryPosition:
    """Where delivery of one partition stands in the current gate tenure."""

    epoch: int
    next_offset: int
    hint: ReadPosition | None = None
    #: a read from the object store in progress (offsets below the local log start)
    stored_read: asyncio.Task[bytes] | None = None


class CohortRuntime:
    def __init__(
        self,
        topic: Topic,
        name: str,
        *,
        grace_ms: int,
        chunk_bytes: int,
        tiering: TieredReads | None = None,
        hold: Callable[[int], int | None] | None = None,
        routed_anew_from: Callable[[int], int | None] | None = None,
        epoch_floor: int = 0,
    ) -> None:
        self.topic = topic
        #: partition -> the first offset this cohort may not be delivered yet (a
        #: repartition's per-key order hold, ``RepartitionHolds.delivery_hold``); None: no hold
        self.hold = hold or (lambda partition: None)
        #: partition -> where the post-cutover records of a partition a grow in flight
        #: routes to anew begin (``RepartitionHolds.routed_anew_from``); None: not such a partition
        self.routed_anew_from = routed_anew_from or (lambda partition: None)
        #: reads below a partition's local log start go to the object store through it
        self.tiering = tiering
        self.name = name
        self.gates = CohortGates(
            name, self._led_partitions(), grace_ms=grace_ms, epoch_floor=epoch_floor
        )
        self._links: dict[str, MemberLink] = {}
        self._credits: dict[str, int] = {}
        self._start: dict[str, str] = {}
        self._isolation: dict[str, Isolation] = {}
        self._positions: dict[int, DeliveryPosition] = {}
        self._sent_views: dict[str, tuple[dict[int, int], list[int]]] = {}
        self._chunk = chunk_bytes
        #: called with the bytes of each delivery (metrics)
        self.on_delivered: Callable[[int], None] | None = None
        #: called with (partition, records) when retention deleted records before this
        #: cohort was delivered them and delivery skips them (metrics)
        self.on_skipped: Callable[[int, int], None] | None = None
        #: orders every view sent to members (see Assignment.sequence)
        self._view_sequence = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delivered_records = 0
        self.delivered_bytes = 0
        self._listening: set[Partition] = set()
        self._listen()

    # ------------------------------------------------------------------ partitions led here

    def _led_partitions(self) -> list[int]:
        """Gates exist only where this broker leads: each owner enforces its own gates.

        Not while a move reopens the partition here: its cursors are not restored yet, so
        a gate opened now would start members from the wrong offset.
        """
        return sorted(
            p.index
            for p in self.topic.partitions.values()
            if p.role is Role.LEADER and (p.tiering is None or p.tiering.reopening is None)
        )

    def _listen(self) -> None:
        current = set(self.topic.partitions.values())
        for partition in current - self._listening:
            partition.add_listener(self._on_hw)
        for partition in self._listening - current:
            partition.remove_listener(self._on_hw)
        self._listening = current

    def set_plan(self, plan: dict[str, list[int]] | None) -> None:
        """The controller's advisory plan for this cohort (None: assign locally)."""
        self.gates.set_plan(plan, clock.monotonic_ms())
        self._publish()

    def refresh_partitions(self) -> None:
        """Leadership or the topic changed: gates follow the partitions led here now."""
        self._listen()
        self.gates.set_partitions(self._led_partitions(), clock.monotonic_ms())
        self._publish()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._pump(), name=f"cohort-{self.name}"
        )

    async def close(self) -> None:
        for pos in self._positions.values():
            if pos.stored_read is not None:
                pos.stored_read.cancel()
        for partition in self._listening:
            partition.remove_listener(self._on_hw)
        self._listening.clear()
        await cancel_and_wait(self._task)

    @property
    def empty(self) -> bool:
        return not self.gates.members

    # ------------------------------------------------------------------ membership

    def join(
        self,
        member_id: str,
        link: MemberLink,
        *,
        start: str,
        session_timeout_ms: int,
        isolation: Isolation,
    ) -> Assignment:
        if start not in ("earliest", "latest"):
            raise InvalidRequest(f"start must be 'earliest' or 'latest', got {start!r}")
        self.gates.join(member_id, clock.monotonic_ms(), session_timeout_ms)
        self._links[member_id] = link
        self._credits[member_id] = 0
        self._start[member_id] = start
        self._isolation[member_id] = isolation
        self._publish(skip=member_id)
        held, revoking = self.gates.view(member_id)
        self._sent_views[member_id] = (held, revoking)
        return self._assignment(held, revoking)

    def _assignment(self, held: dict[int, int], revoking: list[int]) -> Assignment:
        self._view_sequence += 1
        return Assignment(
            self.name,
            self.gates.generation,
            held,
            revoking,
            self.gates.grace_ms,
            self._view_sequence,
        )

    def heartbeat(self, member_id: str) -> None:
        self.gates.heartbeat(member_id, clock.monotonic_ms())

    def end_memberships(self) -> None:
        """The topic is gone: free every member's connection to join again (see ``_publish``)."""
        for member_id, link in list(self._links.items()):
            self._forget(member_id)
            link.membership_ended()

    def leave(self, member_id: str) -> None:
        self.gates.leave(member_id, clock.monotonic_ms())
        self._publish()

    def disconnect(self, member_id: str, link: MemberLink | None = None) -> None:
        """``link``'s connection closed. Ignored if a newer connection now holds the identity."""
        if link is not None and self._links.get(member_id) is not link:
            return
        self.gates.disconnect(member_id, clock.monotonic_ms())
        self._forget(member_id)
        self._publish()

    def release(self, member_id: str, partitions: list[int]) -> None:
        self.gates.release(member_id, partitions, clock.monotonic_ms())
        self._publish()

    def tick(self) -> None:
        for member_id in self.gates.tick(clock.monotonic_ms()):
            log.info("cohort %s: member %s timed out", self.name, member_id)
        self._publish()

    def _forget(self, member_id: str) -> None:
        self._links.pop(member_id, None)
        self._credits.pop(member_id, None)
        self._sent_views.pop(member_id, None)

    # ------------------------------------------------------------------ data path events

    def credit(self, member_id: str, amount: int) -> None:
        if member_id in self._credits:
            self._credits[member_id] += amount
            self._wake.set()

    def ack(self, member_id: str, partition: int, epoch: int, offset: int) -> int:
        """Cumulative ack of every offset <= ``offset``; returns the new cursor (next offset)."""
        self.gates.check_holder(member_id, partition, epoch)
        part = self.topic.partition(partition)
        pos = self._positions.get(partition)
        delivered_end = pos.next_offset if pos is not None and pos.epoch == epoch else None
        if delivered_end is None or offset >= delivered_end:
            raise InvalidRequest(
                f"ack of offset {offset} on partition {partition} beyond what was delivered"
            )
        current = part.cursors.get(self.name)
        if current is None or offset + 1 > current:
            part.cursors.set(self.name, offset + 1)
            return offset + 1
        return current

    def seek(self, member_id: str, partition: int, offset: int) -> int:
        """Restart delivery of a held partition at ``offset``; returns the new gate epoch."""
        gate = self.gates.gates.get(partition)
        if gate is None or gate.holder != member_id or gate.state is not GateState.HELD:
            raise NotGateHolder(f"member {member_id!r} does not hold partition {partition}")
        part = self.topic.partition(partition)
        earliest = self._earliest(part)
        if not earliest <= offset <= part.log.next_offset:
            raise OffsetOutOfRange(
                f"offset {offset} outside [{earliest}, {part.log.next_offset}] of {part.name}"
            )
        gate.epoch += 1
        part.cursors.set(self.name, offset)
        self._positions[partition] = DeliveryPosition(gate.epoch, offset)
        self._sent_views.pop(member_id, None)
        self._publish()
        return gate.epoch

    def _earliest(self, part: Partition) -> int:
        """The lowest offset deliverable: the object store's, when it holds older records."""
        return part.log.log_start_offset if self.tiering is None else self.tiering.earliest(part)

    def in_flight(self, partition: int) -> bool:
        """Records of ``partition`` were delivered and not yet acked."""
        pos = self._positions.get(partition)
        part = self.topic.partitions.get(partition)
        gate = self.gates.gates.get(partition)
        if pos is None or part is None or gate is None or gate.state is GateState.FREE:
            return False  # nobody holds it: nobody will ack
        if gate.epoch != pos.epoch:
            return False
        cursor = part.cursors.get(self.name)
        return cursor is not None and pos.next_offset > cursor

    def _stored_read_done(self, task: asyncio.Task[bytes]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here; the pump reports it if the read still matters
        self._wake.set()

    def _next_held_offset(self, part: Partition, offset: int) -> int:
        """The first offset above ``offset`` that the object store or the disk holds."""
        local = part.log.log_start_offset
        if part.tiering is None:
            return local
        manifest: Manifest = part.tiering.tier.manifest()  # cached: no I/O
        bases = (max(s.base, manifest.retained_from) for s in manifest.segments)
        return min([*(b for b in bases if b > offset), local])

    def _on_hw(self, partition: Partition) -> None:
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ publishing

    def _publish(self, skip: str | None = None) -> None:
        """Push changed views to members and set delivery positions for new tenures."""
        for member_id in [m for m in self._links if m not in self.gates.members]:
            # Gone from the gates (leave finished, session expired): free the connection's
            # identity so the same connection may join again.
            link = self._links[member_id]
            self._forget(member_id)
            link.membership_ended()
        for gate in self.gates.gates.values():
            if gate.state is GateState.HELD and gate.holder is not None:
                pos = self._positions.get(gate.partition)
                if pos is None or pos.epoch != gate.epoch:
                    self._positions[gate.partition] = DeliveryPosition(
                        gate.epoch, self._start_offset(gate.partition, gate.holder)
                    )
        for member_id, link in list(self._links.items()):
            if member_id == skip:
                continue
            view = self.gates.view(member_id)
            if self._sent_views.get(member_id) != view:
                self._sent_views[member_id] = view
                held, revoking = view
                link.push_assignment(self._assignment(held, revoking))
        self._wake.set()

    def _start_offset(self, partition: int, member_id: str) -> int:
        part = self.topic.partition(partition)
        cursor = part.cursors.get(self.name)
        earliest = self._earliest(part)
        if cursor is not None and cursor >= earliest:
            return min(cursor, part.log.next_offset)
        # A partition a grow in flight routes to anew holds from its cutover on only records
        # newer than the cohort's start: a "latest" member must not skip them.
        anew = self.routed_anew_from(partition)
        if self._start.get(member_id) == "earliest":
            start = earliest
        elif anew is not None:
            start = max(earliest, min(anew, part.high_watermark))
        else:
            start = part.high_watermark
        part.cursors.set(self.name, start)
        return start

    # ------------------------------------------------------------------ the pump

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                while self._deliver_round():
                    # Let produce requests and acks in between rounds.
                    await asyncio.sleep(0)
            except Exception:
                # Delivery must not stop silently: log, pause, and try again.
                log.exception("cohort %s delivery round failed; retrying", self.name)
                await asyncio.sleep(0.5)
                self._wake.set()

    def _deliver_round(self) -> bool:
        progressed = False
        for member_id, link in list(self._links.items()):
            credit = self._credits.get(member_id, 0)
            if credit <= 0 or not link.writable:
                continue
            committed = self._isolation.get(member_id, Isolation.COMMITTED) is Isolation.COMMITTED
            for gate in self.gates.deliverable(member_id):
                if credit <= 0 or not link.writable:
                    break
                pos = self._positions.get(gate.partition)
                if pos is None or pos.epoch != gate.epoch:
                    continue
                part = self.topic.partitions.get(gate.partition)
                if part is None or part.moving:
                    continue  # a sealing partition delivers nothing more (acks still count)
                bound = part.high_watermark if committed else part.log.next_offset
                held_from = self.hold(gate.partition)
                if held_from is not None:
                    # A cutover offset is a batch boundary (the fence moves between appends).
                    bound = min(bound, held_from)
                    if pos.next_offset >= bound:
                        continue
                if pos.next_offset < part.log.log_start_offset and part.tiering is not None:
                    sent = self._deliver_stored(
                        member_id, link, gate.epoch, part, pos, credit, held_from
                    )
                    credit -= sent
                    progressed = progressed or sent > 0
                    continue
                if pos.next_offset < part.log.log_start_offset:
                    # Retention deleted what this cohort had not read: skip to what exists,
                    # where a fresh member would start.
                    self._skip(part, pos, part.log.log_start_offset, "retention")
                if pos.next_offset >= bound:
                    continue
                data, hint = part.log.read(
                    pos.next_offset, min(self._chunk, credit), bound, pos.hint
                )
                if not data or hint is None:
                    continue
                link.push_delivery(
                    gate.partition, gate.epoch, part.high_watermark, pos.next_offset, data
                )
                delivered = hint.offset - pos.next_offset
                self.delivered_records += delivered
                self.delivered_bytes += len(data)
                if self.on_delivered is not None:
                    self.on_delivered(len(data))
                pos.next_offset = hint.offset
                pos.hint = hint
                credit -= len(data)
                progressed = True
            self._credits[member_id] = credit
        return progressed

    def _skip(self, part: Partition, pos: DeliveryPosition, to: int, why: str) -> None:
        """Move delivery past records that no longer exist anywhere, counting them."""
        skipped = to - pos.next_offset
        log.warning(
            "cohort %s skips %d records of %s, from %d to %d: %s",
            self.name,
            skipped,
            part.name,
            pos.next_offset,
            to,
            why,
        )
        if self.on_skipped is not None and skipped > 0:
            self.on_skipped(part.index, skipped)
        pos.next_offset = to
        pos.hint = None

    def _deliver_stored(
        self,
        member_id: str,
        link: MemberLink,
        epoch: int,
        part: Partition,
        pos: DeliveryPosition,
        credit: int,
        held_from: int | None = None,
    ) -> int:
        """Deliver from the object store what the local log no longer holds; returns the
        bytes sent. The read runs in a thread; the round after it completes sends it.
        Batches at or beyond ``held_from`` are not sent (read again once released)."""
        task = pos.stored_read
        if task is None:
            assert self.tiering is not None
            pos.stored_read = asyncio.get_running_loop().create_task(
                self.tiering.read(part, pos.next_offset, min(self._chunk, credit))
            )
            pos.stored_read.add_done_callback(self._stored_read_done)
            return 0
        if not task.done():
            return 0
        pos.stored_read = None
        error = task.exception() if not task.cancelled() else None
        if isinstance(error, OffsetOutOfRange):
            # Neither the object store nor the disk holds these offsets any more: skip to
            # what exists, as for local retention.
            self._skip(part, pos, self._next_held_offset(part, pos.next_offset), str(error))
            self._wake.set()
            return 0
        if task.cancelled() or error is not None:
            log.error(
                "cohort %s cannot read %s at %d from the object store: %s",
                self.name,
                part.name,
                pos.next_offset,
                error,
            )
            # Retry later (the store may be back); corrupt objects are logged each time.
            asyncio.get_running_loop().call_later(1.0, self._wake.set)
            return 0
        data = task.result()
        if not data:
            return 0
        next_offset = pos.next_offset
        cut = len(data)
        for at, header in rb.scan(data):
            if held_from is not None and header.next_offset > held_from:
                cut = at
                break
            next_offset = header.next_offset
        data = data[:cut]
        if not data:
            return 0
        link.push_delivery(part.index, epoch, part.high_watermark, pos.next_offset, data)
        self.delivered_records += next_offset - pos.next_offset
        self.delivered_bytes += len(data)
        if self.on_delivered is not None:
            self.on_delivered(len(data))
        pos.next_offset = next_offset
        pos.hint = None
        return len(data)
