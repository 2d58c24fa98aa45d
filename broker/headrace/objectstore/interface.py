"""The object store contract: what every adapter promises.

No I/O of its own (only ``put_file`` reads the local file it is given). The
adapters (``directory``, ``minio_store``) implement ``ObjectStore``; callers
that want retries wrap one in ``retrying.RetryingStore``. The errors
(``objectstore.errors``) and the key rule (``objectstore.keys``) are pure
modules of their own (a pure core such as the tier layout needs them without a
store); import them from there.

Contract, for every implementation:

- Keys are ``/``-separated UTF-8 strings checked by ``validate_key`` (the same
  rule everywhere, so a key that works in local mode works against S3).
- ``put`` is atomic and idempotent: a reader sees the old object, or the whole
  new one, never a part. Putting the same bytes twice is harmless; putting
  different bytes replaces the object.
- ``get``/``get_range``/``stat`` raise ``ObjectNotFound`` for a missing key.
- ``get_range(key, start, length)`` returns ``data[start:start + length]``:
  short at the end of the object, empty at or past it.
- ``list(prefix)`` yields every object whose key starts with ``prefix`` (a raw
  string prefix, not only whole segments), in lexicographic order of the key's
  code points (which is also S3's UTF-8 byte order), with sizes and, where the
  store keeps it, the time of the last write.
- ``delete`` is idempotent: deleting a missing key succeeds. ``delete_many``
  is the same for several keys, in no particular order (S3's multi-object
  delete: one request per 1,000 keys); when it fails, some of the keys may be
  gone already, so callers that care about order delete in steps.
- ``get_versioned`` and ``put_if_version`` are the one conditional write: a put
  that happens only if the object is still the version read (S3's ``If-Match``
  on the ETag; ``None`` means "only if absent", ``If-None-Match: *``). A store
  without them raises ``ObjectStoreRejected``. The compaction job swaps a
  manifest with it, so a leader's concurrent manifest put is never overwritten.
- Failures are ``ObjectStoreError`` subclasses; ``retriable`` says whether the
  same call may succeed later (``ObjectStoreUnavailable``) or not
  (``ObjectNotFound``, ``InvalidObjectKey``, ...).

The API is blocking: the MinIO client is, Spark executors want it so, and the
broker's uploader runs it in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from headrace.objectstore.errors import ObjectNotFound, ObjectStoreError, ObjectStoreRejected
from headrace.objectstore.keys import validate_key

# --- the interface ---


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object as ``stat`` and ``list`` see it."""

    key: str
    #: Length of the object in bytes.
    size: int
    #: When it was last written, ms since the Unix epoch (S3's Last-Modified, a file's
    #: mtime); None if the store did not say. The orphan sweep's grace period needs it.
    modified_ms: int | None = field(default=None, compare=False)


class ObjectStore(abc.ABC):
    """A flat key -> bytes store with the contract in this module's docstring.

    Implementations must be safe to call from several threads at once.
    """

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, atomically replacing any object there."""

    @abc.abstractmethod
    def put_stream(self, key: str, stream: BinaryIO, size: int | None = None) -> None:
        """Store what ``stream`` yields until EOF (or ``size`` bytes) without
        holding it all in memory; large objects go up in parts. Atomic like ``put``.

        The stream is read from its current position. ``size``, when known,
        lets an adapter plan its parts; a stream shorter than ``size`` is an error.
        """

    def put_file(self, key: str, path: Path) -> None:
        """Store the contents of a local file (a sealed segment, say)."""
        with path.open("rb") as f:
            self.put_stream(key, f, path.stat().st_size)

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from offset ``start`` (fewer at the end of the object)."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""

    def delete_many(self, object_keys: Iterable[str]) -> None:
        """Remove every object of ``object_keys``, in any order; missing keys are
        not an error. Every key is checked before any is deleted, and every one is
        tried: the first failure is raised at the end."""
        failed: ObjectStoreError | None = None
        for key in [validate_key(key) for key in object_keys]:
            try:
                self.delete(key)
            except ObjectStoreError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size of the object; ``ObjectNotFound`` if there is none."""

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """The whole object and an opaque version token for ``put_if_version``."""
        raise ObjectStoreRejected(f"{type(self).__name__} has no conditional writes")

    def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """Store ``data`` only if the object is still at ``version`` (from
        ``get_versioned``; None: only if there is no object). False, and nothing
        written, if it is not."""
        raise ObjectStoreRejected(f"{type(self).__name__} has no conditional writes")

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except ObjectNotFound:
            return False
        return True

    def close(self) -> None:
        """Release connections or handles; the store is not used afterwards."""


def check_range(start: int, length: int) -> None:
    if start < 0 or length < 0:
        raise ValueError(f"range start and length must be >= 0, not {start}, {length}")
