"""Moves on a broker: sealing a tiered partition for an unload, and reopening it after one.

**Sealing** (an Unload, Danube's model): the leader keeps accepting writes
while it uploads everything committed, then fences appends, lets cohort
members ack what is in flight, uploads the rest of its log, and writes the
sealed state ``{last_committed_offset, broker, epoch, moves, cursors,
producers}`` to the object store. The heartbeat reports it; the controller
reassigns the partition, and every replica of the new assignment
**reopens** it empty at ``last_committed_offset + 1`` with the producer
dedup state and the cursors from the sealed state. Appends that were waiting
for replication when the partition was fenced are acknowledged once the sealed
state is written: they are in the object store.

Which task runs, which is cancelled, and the seal stage are decided by a pure
table (``tiered.sealing``); ``TierMoves._execute`` feeds it an event with the
evidence it holds (is the last task still running, is the partition still led
here) and performs the effects it returns. The tasks themselves (the uploads,
the object-store writes, the log reset) are here, and retry until they succeed
or are no longer wanted: a seal or reopen that gave up would leave its
partition refusing appends for good.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from headrace import clock
from headrace.broker.ports import PartitionReopened, Publish, TieringHost
from headrace.broker.tier_state import (
    PartitionTiering,
    ReportChanged,
    spawn,
    state_of,
    still,
)
from headrace.broker.tier_upload import CURSORS_NAME, Uploader
from headrace.broker.topics import Partition, write_placement
from headrace.errors import HeadraceError, StorageError
from headrace.objectstore.errors import ObjectNotFound
from headrace.objectstore.interface import ObjectStore
from headrace.protocol.coordination import SealReport
from headrace.tiered import sealing
from headrace.tiered.manifest import Manifest, SealedState
from headrace.tiered.sealing import Effect, SealStage

log = logging.getLogger(__name__)

#: while sealing, keep uploading with appends open until less than this is pending
SEAL_FENCE_BYTES = 4 * 1024 * 1024


class TierMoves:
    """Seals and reopens this broker's tiered partitions, as the controller asks."""

    def __init__(
        self,
        broker: TieringHost,
        store: ObjectStore | None,
        attach: Callable[[Partition], PartitionTiering | None],
        uploader: Uploader,
        publish: Publish,
        report_changed: ReportChanged,
    ) -> None:
        self.broker = broker
        self.store = store
        #: gives a tiered partition its state (``tier_state.TierStates.attach``)
        self.attach = attach
        #: a seal uploads through the uploader's steps, with the uploader's loop held off
        self.uploader = uploader
        #: where finished reopens are reported (the broker then applies the partition's role)
        self.publish = publish
        self.report_changed = report_changed
        self.metrics = broker.metrics

    # ------------------------------------------------------------------ the executor

    def _execute(
        self, p: Partition, state: PartitionTiering, event: sealing.Event, *, first_epoch: int = -1
    ) -> None:
        """Take the table's next state for ``event``, then perform its effects in order.

        ``first_epoch``: the first leader epoch of the incarnation a reopen opens.
        """
        result = sealing.step(state.sealing, event)
        state.sealing = result.state
        for effect in result.effects:
            if effect is Effect.CANCEL_SEAL:
                if state.seal_task is not None:
                    state.seal_task.cancel()
            elif effect is Effect.START_SEAL:
                state.seal_task = spawn(p, state, self._seal(p, state), self.report_changed)
            elif effect is Effect.CANCEL_REOPEN:
                if state.reopen_task is not None:
                    state.reopen_task.cancel()
            elif effect is Effect.START_REOPEN:
                target = state.sealing.reopening
                assert target is not None  # the row that starts a reopen sets it
                moves, start_offset = target
                reopen = self._reopen(p, state, moves, start_offset, first_epoch)
                state.reopen_task = spawn(p, state, reopen, self.report_changed)
            elif effect is Effect.WAKE_COHORTS:
                for runtime in self.broker.cohorts_of(p.topic.name):
                    runtime.wake()

    # ------------------------------------------------------------------ sealing

    def seal(self, p: Partition, *, took_over: bool = False) -> None:
        """The controller asked this leader to seal ``p`` (idempotent for one epoch).

        ``took_over``: this broker became leader with the seal already asked for; the old
        leader may have stored records this one lacks, so it accepts no appends at all.
        """
        state = self.attach(p)
        if state is None:
            log.error("%s: asked to seal, but it is not tiered on this broker", p.name)
            return
        running = _running(state.seal_task)
        self._execute(p, state, sealing.SealAsked(p.leader_epoch, took_over, running))

    def unseal(self, p: Partition) -> None:
        """The seal request was withdrawn before a reassignment: accept appends again."""
        state = state_of(p)
        if state is None:
            return
        self._execute(p, state, sealing.SealWithdrawn())

    async def _seal(self, p: Partition, state: PartitionTiering) -> None:
        epoch, moves = p.leader_epoch, p.moves
        await _retry(
            f"sealing {p.name}",
            lambda: self._seal_once(p, state, epoch, moves),
            lambda: still(p, epoch, state),
        )
        # Leadership moved on before the seal was written: it is void (a new leader, or
        # this broker at a new epoch, seals again if the controller still asks).
        self._execute(p, state, sealing.SealEnded(epoch, still(p, epoch, state)))

    async def _seal_once(
        self, p: Partition, state: PartitionTiering, epoch: int, moves: int
    ) -> None:
        started = time.monotonic()
        if state.checkpoint_epoch != epoch:
            await self.uploader.load_checkpoint(p, state)
        if state.upload_task is not None and not state.upload_task.done():
            await asyncio.wait([state.upload_task])
        if state.sealing.stage is SealStage.DRAINING:
            # Appends still flow: upload the bulk now so the fenced part stays short.
            while still(p, epoch, state):
                if await self.uploader.upload_until(p, state, p.high_watermark) < SEAL_FENCE_BYTES:
                    break
            if not still(p, epoch, state):
                return
            # Fenced: produce is refused and the cohort pump stops delivering the partition;
            # its gates stay, so acks of what was delivered still count.
            self._execute(p, state, sealing.Drained())
            fenced = time.monotonic()
            await self._wait_for_acks(p)
        else:
            fenced = time.monotonic()
        # Everything this leader holds, committed or not, goes to the object store: the
        # records above the HW were accepted under acks=leader or are waiting for acks=all.
        end = p.log.next_offset
        await self.uploader.upload_until(p, state, end)
        if not still(p, epoch, state):
            return
        manifest = await asyncio.to_thread(state.tier.manifest, refresh=True)
        last = max(end - 1, manifest.checkpoint)
        verified, message = _verify(manifest, last, end)
        if not verified:
            # Never hand over while the store lacks records this log holds (a manifest
            # entry lost to a race, say): upload from the stored checkpoint again and retry.
            state.uploaded_through = min(state.uploaded_through, manifest.checkpoint)
            raise StorageError(f"{p.name}: sealed state not written: {message}")
        self.uploader.note_manifest(p, state, manifest)
        sealed = SealedState(
            last_committed_offset=last,
            broker=self.broker.settings.broker_id,
            epoch=epoch,
            time_ms=clock.wall_ms(),
            moves=moves + 1,  # the incarnation it hands over to
            cursors=p.cursors.all(),
            producers=p.log.producers.snapshot(),
            verified=verified,
            message=message,
        )
        await asyncio.to_thread(state.tier.write_sealed, sealed)
        if not still(p, epoch, state):
            return
        report = SealReport(last, epoch, moves, verified, message)
        self._execute(p, state, sealing.SealWritten(report))
        self.metrics.seals.inc()
        # Waiting acks=all produces are answered: their records are in the object store.
        p.raise_high_watermark(end)
        log.info(
            "sealed %s at %d (epoch %d, moves %d, cursors %s): %.0f ms in all, %.0f ms fenced%s",
            p.name,
            last,
            epoch,
            moves,
            sealed.cursors,
            (time.monotonic() - started) * 1000,
            (time.monotonic() - fenced) * 1000,
            "" if verified else f"; verification failed: {message}",
        )

    async def _wait_for_acks(self, p: Partition) -> None:
        """Give cohort members a moment to ack what was delivered, so the cursors the
        sealed state carries are current (bounded: acks after it may be redelivered)."""
        deadline = time.monotonic() + self.broker.settings.seal_ack_wait_ms / 1000
        while time.monotonic() < deadline:
            if not any(r.in_flight(p.index) for r in self.broker.cohorts_of(p.topic.name)):
                return
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------ reopening

    def reopen(self, p: Partition, moves: int, start_offset: int | None, epoch: int) -> bool:
        """Start incarnation ``moves`` of ``p`` empty at ``start_offset`` (None: derive it
        from the object store), whose first leader epoch is ``epoch``. Appends and reads
        wait until it is done. False: done already (no object store on this broker), so
        the caller applies the assignment now."""
        state = self.attach(p)
        if state is None:
            # No object store here: nothing to restore from. Start the incarnation empty
            # so the broker still takes its role (its cursors and dedup state are lost).
            start = p.log.next_offset if start_offset is None else start_offset
            log.error(
                "%s: moved, but this broker has no object store; reopening bare at %d",
                p.name,
                start,
            )
            p.log.reset_to(start)
            write_placement(p.log.directory, moves, start, epoch)
            p.moves, p.start_offset, p.first_epoch = moves, start, epoch
            p.high_watermark = p.leader_high_watermark = start
            return False
        asked = sealing.ReopenAsked((moves, start_offset), _running(state.reopen_task))
        self._execute(p, state, asked, first_epoch=epoch)
        return True

    async def _reopen(
        self,
        p: Partition,
        state: PartitionTiering,
        moves: int,
        start_offset: int | None,
        epoch: int,
    ) -> None:
        await _retry(
            f"reopening {p.name}",
            lambda: self._reopen_once(p, state, moves, start_offset, epoch),
            lambda: state.sealing.reopening == (moves, start_offset) and p.tiering is state,
        )

    async def _reopen_once(
        self,
        p: Partition,
        state: PartitionTiering,
        moves: int,
        start_offset: int | None,
        epoch: int,
    ) -> None:
        sealed, manifest, cursors = await asyncio.to_thread(self._read_move_state, state, moves)
        if state.sealing.reopening != (moves, start_offset) or p.tiering is not state:
            return
        if start_offset is None:
            # The recovery path: the old owner died without a sealed state for this move
            # (or wrote one for a seal that was then withdrawn): start after what is stored.
            start = manifest.checkpoint + 1
            if sealed is not None and sealed.last_committed_offset + 1 >= start:
                start = sealed.last_committed_offset + 1
            else:
                sealed = None
        else:
            start = start_offset
            if sealed is not None and sealed.last_committed_offset + 1 != start:
                log.error(
                    "%s: sealed state ends at %d but the move starts at %d",
                    p.name,
                    sealed.last_committed_offset,
                    start,
                )
        p.log.reset_to(start)
        if sealed is not None:
            p.log.producers.restore(sealed.producers)
            restored = sealed.cursors
        else:
            restored = cursors
        for cohort, cursor in restored.items():
            # A cursor copied after acks of records not stored points past the start.
            p.cursors.set(cohort, min(cursor, start))
        p.log.write_checkpoint(p.log.sync_target())
        snapshot = p.cursors.snapshot_for_flush()
        if snapshot is not None:
            p.cursors.write(snapshot)  # on disk before the placement says the move is done
        write_placement(p.log.directory, moves, start, epoch)
        p.moves, p.start_offset, p.first_epoch = moves, start, epoch
        p.high_watermark = start
        p.leader_high_watermark = start
        state.uploaded_through = start - 1
        state.stored_start = manifest.start_offset
        state.checkpoint_epoch = -1
        self._execute(p, state, sealing.Reopened((moves, start_offset)))
        self.metrics.reopens.inc()
        log.info(
            "reopened %s at %d (moves %d, cursors %s, %s)",
            p.name,
            start,
            moves,
            restored,
            "from the sealed state" if sealed else "from the manifest: no sealed state",
        )
        self.publish(PartitionReopened(p))

    def _read_move_state(
        self, state: PartitionTiering, moves: int
    ) -> tuple[SealedState | None, Manifest, dict[str, int]]:
        """Blocking: the sealed state handing over to incarnation ``moves`` (if written),
        the manifest, and the uploader's copy of the cursors."""
        sealed = state.tier.read_sealed()
        if sealed is not None and sealed.moves != moves:
            sealed = None  # left over from an earlier move
        manifest = state.tier.manifest(refresh=True)
        cursors: dict[str, int] = {}
        if sealed is None and self.store is not None:
            try:
                raw = json.loads(self.store.get(state.tier.prefix + CURSORS_NAME))
                cursors = {str(k): int(v) for k, v in dict(raw["cursors"]).items()}
            except ObjectNotFound:
                pass
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable cursor copy: %s", exc)
        return sealed, manifest, cursors


def _running(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()


def _verify(manifest: Manifest, last: int, end: int) -> tuple[bool, str]:
    """The sealed partition's stored segments must run without a gap to ``last``."""
    gaps = manifest.gaps()
    if gaps:
        return False, f"the manifest has gaps {gaps}"
    if manifest.checkpoint != last:
        return False, f"stored segments end at {manifest.checkpoint}, sealed at {last}"
    if end > 0 and manifest.start_offset is None:
        return False, "no segment is stored"
    return True, ""


async def _retry(
    what: str, attempt: Callable[[], Awaitable[None]], wanted: Callable[[], bool]
) -> bool:
    """Run ``attempt`` until it succeeds (True) or is no longer ``wanted`` (False). Any
    error is logged and retried with backoff: a seal or reopen that gave up would leave
    its partition refusing appends for good."""
    backoff = 0.1
    while wanted():
        try:
            await attempt()
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not wanted():
                break
            expected = isinstance(exc, HeadraceError | OSError)
            log.warning("%s failed, retrying: %s", what, exc, exc_info=not expected)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
    return False
