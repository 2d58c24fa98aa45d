"""Topics and partitions hosted by this broker, and their files.

Layout under the data directory::

    topics/<namespace>/<name>/topic.json        name, partitions, version, config
    topics/<namespace>/<name>/<p>/              the partition log (see storage/log.py)
    topics/<namespace>/<name>/<p>/cursors.json  cohort -> next offset to deliver
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from headrace.errors import (
    InvalidTopicSpec,
    StorageError,
    TopicAlreadyExists,
    UnknownPartition,
    UnknownTopic,
)
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig
from headrace.storage.log import PartitionLog
from headrace.storage.segment import fsync_directory

NAME_PART: Final = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
DEFAULT_NAMESPACE: Final = "default"
MAX_PARTITIONS: Final = 4096
TOPIC_FILE: Final = "topic.json"
CURSOR_FILE: Final = "cursors.json"

#: per-topic settings a user may override, with their LogConfig field and type
TOPIC_CONFIG_KEYS: Final[dict[str, str]] = {
    "retention_ms": "retention_ms",
    "retention_bytes": "retention_bytes",
    "segment_bytes": "segment_bytes",
    "segment_ms": "segment_ms",
    "max_batch_bytes": "max_batch_bytes",
}


def canonical_topic_name(name: str) -> str:
    """``name`` or ``namespace/name`` -> ``namespace/name``, validated."""
    parts = name.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_NAMESPACE, parts[0]]
    if len(parts) != 2 or not all(NAME_PART.match(p) for p in parts):
        raise InvalidTopicSpec(
            f"invalid topic name {name!r}: use NAME or NAMESPACE/NAME, each 1-63 characters of"
            " lower-case letters, digits, '.', '_' or '-', starting and ending with a letter or digit"
        )
    return "/".join(parts)


def topic_log_config(base: LogConfig, overrides: dict[str, Any]) -> LogConfig:
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in TOPIC_CONFIG_KEYS:
            raise InvalidTopicSpec(
                f"unknown topic setting {key!r}; known: {sorted(TOPIC_CONFIG_KEYS)}"
            )
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidTopicSpec(f"topic setting {key!r} must be an integer")
        if key in ("segment_bytes", "segment_ms", "max_batch_bytes") and value <= 0:
            raise InvalidTopicSpec(f"topic setting {key!r} must be positive")
        changes[TOPIC_CONFIG_KEYS[key]] = value
    return dataclasses.replace(base, **changes)


def write_json_atomic(path: Path, doc: object, *, sync: bool = True) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, sort_keys=True)
        if sync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_directory(path.parent)


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
        """Runs on a worker thread."""
        write_json_atomic(self._path, snapshot)


HwListener = Callable[["Partition"], None]


class Partition:
    """One partition hosted here: its log, high watermark, cursors and listeners."""

    def __init__(self, topic: Topic, index: int, log: PartitionLog, cursors: CursorStore) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.cursors = cursors
        self.leader_epoch = 0
        self.high_watermark = self._durable_end()
        self._listeners: list[HwListener] = []

    @property
    def name(self) -> str:
        return f"{self.topic.name}/{self.index}"

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

    def advance_high_watermark(self) -> None:
        hw = self._durable_end()
        if hw > self.high_watermark:
            self.high_watermark = hw
            for listener in list(self._listeners):
                listener(self)


@dataclass(slots=True)
class Topic:
    name: str
    directory: Path
    partition_count: int
    partitioning_version: int
    config: dict[str, Any]
    created_ms: int
    partitions: list[Partition] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partitions": self.partition_count,
            "partitioning_version": self.partitioning_version,
            "config": self.config,
            "created_ms": self.created_ms,
        }

    def partition(self, index: int) -> Partition:
        if not 0 <= index < len(self.partitions):
            raise UnknownPartition(f"topic {self.name!r} has no partition {index}")
        return self.partitions[index]


class TopicRegistry:
    """The topics on this broker. All mutation happens on the event loop."""

    def __init__(self, data_dir: Path, log_config: LogConfig) -> None:
        self._root = data_dir / "topics"
        self._root.mkdir(parents=True, exist_ok=True)
        self._log_config = log_config
        self.topics: dict[str, Topic] = {}
        #: bumped on every create/delete: the standalone topology generation
        self.generation = 1

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
            )
            self._open_partitions(topic)
            self.topics[topic.name] = topic
        self.generation = 1 + len(self.topics)

    def _open_partitions(self, topic: Topic) -> None:
        config = topic_log_config(self._log_config, topic.config)
        for p in range(topic.partition_count):
            pdir = topic.directory / str(p)
            log = PartitionLog.open(pdir, config)
            topic.partitions.append(Partition(topic, p, log, CursorStore(pdir / CURSOR_FILE)))

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
        directory.mkdir(parents=True)
        topic = Topic(key, directory, partitions, 1, config, time.time_ns() // 1_000_000)
        self._open_partitions(topic)
        write_json_atomic(directory / TOPIC_FILE, topic.to_json())
        fsync_directory(directory.parent)
        self.topics[key] = topic
        self.generation += 1
        return topic

    def delete(self, name: str) -> Topic:
        topic = self.get(name)
        del self.topics[topic.name]
        for partition in topic.partitions:
            partition.log.close()
        # Rename first (atomic), remove after: a crash mid-delete leaves no half topic.
        graveyard = self._root.parent / "deleted"
        graveyard.mkdir(exist_ok=True)
        target = graveyard / f"{topic.name.replace('/', '.')}.{time.time_ns()}"
        os.replace(topic.directory, target)
        shutil.rmtree(target, ignore_errors=True)
        self.generation += 1
        return topic

    def all_partitions(self) -> list[Partition]:
        return [p for t in self.topics.values() for p in t.partitions]

    def close(self) -> None:
        for partition in self.all_partitions():
            partition.log.close()
