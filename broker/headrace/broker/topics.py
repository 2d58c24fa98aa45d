"""Topics and partitions hosted by this broker, and their files.

Layout under the data directory::

    topics/<namespace>/<name>/topic.json        name, partitions, version, config
    topics/<namespace>/<name>/<p>/              the partition log (see storage/log.py)
    topics/<namespace>/<name>/<p>/cursors.json  cohort -> next offset to deliver
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from headrace import clock, files
from headrace.errors import (
    InvalidTopicSpec,
    StorageError,
    TopicAlreadyExists,
    UnknownPartition,
    UnknownTopic,
)
from headrace.records.topic_names import canonical_topic_name
from headrace.replication.leader import LeaderReplicaSet
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig
from headrace.storage.log import PartitionLog

if TYPE_CHECKING:
    from headrace.tiered.tier import PartitionTier

log = logging.getLogger(__name__)

MAX_PARTITIONS: Final = 4096
TOPIC_FILE: Final = "topic.json"
#: where a topic deleted with ``deletionPolicy: Retain`` is moved, beside ``topics/``
RETAINED_DIR: Final = "retained"
CURSOR_FILE: Final = "cursors.json"

PLACEMENT_FILE: Final = "placement.json"
#: this copy's repartition cutover (``Partition.cutover``), ``{"version": V, "offset": O}``
CUTOVER_FILE: Final = "cutover.json"

#: per-topic settings a user may override, with their LogConfig field and type
TOPIC_CONFIG_KEYS: Final[dict[str, str]] = {
    "retention_ms": "retention_ms",
    "retention_bytes": "retention_bytes",
    "segment_bytes": "segment_bytes",
    "segment_ms": "segment_ms",
    "max_batch_bytes": "max_batch_bytes",
}
#: per-topic tiered-storage settings (the Topic spec's ``tieredStorage``); not LogConfig fields
TIER_CONFIG_KEYS: Final[dict[str, type]] = {
    "tiered": bool,
    "upload_interval_ms": int,
    "local_retention_ms": int,
    "local_retention_bytes": int,
}
DEFAULT_UPLOAD_INTERVAL_MS: Final = 30_000


@dataclass(frozen=True, slots=True)
class TierConfig:
    """A topic's tiered-storage settings, as far as this broker applies them."""

    enabled: bool = True
    upload_interval_ms: int = DEFAULT_UPLOAD_INTERVAL_MS
    local_retention_ms: int | None = None
    local_retention_bytes: int | None = None

    @classmethod
    def of(cls, config: dict[str, Any]) -> TierConfig:
        return cls(
            bool(config.get("tiered", True)),
            int(config.get("upload_interval_ms", DEFAULT_UPLOAD_INTERVAL_MS)),
            config.get("local_retention_ms"),
            config.get("local_retention_bytes"),
        )


def topic_log_config(
    base: LogConfig, overrides: dict[str, Any], *, tiered: bool = False
) -> LogConfig:
    """The log settings of a topic's partitions. ``tiered``: segments go to an object
    store, so the local copy follows the local retention settings where they are set."""
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in TIER_CONFIG_KEYS:
            kind = TIER_CONFIG_KEYS[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise InvalidTopicSpec(f"topic setting {key!r} must be {kind.__name__}")
            continue
        if key not in TOPIC_CONFIG_KEYS:
            known = sorted([*TOPIC_CONFIG_KEYS, *TIER_CONFIG_KEYS])
            raise InvalidTopicSpec(f"unknown topic setting {key!r}; known: {known}")
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidTopicSpec(f"topic setting {key!r} must be an integer")
        if key in ("segment_bytes", "segment_ms", "max_batch_bytes") and value <= 0:
            raise InvalidTopicSpec(f"topic setting {key!r} must be positive")
        changes[TOPIC_CONFIG_KEYS[key]] = value
    if tiered:
        tier = TierConfig.of(overrides)
        if tier.local_retention_ms is not None:
            changes["retention_ms"] = tier.local_retention_ms
        if tier.local_retention_bytes is not None:
            changes["retention_bytes"] = tier.local_retention_bytes
    return dataclasses.replace(base, **changes)


def read_placement(directory: Path) -> tuple[int, int, int]:
    """(moves, start offset, first leader epoch) of the incarnation a partition directory
    holds; (0, 0, -1) if it was never moved."""
    try:
        raw = json.loads((directory / PLACEMENT_FILE).read_text())
        return int(raw["moves"]), int(raw["start_offset"]), int(raw.get("first_epoch", -1))
    except FileNotFoundError:
        return 0, 0, -1
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"placement file in {directory} is unreadable: {exc}") from exc


def write_placement(directory: Path, moves: int, start_offset: int, first_epoch: int) -> None:
    files.write_json_atomic(
        directory / PLACEMENT_FILE,
        {"moves": moves, "start_offset": start_offset, "first_epoch": first_epoch},
        sort_keys=True,
    )


def read_cutover(directory: Path) -> tuple[int, int] | None:
    """The (partitioning version, cutover offset) a partition directory recorded; None if
    none. An unreadable file reads as none: the copy then takes its log end when it
    leads, as it did before cutovers were kept."""
    try:
        raw = json.loads((directory / CUTOVER_FILE).read_text())
        return int(raw["version"]), int(raw["offset"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        log.warning("cutover file in %s is unreadable; ignoring it", directory)
        return None


def write_cutover(directory: Path, cutover: tuple[int, int] | None) -> None:
    if cutover is None:
        (directory / CUTOVER_FILE).unlink(missing_ok=True)
        return
    files.write_json_atomic(
        directory / CUTOVER_FILE,
        {"version": cutover[0], "offset": cutover[1]},
        sort_keys=True,
    )


class CursorStore:
    """Durable cohort cursors of one partition: cohort -> next offset to deliver.

    Updates are in memory; ``flush`` writes them atomically. The broker
    flushes every ``cursor_flush_interval_ms`` and on every gate release, so
    after a crash at most that window of acks is forgotten (and redelivered).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._cursors: dict[str, int] = {}
        self._dirty = False
        #: bumped on every change; replication sends cursors to followers when it moved
        self.version = 0
        #: called after every change (the partition's cursor listeners)
        self.on_change: Callable[[], None] | None = None
        try:
            raw = json.loads(path.read_text())
            if isinstance(raw, dict):
                self._cursors = {str(k): int(v) for k, v in raw.items()}
        except FileNotFoundError:
            pass
        except (ValueError, TypeError) as exc:
            raise StorageError(f"cursor file {path} is unreadable: {exc}") from exc

    def get(self, cohort: str) -> int | None:
        return self._cursors.get(cohort)

    def set(self, cohort: str, next_offset: int) -> None:
        if self._cursors.get(cohort) != next_offset:
            self._cursors[cohort] = next_offset
            self._dirty = True
            self.version += 1
            if self.on_change is not None:
                self.on_change()

    def all(self) -> dict[str, int]:
        return dict(self._cursors)

    @property
    def dirty(self) -> bool:
        return self._dirty

    def snapshot_for_flush(self) -> dict[str, int] | None:
        if not self._dirty:
            return None
        self._dirty = False
        return dict(self._cursors)

    def write(self, snapshot: dict[str, int]) -> None:
        """Runs on a worker thread. A failed write leaves the store dirty for the next beat."""
        try:
            files.write_json_atomic(self._path, snapshot, sort_keys=True)
        except OSError:
            self._dirty = True
            raise


HwListener = Callable[["Partition"], None]


class TierState(Protocol):
    """A partition's tiered-storage state as the rest of the broker may read it.

    The tiering parts alone create and change it (``tier_state.PartitionTiering``).
    """

    @property
    def tier(self) -> PartitionTier: ...

    @property
    def uploaded_through(self) -> int: ...

    @property
    def stored_start(self) -> int | None:
        """The lowest offset the object store holds (None: unknown or nothing stored)."""

    @property
    def reopening(self) -> tuple[int, int | None] | None:
        """A move's reopen in progress: (moves, start offset or None) it reopens to."""

    @property
    def blocks_appends(self) -> bool: ...


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


class Partition:
    """One partition hosted here: its log, role, high watermark, cursors and listeners.

    As leader (standalone brokers lead everything) the HW comes from the
    replica set: the smallest LEO over the LRS, or the local durable end when
    the partition has no other replicas. As follower it is the leader's HW,
    capped at the local log end.
    """

    def __init__(self, topic: Topic, index: int, log: PartitionLog, cursors: CursorStore) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.cursors = cursors
        self.role = Role.LEADER
        self.leader_id = -1
        self.leader_epoch = 0
        self.replicas: list[int] = []
        self.min_in_sync = 1
        #: the leader's view of its followers; None when there are none to track
        self.replica_set: LeaderReplicaSet | None = None
        #: follower only: the HW the leader last reported
        self.leader_high_watermark = 0
        #: follower only: the epoch whose divergence check has completed
        self.truncated_for_epoch = -1
        #: the incarnation this copy belongs to: how many unloads moved the partition
        #: before it (see ``PLACEMENT_FILE``), and the offset that incarnation started at
        self.moves = 0
        self.start_offset = 0
        #: the incarnation's first leader epoch (-1: never moved)
        self.first_epoch = -1
        #: the tiered-storage state (``broker.tier_state.PartitionTiering``); None when untiered
        self.tiering: TierState | None = None
        #: (partitioning version, the first offset appended under it): a repartition's
        #: cutover offset (records below it were routed under an older version). A leader
        #: takes it when it applies the version or takes the lead under it; a follower
        #: copies its leader's with the records (``replicating``), so the copy that leads
        #: next knows it exactly. Durable (``CUTOVER_FILE``); set it with ``record_cutover``
        self.cutover: tuple[int, int] | None = None
        self.high_watermark = self._durable_end()
        self._listeners: list[HwListener] = []
        self._append_listeners: list[HwListener] = []
        self._cursor_listeners: list[HwListener] = []
        cursors.on_change = self._cursors_changed
        self._hw_waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def name(self) -> str:
        return f"{self.topic.name}/{self.index}"

    def record_cutover(self, cutover: tuple[int, int] | None) -> None:
        """Keep ``cutover``, on disk before any record past it is appended here: a copy
        restarted with such records in its log must not lead with its log end instead."""
        if cutover != self.cutover:
            write_cutover(self.log.directory, cutover)
            self.cutover = cutover

    @property
    def lrs(self) -> list[int]:
        if self.role is Role.LEADER and self.replica_set is not None:
            return self.replica_set.sorted_lrs()
        return [self.leader_id] if self.role is Role.LEADER else []

    @property
    def moving(self) -> bool:
        """Sealed or sealing for a move, or reopening after one: no appends, no gates.

        Also a leader whose log ends at or below what the object store already holds:
        an earlier leader stored records this one lacks, and appending would give their
        offsets to other records.
        """
        tiering = self.tiering
        if tiering is None:
            return False
        behind_store = self.role is Role.LEADER and tiering.uploaded_through >= self.log.next_offset
        return bool(tiering.blocks_appends or behind_store)

    def _durable_end(self) -> int:
        # Under fsync=always nothing becomes visible before it is on disk.
        if self.log.config.fsync is FsyncPolicy.ALWAYS:
            return self.log.flushed_offset
        return self.log.next_offset

    def add_listener(self, listener: HwListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: HwListener) -> None:
        try:
            self._listeners.remove(listener)
        except ValueError:
            pass

    def add_append_listener(self, listener: HwListener) -> None:
        self._append_listeners.append(listener)

    def remove_append_listener(self, listener: HwListener) -> None:
        try:
            self._append_listeners.remove(listener)
        except ValueError:
            pass

    def add_cursor_listener(self, listener: HwListener) -> None:
        """Called after every change of a cohort cursor (replica fetch sessions)."""
        self._cursor_listeners.append(listener)

    def remove_cursor_listener(self, listener: HwListener) -> None:
        try:
            self._cursor_listeners.remove(listener)
        except ValueError:
            pass

    def _cursors_changed(self) -> None:
        for listener in list(self._cursor_listeners):
            listener(self)

    def followers_reset(self) -> None:
        """The leader reset some followers' progress (a move started): wake whoever
        follows the log end, as an append does, so fetch sessions answer with the
        partition and re-credit their followers' positions."""
        for listener in list(self._append_listeners):
            listener(self)

    def appended(self) -> None:
        """The log end moved: wake long-polling followers, then recompute the HW."""
        for listener in list(self._append_listeners):
            listener(self)
        self.advance_high_watermark()

    def advance_high_watermark(self) -> None:
        if self.role is Role.LEADER:
            end = self._durable_end()
            if self.replica_set is None:
                hw = end
            else:
                self.replica_set.advance(end)
                hw = self.replica_set.high_watermark
        else:
            hw = min(self.leader_high_watermark, self.log.next_offset)
        self.raise_high_watermark(hw)

    def raise_high_watermark(self, hw: int) -> None:
        """Move the HW up to ``hw`` (never down), waking listeners and acks=all waiters."""
        if hw > self.high_watermark:
            self.high_watermark = hw
            for listener in list(self._listeners):
                listener(self)
            if self._hw_waiters:
                waiting = []
                for offset, fut in self._hw_waiters:
                    if fut.done():
                        continue
                    if hw >= offset:
                        fut.set_result(None)
                    else:
                        waiting.append((offset, fut))
                self._hw_waiters = waiting

    def wait_for_high_watermark(self, offset: int) -> asyncio.Future[None]:
        """Completes once the HW reaches ``offset`` (acks=all); fails if leadership is lost."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.high_watermark >= offset:
            fut.set_result(None)
        else:
            self._hw_waiters.append((offset, fut))
        return fut

    def fail_waiters(self, exc: Exception) -> None:
        waiters, self._hw_waiters = self._hw_waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)


@dataclass(slots=True)
class Topic:
    name: str
    directory: Path
    partition_count: int
    partitioning_version: int
    config: dict[str, Any]
    created_ms: int
    #: the partitions hosted on this broker (all of them on a standalone broker)
    partitions: dict[int, Partition] = field(default_factory=dict)
    #: which incarnation of the topic this is: the prefix of its objects
    #: (``tiered.layout``); "" for a topic from before creation ids (the legacy layout)
    creation_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partitions": self.partition_count,
            "partitioning_version": self.partitioning_version,
            "config": self.config,
            "created_ms": self.created_ms,
            **({"creation_id": self.creation_id} if self.creation_id else {}),
        }

    def partition(self, index: int) -> Partition:
        part = self.partitions.get(index)
        if part is None:
            raise UnknownPartition(f"topic {self.name!r} has no partition {index} on this broker")
        return part


class TopicRegistry:
    """The topics on this broker. All mutation happens on the event loop."""

    def __init__(
        self, data_dir: Path, log_config: LogConfig, *, object_store_configured: bool = False
    ) -> None:
        self._root = data_dir / "topics"
        files.mkdir_durable(self._root)
        self._log_config = log_config
        self.topics: dict[str, Topic] = {}
        #: bumped on every create/delete: the standalone topology generation (persisted, so
        #: it never goes back across restarts and clients keep accepting pushes)
        self._generation_file = data_dir / "topology-generation"
        self.generation = 1
        #: when the generation counter began (Unix ms; 0 for one kept since before epochs
        #: were): a counter that starts again, its file lost, still orders after the old
        #: one's generations at the clients (``TopologySnapshot.order``)
        self._epoch_file = data_dir / "topology-epoch"
        self.generation_epoch = 0
        #: the broker has an object store (tiered topics upload to it)
        self.object_store_configured = object_store_configured

    def load(self) -> None:
        for topic_file in sorted(self._root.glob(f"*/*/{TOPIC_FILE}")):
            raw = json.loads(topic_file.read_text())
            topic = Topic(
                raw["name"],
                topic_file.parent,
                int(raw["partitions"]),
                int(raw["partitioning_version"]),
                dict(raw.get("config", {})),
                int(raw.get("created_ms", 0)),
                creation_id=str(raw.get("creation_id", "")),
            )
            self._open_partitions(topic, only_existing=True)
            self.topics[topic.name] = topic
        try:
            self.generation = max(1, int(self._generation_file.read_text()))
            self.generation_epoch = self._read_epoch()
        except (FileNotFoundError, ValueError):
            # The counter starts again: numbers it already gave out may come again, so it
            # takes a new epoch, and clients order its generations after the old ones.
            self.generation = 1 + len(self.topics)
            self.generation_epoch = max(clock.wall_ms(), self._read_epoch() + 1)
            files.write_json_atomic(self._epoch_file, self.generation_epoch)
        self.bump_generation()

    def _read_epoch(self) -> int:
        try:
            return max(0, int(self._epoch_file.read_text()))
        except (FileNotFoundError, ValueError):
            return 0  # a counter older than epochs: clients saw it as epoch 0

    def _open_partitions(self, topic: Topic, *, only_existing: bool = False) -> None:
        for p in range(topic.partition_count):
            if only_existing and not (topic.directory / str(p)).is_dir():
                continue  # a cluster broker hosts only the partitions it replicates
            self.open_partition(topic, p)

    def directory_of(self, name: str) -> Path:
        """Where topic ``name``'s files are (whether or not it exists yet)."""
        return self._root / canonical_topic_name(name)

    def log_config_of(self, topic_config: dict[str, Any]) -> LogConfig:
        """The log settings of the partitions of a topic with ``topic_config``."""
        tiered = self.object_store_configured and TierConfig.of(topic_config).enabled
        return topic_log_config(self._log_config, topic_config, tiered=tiered)

    def whole_log_config_of(self, topic_config: dict[str, Any]) -> LogConfig:
        """The settings that bound a topic's whole log, local and tiered: its own
        retention, not ``tieredStorage.localRetention*`` (``tiered.retention``)."""
        return topic_log_config(self._log_config, topic_config, tiered=False)

    def open_partition(
        self,
        topic: Topic,
        index: int,
        syncs: files.DirectorySyncs | None = None,
        opened: PartitionLog | None = None,
    ) -> Partition:
        """Open (creating if needed) a hosted partition. ``syncs``: a new partition's
        directory fsyncs go there (``PartitionLog.open``); flush it before using it.
        ``opened``: its log, already opened off the event loop (``Placer.prepare``)."""
        existing = topic.partitions.get(index)
        if existing is not None:
            if opened is not None:
                opened.close()
            return existing
        config = self.log_config_of(topic.config)
        pdir = topic.directory / str(index)
        if opened is not None and (opened.directory, opened.config) != (pdir, config):
            opened.close()  # opened for other settings: open it again with these
            opened = None
        log = opened if opened is not None else PartitionLog.open(pdir, config, syncs=syncs)
        partition = Partition(topic, index, log, CursorStore(pdir / CURSOR_FILE))
        partition.moves, partition.start_offset, partition.first_epoch = read_placement(pdir)
        partition.cutover = read_cutover(pdir)
        topic.partitions[index] = partition
        return partition

    def tiered(self, topic: Topic) -> bool:
        """Whether the topic's segments go to an object store on this broker."""
        return self.object_store_configured and TierConfig.of(topic.config).enabled

    def drop_partition(self, topic: Topic, index: int, *, keep_files: bool = False) -> None:
        """This broker no longer replicates the partition: close it and remove its files
        (``keep_files``: leave them, ``retain_topic`` moves them aside)."""
        partition = topic.partitions.pop(index, None)
        if partition is None:
            return
        partition.fail_waiters(UnknownPartition(f"{partition.name} moved away from this broker"))
        partition.log.close()
        if not keep_files:
            shutil.rmtree(topic.directory / str(index), ignore_errors=True)

    def forget_topic(self, name: str) -> None:
        """A deleted topic whose partitions were dropped here: forget it and remove what is
        left of its directory (its ``topic.json``), so a restart does not load it again."""
        topic = self.topics.pop(canonical_topic_name(name), None)
        if topic is None or topic.partitions:
            return  # partitions left: not ours to remove (``drop_partition`` first)
        graveyard = self._root.parent / "deleted"
        graveyard.mkdir(exist_ok=True)
        target = graveyard / f"{topic.name.replace('/', '.')}.{time.time_ns()}"
        try:
            os.replace(topic.directory, target)
        except FileNotFoundError:
            return
        shutil.rmtree(target, ignore_errors=True)

    def retain_topic(self, name: str) -> Path | None:
        """A topic deleted with ``deletionPolicy: Retain``: forget it, and move its directory
        (closed partitions and all) to ``<data dir>/retained/<namespace>.<name>.<ns>``,
        where ``load`` does not look, so a restart does not bring it back. The move is one
        rename: a crash leaves the topic either in place or retained, never half of it."""
        key = canonical_topic_name(name)
        topic = self.topics.pop(key, None)
        if topic is None:
            return None
        for partition in topic.partitions.values():
            partition.fail_waiters(UnknownTopic(f"topic {topic.name!r} was deleted"))
            partition.log.close()
        topic.partitions.clear()
        keep = self._root.parent / RETAINED_DIR
        files.mkdir_durable(keep)
        target = keep / f"{topic.name.replace('/', '.')}.{time.time_ns()}"
        os.replace(topic.directory, target)
        files.fsync_directory(keep)
        files.fsync_directory(topic.directory.parent)
        return target

    def ensure_topic(
        self,
        name: str,
        partition_count: int,
        version: int,
        config: dict[str, Any],
        creation_id: str = "",
    ) -> Topic:
        """Create or update a topic's metadata as the controller dictates (no partitions
        opened). ``creation_id`` is taken when the topic is created here; it never changes."""
        key = canonical_topic_name(name)
        topic = self.topics.get(key)
        if topic is None:
            directory = self._root / key
            files.mkdir_durable(directory)
            topic = Topic(
                key,
                directory,
                partition_count,
                version,
                dict(config),
                clock.wall_ms(),
                creation_id=creation_id,
            )
            self.topics[key] = topic
        elif (topic.partition_count, topic.partitioning_version, topic.config) == (
            partition_count,
            version,
            config,
        ):
            return topic
        # checked before anything changes (the controller checked it too)
        log_config = self.log_config_of(config) if config != topic.config else None
        if version != topic.partitioning_version:
            # The fence moves now, between two appends: what a leader holds is pre-cutover.
            for partition in topic.partitions.values():
                if partition.role is Role.LEADER:
                    partition.record_cutover((version, partition.log.next_offset))
        topic.partition_count = partition_count
        topic.partitioning_version = version
        if log_config is not None:
            # what the hosted logs roll and retain by, not only what the file says
            for partition in topic.partitions.values():
                partition.log.config = log_config
        topic.config = dict(config)
        files.write_json_atomic(topic.directory / TOPIC_FILE, topic.to_json(), sort_keys=True)
        return topic

    def reconfigure(self, name: str, config: dict[str, Any]) -> Topic:
        """Give topic ``name`` the settings ``config`` (a standalone broker's own change):
        checked first, then written to its topic file, then in force for its open logs
        (rolls and retention read them on each use)."""
        topic = self.get(name)
        log_config = self.log_config_of(config)  # raises InvalidTopicSpec before any change
        topic.config = dict(config)
        files.write_json_atomic(topic.directory / TOPIC_FILE, topic.to_json(), sort_keys=True)
        for partition in topic.partitions.values():
            partition.log.config = log_config
        return topic

    def get(self, name: str) -> Topic:
        try:
            key = canonical_topic_name(name)
        except InvalidTopicSpec as exc:
            raise UnknownTopic(str(exc)) from exc
        topic = self.topics.get(key)
        if topic is None:
            raise UnknownTopic(f"unknown topic {key!r}")
        return topic

    def create(self, name: str, partitions: int, config: dict[str, Any] | None = None) -> Topic:
        key = canonical_topic_name(name)
        if key in self.topics:
            raise TopicAlreadyExists(f"topic {key!r} already exists")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidTopicSpec(
                f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}"
            )
        config = dict(config or {})
        topic_log_config(self._log_config, config)  # validate before touching disk
        directory = self._root / key
        if directory.exists():
            shutil.rmtree(directory)
        files.mkdir_durable(directory)  # the namespace directory may be new too
        # a standalone broker is its own controller: it names the incarnation
        topic = Topic(
            key, directory, partitions, 1, config, clock.wall_ms(), creation_id=str(uuid.uuid4())
        )
        self._open_partitions(topic)
        files.write_json_atomic(directory / TOPIC_FILE, topic.to_json(), sort_keys=True)
        files.fsync_directory(directory.parent)
        self.topics[key] = topic
        self.bump_generation()
        return topic

    def delete(self, name: str) -> Topic:
        topic = self.get(name)
        del self.topics[topic.name]
        for partition in topic.partitions.values():
            partition.fail_waiters(UnknownTopic(f"topic {topic.name!r} was deleted"))
            partition.log.close()
        # Rename first (atomic), remove after: a crash mid-delete leaves no half topic.
        graveyard = self._root.parent / "deleted"
        graveyard.mkdir(exist_ok=True)
        target = graveyard / f"{topic.name.replace('/', '.')}.{time.time_ns()}"
        os.replace(topic.directory, target)
        shutil.rmtree(target, ignore_errors=True)
        self.bump_generation()
        return topic

    def bump_generation(self) -> None:
        self.generation += 1
        files.write_json_atomic(self._generation_file, self.generation)

    def all_partitions(self) -> list[Partition]:
        return [p for t in self.topics.values() for p in t.partitions.values()]

    def close(self) -> None:
        for partition in self.all_partitions():
            partition.log.close()
