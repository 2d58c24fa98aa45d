"""The Lease rules, as client-go's leader election has them: expiry judged by the
observer's own clock, a holder that stops acting at its renew deadline, and no write
from a replica that does not lead (``FencedApi``).

The elector talks to a small in-memory stand-in for the Lease API (read, create,
replace under a ``resourceVersion`` precondition): the narrow unit level. Time is a
fake monotonic clock, moved by the test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from headrace.operator.kube import FencedApi, NotLeading, ObjectRef
from headrace.operator.leasing import (
    LeaseElector,
    LeaseRecord,
    LeaseSettings,
    Observation,
    may_acquire,
    observe,
)

SETTINGS = LeaseSettings.for_duration("ns", "op", 60)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LeaseStore:
    """One Lease, stored as the API server would: a replace names the resourceVersion it
    read, and a stale one is refused with 409."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Any:
        assert kw.get("_request_timeout"), "every Lease call has a timeout"
        if self.down:
            raise ApiException(status=503)
        if self.spec is None:
            raise ApiException(status=404)
        spec = SimpleNamespace(
            holder_identity=self.spec["holderIdentity"],
            lease_duration_seconds=self.spec["leaseDurationSeconds"],
            acquire_time=self.spec["acquireTime"],
            lease_transitions=self.spec["leaseTransitions"],
        )
        return SimpleNamespace(
            spec=spec, metadata=SimpleNamespace(resource_version=str(self.version))
        )

    def create_namespaced_lease(self, namespace: str, body: Mapping[str, Any], **kw: Any) -> None:
        assert kw.get("_request_timeout")
        if self.spec is not None:
            raise ApiException(status=409)
        self.spec, self.version = dict(body["spec"]), self.version + 1

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: Mapping[str, Any], **kw: Any
    ) -> None:
        assert kw.get("_request_timeout")
        if self.down:
            raise ApiException(status=503)
        if body["metadata"]["resourceVersion"] != str(self.version):
            raise ApiException(status=409)
        self.spec, self.version = dict(body["spec"]), self.version + 1


def elector(store: LeaseStore, identity: str, clock: Callable[[], float]) -> LeaseElector:
    return LeaseElector(store, identity, SETTINGS, monotonic=clock)


def record(version: str, holder: str | None) -> LeaseRecord:
    return LeaseRecord(version, holder, 60, None, 0)


def test_expiry_counts_from_the_observers_first_sighting_of_an_unchanged_record() -> None:
    seen = observe(None, record("7", "other"), now=0.0)
    assert not may_acquire(seen, "me", 59.0)
    seen = observe(seen, record("7", "other"), now=59.0)  # unchanged: the first sighting holds
    assert may_acquire(seen, "me", 61.0)
    renewed = observe(seen, record("8", "other"), now=61.0)  # a renewal: counting starts anew
    assert renewed == Observation(record("8", "other"), 61.0)
    assert not may_acquire(renewed, "me", 100.0)


@pytest.mark.parametrize("holder", [None, "", "me"])
def test_a_free_lease_or_ones_own_is_always_available(holder: str | None) -> None:
    assert may_acquire(observe(None, record("1", holder), 0.0), "me", 0.0)


def test_a_successor_ignores_the_holders_renew_time_and_waits_out_its_own_observation() -> None:
    store, clock = LeaseStore(), FakeClock()
    holder = elector(store, "a", clock)
    assert holder.try_acquire()
    store.spec = {**(store.spec or {}), "renewTime": "2001-01-01T00:00:00.000000Z"}  # skewed
    successor = elector(store, "b", clock)
    assert not successor.try_acquire()
    clock.now += 59
    assert not successor.try_acquire()
    clock.now += 2
    assert successor.try_acquire()
    assert store.spec is not None and store.spec["holderIdentity"] == "b"
    assert store.spec["leaseTransitions"] == 1


def test_a_holder_that_keeps_renewing_keeps_the_lease() -> None:
    store, clock = LeaseStore(), FakeClock()
    holder, successor = elector(store, "a", clock), elector(store, "b", clock)
    assert holder.try_acquire()
    for _ in range(10):
        assert not successor.try_acquire()
        clock.now += SETTINGS.renew_seconds
        assert holder.try_acquire()
    assert holder.leading() and not successor.leading()


def test_the_holder_stops_leading_at_its_renew_deadline_before_anyone_may_take_over() -> None:
    store, clock = LeaseStore(), FakeClock()
    holder, successor = elector(store, "a", clock), elector(store, "b", clock)
    assert holder.try_acquire()
    assert not successor.try_acquire()  # the successor's first sighting
    clock.now += SETTINGS.renew_deadline_seconds - 0.1
    assert holder.leading()
    clock.now += 0.2
    assert not holder.leading()  # stopped acting...
    assert not successor.try_acquire()  # ...while the successor still waits
    clock.now += SETTINGS.duration_seconds - SETTINGS.renew_deadline_seconds
    assert successor.try_acquire()


def test_a_paused_holder_writes_nothing_when_it_wakes() -> None:
    store, clock = LeaseStore(), FakeClock()
    holder = elector(store, "a", clock)
    assert holder.try_acquire()
    writes: list[str] = []

    class Inner:
        async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
            return {"read": ref.name}

        async def replace_status(self, ref: ObjectRef, version: str, status: Any) -> None:
            writes.append(ref.name)

    api = FencedApi(Inner(), holder.leading)  # type: ignore[arg-type]
    ref = ObjectRef("headrace.dev/v1alpha1", "Topic", "ns", "orders")

    asyncio.run(api.replace_status(ref, "1", {}))
    assert writes == ["orders"]
    clock.now += 120  # SIGSTOP past the lease, then SIGCONT: its renewal thread has not run
    with pytest.raises(NotLeading):
        asyncio.run(api.replace_status(ref, "1", {}))
    assert asyncio.run(api.get(ref)) == {"read": "orders"}  # reads still pass
    assert writes == ["orders"]


def test_renewals_that_fail_until_the_deadline_lose_the_lease() -> None:
    store = LeaseStore()
    holder = LeaseElector(store, "a", LeaseSettings.for_duration("ns", "op", 3))
    assert holder.try_acquire()
    store.down = True  # the API server stops answering the holder
    lost = threading.Event()
    stop = threading.Event()
    thread = holder.keep(lost.set, stop)
    try:
        assert lost.wait(timeout=30), "the holder never gave up"
        assert not holder.leading()
    finally:
        stop.set()
        thread.join(timeout=10)


def test_settings_keep_the_timeout_inside_the_deadline_inside_the_duration() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaseSettings(duration_seconds=10, renew_deadline_seconds=10)
    for duration in (3, 15, 60, 600):
        LeaseSettings.for_duration("ns", "op", duration)  # valid for any sensible duration
