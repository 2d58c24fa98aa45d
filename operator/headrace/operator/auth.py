"""A BrokerCluster's credentials on Kubernetes: its auth Secret, its Users, its ACL file.

With ``spec.auth.enabled`` the operator keeps, per cluster (docs/security.md §8):

* the Secret ``<cluster>-cluster-auth``: a random replication token (the brokers'
  principal ``headrace:broker``, which the operator also presents on its heartbeat polls,
  topology pushes and drain calls) and the cluster key that signs member identities;
* one Secret per token ``User``, named after it, holding a random token (key ``token``)
  and, in its annotations, the token's generation, the ``rotateToken`` value it answers,
  when it was rotated in and the hash of the previous token during its grace
  (``control.tokens`` decides; ``plan_user_token`` and ``write_user_token`` store,
  after the ConfigMap lists the new hash);
* the ConfigMap ``<cluster>-acl`` with ``acl.json``: every ``User`` of the cluster as an
  ACL file principal (token hashes only, never a token), which the brokers load with
  ``--acl-file`` and reload when the kubelet updates the mounted file.

Secrets are made once and never overwritten by surprise: a token or key that changed
under running clients and brokers would lock them out. ``ensure_secret`` reads first and
applies only when the Secret is absent; a User's token changes only when its
``rotateToken`` asks, and the previous one stays valid for the User's grace period. One
operator replica acts at a time (the leader lease), and one lock per Secret orders this
replica's callers, so nothing races it. Every object is owner-referenced (the cluster's to the cluster, a
User's to the User), so deleting the owner deletes it.

The builders are pure; the ``async`` functions are the thin I/O around them (``KubeApi``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.control import tokens
from headrace.control.documents import epoch_ms, rfc3339
from headrace.errors import InvalidRequest
from headrace.operator.bodies import Parsed, ResourceT, parse_user
from headrace.operator.kube import KubeApi, ObjectRef
from headrace.resources import BrokerCluster
from headrace.resources.users import AuthenticationType, User
from headrace.security import acl, keyrings

log = logging.getLogger(__name__)

#: the auth Secret's keys
REPLICATION_TOKEN_KEY: Final = "replicationToken"
CLUSTER_KEY_KEY: Final = "clusterKey"
#: a token User's Secret key
USER_TOKEN_KEY: Final = "token"
#: the ACL ConfigMap's key and where brokers find it and the cluster key
ACL_KEY: Final = "acl.json"
ACL_DIR: Final = "/etc/headrace/acl"
AUTH_DIR: Final = "/etc/headrace/auth"
CLUSTER_KEY_FILE: Final = "cluster.key"
#: the broker (``--replication-token-file``) and ``headrace drain`` read the replication
#: tokens from here, the Secret's ``replicationToken`` as the kubelet keeps it current
REPLICATION_TOKEN_FILE: Final = "replication.token"
REPLICATION_TOKEN_PATH: Final = f"{AUTH_DIR}/{REPLICATION_TOKEN_FILE}"
#: tells ``headrace drain`` where that file is
REPLICATION_TOKEN_FILE_ENV: Final = "HEADRACE_REPLICATION_TOKEN_FILE"
#: the token itself, in pods made before the file (``headrace drain`` falls back to it)
REPLICATION_TOKEN_ENV: Final = "HEADRACE_REPLICATION_TOKEN"
USER_API_VERSION: Final = "headrace.dev/v1alpha1"
#: a token User's Secret's annotations: its token's state (``control.tokens.TokenState``)
TOKEN_GENERATION_ANNOTATION: Final = "headrace.dev/token-generation"
ROTATE_TOKEN_ANNOTATION: Final = "headrace.dev/rotate-token"
ROTATED_AT_ANNOTATION: Final = "headrace.dev/rotated-at"
PREVIOUS_TOKEN_HASH_ANNOTATION: Final = "headrace.dev/previous-token-hash"
#: the previous token's SCRAM credentials, comma-separated, kept as long as its hash
PREVIOUS_TOKEN_SCRAM_ANNOTATION: Final = "headrace.dev/previous-token-scram"


def auth_secret_name(cluster_name: str) -> str:
    return f"{cluster_name}-cluster-auth"


def acl_config_name(cluster_name: str) -> str:
    return f"{cluster_name}-acl"


def owner_reference(owner: Parsed[ResourceT]) -> dict[str, Any]:
    return {
        "apiVersion": owner.ref.api_version,
        "kind": owner.kind,
        "name": owner.meta.name,
        "uid": owner.meta.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _secret(
    name: str, namespace: str, owner: Parsed[ResourceT], data: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "headrace-operator"},
            "ownerReferences": [owner_reference(owner)],
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def new_auth_secret(cluster: Parsed[BrokerCluster]) -> dict[str, Any]:
    """A fresh ``<cluster>-cluster-auth``: a 256-bit replication token and cluster key
    (64 hex digits, the key file's format)."""
    return _secret(
        auth_secret_name(cluster.meta.name),
        cluster.meta.namespace,
        cluster,
        {
            REPLICATION_TOKEN_KEY: secrets.token_urlsafe(32),
            CLUSTER_KEY_KEY: secrets.token_hex(32) + "\n",
        },
    )


def user_secret(user: Parsed[User], state: tokens.TokenState) -> dict[str, Any]:
    """A User's token Secret, named after it, holding ``state``."""
    secret = _secret(user.meta.name, user.meta.namespace, user, {USER_TOKEN_KEY: state.token})
    annotations = {TOKEN_GENERATION_ANNOTATION: str(state.generation)}
    if state.rotation is not None:
        annotations[ROTATE_TOKEN_ANNOTATION] = state.rotation
    if state.rotated_at_ms is not None:
        annotations[ROTATED_AT_ANNOTATION] = rfc3339(state.rotated_at_ms)
    if state.previous_token_hash is not None:
        annotations[PREVIOUS_TOKEN_HASH_ANNOTATION] = state.previous_token_hash
    if state.previous_scram:
        annotations[PREVIOUS_TOKEN_SCRAM_ANNOTATION] = ",".join(state.previous_scram)
    secret["metadata"]["annotations"] = annotations
    return secret


def token_state(secret: Mapping[str, Any]) -> tokens.TokenState | None:
    """The token state a User's Secret holds; None without a token. A Secret made before
    rotation existed (no annotations) holds generation 1, never rotated."""
    token = secret_value(secret, USER_TOKEN_KEY)
    if not token:
        return None
    annotations = secret.get("metadata", {}).get("annotations") or {}
    rotated_at = annotations.get(ROTATED_AT_ANNOTATION)
    try:
        generation = int(annotations.get(TOKEN_GENERATION_ANNOTATION) or 1)
        rotated_at_ms = None if rotated_at is None else epoch_ms(rotated_at)
    except (ValueError, InvalidRequest):  # edited by hand: the token stands, not its history
        generation, rotated_at_ms = 1, None
    return tokens.TokenState(
        token=token,
        generation=generation,
        rotation=annotations.get(ROTATE_TOKEN_ANNOTATION),
        rotated_at_ms=rotated_at_ms,
        previous_token_hash=annotations.get(PREVIOUS_TOKEN_HASH_ANNOTATION),
        previous_scram=tuple(
            text
            for text in (annotations.get(PREVIOUS_TOKEN_SCRAM_ANNOTATION) or "").split(",")
            if text
        ),
    )


def secret_value(secret: Mapping[str, Any], key: str) -> str | None:
    value = (secret.get("data") or {}).get(key)
    return None if value is None else base64.b64decode(value).decode()


def acl_document(principals: Iterable[acl.PrincipalSpec]) -> str:
    """The brokers' ACL file (JSON is YAML), validated with the brokers' own model."""
    document = acl.AclFile(principals=sorted(principals, key=lambda p: p.name))
    return json.dumps(document.model_dump(mode="json", exclude_none=True), indent=2, sort_keys=True)


def acl_config(cluster: Parsed[BrokerCluster], document: str) -> dict[str, Any]:
    meta = cluster.meta
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": acl_config_name(meta.name),
            "namespace": meta.namespace,
            "labels": {"app.kubernetes.io/managed-by": "headrace-operator"},
            "ownerReferences": [owner_reference(cluster)],
        },
        "data": {ACL_KEY: document},
    }


def users_of(users: Iterable[Parsed[User]], cluster_name: str) -> list[tuple[Parsed[User], User]]:
    """The Users whose ``spec.clusterRef.name`` is the cluster (not being deleted), each
    with its model. One whose spec does not parse names no cluster: it is left out (its
    own handler reports why)."""
    mine = []
    for user in users:
        if user.resource is None:
            log.warning("User %s left out of every ACL file: %s", user.meta.full_name, user.problem)
        elif user.resource.spec.cluster_ref.name == cluster_name and not user.meta.deleting:
            mine.append((user, user.resource))
    return mine


# ---------------------------------------------------------------------- I/O


#: one lock per Secret: a cluster's workload handler and its control loop both ask for
#: the auth Secret when the cluster is created; without it both could find none and the
#: second apply would replace the first's token after one of them had read it
_SECRET_LOCKS: dict[ObjectRef, asyncio.Lock] = {}


class ForeignSecret(LookupError):
    """A Secret of the name the operator would make exists, owned by something else: it is
    never adopted (its values would become broker credentials)."""


async def ensure_secret(api: KubeApi, fresh: Mapping[str, Any]) -> dict[str, Any]:
    """The Secret ``fresh`` names as stored: created from ``fresh`` only when absent, so an
    existing one (and every credential in it) is never overwritten. An existing Secret not
    owned by ``fresh``'s owner (another User's or cluster's, or one a person made) is
    refused with ``ForeignSecret``: adopting it would turn whatever it holds into a token
    with the grants the User asks for."""
    ref = ObjectRef.of(fresh)
    async with _SECRET_LOCKS.setdefault(ref, asyncio.Lock()):
        found = _owned_or_absent(await api.get(ref), fresh)
        if found is None:
            await api.apply(fresh)
            log.info("created Secret %s/%s", ref.namespace, ref.name)
            found = await api.get(ref)
            if found is None:
                raise LookupError(f"Secret {ref.namespace}/{ref.name} vanished after its creation")
    return found


def _owned_or_absent(
    found: dict[str, Any] | None, fresh: Mapping[str, Any]
) -> dict[str, Any] | None:
    """``found`` if ``fresh``'s owner owns it (or None if there is none); ``ForeignSecret``
    if something else does."""
    owner = fresh["metadata"]["ownerReferences"][0]
    if found is not None and owner["uid"] not in {
        o.get("uid") for o in found.get("metadata", {}).get("ownerReferences") or []
    }:
        ref = ObjectRef.of(fresh)
        raise ForeignSecret(
            f"Secret {ref.namespace}/{ref.name} exists and is not owned by"
            f" {owner['kind']} {owner['name']}: not adopted (delete or rename it)"
        )
    return found


@dataclass(frozen=True, slots=True)
class TokenWrite:
    """The change a User's token plan makes to its Secret, not written yet."""

    ref: ObjectRef
    #: the whole Secret to apply (a creation or a rotation), else None: an expiry, which
    #: only drops the previous token's hash from the annotations
    secret: dict[str, Any] | None
    plan: tokens.TokenPlan


async def plan_user_token(
    api: KubeApi, stored: Parsed[User], user: User, now_ms: int
) -> tuple[tokens.TokenPlan, TokenWrite | None]:
    """A token User's Secret made, rotated or its previous token expired, as
    ``control.tokens`` plans it: the plan (which token hashes the brokers accept) and the
    write it takes (None: no change), for ``write_user_token`` once the ACL ConfigMap
    lists the hashes. Refuses a Secret the User does not own (``ForeignSecret``), as
    ``ensure_secret`` does."""
    authentication = user.spec.authentication
    placeholder = user_secret(stored, tokens.TokenState(token=""))
    ref = ObjectRef.of(placeholder)
    found = _owned_or_absent(await api.get(ref), placeholder)
    step = tokens.plan(
        None if found is None else token_state(found),
        authentication.rotate_token,
        authentication.previous_token_grace_period_seconds * 1000,
        now_ms,
        secrets.token_urlsafe(32),
        scram_salt=tokens.scram_salt(
            f"{stored.meta.namespace}/{user.spec.cluster_ref.name}", user.principal_name
        ),
    )
    if not step.changed:
        return step, None
    renewed = tokens.TokenEvent.CREATED in step.events or tokens.TokenEvent.ROTATED in step.events
    return step, TokenWrite(ref, user_secret(stored, step.state) if renewed else None, step)


async def write_user_token(api: KubeApi, write: TokenWrite) -> None:
    """Store a planned token change: a creation or a rotation applies the whole Secret
    (the new token and its state, in one write); an expiry only removes the previous
    token's hash from the annotations (a merge patch)."""
    ref, step = write.ref, write.plan
    async with _SECRET_LOCKS.setdefault(ref, asyncio.Lock()):
        if write.secret is not None:
            await api.apply(write.secret)
        else:
            await api.patch_metadata(
                ref,
                {
                    "annotations": {
                        PREVIOUS_TOKEN_HASH_ANNOTATION: None,
                        PREVIOUS_TOKEN_SCRAM_ANNOTATION: None,
                    }
                },
            )
    for event in step.events:
        log.info(
            "User %s/%s: %s (token generation %d)",
            ref.namespace, ref.name, event.value, step.state.generation,
        )  # fmt: skip


def replication_tokens_of(secret: Mapping[str, Any]) -> tuple[str, ...]:
    """The replication tokens an auth Secret lists, the one to present first.

    ``replicationToken`` holds one token, or several one a line while it rotates
    (``keyrings`` format, as the brokers read it from their mounted copy): every listed
    token is accepted by the brokers, the first is the one to send. ``InvalidRequest``
    when it does not parse (the message names lines, never a value); ``LookupError``
    when the key is missing."""
    name = secret.get("metadata", {}).get("name", "the auth Secret")
    value = secret_value(secret, REPLICATION_TOKEN_KEY)
    if value is None:
        raise LookupError(f"Secret {name} has no {REPLICATION_TOKEN_KEY}")
    return keyrings.parse_tokens(value, f"Secret {name} key {REPLICATION_TOKEN_KEY}")


async def replication_token(api: KubeApi, cluster: Parsed[BrokerCluster]) -> str:
    """The replication token to present to the cluster's brokers: the first the auth
    Secret lists (the Secret made first if absent)."""
    secret = await ensure_secret(api, new_auth_secret(cluster))
    return replication_tokens_of(secret)[0]


async def read_replication_tokens(api: KubeApi, cluster: Parsed[BrokerCluster]) -> tuple[str, ...]:
    """The replication tokens the auth Secret lists now (a GET by name, never a create:
    the cluster's workload handler makes the Secret). ``LookupError`` when it is gone,
    ``InvalidRequest`` when it does not parse: the caller keeps what it presents."""
    ref = ObjectRef("v1", "Secret", cluster.meta.namespace, auth_secret_name(cluster.meta.name))
    secret = await api.get(ref)
    if secret is None:
        raise LookupError(f"Secret {ref.namespace}/{ref.name} not found")
    return replication_tokens_of(secret)


@dataclass(frozen=True, slots=True)
class AclSync:
    """What ``sync_acl`` wrote: the principals, and each User's Secret (token users)."""

    principals: dict[str, str]  # User name -> principal
    secrets: dict[str, str]  # User name -> its Secret's name
    #: User name -> why it was left out (its Secret's name is taken: ``ForeignSecret``)
    refused: dict[str, str] = field(default_factory=dict)
    #: token User name -> its tokens as planned (generation, rotation, previous's expiry)
    token_plans: dict[str, tokens.TokenPlan] = field(default_factory=dict)


#: one lock per cluster: its ACL ConfigMap and its Users' Secrets are planned and
#: written as one step (two concurrent syncs could otherwise each rotate a token and
#: leave one's ConfigMap beside the other's Secret)
_ACL_LOCKS: dict[tuple[str, str], asyncio.Lock] = {}


async def sync_acl(api: KubeApi, cluster: Parsed[BrokerCluster], now_ms: int) -> AclSync:
    """Make, rotate or expire the tokens of every token User of the cluster
    (``plan_user_token``) and apply the ACL ConfigMap with all its Users: a User in the
    grace of a rotation is listed with both its tokens' hashes. A User whose spec does not
    parse is left out (its own handler reports why).

    The ConfigMap is written before the Users' Secrets: the kubelet syncs the two volumes
    independently, and a client that reads a rotated token from its Secret must find its
    hash already on its way to the brokers. (A Secret write that then fails leaves a hash
    no one holds a token for; the next sync plans again.)"""
    namespace, name = cluster.meta.namespace, cluster.meta.name
    async with _ACL_LOCKS.setdefault((namespace, name), asyncio.Lock()):
        listed = await api.list(USER_API_VERSION, "User", namespace)
        principals: list[acl.PrincipalSpec] = []
        synced = AclSync({}, {})
        writes: list[TokenWrite] = []
        for stored, user in users_of(map(parse_user, listed), name):
            hashes: list[str] = []
            scram_credentials: list[str] = []
            if user.spec.authentication.type is AuthenticationType.TOKEN:
                try:
                    step, write = await plan_user_token(api, stored, user, now_ms)
                except ForeignSecret as exc:
                    # left out, not the whole file: one squatted name must not lock every
                    # User out
                    log.warning(
                        "User %s/%s left out of the ACL file: %s",
                        namespace, user.metadata.name, exc,
                    )  # fmt: skip
                    synced.refused[user.metadata.name] = str(exc)
                    continue
                if write is not None:
                    writes.append(write)
                hashes = list(step.accepted_hashes)
                scram_credentials = list(step.accepted_scram)
                synced.secrets[user.metadata.name] = user.metadata.name
                synced.token_plans[user.metadata.name] = step
            principals.append(user.acl_principal(hashes, scram_credentials))
            synced.principals[user.metadata.name] = user.principal_name
        await api.apply(acl_config(cluster, acl_document(principals)))
        for write in writes:
            await write_user_token(api, write)
    return synced
