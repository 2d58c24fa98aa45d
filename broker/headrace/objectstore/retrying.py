"""Retries with exponential backoff and jitter around any ``ObjectStore``.

Only errors whose ``retriable`` flag is set are retried; ``ObjectNotFound``,
``InvalidObjectKey`` and the like go straight to the caller. The clock, the
sleep and the random source are passed in so tests drive time by hand.

The delay before retry ``n`` (``n`` = 1, 2, ...) is
``min(max_backoff, initial_backoff * multiplier ** (n - 1))`` scaled by a
random factor in ``[1 - jitter, 1]``. With ``jitter = 1`` that is "full
jitter": many clients that failed together do not come back together.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from headrace.objectstore import keys
from headrace.objectstore.errors import ObjectStoreError
from headrace.objectstore.interface import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """How hard to try. The defaults ride out a MinIO restart (a few seconds)
    without holding an upload for longer than the broker's request timeouts."""

    #: Tries in all, the first included; 1 disables retrying.
    attempts: int = 6
    #: Delay before the first retry, in seconds: long enough for a refused
    #: connection not to become a busy loop.
    initial_backoff: float = 0.1
    #: Each retry's delay is the previous one times this.
    multiplier: float = 2.0
    #: Upper bound of one delay, in seconds.
    max_backoff: float = 5.0
    #: Fraction of each delay that is randomised, 0..1 (1 = full jitter).
    jitter: float = 1.0
    #: Give up once this many seconds have passed since the first try, even
    #: with attempts left; None for no limit.
    deadline: float | None = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be >= 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoffs must be >= 0 and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within 0..1")

    def backoff(self, retry: int, rand: float) -> float:
        """Delay in seconds before retry number ``retry`` (1-based); ``rand`` in [0, 1)."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (retry - 1))
        return base * (1.0 - self.jitter * rand)


class Retrier:
    """Runs a call until it succeeds, fails for good, or the budget is spent."""

    def __init__(
        self,
        settings: RetrySettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings or RetrySettings()
        self._clock = clock
        self._sleep = sleep
        self._rand = rand

    def call(
        self, what: str, fn: Callable[[], T], *, before_retry: Callable[[], object] | None = None
    ) -> T:
        """``fn()``, retried on retriable ``ObjectStoreError``s; the last error is raised.

        ``before_retry`` runs before each new try (to rewind a stream, say); if
        it raises, that error ends the retrying.
        """
        s = self.settings
        started = self._clock()
        retry = 0
        while True:
            try:
                return fn()
            except ObjectStoreError as exc:
                if not exc.retriable:
                    raise
                retry += 1
                if retry >= s.attempts:
                    raise
                delay = s.backoff(retry, self._rand())
                if s.deadline is not None and self._clock() + delay - started > s.deadline:
                    raise
                log.warning(
                    "object store %s failed (%s); retry %d in %.3f s", what, exc, retry, delay
                )
                self._sleep(delay)
                if before_retry is not None:
                    before_retry()


class RetryingStore(ObjectStore):
    """An ``ObjectStore`` that retries the calls of another one.

    A listing that fails part-way is resumed after the last key it yielded. A
    streamed put is retried only if the stream can be rewound (``seekable``).
    """

    def __init__(self, inner: ObjectStore, retrier: Retrier | None = None) -> None:
        self.inner = inner
        self.retrier = retrier or Retrier()

    def put(self, key: str, data: bytes) -> None:
        self.retrier.call("put", lambda: self.inner.put(key, data))

    def put_stream(self, key: str, stream: BinaryIO, size: int | None = None) -> None:
        if not stream.seekable():
            self.inner.put_stream(key, stream, size)
            return
        start = stream.tell()
        self.retrier.call(
            "put",
            lambda: self.inner.put_stream(key, stream, size),
            before_retry=lambda: stream.seek(start),
        )

    def put_file(self, key: str, path: Path) -> None:
        self.retrier.call("put", lambda: self.inner.put_file(key, path))

    def get(self, key: str) -> bytes:
        return self.retrier.call("get", lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.retrier.call("get", lambda: self.inner.get_range(key, start, length))

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        return self.retrier.call("get", lambda: self.inner.get_versioned(key))

    def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        # A retry after a put whose answer was lost finds the version changed
        # (by that put) and answers False: callers re-read to tell the cases apart.
        return self.retrier.call("put", lambda: self.inner.put_if_version(key, data, version))

    def stat(self, key: str) -> ObjectInfo:
        return self.retrier.call("stat", lambda: self.inner.stat(key))

    def delete(self, key: str) -> None:
        self.retrier.call("delete", lambda: self.inner.delete(key))

    def delete_many(self, object_keys: Iterable[str]) -> None:
        batch = list(object_keys)  # a retry deletes all of them again: deleting is idempotent
        self.retrier.call("delete_many", lambda: self.inner.delete_many(batch))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        keys.validate_prefix(prefix)
        last: str | None = None
        listing: list[Iterator[ObjectInfo]] = []  # the open listing, if any

        def step() -> ObjectInfo | None:
            # Each item is one retried call. A failure drops the listing; the
            # retry opens a new one and skips what was already yielded.
            if not listing:
                listing.append(self.inner.list(prefix))
            try:
                for info in listing[0]:
                    if last is None or info.key > last:
                        return info
                return None
            except ObjectStoreError:
                listing.clear()
                raise

        while True:
            found = self.retrier.call("list", step)
            if found is None:
                return
            yield found
            last = found.key

    def close(self) -> None:
        self.inner.close()
