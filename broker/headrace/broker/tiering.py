"""Tiered storage on a broker: the uploader, tiered reads, and sealing and reopening for moves.

Every tiered partition this broker leads uploads its committed records to the
object store (``headrace.tiered``): rolled segments at once, the active
segment's tail every ``upload_interval_ms`` or once ``tier_upload_threshold_bytes``
are pending. The manifest's checkpoint (the last offset stored contiguously) is
the *upload floor*: local retention deletes only segments wholly below it, on
the leader and on followers alike, so every offset is always on some disk or
in the object store. A new leader reads the checkpoint from the manifest and
continues after it: nothing is uploaded twice, nothing is skipped.

A read below the local log start (a cohort cursor or fetch into history, or
any read after a move) is served from the object store, then chains to the
local log: the objects and the local log share offsets, so the seam has no gap
and no duplicate.

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

Object-store calls block; they run in worker threads. Each step re-checks on
the loop that the partition still has the role and incarnation it started
with, so a leadership change mid-upload discards the result instead of
applying it.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from headrace import clock
from headrace.aio import cancel_and_wait
from headrace.broker.ports import PartitionReopened, Publish, TieringHost
from headrace.broker.topics import Partition, Role, TierConfig, write_placement
from headrace.errors import HeadraceError, OffsetOutOfRange, StorageError
from headrace.objectstore.errors import ObjectNotFound
from headrace.objectstore.interface import ObjectStore
from headrace.protocol.coordination import SealReport
from headrace.records import batch as rb
from headrace.tiered.layout import MANIFEST_NAME, partition_prefix
from headrace.tiered.manifest import Manifest, SealedState, SegmentObject
from headrace.tiered.retention import Bounds, retained_start
from headrace.tiered.tier import PartitionTier

log = logging.getLogger(__name__)

#: a copy of the cursors next to the manifest, refreshed by the uploader: what an RF=1
#: partition's new owner restores when its old owner died without a sealed state
CURSORS_NAME = "cursors.json"
#: while sealing, keep uploading with appends open until less than this is pending
SEAL_FENCE_BYTES = 4 * 1024 * 1024
TICK_S = 0.1
#: how often the uploader looks at every partition, not only those that may have work
#: (a placement makes it look at once); seconds
SWEEP_S = 30.0
#: failed upload rounds in a row before the heartbeat reports them (``uploadError``)
UPLOAD_ERROR_ROUNDS = 2


class SealStage(enum.Enum):
    #: uploading everything committed while appends still flow
    DRAINING = "draining"
    #: appends refused; waiting for in-flight acks, uploading the rest, writing the state
    FENCED = "fenced"
    #: the sealed state is written; waiting for the controller to reassign
    SEALED = "sealed"


@dataclass(slots=True)
class PartitionTiering:
    """One partition's tiered-storage state on this broker."""

    tier: PartitionTier
    config: TierConfig
    #: the manifest's checkpoint as this broker last saw it (-1: nothing stored yet)
    uploaded_through: int = -1
    #: the lowest offset the object store holds (None: unknown or nothing stored)
    stored_start: int | None = None
    #: whether ``uploaded_through`` was read from the manifest for the current leadership
    checkpoint_epoch: int = -1
    last_upload_ms: int = 0
    #: active segment (base, size) at the last upload: the size threshold counts from it
    last_upload_mark: tuple[int, int] = (-1, 0)
    upload_task: asyncio.Task[None] | None = None
    cursors_uploaded_version: int = -1
    #: the uploader listens to the partition (HW and cursor moves mark it for a look)
    listened: bool = False
    seal_stage: SealStage | None = None
    #: the leader epoch the seal in progress (or done) belongs to
    seal_epoch: int = -1
    seal_task: asyncio.Task[None] | None = None
    sealed: SealReport | None = None
    #: a move's reopen is in progress: (moves, start offset or None) it reopens to
    reopening: tuple[int, int | None] | None = None
    reopen_task: asyncio.Task[None] | None = None
    #: objects retention removed from the manifest: (monotonic ms when they may be
    #: deleted, their entries), oldest first
    doomed: list[tuple[int, tuple[SegmentObject, ...]]] = field(default_factory=list)
    #: upload rounds failed in a row, and the last one's error
    errors: int = 0
    last_error: str = ""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def blocks_appends(self) -> bool:
        return self.reopening is not None or self.seal_stage in (SealStage.FENCED, SealStage.SEALED)

    @property
    def upload_floor(self) -> int:
        """Local retention may delete segments wholly below this offset."""
        return self.uploaded_through + 1


class Tiering:
    """The tiered-storage side of one broker."""

    def __init__(self, broker: TieringHost, store: ObjectStore | None, publish: Publish) -> None:
        self.broker = broker
        self.store = store
        #: where finished reopens are reported (the broker then applies the partition's role)
        self.publish = publish
        self._task: asyncio.Task[None] | None = None
        self.metrics = broker.metrics
        #: deletions of deleted topics' objects in progress
        self._forgetting: set[asyncio.Task[None]] = set()
        #: readahead for every partition's tier (one pool, not threads per partition)
        self._prefetch_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tier-prefetch")
        #: told of a partition whose upload, seal or reopen task ended: its heartbeat report
        #: (stored through, sealed) may have changed (``broker.reporting``)
        self.report_changed: Callable[[Partition], None] = lambda p: None
        #: partitions the next tick looks at (the rest are idle: nothing to upload)
        self._watch: set[Partition] = set()
        self._sweep_at = 0.0

    @property
    def enabled(self) -> bool:
        return self.store is not None

    @property
    def cluster_id(self) -> str:
        return self.broker.cluster_id

    # ------------------------------------------------------------------ attaching

    def attach(self, partition: Partition) -> PartitionTiering | None:
        """Give a tiered partition its tier state (idempotent); None if it is not tiered."""
        if partition.tiering is not None:
            return _state(partition)
        if self.store is None or not self.broker.registry.tiered(partition.topic):
            return None
        topic = partition.topic
        prefix = partition_prefix(self.cluster_id, topic.name, partition.index, topic.creation_id)
        tier = PartitionTier(self.store, prefix, executor=self._prefetch_pool)
        state = PartitionTiering(tier, TierConfig.of(partition.topic.config))
        partition.tiering = state
        return state

    def forget(self, partition: Partition) -> None:
        """The partition's topic was deleted: remove its objects, in the background.

        The manifest goes first, so a reader sees no history rather than part of one.
        A topic created again under the same name meanwhile has another creation id, so
        its objects are under another prefix (``tiered.layout``): this never touches them.
        """
        state = _state(partition)
        if state is None or self.store is None:
            return
        store, prefix = self.store, state.tier.prefix

        def remove() -> None:
            keys = [o.key for o in store.list(prefix)]
            manifests = [k for k in keys if k.endswith(MANIFEST_NAME)]
            for key in manifests:
                store.delete(key)
            store.delete_many(k for k in keys if not k.endswith(MANIFEST_NAME))

        task = asyncio.get_running_loop().create_task(asyncio.to_thread(remove))
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)
        task.add_done_callback(_log_death)

    def detach(self, partition: Partition) -> None:
        state = _state(partition)
        if state is None:
            return
        for task in state.tasks:  # every upload, seal and reopen task (see ``_spawn``)
            task.cancel()
        if state.listened:
            partition.remove_listener(self._note)
            partition.remove_cursor_listener(self._note)
        self._watch.discard(partition)
        partition.tiering = None

    def mark_all(self) -> None:
        """Roles or partitions changed: the next tick looks at every partition."""
        self._sweep_at = 0.0

    def _note(self, partition: Partition) -> None:
        self._watch.add(partition)

    def start(self) -> None:
        if self.store is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tiering")

    async def close(self) -> None:
        await cancel_and_wait(self._task, *self._forgetting)
        for p in self.broker.registry.all_partitions():
            state = _state(p)
            if state is not None:
                await cancel_and_wait(*state.tasks)
        self._prefetch_pool.shutdown(wait=False, cancel_futures=True)
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ the uploader

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
            if p.role is not Role.LEADER or state.reopening is not None:
                continue
            keep.add(p)
            if state.seal_stage is not None:
                continue  # the seal task uploads for itself
            if state.upload_task is not None and not state.upload_task.done():
                continue
            if state.errors and now - state.last_upload_ms < min(500 << state.errors, 10_000):
                continue  # the store failed: back off instead of retrying every tick
            if state.checkpoint_epoch != p.leader_epoch or self._upload_due(p, state, now):
                state.upload_task = self._spawn(
                    p, state, self._upload_round(p, state, p.high_watermark)
                )
            elif (
                not state.errors
                and state.uploaded_through + 1 >= p.high_watermark
                and p.cursors.version == state.cursors_uploaded_version
            ):
                keep.discard(p)  # nothing to upload: idle until its HW or cursors move

    def _spawn(self, p: Partition, state: PartitionTiering, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        state.tasks.add(task)
        task.add_done_callback(state.tasks.discard)
        task.add_done_callback(lambda _: self.report_changed(p))
        task.add_done_callback(_log_death)
        return task

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

    async def _load_checkpoint(self, p: Partition, state: PartitionTiering) -> None:
        """A new leadership starts from the stored checkpoint as it is, not from what this
        broker uploaded in an earlier term: an entry lost from the manifest is uploaded again."""
        epoch = p.leader_epoch
        manifest = await asyncio.to_thread(state.tier.manifest, refresh=True)
        if p.leader_epoch == epoch and p.tiering is state:
            state.uploaded_through = self._checkpoint(p, state, manifest)
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
        while p.log.next_offset < target and self._still(p, epoch, state):
            end = p.log.next_offset
            data = await asyncio.to_thread(state.tier.read, end, 8 * 1024 * 1024)
            if not self._still(p, epoch, state) or p.log.next_offset != end:
                return
            # The object's first batch may start below ``end`` (its batch boundaries are
            # the old leader's); keep whole batches from ``end`` on only.
            keep = [pos for pos, h in rb.scan(data) if h.base_offset >= end]
            if not keep:
                raise StorageError(f"{p.name}: no batch boundary at {end} in the object store")
            p.log.append_stamped(data[keep[0] :])
            self.broker.committer.appended(p)
            p.appended()

    def _note_manifest(self, p: Partition, state: PartitionTiering, manifest: Manifest) -> None:
        state.uploaded_through = max(state.uploaded_through, self._checkpoint(p, state, manifest))
        state.stored_start = manifest.start_offset

    @staticmethod
    def _checkpoint(p: Partition, state: PartitionTiering, manifest: Manifest) -> int:
        """The stored checkpoint, counting above this incarnation's start only objects its
        own leaders wrote: an old owner cut off from the controller may still upload."""
        if p.moves == 0 or p.first_epoch < 0:
            return manifest.checkpoint
        kept = tuple(
            s for s in manifest.segments if s.last < p.start_offset or s.epoch >= p.first_epoch
        )
        return Manifest(kept, manifest.epoch, manifest.version, manifest.retained_from).checkpoint

    async def _upload_round(self, p: Partition, state: PartitionTiering, end: int) -> None:
        """Upload committed records below ``end`` (and the cursors if they moved)."""
        try:
            if state.checkpoint_epoch != p.leader_epoch:
                await self._load_checkpoint(p, state)
            await self._upload_until(p, state, end)
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

    async def _upload_until(self, p: Partition, state: PartitionTiering, end: int) -> int:
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
            if not self._still(p, epoch, state) or p.log.truncations != truncations:
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
            if not self._still(p, epoch, state):
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
        if not self._still(p, p.leader_epoch, state) or state.checkpoint_epoch != p.leader_epoch:
            return  # a deposed leader must not overwrite the new one's copy
        body = json.dumps({"cursors": p.cursors.all(), "epoch": p.leader_epoch}).encode()
        key = state.tier.prefix + CURSORS_NAME
        await asyncio.to_thread(self.store.put, key, body)
        state.cursors_uploaded_version = version

    def _still(self, p: Partition, epoch: int, state: PartitionTiering) -> bool:
        return (
            p.role is Role.LEADER
            and p.leader_epoch == epoch
            and p.tiering is state
            and p.topic.partitions.get(p.index) is p
        )

    # ------------------------------------------------------------------ retention floor

    async def refresh_floor(self, p: Partition) -> int | None:
        """The upload floor for retention, checked against the stored manifest; None: the
        partition is not tiered here, so retention has no floor.

        Only a manifest written at this replica's leader epoch or later counts: until the
        current leader has confirmed the stored checkpoint, local segments stay (a
        conservative rule: the uploaders' conditional writes never drop an entry).
        """
        state: PartitionTiering | None = self.attach(p)
        if state is None:
            return None
        epoch = p.leader_epoch
        try:
            manifest = await asyncio.to_thread(state.tier.manifest, refresh=True)
        except HeadraceError as exc:  # unreachable store, or a manifest that does not parse
            log.warning("no usable manifest for %s (keeping its segments): %s", p.name, exc)
            return 0
        self._note_manifest(p, state, manifest)
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
        state = _state(p)
        if state is None or self.store is None:
            return False
        moved = False
        epoch = p.leader_epoch
        if (
            self._still(p, epoch, state)
            and state.checkpoint_epoch == epoch
            and state.seal_stage is None
            and state.reopening is None
        ):
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
            log.warning(
                "%s: deleting %d retired objects failed, retrying: %s", p.name, len(segments), exc
            )
            return
        state.doomed = [(at, entries) for at, entries in state.doomed if at > now]
        self.metrics.tier_retention_deleted_objects.inc(len(deleted))

    # ------------------------------------------------------------------ reads

    def stored_start(self, p: Partition) -> int | None:
        state = p.tiering  # on every fetch: no helper call
        return None if state is None else state.stored_start

    def earliest(self, p: Partition) -> int:
        """The lowest offset a reader can get: from the object store if it holds older ones."""
        stored = self.stored_start(p)
        local = p.log.log_start_offset
        return local if stored is None else min(stored, local)

    async def read(self, p: Partition, offset: int, max_bytes: int) -> bytes:
        """Whole batches from ``offset`` (below the local log start) out of the object store."""
        state = _state(p)
        if state is None:
            raise OffsetOutOfRange(
                f"offset {offset} is below log start {p.log.log_start_offset} of {p.name}"
            )
        data = await asyncio.to_thread(state.tier.read, offset, max_bytes)
        self.metrics.tier_read_bytes.inc(len(data))
        return data

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
        running = state.seal_task is not None and not state.seal_task.done()
        if state.seal_epoch == p.leader_epoch and (running or state.seal_stage is SealStage.SEALED):
            return
        if state.seal_task is not None:
            state.seal_task.cancel()
        state.seal_epoch = p.leader_epoch
        state.sealed = None
        state.seal_stage = SealStage.FENCED if took_over else SealStage.DRAINING
        state.seal_task = self._spawn(p, state, self._seal(p, state))

    def unseal(self, p: Partition) -> None:
        """The seal request was withdrawn before a reassignment: accept appends again."""
        state = _state(p)
        if state is None or state.seal_stage is None:
            return
        if state.seal_task is not None:
            state.seal_task.cancel()
        state.seal_stage = None
        state.seal_epoch = -1
        state.sealed = None
        for runtime in self.broker.cohorts_of(p.topic.name):
            runtime.wake()

    async def _seal(self, p: Partition, state: PartitionTiering) -> None:
        epoch, moves = p.leader_epoch, p.moves
        await _retry(
            f"sealing {p.name}",
            lambda: self._seal_once(p, state, epoch, moves),
            lambda: self._still(p, epoch, state),
        )
        # Leadership moved on before the seal was written: it is void (a new leader, or
        # this broker at a new epoch, seals again if the controller still asks).
        if (
            state.seal_epoch == epoch
            and state.seal_stage is not SealStage.SEALED
            and not self._still(p, epoch, state)
        ):
            state.seal_stage = None
            state.seal_epoch = -1

    async def _seal_once(
        self, p: Partition, state: PartitionTiering, epoch: int, moves: int
    ) -> None:
        started = time.monotonic()
        if state.checkpoint_epoch != epoch:
            await self._load_checkpoint(p, state)
        if state.upload_task is not None and not state.upload_task.done():
            await asyncio.wait([state.upload_task])
        if state.seal_stage is SealStage.DRAINING:
            # Appends still flow: upload the bulk now so the fenced part stays short.
            while self._still(p, epoch, state):
                if await self._upload_until(p, state, p.high_watermark) < SEAL_FENCE_BYTES:
                    break
            if not self._still(p, epoch, state):
                return
            # Fenced: produce is refused and the cohort pump stops delivering the partition;
            # its gates stay, so acks of what was delivered still count.
            state.seal_stage = SealStage.FENCED
            fenced = time.monotonic()
            await self._wait_for_acks(p)
        else:
            fenced = time.monotonic()
        # Everything this leader holds, committed or not, goes to the object store: the
        # records above the HW were accepted under acks=leader or are waiting for acks=all.
        end = p.log.next_offset
        await self._upload_until(p, state, end)
        if not self._still(p, epoch, state):
            return
        manifest = await asyncio.to_thread(state.tier.manifest, refresh=True)
        last = max(end - 1, manifest.checkpoint)
        verified, message = _verify(manifest, last, end)
        if not verified:
            # Never hand over while the store lacks records this log holds (a manifest
            # entry lost to a race, say): upload from the stored checkpoint again and retry.
            state.uploaded_through = min(state.uploaded_through, manifest.checkpoint)
            raise StorageError(f"{p.name}: sealed state not written: {message}")
        self._note_manifest(p, state, manifest)
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
        if not self._still(p, epoch, state):
            return
        state.seal_stage = SealStage.SEALED
        state.sealed = SealReport(last, epoch, moves, verified, message)
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
        running = state.reopen_task is not None and not state.reopen_task.done()
        if state.reopening == (moves, start_offset) and running:
            return True
        if state.reopen_task is not None:
            state.reopen_task.cancel()
        if state.seal_task is not None:
            state.seal_task.cancel()
        state.reopening = (moves, start_offset)
        state.reopen_task = self._spawn(
            p, state, self._reopen(p, state, moves, start_offset, epoch)
        )
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
            lambda: state.reopening == (moves, start_offset) and p.tiering is state,
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
        if state.reopening != (moves, start_offset) or p.tiering is not state:
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
        state.seal_stage = None
        state.seal_epoch = -1
        state.sealed = None
        state.reopening = None
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

    # ------------------------------------------------------------------ reports

    def describe(self, p: Partition) -> dict[str, Any]:
        """Tier fields of a topic description (``/v1/topics/...``)."""
        state = _state(p)
        if state is None:
            return {"tiered": False}
        return {
            "tiered": True,
            "stored_start_offset": state.stored_start,
            "uploaded_through": state.uploaded_through,
            "moves": p.moves,
            "move_start_offset": p.start_offset,
            "seal": state.seal_stage.value if state.seal_stage else None,
        }

    def stored_through(self, p: Partition) -> int | None:
        """The heartbeat's ``storedThrough``: the last offset uploaded, None if not tiered."""
        state = _state(p)
        return state.uploaded_through if state is not None else None

    def upload_error(self, p: Partition) -> str | None:
        """The heartbeat's ``uploadError``: set once ``UPLOAD_ERROR_ROUNDS`` upload rounds in a
        row failed (one failure is a blip the next round usually fixes), None otherwise."""
        state = _state(p)
        if state is None or state.errors < UPLOAD_ERROR_ROUNDS:
            return None
        return f"{state.errors} upload rounds in a row failed: {state.last_error}"

    def seal_report(self, p: Partition) -> SealReport | None:
        """The heartbeat's ``sealed`` for one partition: set once this leader has sealed it."""
        state = _state(p)
        return state.sealed if state is not None else None


def _state(p: Partition) -> PartitionTiering | None:
    """The partition's tier state: ``Tiering.attach`` is the only writer of ``p.tiering``."""
    return cast(PartitionTiering | None, p.tiering)


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


def _below(data: bytes, end: int) -> bytes:
    """The whole batches of ``data`` that start below ``end``."""
    cut = 0
    for pos, header in rb.scan(data):
        if header.base_offset >= end:
            break
        cut = pos + header.size
    return data if cut == len(data) else data[:cut]


def _log_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("tiering task %s died", task.get_name(), exc_info=task.exception())


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
