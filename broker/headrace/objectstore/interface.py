"""The object store contract: what every adapter promises, and its errors.

Pure: no I/O here. The adapters (``directory``, ``minio_store``) implement
``ObjectStore``; callers that want retries wrap one in
``retrying.RetryingStore``.

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
  code points (which is also S3's UTF-8 byte order), with sizes.
- ``delete`` is idempotent: deleting a missing key succeeds.
- Failures are ``ObjectStoreError`` subclasses; ``retriable`` says whether the
  same call may succeed later (``ObjectStoreUnavailable``) or not
  (``ObjectNotFound``, ``InvalidObjectKey``, ...).

The API is blocking: the MinIO client is, Spark executors want it so, and the
broker's uploader runs it in a worker thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from headrace.errors import HeadraceError

#: S3's limit on a key's length, in UTF-8 bytes.
MAX_KEY_BYTES = 1024


# --- errors (codes 70-79; not wire errors, so not in headrace.errors' registry) ---


class ObjectStoreError(HeadraceError):
    """The object store failed; unless a subclass says otherwise, try again later."""

    CODE = 70
    retriable = True


class ObjectNotFound(ObjectStoreError):
    """No object has this key (or, for a bucket store, the bucket has none)."""

    CODE = 71
    retriable = False


class ObjectStoreUnavailable(ObjectStoreError):
    """The store could not be reached or is overloaded: refused, reset, timed out, 5xx."""

    CODE = 72
    retriable = True


class InvalidObjectKey(ObjectStoreError):
    """The key breaks the key rules (``validate_key``) or clashes with the store's layout."""

    CODE = 73
    retriable = False


class ObjectStoreAccessDenied(ObjectStoreError):
    """Credentials were refused; retrying with the same ones will not help."""

    CODE = 74
    retriable = False


class ObjectStoreRejected(ObjectStoreError):
    """The store refused the request for another reason (missing bucket, bad argument)."""

    CODE = 75
    retriable = False


ERROR_CLASSES: tuple[type[ObjectStoreError], ...] = (
    ObjectStoreError,
    ObjectNotFound,
    ObjectStoreUnavailable,
    InvalidObjectKey,
    ObjectStoreAccessDenied,
    ObjectStoreRejected,
)


# --- keys ---


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``InvalidObjectKey``.

    The rule is stricter than S3's so that every key is also a safe relative
    path for ``DirectoryStore``: non-empty segments separated by single ``/``;
    no leading or trailing ``/``; no segment that starts with ``.`` (which
    rules out ``.`` and ``..`` and leaves hidden names to the adapters' own
    temporary files); no backslash, NUL or other control characters; at most
    ``MAX_KEY_BYTES`` bytes of UTF-8.
    """
    if not key:
        raise InvalidObjectKey("object key is empty")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidObjectKey(f"object key is longer than {MAX_KEY_BYTES} bytes")
    if any(ord(c) < 0x20 or c == "\x7f" or c == "\\" for c in key):
        raise InvalidObjectKey(f"object key {key!r} has a control character or backslash")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in key):
        raise InvalidObjectKey(f"object key {key!r} is not valid UTF-8")
    for segment in key.split("/"):
        if not segment:
            raise InvalidObjectKey(
                f"object key {key!r} has an empty segment (or a leading, trailing or double /)"
            )
        if segment.startswith("."):
            raise InvalidObjectKey(f"object key {key!r} has a segment starting with '.'")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or the beginning of some valid key."""
    if not prefix:
        return prefix
    # A prefix may end inside a segment or right after a '/'; check it as the
    # key it would be with a neutral character appended.
    validate_key(prefix + "x" if prefix.endswith("/") else prefix)
    return prefix


# --- the interface ---


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object as ``stat`` and ``list`` see it."""

    key: str
    #: Length of the object in bytes.
    size: int


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

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size of the object; ``ObjectNotFound`` if there is none."""

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
