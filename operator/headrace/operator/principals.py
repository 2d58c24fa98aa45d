"""The kopf handlers of ``User``: its token Secret, its place in the cluster's ACL file.

A User created, changed or found at start-up makes the operator render the ACL file of
its BrokerCluster again (``auth.sync_acl``: every token User's Secret is made if absent,
then the ConfigMap ``<cluster>-acl`` is applied with all the cluster's Users) and write
the User's status: ``secret`` (token users), ``principal`` and a ``Ready`` condition.
A User whose cluster does not exist, or runs without ``spec.auth.enabled``, is not Ready
and is tried again after ``retry_delay`` (5 s, doubling up to a minute, so a User left
waiting costs few writes; the cluster's own workload handler renders the
ACL file too when it appears or turns auth on). A deleted User is taken out of the file
before it goes: kopf's finalizer holds it until the file is written without it, and a
failed write is tried again (review finding F7: an event handler, which kopf does not
retry, left it in the file until the next sync). kopf puts the finalizer on every User it
handles, existing ones too, at start-up; a User that goes without it (deleted before, or
its finalizer removed by hand) is still taken out, once, when its deletion is seen, and
the cluster's workload handler renders the whole file again at every operator start.

How fast a change reaches the brokers: the kubelet updates a mounted ConfigMap within
its sync period (about a minute by default), then each broker's ACL reload
(``--acl-reload-interval-ms``) picks it up; open connections of a removed principal are
refused at their next request (docs/security.md §3).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import kopf
import pydantic

from headrace.control.documents import condition, condition_time
from headrace.operator import auth
from headrace.operator.handlers import GROUP, VERSION, OperatorContext, parse_cluster
from headrace.operator.kube import KubeApiError, ObjectRef
from headrace.resources.users import AuthenticationType, User

log = logging.getLogger(__name__)

#: the first and the longest wait before a User waiting for its cluster (or for auth on
#: it) is tried again, in s
RETRY_S: Final = 5.0
MAX_RETRY_S: Final = 60.0


def retry_delay(retry: int) -> float:
    """The wait before try ``retry + 1`` (kopf counts retries from 0)."""
    return min(MAX_RETRY_S, RETRY_S * (1 << min(retry, 8)))


def ready_condition(
    previous: Mapping[str, Any] | None,
    generation: int,
    ready: bool,
    reason: str,
    message: str,
    now: str,
) -> dict[str, Any]:
    return condition(
        "Ready", "True" if ready else "False", reason, message, generation, previous, now
    )


def _write_status(
    patch: kopf.Patch, body: Mapping[str, Any], now: str, ready: bool, reason: str, message: str,
    secret: str | None = None, principal: str | None = None,
) -> None:  # fmt: skip
    status = body.get("status") or {}
    previous = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    generation = int(body["metadata"].get("generation") or 1)
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = [
        ready_condition(previous, generation, ready, reason, message, now)
    ]
    if secret is not None:
        patch.status["secret"] = {"name": secret}
    if principal is not None:
        patch.status["principal"] = principal


@kopf.on.resume(GROUP, VERSION, "users")
@kopf.on.create(GROUP, VERSION, "users")
@kopf.on.update(GROUP, VERSION, "users", field="spec")
async def user_changed(
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: Any,
    patch: kopf.Patch,
    retry: int = 0,
    **_: Any,
) -> None:
    context: OperatorContext = memo.context
    delay = retry_delay(retry)
    namespace = namespace or "default"
    now = condition_time(context.clock.now_ms())
    try:
        user = User.from_manifest({k: v for k, v in body.items() if k != "status"})
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        _write_status(patch, body, now, False, "Invalid", problems)
        raise kopf.PermanentError(f"invalid User: {problems}") from None
    cluster_name = user.spec.cluster_ref.name
    cluster = await context.api.get(
        ObjectRef(f"{GROUP}/{VERSION}", "BrokerCluster", namespace, cluster_name)
    )
    if cluster is None:
        _write_status(
            patch, body, now, False, "ClusterNotFound",
            f"BrokerCluster {cluster_name!r} does not exist in this namespace",
        )  # fmt: skip
        raise kopf.TemporaryError(f"BrokerCluster {cluster_name} not found", delay=delay)
    if not parse_cluster(cluster).spec.auth.enabled:
        _write_status(
            patch, body, now, False, "AuthDisabled",
            f"BrokerCluster {cluster_name!r} runs without spec.auth.enabled: its brokers ask"
            " for no credentials",
        )  # fmt: skip
        raise kopf.TemporaryError(f"BrokerCluster {cluster_name} has no auth", delay=delay)
    synced = await auth.sync_acl(context.api, cluster)
    secret = synced.secrets.get(name)
    if name in synced.refused:
        _write_status(patch, body, now, False, "SecretNotOwned", synced.refused[name])
        raise kopf.TemporaryError(synced.refused[name], delay=delay)
    if user.spec.authentication.type is AuthenticationType.TOKEN and secret is None:
        raise kopf.TemporaryError(f"the token Secret of User {name} is not there yet", delay=delay)
    where = f"its token is in Secret {secret!r}; " if secret else ""
    _write_status(
        patch, body, now, True, "Provisioned",
        f"{where}principal {user.principal_name!r} is in ConfigMap"
        f" {auth.acl_config_name(cluster_name)!r}",
        secret=secret, principal=user.principal_name,
    )  # fmt: skip


@kopf.on.delete(GROUP, VERSION, "users")
async def user_removed(
    body: kopf.Body, namespace: str | None, memo: Any, retry: int = 0, **_: Any
) -> None:
    """Take a User being deleted out of its cluster's ACL file (``auth.sync_acl`` leaves out
    Users with a ``deletionTimestamp``); its finalizer goes only once that is written. Its
    Secret goes with it: the garbage collector follows the owner reference."""
    try:
        await _drop_from_acl(memo.context, body, namespace)
    except KubeApiError as exc:
        raise kopf.TemporaryError(
            f"the ACL file still names the deleted User: {exc}", delay=retry_delay(retry)
        ) from exc


@kopf.on.event(GROUP, VERSION, "users")
async def user_deleted(body: kopf.Body, namespace: str | None, memo: Any, **kwargs: Any) -> None:
    """A User gone without the finalizer (see the module doc): taken out once, no retry."""
    if kwargs.get("type") != "DELETED":
        return
    await _drop_from_acl(memo.context, body, namespace)


async def _drop_from_acl(
    context: OperatorContext, body: Mapping[str, Any], namespace: str | None
) -> None:
    cluster_name = ((body.get("spec") or {}).get("clusterRef") or {}).get("name")
    if not cluster_name:
        return
    cluster = await context.api.get(
        ObjectRef(f"{GROUP}/{VERSION}", "BrokerCluster", namespace or "default", cluster_name)
    )
    if cluster is not None and parse_cluster(cluster).spec.auth.enabled:
        await auth.sync_acl(context.api, cluster)
