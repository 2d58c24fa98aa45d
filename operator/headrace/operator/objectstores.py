"""A BrokerCluster's object store as the operator sees it: credentials and reachability.

What breaks tiered storage gets a condition on the BrokerCluster (written by its ``ClusterRuntime`` through the
status store, so only a change costs a write):

* **the credentials Secret is missing** (or lacks a key the spec names). The
  operator has no right to read Secrets (least privilege: the chart grants none),
  so it learns this as the kubelet reports it: a broker pod waiting with reason
  ``CreateContainerConfigError`` whose message names the Secret. The cluster is
  then ``Ready=False``, reason ``CredentialsSecretMissing``, and ``Stalled`` (a
  person has to create the Secret). Nothing stored is lost: a pod that cannot start
  keeps its PVC, the StatefulSet's rolling update stops at the first such pod (the
  other brokers keep serving), and once the Secret exists the kubelet starts it.
* **the endpoint does not answer, or uploads fail**. Brokers keep serving when
  the store is down (uploads wait and retry; the local log keeps everything), so
  this is not a Ready matter: ``ObjectStoreReachable=False``, reason
  ``EndpointUnreachable`` when a TCP connect by the operator to the endpoint's
  host and port fails, else ``UploadsFailing`` when a leader's heartbeat reports
  ``uploadError`` (upload rounds failing in a row: wrong credentials, a missing
  bucket, a store reachable from the operator but not from the pods).

``credentials_problem``, ``upload_problem`` and ``endpoint_of`` are pure;
``StoreChecks`` does the TCP connect (in a task of its own) and decides when to check
again: every ``failing_recheck_s`` (5 s) while the endpoint does not answer, else every
``recheck_s`` (30 s), and at once when the spec changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from headrace.protocol.coordination import Heartbeat
from headrace.resources.clusters import ObjectStore

CREDENTIALS_MISSING: Final = "CredentialsSecretMissing"
UNREACHABLE: Final = "EndpointUnreachable"
UPLOADS_FAILING: Final = "UploadsFailing"
REACHABLE_CONDITION: Final = "ObjectStoreReachable"
#: the kubelet's reason for a container whose env or volumes cannot be resolved
CONFIG_ERROR: Final = "CreateContainerConfigError"


def credentials_problem(store: ObjectStore | None, pods: Iterable[Mapping[str, Any]]) -> str | None:
    """Why brokers cannot get their credentials from the Secret ``store`` names, as the
    kubelet says on the cluster's ``pods`` (None: no pod says so)."""
    if store is None or store.credentials_secret is None:
        return None
    name = store.credentials_secret.name
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            message = str(waiting.get("message") or "")
            if waiting.get("reason") == CONFIG_ERROR and (
                f'"{name}"' in message or f"/{name}" in message
            ):
                pod_name = (pod.get("metadata") or {}).get("name")
                return (
                    f"pod {pod_name} cannot start: {message} (objectStore.credentialsSecret"
                    f" {name!r} must exist with keys {store.credentials_secret.access_key_key!r}"
                    f" and {store.credentials_secret.secret_key_key!r})"
                )
    return None


def upload_problem(heartbeats: Mapping[int, Heartbeat]) -> str | None:
    """What the brokers' heartbeats say about failing uploads (None: nothing): the first
    few partitions whose leader reports ``uploadError``, and how many there are."""
    failing = [
        f"broker {broker_id}: {p.topic}/{p.partition}: {p.upload_error}"
        for broker_id, heartbeat in sorted(heartbeats.items())
        for p in heartbeat.partitions
        if p.upload_error is not None
    ]
    if not failing:
        return None
    more = f" (and {len(failing) - 3} more partitions)" if len(failing) > 3 else ""
    return "; ".join(failing[:3]) + more


def endpoint_of(store: ObjectStore) -> tuple[str, int]:
    """(host, port) of the store's endpoint URL; 80/443 when it names no port."""
    parts = urlsplit(store.endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What the operator found (None: fine, or not checked)."""

    credentials: str | None = None
    unreachable: str | None = None
    #: brokers' ``uploadError`` reports (``upload_problem``)
    uploads: str | None = None
    #: False until the first endpoint check of this spec has finished (``unreachable`` says
    #: nothing yet: the condition stays as stored)
    endpoint_known: bool = True


class StoreChecks:
    """The endpoint check of one cluster's object store and when to repeat it.

    The TCP connect runs as a task of its own, never inside a control-loop step: an
    endpoint that drops packets would otherwise hold every step for the connect timeout.
    A step reads the latest finished result.
    """

    def __init__(
        self,
        recheck_s: float = 30.0,
        failing_recheck_s: float = 5.0,
        connect_timeout_s: float = 2.0,
    ) -> None:
        self.recheck_s = recheck_s
        self.failing_recheck_s = failing_recheck_s
        self.connect_timeout_s = connect_timeout_s
        self.unreachable: str | None = None
        #: the spec the result is for (None: no result yet)
        self._result_for: str | None = None
        self._started: tuple[str, float] | None = None  # (what, when: monotonic)
        self._task: asyncio.Task[None] | None = None

    async def check(
        self,
        store: ObjectStore | None,
        pods: Iterable[Mapping[str, Any]],
        heartbeats: Mapping[int, Heartbeat] | None = None,
    ) -> StoreHealth:
        """The store's health as last found; starts an endpoint check when one is due."""
        if store is None:
            self._started = self._result_for = None
            self.unreachable = None
            return StoreHealth()
        key = store.model_dump_json()
        now = time.monotonic()
        every = self.failing_recheck_s if self.unreachable is not None else self.recheck_s
        due = self._started is None or self._started[0] != key or now - self._started[1] >= every
        if due and (self._task is None or self._task.done()):
            self._started = (key, now)
            self._task = asyncio.get_running_loop().create_task(self._run(key, store))
        known = self._result_for == key
        return StoreHealth(
            credentials_problem(store, pods),
            self.unreachable if known else None,
            upload_problem(heartbeats or {}),
            endpoint_known=known,
        )

    async def settled(self) -> None:
        """Until the check in progress (if any) has finished (for tests)."""
        if self._task is not None:
            await self._task

    async def _run(self, key: str, store: ObjectStore) -> None:
        self.unreachable = await self._connect(store)
        self._result_for = key

    async def _connect(self, store: ObjectStore) -> str | None:
        host, port = endpoint_of(store)
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            return f"{store.endpoint} does not answer ({type(exc).__name__}: {exc or 'timeout'})"
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None
