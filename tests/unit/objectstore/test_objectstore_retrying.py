"""Retries with backoff and jitter, driven by a fake clock (no real sleeping)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO

import pytest

from headrace.objectstore import errors, retrying
from headrace.objectstore.errors import ObjectNotFound, ObjectStoreUnavailable
from headrace.objectstore.interface import ObjectInfo, ObjectStore


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def retrier(t: FakeTime, rand: float = 0.0, **kw: object) -> retrying.Retrier:
    settings = retrying.RetrySettings(**kw)  # type: ignore[arg-type]
    return retrying.Retrier(settings, clock=t.clock, sleep=t.sleep, rand=lambda: rand)


class Flaky:
    """Fails `failures` times with `error`, then returns 'ok'."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or ObjectStoreUnavailable("down")
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    s = retrying.RetrySettings(initial_backoff=0.1, multiplier=2, max_backoff=1.0, jitter=0)
    assert [s.backoff(n, 0.5) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_jitter_scales_each_delay_down_by_at_most_the_jitter_fraction() -> None:
    s = retrying.RetrySettings(initial_backoff=1.0, multiplier=2, max_backoff=100, jitter=0.5)
    assert s.backoff(3, 0.0) == pytest.approx(4.0)
    assert s.backoff(3, 0.999) == pytest.approx(2.002)
    full = retrying.RetrySettings(initial_backoff=1.0, jitter=1.0)
    assert full.backoff(1, 0.75) == pytest.approx(0.25)


def test_retriable_errors_are_retried_with_the_computed_delays() -> None:
    t = FakeTime()
    fn = Flaky(3)
    assert retrier(t, initial_backoff=0.1, multiplier=3, jitter=0).call("get", fn) == "ok"
    assert fn.calls == 4
    assert t.sleeps == pytest.approx([0.1, 0.3, 0.9])


def test_jittered_delays_use_the_random_source() -> None:
    t = FakeTime()
    retrier(t, rand=0.5, initial_backoff=1.0, jitter=1.0).call("get", Flaky(2))
    assert t.sleeps == pytest.approx([0.5, 1.0])


@pytest.mark.parametrize(
    "error",
    [
        ObjectNotFound("k"),
        errors.InvalidObjectKey("k"),
        errors.ObjectStoreAccessDenied("k"),
        errors.ObjectStoreRejected("k"),
    ],
)
def test_errors_that_are_not_retriable_surface_at_once(error: Exception) -> None:
    t = FakeTime()
    fn = Flaky(1, error)
    with pytest.raises(type(error)):
        retrier(t).call("get", fn)
    assert fn.calls == 1 and t.sleeps == []


def test_other_exceptions_are_not_retried() -> None:
    t = FakeTime()
    fn = Flaky(1, KeyError("bug"))
    with pytest.raises(KeyError):
        retrier(t).call("get", fn)
    assert fn.calls == 1


def test_gives_up_after_the_attempts() -> None:
    t = FakeTime()
    fn = Flaky(10)
    with pytest.raises(ObjectStoreUnavailable):
        retrier(t, attempts=4, deadline=None).call("get", fn)
    assert fn.calls == 4 and len(t.sleeps) == 3


def test_gives_up_before_sleeping_past_the_deadline() -> None:
    t = FakeTime()
    fn = Flaky(100)
    with pytest.raises(ObjectStoreUnavailable):
        retrier(
            t, attempts=100, initial_backoff=1, multiplier=2, max_backoff=8, jitter=0, deadline=20
        ).call("get", fn)
    # 1 + 2 + 4 + 8 = 15 s slept; the next 8 s would end past 20 s
    assert t.sleeps == [1, 2, 4, 8]
    assert t.now - 1000.0 <= 20


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="attempts"):
        retrying.RetrySettings(attempts=0)
    with pytest.raises(ValueError, match="jitter"):
        retrying.RetrySettings(jitter=1.5)


class ScriptedStore(ObjectStore):
    """A store whose calls fail on a script: a list of booleans, True = fail."""

    def __init__(self, script: list[bool], keys: list[str] | None = None) -> None:
        self.script = script
        self.keys = keys or []
        self.data: dict[str, bytes] = {}
        self.put_bodies: list[bytes] = []

    def _maybe_fail(self) -> None:
        if self.script and self.script.pop(0):
            raise ObjectStoreUnavailable("scripted")

    def put(self, key: str, data: bytes) -> None:
        self._maybe_fail()
        self.data[key] = data

    def put_stream(self, key: str, stream: BinaryIO, size: int | None = None) -> None:
        body = stream.read(2)
        self.put_bodies.append(body)
        self._maybe_fail()
        self.data[key] = body + stream.read()

    def get(self, key: str) -> bytes:
        self._maybe_fail()
        return self.data[key]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._maybe_fail()
        return self.data[key][start : start + length]

    def stat(self, key: str) -> ObjectInfo:
        self._maybe_fail()
        return ObjectInfo(key, len(self.data[key]))

    def delete(self, key: str) -> None:
        self._maybe_fail()
        self.data.pop(key, None)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._maybe_fail()
        for k in self.keys:
            self._maybe_fail()
            yield ObjectInfo(k, 0)


def retrying_store(inner: ObjectStore, t: FakeTime) -> retrying.RetryingStore:
    return retrying.RetryingStore(inner, retrier(t, attempts=5, initial_backoff=0.01))


def test_store_calls_are_retried() -> None:
    t = FakeTime()
    inner = ScriptedStore([True, False, True, True, False, True, False, True, False])
    s = retrying_store(inner, t)
    s.put("k", b"abc")
    assert s.get("k") == b"abc"
    assert s.get_range("k", 1, 1) == b"b"
    assert s.stat("k").size == 3
    assert len(t.sleeps) == 5


def test_streamed_put_rewinds_before_a_retry() -> None:
    t = FakeTime()
    inner = ScriptedStore([True, True, False])
    stream = io.BytesIO(b"..payload")
    stream.read(2)  # the caller's position is where the object starts
    retrying_store(inner, t).put_stream("k", stream)
    assert inner.put_bodies == [b"pa", b"pa", b"pa"]
    assert inner.data["k"] == b"payload"


def test_an_unrewindable_stream_is_not_retried() -> None:
    class OneWay(io.BytesIO):
        def seekable(self) -> bool:
            return False

    inner = ScriptedStore([True])
    with pytest.raises(ObjectStoreUnavailable):
        retrying_store(inner, FakeTime()).put_stream("k", OneWay(b"abc"))


def test_a_listing_that_fails_part_way_resumes_after_the_last_key() -> None:
    t = FakeTime()
    # open ok, a ok, b ok, c FAILS; reopen ok, a b c again (skipped), d ok, end
    script = [False, False, False, True, False, False, False, False, False]
    inner = ScriptedStore(script, keys=["a", "b", "c", "d"])
    assert [i.key for i in retrying_store(inner, t).list("")] == ["a", "b", "c", "d"]
    assert len(t.sleeps) == 1


def test_a_listing_that_fails_to_open_is_retried() -> None:
    t = FakeTime()
    inner = ScriptedStore([True, True], keys=["a"])
    assert [i.key for i in retrying_store(inner, t).list("")] == ["a"]
    assert len(t.sleeps) == 2
