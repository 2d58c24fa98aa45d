"""The uploader: a broker's committed records into the object store, and the tier's retention.

Every tiered partition this broker leads uploads its committed records to the
object store (``headrace.tiered``): rolled segments at once, the active
segment's tail every ``upload_interval_ms`` or once ``tier_upload_threshold_bytes``
are pending. The manifest's checkpoint (the last offset stored contiguously) is
the *upload floor*: local retention deletes only segments wholly below it, on
the leader and on followers alike, so every offset is always on some disk or
in the object store. A new leader reads the checkpoint from the manifest and
continues after it: nothing is uploaded twice, nothing is skipped.

The uploader is also the only writer of the manifest's start: the topic's
retention over its whole log trims the manifest (a conditional write fenced at
the leader's epoch) and deletes the removed objects after a grace period.

A seal drives the same upload steps itself (``tier_moves``): while a partition
seals or reopens, the uploader's own loop leaves it alone.

Object-store calls block; they run in worker threads. Each step re-checks on
the loop that the partition still has the role and incarnation it started
with (``tier_state.still``), so a leadership change mid-upload discards the
result instead of applying it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable

from headrace import clock
from headrace.aio import cancel_and_wait
from headrace.broker.ports import TieringHost
from headrace.broker.tier_state import (
    PartitionTiering,
    ReportChanged,
    spawn,
    state_of,
    still,
)
from headrace.broker.topics import Partition, Role
from headrace.errors import HeadraceError, StorageError
from headrace.objectstore.interface import ObjectStore
from headrace.records import batch as rb
from headrace.tiered.manifest import Manifest
from headrace.tiered.retention import Bounds, retained_start

log = logging.getLogger(__name__)

#: a copy of the cursors next to the manifest, refreshed by the uploader: what an RF=1
#: partition's new owner restores when its old owner died without a sealed state
CURSORS_NAME = "cursors.json"
TICK_S = 0.1
#: how often the uploader looks at every partition, not only those that may have work
#: (a placement makes it look at once); seconds
SWEEP_S = 30.0


class Uploader:
    """Uploads every tiered partition this broker leads, and applies the tier's retention."""

    def __init__(
        self,
        broker: TieringHost,
        store: ObjectStore | None,
        attach: Callable[[Partition], PartitionTiering | None],
        report_changed: ReportChanged,
    ) -> None:
        self.broker = broker
        self.store = store
        #: gives a tiered partition its state (``tier_state.TierStates.attach``)
        self.attach = attach
        self.report_changed = report_changed
        self.metrics = broker.metrics
        self._task: asyncio.Task[None] | None = None
        #: partitions the next tick looks at (the rest are idle: nothing to upload)
        self._watch: set[Partition] = set()
        self._sweep_at = 0.0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tiering")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def mark_all(self) -> None:
        """Roles or partitions changed: the next tick looks at every partition."""
        self._sweep_at = 0.0

    def unlisten(self, partition: Partition, state: PartitionTiering) -> None:
        """The partition's tier state is going away: stop watching it."""
        if state.listened:
            partition.remove_listener(self._note)
            partition.remove_cursor_listener(self._note)
        self._watch.discard(partition)

    def _note(self, partition: Partition) -> None:
        self._watch.add(partition)

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self._tick()
            except Exception:
                log.exception("tiering tick failed")

    def _tick(self) -> None:
        if self.broker.awaiting_topology:
            # Roles are unknown until the controller's first push: a copy of an older
            # incarnation must not upload its leftovers as if it still led.
            return
        now = clock.monotonic_ms()
        # Only partitions that may have work: marked since (their HW or cursors moved), or
        # kept from the last tick (work pending); every partition on a sweep. An idle
        # partition costs nothing here between sweeps.
        look: Iterable[Partition]
        marked, self._watch = self._watch, set()
        if time.monotonic() >= self._sweep_at:
            self._sweep_at = time.monotonic() + SWEEP_S
            look = self.broker.registry.all_partitions()
        else:
            look = marked
        keep = self._watch
        for p in look:
            state = self.attach(p)
            if state is None:
                continue
            if not state.listened:
                p.add_listener(self._note)
                p.add_cursor_listener(self._note)
                state.listened = True
            if p.role is not Role.LEADER or state.sealing.reopening is not None:
                continue
            keep.add(p)
            if state.sealing.stage is not None:
                continue  # the seal task uploads for itself
            if state.upload_task is not None and not state.upload_task.done():
                continue
            if state.errors and now - state.last_upload_ms < min(500 << state.errors, 10_000):
                continue  # the store failed: back off instead of retrying every tick
            if state.checkpoint_epoch != p.leader_epoch or self._upload_due(p, state, now):
                state.upload_task = spawn(
                    p, state, self._upload_round(p, state, p.high_watermark), self.report_changed
                )
            elif (
                not state.errors
                and state.uploaded_through + 1 >= p.high_watermark
                and p.cursors.version == state.cursors_uploaded_version
            ):
                keep.discard(p)  # nothing to upload: idle until its HW or cursors move

    def _upload_due(self, p: Partition, state: PartitionTiering, now: int) -> bool:
        if p.cursors.version != state.cursors_uploaded_version and (
            now - state.last_upload_ms >= min(state.config.upload_interval_ms, 5_000)
        ):
            return True
        next_offset = state.uploaded_through + 1
        if next_offset >= p.high_watermark:
            return False
        active = p.log.active
        if active.base_offset > next_offset:
            return True  # rolled segments are waiting: upload them now
        base, size = state.last_upload_mark
        pending = active.size - (size if base == active.base_offset else 0)
        if pending >= self.broker.settings.tier_upload_threshold_bytes:
            return True
        return now - state.last_upload_ms >= state.config.upload_interval_ms

    # ------------------------------------------------------------------ the checkpoint

    async def load_checkpoint(self, p: Partition, state: PartitionTiering) -> None:
        """A new leadership starts from the stored checkpoint as it is, not from what this
        broker uploaded in an earlier term: an entry lost from the manifest is uploaded again."""
        epoch = p.leader_epoch
        manifest = await asyncio.to_thread(state.tier.manifest, refresh=True)
        if p.leader_epoch == epoch and p.tiering is state:
            state.uploaded_through = self._checkpoint(p, manifest)
            state.stored_start = manifest.start_offset
            state.checkpoint_epoch = epoch
            if state.uploaded_through >= p.log.next_offset:
                await self._restore_tail(p, state, epoch)

    async def _restore_tail(self, p: Partition, state: PartitionTiering, epoch: int) -> None:
        """The store holds records past this leader's log end (a crash lost a tail that was
        uploaded but not yet synced, or an earlier leader stored what this one never got):
        copy them back before appending anything, so their offsets are not reused."""
        target = state.uploaded_through + 1
        log.warning(
            "%s: log ends at %d but the object store holds up to %d; restoring from it",
            p.name,
            p.log.next_offset,
            target - 1,
        )
        while p.log.next_offset < target and still(p, epoch, state):
            end = p.log.next_offset
            data = await asyncio.to_thread(state.tier.read, end, 8 * 1024 * 1024)
            if not still(p, epoch, state) or p.log.next_offset != end:
                return
            # The object's first batch may start below ``end`` (its batch boundaries are
            # the old leader's); keep whole batches from ``end`` on only.
            keep = [pos for pos, h in rb.scan(data) if h.base_offset >= end]
            if not keep:
                raise StorageError(f"{p.name}: no batch boundary at {end} in the object store")
            p.log.append_stamped(data[keep[0] :])
            self.broker.committer.appended(p)
            p.appended()

    def note_manifest(self, p: Partition, state: PartitionTiering, manifest: Manifest) -> None:
        state.uploaded_through = max(state.uploaded_through, self._checkpoint(p, manifest))
        state.stored_start = manifest.start_offset

    @staticmethod
    def _checkpoint(p: Partition, manifest: Manifest) -> int:
        """The stored checkpoint, counting above this incarnation's start only objects its
        own leaders wrote: an old owner cut off from the controller may still upload."""
        if p.moves == 0 or p.first_epoch < 0:
            return manifest.checkpoint
        kept = tuple(
            s for s in manifest.segments if s.last < p.start_offset or s.epoch >= p.first_epoch
        )
        return Manifest(kept, manifest.epoch, manifest.version, manifest.retained_from).checkpoint

    # ------------------------------------------------------------------ uploads

    async def _upload_round(self, p: Partition, state: PartitionTiering, end: int) -> None:
        """Upload committed records below ``end`` (and the cursors if they moved)."""
        try:
            if state.checkpoint_epoch != p.leader_epoch:
                await self.load_checkpoint(p, state)
            await self.upload_until(p, state, end)
            await self._upload_cursors(p, state)
            state.last_upload_ms = clock.monotonic_ms()
            state.errors = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            state.errors += 1
            state.last_error = f"{type(exc).__name__}: {exc}"[:1000]
            self.metrics.tier_upload_errors.inc()
            state.last_upload_ms = clock.monotonic_ms()  # back off, not retry every tick
            expected = isinstance(exc, HeadraceError | OSError)
            log.warning(
                "upload of %s failed (%d in a row): %s",
                p.name,
                state.errors,
                exc,
                exc_info=not expected,
            )

    async def upload_until(self, p: Partition, state: PartitionTiering, end: int) -> int:
        """Upload [checkpoint + 1, end) in objects of whole batches; returns the bytes sent."""
        sent = 0
        epoch = p.leader_epoch
        max_bytes = self.broker.settings.tier_object_max_bytes
        while state.uploaded_through + 1 < min(end, p.log.next_offset):
            start = state.uploaded_through + 1
            if start < p.log.log_start_offset:
                if state.stored_start is not None:
                    raise StorageError(
                        f"{p.name}: offsets {start}..{p.log.log_start_offset - 1} are neither"
                        " stored nor on this broker's disk"
                    )
                # Nothing stored yet (tiering turned on for an existing log): the stored
                # history starts where the local one does.
                log.warning(
                    "%s: first upload starts at the log start %d", p.name, p.log.log_start_offset
                )
                state.uploaded_through = p.log.log_start_offset - 1
                continue
            truncations = p.log.truncations
            active = p.log.active
            mark = (active.base_offset, active.size)
            read, _ = await asyncio.to_thread(p.log.read, start, max_bytes, end)
            if not still(p, epoch, state) or p.log.truncations != truncations:
                return sent  # leadership or the log changed under the read: drop it
            # the thread may have seen a batch appended meanwhile (a view cut short of
            # the read becomes bytes here, the copy its slicing used to make)
            data = _below(read if isinstance(read, bytes) else bytes(read), end)
            if not data:
                break
            first = rb.read_header(data)
            if not first.base_offset <= start < first.next_offset:
                raise StorageError(f"{p.name}: read at {start} returned offset {first.base_offset}")
            obj = await asyncio.to_thread(state.tier.upload, data, epoch)
            if not still(p, epoch, state):
                return sent
            state.uploaded_through = max(state.uploaded_through, obj.last)
            if state.stored_start is None:
                state.stored_start = obj.base
            state.last_upload_mark = mark
            sent += len(data)
            self.metrics.tier_uploaded_bytes.inc(len(data))
            self.metrics.tier_uploaded_objects.inc()
        return sent

    async def _upload_cursors(self, p: Partition, state: PartitionTiering) -> None:
        version = p.cursors.version
        if version == state.cursors_uploaded_version or self.store is None:
            return
        if version == 0 and not p.cursors.all():
            # No cursor was ever set on this copy: nothing for a reopen to restore. An empty
            # copy was an object write (with fsyncs, in a directory store) per new leader,
            # 10,000 of them after creating 10,000 partitions. An older copy
            # in the store stays as it is: a cursor behind means redelivery, never loss.
            state.cursors_uploaded_version = version
            return
        if not still(p, p.leader_epoch, state) or state.checkpoint_epoch != p.leader_epoch:
            return  # a deposed leader must not overwrite the new one's copy
        body = json.dumps({"cursors": p.cursors.all(), "epoch": p.leader_epoch}).encode()
        key = state.tier.prefix + CURSORS_NAME
        await asyncio.to_thread(self.store.put, key, body)
        state.cursors_uploaded_version = version

    # ------------------------------------------------------------------ retention floor

    async def refresh_floor(self, p: Partition) -> int | None:
        """The upload floor for retention, checked against the stored manifest; None: the
        partition is not tiered here, so retention has no floor.

        Only a manifest written at this replica's leader epoch or later counts: until the
        current leader has confirmed the stored checkpoint, local segments stay (a
        conservative rule: the uploaders' conditional writes never drop an entry).
        """
        state = self.attach(p)
        if state is None:
            return None
        epoch = p.leader_epoch
        try:
            manifest = await asyncio.to_thread(state.tier.manifest, refresh=True)
        except HeadraceError as exc:  # unreachable store, or a manifest that does not parse
            log.warning("no usable manifest for %s (keeping its segments): %s", p.name, exc)
            return 0
        self.note_manifest(p, state, manifest)
        if manifest.epoch < epoch:
            return 0  # not yet confirmed by this epoch's leader: keep everything
        return min(state.upload_floor, manifest.checkpoint + 1)

    # ------------------------------------------------------------------ retention in the tier

    async def apply_retention(self, p: Partition) -> bool:
        """The topic's retention over its whole log, on the leader: raise the manifest's
        start past the objects it no longer keeps (a conditional write fenced at this
        leader's epoch), and delete removed objects once ``tier_delete_grace_ms`` has
        passed (readers holding the old manifest read them until then). Returns whether
        the stored start moved.

        Deleting what an earlier trim removed does not need the leadership: the trim is
        in the manifest already, and only objects it still does not list go. A broker
        that dies before then leaves them as orphans for the sweep (``tiered.orphans``).
        """
        state = state_of(p)
        if state is None or self.store is None:
            return False
        moved = False
        epoch = p.leader_epoch
        if still(p, epoch, state) and state.checkpoint_epoch == epoch and not state.sealing.busy:
            moved = await self._trim(p, state, epoch)
        await self._delete_doomed(p, state)
        return moved

    async def _trim(self, p: Partition, state: PartitionTiering, epoch: int) -> bool:
        config = self.broker.registry.whole_log_config_of(p.topic.config)
        bounds = Bounds(config.retention_ms, config.retention_bytes)
        now = clock.wall_ms()
        cached = state.tier.manifest()  # kept current by the uploader: no I/O when idle
        # local bytes not stored yet count towards retention_bytes too: the segments wholly
        # above the checkpoint (an undercount by at most one segment: retention keeps more,
        # never less, than the bound)
        unstored = sum(s.stats.size for s in p.log.segments if s.base_offset > cached.checkpoint)
        if retained_start(cached, bounds, now, unstored) is None:
            return False
        removed = await asyncio.to_thread(
            state.tier.trim, lambda stored: retained_start(stored, bounds, now, unstored), epoch
        )
        if not removed:
            return False
        grace = self.broker.settings.tier_delete_grace_ms
        state.doomed.append((clock.monotonic_ms() + grace, removed))
        manifest = state.tier.manifest()
        state.stored_start = manifest.start_offset
        log.info(
            "%s: retention moved the stored log start to %d (%d objects removed, deleted"
            " after %d ms)",
            p.name,
            manifest.retained_from,
            len(removed),
            grace,
        )
        return True

    async def _delete_doomed(self, p: Partition, state: PartitionTiering) -> None:
        now = clock.monotonic_ms()
        due = [entries for at, entries in state.doomed if at <= now]
        if not due:
            return
        segments = [s for entries in due for s in entries]
        try:
            deleted = await asyncio.to_thread(state.tier.delete_unlisted, segments)
        except HeadraceError as exc:
            # a policy refusing deletes (AccessDenied) or a store that is down: the objects
            # are unlisted already, so they stay until a later round deletes them
            self.metrics.tier_delete_errors.inc()
            log.warning(
                "%s: deleting %d retired objects failed, retrying: %s", p.name, len(segments), exc
            )
            return
        state.doomed = [(at, entries) for at, entries in state.doomed if at > now]
        self.metrics.tier_retention_deleted_objects.inc(len(deleted))


def _below(data: bytes, end: int) -> bytes:
    """The whole batches of ``data`` that start below ``end``."""
    cut = 0
    for pos, header in rb.scan(data):
        if header.base_offset >= end:
            break
        cut = pos + header.size
    return data if cut == len(data) else data[:cut]
