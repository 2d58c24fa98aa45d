"""One active operator replica: a ``coordination.k8s.io/v1`` Lease.

Why a Lease and not kopf's peering: with peering, replicas of *equal*
priority only warn about each other and both keep handling (kopf freezes
only the lower priority), so two replicas of one Deployment would both be
active. A Lease is the standard leader election: the replica holding an
unexpired Lease is active; another one that starts waits, retrying, until the
holder stops renewing. The Lease is written with the ``resourceVersion`` it
was read at, so two replicas racing for an expired Lease cannot both win.

A Lease is not a fence either (a replica may be paused past its expiry with a
write in flight), which is why every status write is also compare-and-swap
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
from collections.abc import Callable, Mapping
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


def may_acquire(spec: Mapping[str, Any] | None, identity: str, now: dt.datetime) -> bool:
    """Whether ``identity`` may take (or keep) a Lease whose spec is ``spec``.

    Its own Lease, a Lease nobody holds, or one whose holder has not renewed it within
    ``leaseDurationSeconds``.
    """
    if not spec or not spec.get("holderIdentity"):
        return True
    if spec["holderIdentity"] == identity:
        return True
    renewed = _time(spec.get("renewTime")) or _time(spec.get("acquireTime"))
    duration = int(spec.get("leaseDurationSeconds") or 0)
    return renewed is None or renewed + dt.timedelta(seconds=duration) < now


#: a holder that has not renewed for this long is presumed gone: long enough that a busy
#: API server does not cost the Lease, short enough that a crashed replica is replaced soon
DEFAULT_LEASE_SECONDS = 60


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    namespace: str = "default"
    name: str = "headrace-operator"
    #: a holder that has not renewed for this long is presumed gone
    duration_seconds: int = DEFAULT_LEASE_SECONDS
    #: renew this often (well inside the duration, so one slow renewal does not lose it)
    renew_seconds: float = 20.0
    #: how often a waiting replica retries
    retry_seconds: float = 2.0


class LeaseElector:
    def __init__(self, api_client: Any, identity: str, settings: LeaseSettings) -> None:
        from kubernetes import client

        # the client's generated models are only partly typed: treat it as untyped
        self.api: Any = client.CoordinationV1Api(api_client)
        self.identity = identity
        self.settings = settings
        #: Lease writes made (acquisitions and renewals), for the idle-writes figure
        self.writes = 0

    def try_acquire(self) -> bool:
        """Take or renew the Lease if ``may_acquire``; False if another replica holds it."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        now = _now()
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": s.name, "namespace": s.namespace},
                "spec": self._spec(now, now, 0),
            }
            try:
                self.api.create_namespaced_lease(s.namespace, body)
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False  # another replica created it first
                raise
            self.writes += 1
            return True
        spec = lease.spec.to_dict() if lease.spec else {}
        spec = {
            "holderIdentity": spec.get("holder_identity"),
            "renewTime": spec.get("renew_time"),
            "acquireTime": spec.get("acquire_time"),
            "leaseDurationSeconds": spec.get("lease_duration_seconds"),
            "leaseTransitions": spec.get("lease_transitions") or 0,
        }
        if not may_acquire(spec, self.identity, now):
            return False
        ours = spec["holderIdentity"] == self.identity
        acquired = _time(spec["acquireTime"]) if ours else now
        transitions = spec["leaseTransitions"] + (0 if ours else 1)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": s.name,
                "namespace": s.namespace,
                "resourceVersion": lease.metadata.resource_version,
            },
            "spec": self._spec(acquired or now, now, transitions),
        }
        try:
            self.api.replace_namespaced_lease(s.name, s.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return False  # changed meanwhile: someone else renewed or took it
            raise
        self.writes += 1
        return True

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
        try:
            lease = self.api.read_namespaced_lease(s.name, s.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": s.name,
                    "namespace": s.namespace,
                    "resourceVersion": lease.metadata.resource_version,
                },
                "spec": {**self._spec(_now(), _now(), 0), "holderIdentity": None},
            }
            self.api.replace_namespaced_lease(s.name, s.namespace, body)
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
        """Renew in a thread; call ``lost`` once a renewal is refused or the Lease expires."""

        def renew() -> None:
            last = time.monotonic()
            while not stop.wait(self.settings.renew_seconds):
                try:
                    if self.try_acquire():
                        last = time.monotonic()
                        continue
                    log.error("lease %s was taken by another replica", self.settings.name)
                except Exception:
                    log.exception("lease %s: renewal failed", self.settings.name)
                    if time.monotonic() - last < self.settings.duration_seconds:
                        continue
                lost()
                return

        thread = threading.Thread(target=renew, name="lease", daemon=True)
        thread.start()
        return thread
