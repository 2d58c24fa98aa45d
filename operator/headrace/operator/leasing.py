"""One active operator replica: a ``coordination.k8s.io/v1`` Lease.

Why a Lease and not kopf's peering: with peering, replicas of *equal*
priority only warn about each other and both keep handling (kopf freezes
only the lower priority), so two replicas of one Deployment would both be
active. A Lease is the standard leader election: the replica holding an
unexpired Lease is active; another one that starts waits, retrying, until the
holder stops renewing. The Lease is written with the ``resourceVersion`` it
was read at, so two replicas racing for an expired Lease cannot both win.

The rules are client-go's ``leaderelection``:

- **Expiry is judged by the observer's own clock.** A waiting replica notes
  when it first saw the Lease record it holds now (its ``resourceVersion``);
  the holder is presumed gone once that record has not changed for
  ``duration_seconds`` on the waiting replica's monotonic clock. The holder's
  ``renewTime`` is another machine's wall clock and is never compared with
  ours.
- **The holder stops acting before anyone may take over.** It counts as
  leading only while its last successful renewal is younger than
  ``renew_deadline_seconds``, which is shorter than the duration. A renewal
  that fails is retried every ``retry_seconds`` until that deadline; then the
  holder gives up (``lost``). ``leading()`` is checked before every write
  the operator makes (``FencedApi``), so a replica that was paused (SIGSTOP,
  a frozen VM) past its deadline writes nothing when it wakes, even before
  its renewal thread has run.
- **Every Lease call has a timeout**, so a hung connection cannot keep the
  holder from learning that it can no longer renew.

A Lease is still not a perfect fence (a write can be in flight when the
holder is paused), which is why every status write is also compare-and-swap
(``statuses``). The holder renews every ``renew_seconds``: those renewals are
the operator's only writes on an idle cluster.

``may_acquire`` is the pure rule; ``LeaseElector`` does the API calls (the
official client, synchronous: it runs before kopf starts and then in a thread).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _time(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The Lease as read: who holds it, and the version that identifies this record."""

    resource_version: str
    holder: str | None
    duration_seconds: int
    acquire_time: dt.datetime | None
    transitions: int


@dataclass(frozen=True, slots=True)
class Observation:
    """A Lease record and when this replica first saw it (its own monotonic clock)."""

    record: LeaseRecord
    seen_at: float


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """The observation after reading ``record`` at ``now``: a record unchanged since the
    last read keeps its first sighting, a changed one (a renewal) starts anew."""
    if previous is not None and previous.record.resource_version == record.resource_version:
        return previous
    return Observation(record, now)


def may_acquire(seen: Observation, identity: str, now: float) -> bool:
    """Whether ``identity`` may take (or keep) the Lease it observed as ``seen``.

    Its own Lease, a Lease nobody holds, or one whose record has not changed for its
    ``leaseDurationSeconds`` since this replica first saw it.
    """
    holder = seen.record.holder
    if not holder or holder == identity:
        return True
    return now - seen.seen_at > seen.record.duration_seconds


#: a holder that has not renewed for this long is presumed gone: long enough that a busy
#: API server does not cost the Lease, short enough that a crashed replica is replaced soon
DEFAULT_LEASE_SECONDS = 60


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    namespace: str = "default"
    name: str = "headrace-operator"
    #: seconds: a holder whose record has not changed for this long is presumed gone
    duration_seconds: int = DEFAULT_LEASE_SECONDS
    #: seconds: the holder stops acting once its last successful renewal is this old.
    #: Shorter than the duration by more than a renewal's timeout, so the holder has
    #: stopped before any successor may start (client-go uses 2/3 of the duration)
    renew_deadline_seconds: float = DEFAULT_LEASE_SECONDS * 2 / 3
    #: seconds: renew this often (several tries fit before the deadline)
    renew_seconds: float = DEFAULT_LEASE_SECONDS / 6
    #: seconds: how often a waiting replica retries, and a failed renewal is retried
    retry_seconds: float = 2.0
    #: seconds: the longest one Lease API call may take
    request_timeout_seconds: float = 5.0

    @classmethod
    def for_duration(cls, namespace: str, name: str, duration_seconds: int) -> LeaseSettings:
        """Settings whose deadline and periods scale with ``duration_seconds``."""
        return cls(
            namespace=namespace,
            name=name,
            duration_seconds=duration_seconds,
            renew_deadline_seconds=duration_seconds * 2 / 3,
            renew_seconds=duration_seconds / 6,
            retry_seconds=min(2.0, duration_seconds / 10),
            request_timeout_seconds=min(5.0, duration_seconds / 6),
        )

    def __post_init__(self) -> None:
        if not (self.request_timeout_seconds < self.renew_deadline_seconds < self.duration_seconds):
            raise ValueError(
                "lease settings need request timeout < renew deadline < duration, got"
                f" {self.request_timeout_seconds} s, {self.renew_deadline_seconds} s and"
                f" {self.duration_seconds} s"
            )


class LeaseElector:
    def __init__(
        self,
        coordination: Any,
        identity: str,
        settings: LeaseSettings,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``coordination``: the official client's ``CoordinationV1Api`` (``over``), or
        anything with its three Lease calls."""
        # the client's generated models are only partly typed: treat it as untyped
        self.api: Any = coordination
        self.identity = identity
        self.settings = settings
        self._monotonic = monotonic
        #: Lease writes made (acquisitions and renewals), for the idle-writes figure
        self.writes = 0
        #: the Lease record as this replica last read it, and when it first saw it
        self._seen: Observation | None = None
        #: monotonic time of the last successful acquisition or renewal (None: never)
        self._renewed_at: float | None = None

    @classmethod
    def over(cls, api_client: Any, identity: str, settings: LeaseSettings) -> LeaseElector:
        """An elector over an official-client ``ApiClient``."""
        from kubernetes import client

        return cls(client.CoordinationV1Api(api_client), identity, settings)

    def leading(self) -> bool:
        """Whether this replica may act: it holds the Lease and renewed it within the
        renew deadline, by its own monotonic clock."""
        renewed = self._renewed_at
        return (
            renewed is not None
            and self._monotonic() - renewed < self.settings.renew_deadline_seconds
        )

    def _read(self) -> LeaseRecord | None:
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        try:
            lease = self.api.read_namespaced_lease(
                s.name, s.namespace, _request_timeout=s.request_timeout_seconds
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        spec = lease.spec
        return LeaseRecord(
            resource_version=str(lease.metadata.resource_version),
            holder=getattr(spec, "holder_identity", None),
            duration_seconds=int(getattr(spec, "lease_duration_seconds", None) or 0),
            acquire_time=_time(getattr(spec, "acquire_time", None)),
            transitions=int(getattr(spec, "lease_transitions", None) or 0),
        )

    def try_acquire(self) -> bool:
        """Take or renew the Lease if ``may_acquire``; False if another replica holds it."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        started = self._monotonic()
        now = _now()
        record = self._read()
        if record is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": s.name, "namespace": s.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self.api.create_namespaced_lease(
                    s.namespace, body, _request_timeout=s.request_timeout_seconds
                )
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False  # another replica created it first
                raise
            self._won(started)
            return True
        self._seen = observe(self._seen, record, started)
        if not may_acquire(self._seen, self.identity, started):
            return False
        ours = record.holder == self.identity
        acquired = record.acquire_time if ours else now
        transitions = record.transitions + (0 if ours else 1)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": s.name,
                "namespace": s.namespace,
                "resourceVersion": record.resource_version,
            },
            "spec": self._spec(acquired or now, now, transitions),
        }
        try:
            self.api.replace_namespaced_lease(
                s.name, s.namespace, body, _request_timeout=s.request_timeout_seconds
            )
        except ApiException as exc:
            if exc.status == 409:
                return False  # changed meanwhile: someone else renewed or took it
            raise
        self._won(started)
        return True

    def _won(self, started: float) -> None:
        """A write of ours was accepted: leading counts from when the attempt *started*
        (the renewal may have taken up to its timeout)."""
        self.writes += 1
        self._renewed_at = started
        self._seen = None

    def _spec(
        self, acquired: dt.datetime, renewed: dt.datetime, transitions: int
    ) -> dict[str, Any]:
        def stamp(when: dt.datetime) -> str:
            return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.settings.duration_seconds,
            "acquireTime": stamp(acquired),
            "renewTime": stamp(renewed),
            "leaseTransitions": transitions,
        }

    def release(self) -> None:
        """Give the Lease up on a clean exit, so a successor need not wait for it to expire."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        self._renewed_at = None  # acts no more, whatever the release's outcome
        try:
            record = self._read()
            if record is None or record.holder != self.identity:
                return
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": s.name,
                    "namespace": s.namespace,
                    "resourceVersion": record.resource_version,
                },
                "spec": {**self._spec(_now(), _now(), 0), "holderIdentity": None},
            }
            self.api.replace_namespaced_lease(
                s.name, s.namespace, body, _request_timeout=s.request_timeout_seconds
            )
            self.writes += 1
            log.info("lease %s released", s.name)
        except (ApiException, OSError) as exc:
            log.warning("lease %s: release failed (%s); it expires on its own", s.name, exc)

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until the Lease is ours (True), or ``stop`` is set (False)."""
        waiting_logged = False
        while stop is None or not stop.is_set():
            try:
                if self.try_acquire():
                    log.info("lease %s acquired by %s", self.settings.name, self.identity)
                    return True
            except Exception:
                log.exception("lease %s: acquiring failed", self.settings.name)
            if not waiting_logged:
                log.info("lease %s is held by another replica: waiting", self.settings.name)
                waiting_logged = True
            time.sleep(self.settings.retry_seconds)
        return False

    def keep(self, lost: Callable[[], None], stop: threading.Event) -> threading.Thread:
        """Renew in a thread; call ``lost`` once a renewal is refused, or once the renew
        deadline passes without a successful renewal."""
        thread = threading.Thread(target=self.renew_until_lost, args=(lost, stop), daemon=True)
        thread.name = "lease"
        thread.start()
        return thread

    def renew_until_lost(self, lost: Callable[[], None], stop: threading.Event) -> None:
        s = self.settings
        wait = s.renew_seconds
        while not stop.wait(wait):
            try:
                if self.try_acquire():
                    wait = s.renew_seconds
                    continue
                log.error("lease %s was taken by another replica", s.name)
            except Exception:
                log.exception("lease %s: renewal failed", s.name)
                if self.leading():
                    renewed = self._renewed_at or 0.0
                    left = s.renew_deadline_seconds - (self._monotonic() - renewed)
                    wait = max(0.0, min(s.retry_seconds, left))
                    continue
            self._renewed_at = None
            lost()
            return
        return
