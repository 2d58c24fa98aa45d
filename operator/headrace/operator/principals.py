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
failed write is tried again (an event handler, which kopf does not
retry, left it in the file until the next sync). kopf puts the finalizer on every User it
handles, existing ones too, at start-up; a User that goes without it (deleted before, or
its finalizer removed by hand) is still taken out, once, when its deletion is seen, and
the cluster's workload handler renders the whole file again at every operator start.

Token rotation (``control.tokens``): a new ``spec.authentication.rotateToken`` value
makes the next render mint a new token into the User's Secret and list the hashes of
both the new and the previous token in the ACL file; the status shows
``tokenGeneration``, ``rotatedAt`` and ``previousTokenExpiresAt``. A timer per User with
a previous token pending (``previous_token_expiry``, every ``EXPIRY_CHECK_S``, no API
call before the expiry) renders again once the grace is over, which drops the previous
token's hash from the Secret and the ACL file. Each step is an Event on the User.

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

from headrace.control import tokens
from headrace.control.documents import condition, condition_time, epoch_ms, rfc3339
from headrace.operator import auth, bodies
from headrace.operator.bodies import Parsed
from headrace.operator.handlers import GROUP, VERSION, OperatorContext, cluster_model
from headrace.operator.kube import KubeApiError, ObjectRef
from headrace.resources.meta import READY
from headrace.resources.users import AuthenticationType, User

log = logging.getLogger(__name__)

#: the first and the longest wait before a User waiting for its cluster (or for auth on
#: it) is tried again, in s
RETRY_S: Final = 5.0
MAX_RETRY_S: Final = 60.0
#: how often a User with a previous token in its grace checks whether the grace is over,
#: in s: the brokers refuse the previous token at most this much (plus the kubelet's
#: volume sync and the brokers' ACL reload) after ``previousTokenExpiresAt``
EXPIRY_CHECK_S: Final = 5.0


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
    patch: kopf.Patch, user: Parsed[User], now: str, ready: bool, reason: str, message: str,
    secret: str | None = None, principal: str | None = None,
    token: tokens.TokenPlan | None = None,
) -> None:  # fmt: skip
    status = None if user.resource is None else user.resource.status
    condition = None if status is None else status.condition(READY)
    previous = (
        None
        if condition is None
        else condition.model_dump(mode="json", by_alias=True, exclude_unset=True)
    )
    generation = user.meta.generation
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = [
        ready_condition(previous, generation, ready, reason, message, now)
    ]
    if secret is not None:
        patch.status["secret"] = {"name": secret}
    if principal is not None:
        patch.status["principal"] = principal
    if token is not None:
        state = token.state
        patch.status["tokenGeneration"] = state.generation
        patch.status["rotatedAt"] = (
            None if state.rotated_at_ms is None else rfc3339(state.rotated_at_ms)
        )
        expires = token.previous_expires_at_ms
        patch.status["previousTokenExpiresAt"] = None if expires is None else rfc3339(expires)


def _post_events(body: Mapping[str, Any], token: tokens.TokenPlan) -> None:
    """An Event on the User per token step (never the token: generation and times only)."""
    for event in token.events:
        if event is tokens.TokenEvent.ROTATED:
            expires = token.previous_expires_at_ms
            until = "refused at once" if expires is None else f"accepted until {rfc3339(expires)}"
            message = (
                f"token generation {token.state.generation} made; the previous token is {until}"
            )
        elif event is tokens.TokenEvent.PREVIOUS_EXPIRED:
            message = f"the token before generation {token.state.generation} is refused from now"
        else:
            message = "token generation 1 made"
        try:
            kopf.event(
                kopf.Body(dict(body)),  # type: ignore[arg-type]
                type="Normal", reason=event.value, message=message,
            )  # fmt: skip
        except Exception:  # outside kopf's loop (tests): the status says it all the same
            log.debug("no event posted for User %s", bodies.meta_of(body).name)


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
    await _provision(memo.context, body, namespace or "default", name, patch, retry)


def _previous_token_pending(status: Mapping[str, Any] | None, **_: Any) -> bool:
    return bool((status or {}).get("previousTokenExpiresAt"))


@kopf.timer(GROUP, VERSION, "users", interval=EXPIRY_CHECK_S, when=_previous_token_pending)
async def previous_token_expiry(
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: Any,
    patch: kopf.Patch,
    status: Mapping[str, Any],
    **_: Any,
) -> None:
    """Once a rotated User's previous token is past its grace, render its cluster's ACL
    file again (which drops it). Before that, nothing: no API call."""
    context: OperatorContext = memo.context
    expires = status.get("previousTokenExpiresAt")
    if not expires or context.clock.now_ms() < epoch_ms(str(expires)):
        return
    await _provision(context, body, namespace or "default", name, patch, 0)


async def _provision(
    context: OperatorContext,
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    patch: kopf.Patch,
    retry: int,
) -> None:
    """Render the User's cluster's ACL file (its token made, rotated or expired on the
    way) and write the User's status."""
    delay = retry_delay(retry)
    now_ms = context.clock.now_ms()
    now = condition_time(now_ms)
    parsed = bodies.parse_user(body)
    if parsed.resource is None:
        problems = str(parsed.problem)
        _write_status(patch, parsed, now, False, "Invalid", problems)
        raise kopf.PermanentError(f"invalid User: {problems}")
    user = parsed.resource
    cluster_name = user.spec.cluster_ref.name
    cluster = await context.api.get(
        ObjectRef(f"{GROUP}/{VERSION}", "BrokerCluster", namespace, cluster_name)
    )
    if cluster is None:
        _write_status(
            patch, parsed, now, False, "ClusterNotFound",
            f"BrokerCluster {cluster_name!r} does not exist in this namespace",
        )  # fmt: skip
        raise kopf.TemporaryError(f"BrokerCluster {cluster_name} not found", delay=delay)
    stored_cluster = bodies.parse_cluster(cluster)
    if not cluster_model(stored_cluster).spec.auth.enabled:
        _write_status(
            patch, parsed, now, False, "AuthDisabled",
            f"BrokerCluster {cluster_name!r} runs without spec.auth.enabled: its brokers ask"
            " for no credentials",
        )  # fmt: skip
        raise kopf.TemporaryError(f"BrokerCluster {cluster_name} has no auth", delay=delay)
    synced = await auth.sync_acl(context.api, stored_cluster, now_ms)
    secret = synced.secrets.get(name)
    if name in synced.refused:
        _write_status(patch, parsed, now, False, "SecretNotOwned", synced.refused[name])
        raise kopf.TemporaryError(synced.refused[name], delay=delay)
    if user.spec.authentication.type is AuthenticationType.TOKEN and secret is None:
        raise kopf.TemporaryError(f"the token Secret of User {name} is not there yet", delay=delay)
    token = synced.token_plans.get(name)
    if token is not None:
        _post_events(body, token)
    where = f"its token is in Secret {secret!r}; " if secret else ""
    _write_status(
        patch, parsed, now, True, "Provisioned",
        f"{where}principal {user.principal_name!r} is in ConfigMap"
        f" {auth.acl_config_name(cluster_name)!r}",
        secret=secret, principal=user.principal_name, token=token,
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
    user = bodies.parse_user(body).resource
    if user is None:
        return  # names no cluster (the CRD's rules keep such a spec out)
    cluster_name = user.spec.cluster_ref.name
    cluster = await context.api.get(
        ObjectRef(f"{GROUP}/{VERSION}", "BrokerCluster", namespace or "default", cluster_name)
    )
    if cluster is None:
        return
    stored = bodies.parse_cluster(cluster)
    if cluster_model(stored).spec.auth.enabled:
        await auth.sync_acl(context.api, stored, context.clock.now_ms())
