"""A BrokerCluster's object store as the operator checks it: credentials and reachability.

Two things break tiered storage before any broker could say so, and both get a
condition on the BrokerCluster (written by its ``ClusterRuntime`` through the
status store, so only a change costs a write):

* **the credentials Secret is missing** (or lacks a key the spec names). A broker
  pod whose ``secretKeyRef`` cannot be resolved never starts, so the operator
  does not roll the StatefulSet onto such a spec: it keeps the StatefulSet it has
  (``apply_workload`` skips it, running brokers and their data stay as they are),
  and the cluster is ``Ready=False``, reason ``CredentialsSecretMissing``, and
  ``Stalled`` (a person has to create the Secret). Once it exists the runtime
  applies the workload again.
* **the endpoint does not answer**. Brokers keep serving when the store is down
  (uploads wait and retry; the local log keeps everything), so this is not a
  Ready matter: ``ObjectStoreReachable=False``, reason ``EndpointUnreachable``,
  from a TCP connect by the operator to the endpoint's host and port. Brokers do
  not report upload failures in their heartbeats (only ``storedThrough``), so
  the operator's own view is what there is; a store reachable from the operator
  but not from the pods shows as brokers' ``storedThrough`` not moving.

``credentials_problem`` and ``endpoint_of`` are pure; ``StoreChecks`` does the
I/O (one Secret GET and one TCP connect per check) and decides when to check
again: every step while something is wrong, else every ``recheck_s`` or when the
spec changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from headrace.operator.kube import KubeApi, ObjectRef
from headrace.resources.clusters import ObjectStore

CREDENTIALS_MISSING: Final = "CredentialsSecretMissing"
UNREACHABLE: Final = "EndpointUnreachable"
REACHABLE_CONDITION: Final = "ObjectStoreReachable"


def credentials_problem(store: ObjectStore | None, secret: Mapping[str, Any] | None) -> str | None:
    """Why the Secret ``store`` names cannot give brokers their credentials, or None.

    ``secret``: the Secret as the API returned it (None: it does not exist).
    """
    if store is None or store.credentials_secret is None:
        return None
    ref = store.credentials_secret
    if secret is None:
        return (
            f"Secret {ref.name!r} (objectStore.credentialsSecret) does not exist; brokers cannot"
            " start without their object-store credentials. The StatefulSet is left as it was"
        )
    data = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
    missing = [k for k in (ref.access_key_key, ref.secret_key_key) if not data.get(k)]
    if missing:
        return f"Secret {ref.name!r} has no (or an empty) {' and '.join(map(repr, missing))}"
    return None


def endpoint_of(store: ObjectStore) -> tuple[str, int]:
    """(host, port) of the store's endpoint URL; 80/443 when it names no port."""
    parts = urlsplit(store.endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """The latest check's findings (None: fine, or not checked)."""

    credentials: str | None = None
    unreachable: str | None = None


class StoreChecks:
    """The checks of one cluster's object store and when to repeat them (see the module)."""

    def __init__(self, api: KubeApi, recheck_s: float = 30.0, connect_timeout_s: float = 2.0):
        self.api = api
        self.recheck_s = recheck_s
        self.connect_timeout_s = connect_timeout_s
        self.health = StoreHealth()
        self._checked: tuple[Any, float] | None = None  # (what was checked, when: monotonic)

    async def check(self, namespace: str, store: ObjectStore | None) -> StoreHealth:
        """The store's health now, checking again only when it is due."""
        key = None if store is None else store.model_dump_json()
        now = time.monotonic()
        due = (
            self._checked is None
            or self._checked[0] != key
            or self.health != StoreHealth()
            or now - self._checked[1] >= self.recheck_s
        )
        if not due:
            return self.health
        self._checked = (key, now)
        if store is None:
            self.health = StoreHealth()
            return self.health
        secret = None
        if store.credentials_secret is not None:
            secret = await self.api.get(
                ObjectRef("v1", "Secret", namespace, store.credentials_secret.name)
            )
        self.health = StoreHealth(
            credentials_problem(store, secret), await self._unreachable(store)
        )
        return self.health

    async def _unreachable(self, store: ObjectStore) -> str | None:
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


async def credentials_missing(
    api: KubeApi, namespace: str, store: ObjectStore | None
) -> str | None:
    """``credentials_problem`` of the Secret as stored now (one GET)."""
    if store is None or store.credentials_secret is None:
        return None
    secret = await api.get(ObjectRef("v1", "Secret", namespace, store.credentials_secret.name))
    return credentials_problem(store, secret)
