"""``DirectoryStore``: objects as files under a root directory (adapter).

The embedded default of local mode, and the reference the contract tests hold
MinIO to. Key ``a/b/c`` is the file ``<root>/a/b/c``.

Writes are atomic: the bytes go to a hidden temporary file in the target's
directory (``.<name>.<random>.tmp``), are fsynced, and the file is renamed over
the target, then the directory is fsynced. A crash leaves at most a temporary
file, which no read or listing ever shows (key segments never start with
``.``, so temporaries cannot collide with keys); ``remove_partial_writes``
sweeps them up.

Unlike S3, a file system cannot hold both ``a/b`` and ``a/b/c``; such a put
raises ``InvalidObjectKey``. The segment key layout never needs both.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from headrace.files import atomic_writer, fsync_directory
from headrace.objectstore import interface, keys
from headrace.objectstore.errors import (
    InvalidObjectKey,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreRejected,
    ObjectStoreUnavailable,
)
from headrace.objectstore.interface import ObjectInfo, ObjectStore

#: Bytes copied per read/write when streaming.
CHUNK = 1 << 20
_TMP_SUFFIX = ".tmp"


class DirectoryStore(ObjectStore):
    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        """``fsync=False`` skips the flushes (tests, throwaway data); renames stay atomic."""
        self.root = Path(root)
        self.fsync = fsync
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _translate(exc, str(root)) from exc

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*keys.validate_key(key).split("/"))

    # --- writing ---

    def put(self, key: str, data: bytes) -> None:
        self._write(key, lambda f: f.write(data))

    def put_stream(self, key: str, stream: BinaryIO, size: int | None = None) -> None:
        def copy(f: BinaryIO) -> None:
            left = size
            while left is None or left > 0:
                chunk = stream.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    break
                f.write(chunk)
                if left is not None:
                    left -= len(chunk)
            if left:
                raise ObjectStoreRejected(f"stream for {key!r} ended {left} bytes short of {size}")

        self._write(key, copy)

    def _write(self, key: str, fill: Callable[[BinaryIO], object]) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise InvalidObjectKey(f"{key!r}: a parent of this key is an object") from exc
        except OSError as exc:
            raise _translate(exc, key) from exc
        if path.is_dir():
            raise InvalidObjectKey(
                f"{key!r}: other objects have this key as their prefix directory"
            )
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}")
        try:
            with atomic_writer(path, sync=self.fsync, tmp=tmp, exclusive=True) as f:
                fill(f)
        except OSError as exc:
            raise _translate(exc, key) from exc

    def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """The conditional put of a directory: the new file is written beside the
        object, then renamed over it if the object's version (inode, mtime, size:
        every put renames a new file in) is still ``version``. Between that check
        and the rename (microseconds) another process's rename can still land: the
        check is exact against writers that use this method, and narrows, but does
        not close, the window against plain ``put``s (S3 checks it atomically)."""
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("xb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            if self._version(path) != version:
                tmp.unlink()
                return False
            os.rename(tmp, path)
            if self.fsync:
                fsync_directory(path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise _translate(exc, key) from exc
        return True

    @staticmethod
    def _version(path: Path) -> str | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except IsADirectoryError:
            return  # a prefix of other keys, not an object
        except OSError as exc:
            raise _translate(exc, key) from exc
        if self.fsync:
            fsync_directory(path.parent)

    def remove_partial_writes(self, older_than: float = 3600.0) -> int:
        """Remove temporary files left by crashed writers, if older than
        ``older_than`` seconds (so that live writers are left alone). Returns the count."""
        cutoff = time.time() - older_than
        removed = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(".") and name.endswith(_TMP_SUFFIX):
                    p = Path(dirpath, name)
                    try:
                        if p.stat().st_mtime < cutoff:
                            p.unlink()
                            removed += 1
                    except FileNotFoundError:
                        pass
        return removed

    # --- reading ---

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise _translate(exc, key) from exc

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        path = self._path(key)
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                return f.read(), f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"
        except OSError as exc:
            raise _translate(exc, key) from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        interface.check_range(start, length)
        path = self._path(key)
        try:
            with path.open("rb") as f:
                f.seek(start)
                return f.read(length)
        except OSError as exc:
            raise _translate(exc, key) from exc

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except OSError as exc:
            raise _translate(exc, key) from exc
        if not os.path.isfile(path):
            raise ObjectNotFound(key)
        return ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        keys.validate_prefix(prefix)
        # Start at the deepest directory the prefix names whole; filter the rest.
        base = prefix.rpartition("/")[0]
        start = self.root.joinpath(*base.split("/")) if base else self.root
        yield from self._walk(start, base + "/" if base else "", prefix)

    def _walk(self, directory: Path, key_prefix: str, prefix: str) -> Iterator[ObjectInfo]:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise _translate(exc, key_prefix) from exc
        # Keys under directory d all begin with "d/", so sorting directories by
        # name + "/" among files by name gives the keys' lexicographic order.
        named: list[tuple[str, os.DirEntry[str]]] = []
        for e in entries:
            if e.name.startswith("."):
                continue  # temporary files of writes in progress
            is_dir = e.is_dir(follow_symlinks=False)
            named.append((e.name + "/" if is_dir else e.name, e))
        named.sort(key=lambda t: t[0])
        for name, e in named:
            key = key_prefix + name
            if name.endswith("/"):
                if key.startswith(prefix) or prefix.startswith(key):
                    yield from self._walk(Path(e.path), key, prefix)
            elif key.startswith(prefix):
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted since the scan
                yield ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000)


def _translate(exc: OSError, key: str) -> ObjectStoreError:
    if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return ObjectNotFound(key)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
        return ObjectStoreUnavailable(f"{key!r}: {exc}")
    return ObjectStoreError(f"{key!r}: {exc}")
