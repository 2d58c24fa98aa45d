"""A standalone broker's committed Kafka group offsets: one file per group under
``<data dir>/kafka-groups/``, replaced atomically and fsynced before a commit is
answered, so that a broker restart keeps them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from headrace import files
from headrace.errors import StorageError
from headrace.kafka.groups import Committed

_FORMAT = 1

#: a group's committed offsets, by (topic, partition)
Offsets = dict[tuple[str, int], Committed]


class GroupOffsetFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self) -> Iterator[tuple[str, Offsets]]:
        """Every group's committed offsets (making the directory if there is none)."""
        files.mkdir_durable(self.directory)
        for path in sorted(self.directory.glob("*.json")):
            yield _read(path)

    def write(self, group_id: str, offsets: Offsets) -> None:
        doc = {
            "format": _FORMAT,
            "group": group_id,
            "offsets": [
                [topic, partition, c.offset, c.leader_epoch, c.metadata]
                for (topic, partition), c in sorted(offsets.items())
            ],
        }
        files.write_atomic(self._path(group_id), json.dumps(doc).encode())

    def remove(self, group_id: str) -> None:
        self._path(group_id).unlink(missing_ok=True)

    def _path(self, group_id: str) -> Path:
        # group ids are any string: the file is named by a digest, the id kept inside
        digest = hashlib.blake2b(group_id.encode(), digest_size=16).hexdigest()
        return self.directory / f"{digest}.json"


def _read(path: Path) -> tuple[str, Offsets]:
    try:
        doc = json.loads(path.read_bytes())
        if doc["format"] != _FORMAT:
            raise StorageError(f"{path}: committed offsets in format {doc['format']}")
        offsets = {
            (str(topic), int(partition)): Committed(int(offset), int(epoch), str(metadata))
            for topic, partition, offset, epoch, metadata in doc["offsets"]
        }
        return str(doc["group"]), offsets
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"{path}: unreadable committed offsets: {exc}") from exc
