"""Atomic file writes: the one way headrace replaces a file on disk.

A write goes to a temporary file in the target's directory, which is flushed
(and fsynced when ``sync``), then renamed over the target; with ``sync`` the
directory is fsynced too, so the rename itself survives a power loss. A reader
sees the old content or the new, never a torn file; a crash leaves at most the
temporary file, which the next write to the same target overwrites.

Used by both planes (the broker's topic, placement, cursor, epoch and
recovery-point files, the directory object store, the controller's store and
``headrace local``'s state file), so it lives at the root of the data plane.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: the mode a new file gets before the umask, as ``open()`` would give it
DEFAULT_MODE = 0o666


def fsync_directory(path: Path) -> None:
    """Make a created, renamed or removed directory entry durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durable(path: Path) -> None:
    """``mkdir -p`` whose new entries survive a power loss.

    A new directory's name lives in its parent, and only an fsync of the parent
    makes it durable; syncing files inside the new directory does not. So every
    directory created here has its parent fsynced (parents first). Without this
    a power cut may drop a whole partition directory whose segments were synced.
    """
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # made by someone else meanwhile: its parent is theirs to sync
        fsync_directory(directory.parent)


@contextmanager
def atomic_writer(
    path: Path,
    *,
    sync: bool = True,
    mode: int = DEFAULT_MODE,
    tmp: Path | None = None,
    exclusive: bool = False,
) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` when the block ends without an exception.

    ``sync=False`` skips both fsyncs (the rename stays atomic, not durable).
    ``mode`` applies when the temporary file is created (``0o600`` for secrets).
    ``tmp`` names the temporary file (default ``<name>.tmp`` beside ``path``);
    ``exclusive`` refuses an existing one (for unique names). On an exception the
    temporary file is removed and the exception propagates.
    """
    if tmp is None:
        tmp = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        if sync:
            fsync_directory(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(
    path: Path,
    data: bytes,
    *,
    sync: bool = True,
    mode: int = DEFAULT_MODE,
    tmp: Path | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, sync=sync, mode=mode, tmp=tmp) as fh:
        fh.write(data)


def write_json_atomic(
    path: Path,
    doc: object,
    *,
    sync: bool = True,
    mode: int = DEFAULT_MODE,
    tmp: Path | None = None,
    indent: int | None = None,
    sort_keys: bool = False,
) -> None:
    """Replace ``path`` with ``doc`` as JSON atomically (see :func:`atomic_writer`)."""
    data = json.dumps(doc, indent=indent, sort_keys=sort_keys).encode()
    write_atomic(path, data, sync=sync, mode=mode, tmp=tmp)
