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
from concurrent.futures import ThreadPoolExecutor
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


class DirectorySyncs:
    """Directory fsyncs owed by a batch of creations, done together by ``flush``.

    Creating a partition makes entries in two directories (the partition's own in the
    topic directory, its first segment files in the partition directory), and each
    needs an fsync of the directory that holds it. Done one partition at a time, every
    fsync waits for its own journal commit and disk flush: about 5 ms per partition here,
    50 s for 10,000. Done after all the creations, the first fsync commits
    them all and the rest find little left to do; the fsyncs also run on a few threads
    at once, so their flushes overlap. Every directory is still fsynced: the creations
    are durable once ``flush`` returns, and the caller must not report or use them
    before that.
    """

    #: threads fsyncing at once: enough to overlap the flushes, few enough to stay cheap
    THREADS = 8

    def __init__(self) -> None:
        self._pending: dict[Path, None] = {}  # insertion-ordered set

    def add(self, directory: Path) -> None:
        """``directory`` gained or lost an entry: fsync it at ``flush``."""
        self._pending[directory] = None

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Fsync every directory added since the last flush; the first error propagates."""
        pending, self._pending = list(self._pending), {}
        if len(pending) <= 2:
            for directory in pending:
                fsync_directory(directory)
            return
        with ThreadPoolExecutor(min(self.THREADS, len(pending)), "dirsync") as pool:
            for _ in pool.map(fsync_directory, pending):
                pass


def mkdir_durable(path: Path, syncs: DirectorySyncs | None = None) -> None:
    """``mkdir -p`` whose new entries survive a power loss.

    A new directory's name lives in its parent, and only an fsync of the parent
    makes it durable; syncing files inside the new directory does not. So every
    directory created here has its parent fsynced (parents first). Without this
    a power cut may drop a whole partition directory whose segments were synced.
    With ``syncs`` the parents are added to it instead, for the caller to flush.
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
        if syncs is None:
            fsync_directory(directory.parent)
        else:
            syncs.add(directory.parent)


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
