"""The broker's claim on its data directory: an exclusive lock, and a start count.

Both are taken once at start-up (``lifecycle``), before the registry reads a log.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from headrace import files
from headrace.errors import StorageError

#: the data directory's start count (``count_incarnation``)
INCARNATION_FILE = "incarnation.json"
#: gate admissions an incarnation may make per partition before its epochs reach the next
#: incarnation's floor (65536), and how many incarnations fit in a u32 epoch with that room
EPOCHS_PER_INCARNATION_BITS = 16
_INCARNATIONS = 1 << 15


def lock(data_dir: Path) -> int:
    """Hold ``data_dir`` for this process (the descriptor of its lock: close it to let go).
    Raises ``StorageError`` if another broker holds it."""
    path = data_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"data directory {data_dir} is in use by another broker") from exc
    return fd


def count_incarnation(data_dir: Path) -> int:
    """Bump and return ``data_dir``'s start count (``incarnation``, fsynced).

    Gate epochs are in memory; without a floor that grows per start they would
    begin at 0 again after a restart, and a delivery or ack of the previous
    incarnation could carry the same epoch as one of this. The count wraps so
    that the floor plus an incarnation's admissions stays within the wire's u32.
    """
    path = data_dir / INCARNATION_FILE
    try:
        previous = int(json.loads(path.read_text())["incarnation"])
    except FileNotFoundError:
        previous = 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"cannot read {path}: {exc}") from exc
    current = (previous + 1) % _INCARNATIONS
    try:
        files.write_json_atomic(path, {"incarnation": current})
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc}") from exc
    return current


def gate_epoch_floor(incarnation: int) -> int:
    """The first gate epoch of incarnation ``incarnation``'s cohorts."""
    return incarnation << EPOCHS_PER_INCARNATION_BITS
