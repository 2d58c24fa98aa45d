"""Token rotation through the User handlers, over the operator's ``ClientApi`` and kmock's
API emulator (``server``): what reaches the API server when a User is made, rotated and
its previous token expires, and that nothing does while the grace runs."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import Any

import kmock
import kopf
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER

from headrace.control.documents import rfc3339
from headrace.operator import auth, principals
from headrace.operator.handlers import OperatorContext
from headrace.operator.kube import ClientApi
from headrace.security import acl, scram
from tests.unit.controller.controller_fakes import ManualClock

AUTH_CLUSTER = {**CLUSTER, "spec": {"replicas": 3, "auth": {"enabled": True}}}
GRACE_S = 60


def user(rotate: str | None = None, grace_s: int = GRACE_S) -> dict[str, Any]:
    authentication: dict[str, Any] = {"type": "token", "previousTokenGracePeriodSeconds": grace_s}
    if rotate is not None:
        authentication["rotateToken"] = rotate
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "User",
        "metadata": {"name": "writer", "namespace": "ns", "uid": "uid-writer", "generation": 1},
        "spec": {
            "clusterRef": {"name": "demo"},
            "authentication": authentication,
            "authorization": {"grants": [{"operations": ["produce"], "topics": ["orders"]}]},
        },
    }


def context(api: ClientApi, clock: ManualClock) -> SimpleNamespace:
    return SimpleNamespace(context=OperatorContext(api=api, clock=clock))


async def changed(server: ApiServer, api: ClientApi, clock: ManualClock) -> dict[str, Any]:
    """Run the User's change handler on the User as stored; store and return its status."""
    body = server.body("User", "writer")
    patch = kopf.Patch()
    await principals.user_changed(
        body=kopf.Body(body), namespace="ns", name="writer", memo=context(api, clock),
        patch=patch,
    )  # fmt: skip
    return store_status(server, body, patch)


def store_status(server: ApiServer, body: dict[str, Any], patch: kopf.Patch) -> dict[str, Any]:
    status = {**(body.get("status") or {}), **dict(patch.get("status") or {})}
    status = {k: v for k, v in status.items() if v is not None}  # a merge patch's nulls
    server.put({**body, "status": status})
    return status


def token(server: ApiServer) -> str:
    secret = server.objects["v1/secrets", "ns", "writer"].raw
    return base64.b64decode(secret["data"][auth.USER_TOKEN_KEY]).decode()


def accepted_scram(server: ApiServer) -> list[scram.ScramCredential]:
    document = json.loads(server.objects["v1/configmaps", "ns", "demo-acl"].raw["data"]["acl.json"])
    [principal] = document["principals"]
    return [scram.ScramCredential.parse(text) for text in principal["scram"]]


def scram_accepts(server: ApiServer, password: str) -> bool:
    """Whether a SCRAM-SHA-512 client with ``password`` gets past the brokers' check of
    the rendered credentials (the salt the server would answer with: the first's)."""
    credentials = [
        c for c in accepted_scram(server) if c.mechanism is scram.Mechanism.SCRAM_SHA_512
    ]
    salt, iterations = credentials[0].salt, credentials[0].iterations
    mine = scram.derive(scram.Mechanism.SCRAM_SHA_512, password, salt, iterations)
    return mine in credentials


def accepted_hashes(server: ApiServer) -> list[str]:
    document = json.loads(server.objects["v1/configmaps", "ns", "demo-acl"].raw["data"]["acl.json"])
    [principal] = document["principals"]
    return list(principal["tokens"])


async def test_rotation_keeps_the_previous_token_for_the_grace_then_drops_it(
    server: ApiServer, api: ClientApi
) -> None:
    clock = ManualClock(1_795_000_000_000)
    server.put(AUTH_CLUSTER)
    server.put(user())
    status = await changed(server, api, clock)
    first = token(server)
    assert status["tokenGeneration"] == 1 and "rotatedAt" not in status
    assert accepted_hashes(server) == [acl.hash_token(first)]
    assert scram_accepts(server, first)

    # a new rotateToken value: a new token, both accepted, the status says until when
    clock.advance(1_000)
    rotated_at = clock.now_ms()
    server.put({**user(rotate="ticket-1"), "status": status})
    status = await changed(server, api, clock)
    second = token(server)
    assert second != first
    assert accepted_hashes(server) == [acl.hash_token(second), acl.hash_token(first)]
    assert status["tokenGeneration"] == 2
    assert status["previousTokenExpiresAt"] == rfc3339(rotated_at + GRACE_S * 1000)
    annotations = server.objects["v1/secrets", "ns", "writer"].raw["metadata"]["annotations"]
    assert annotations[auth.PREVIOUS_TOKEN_HASH_ANNOTATION] == acl.hash_token(first)
    assert first not in json.dumps(server.objects["v1/secrets", "ns", "writer"].raw)
    assert scram_accepts(server, first) and scram_accepts(server, second)
    assert len(accepted_scram(server)) == 4  # SHA-256 and SHA-512 of each token

    # the same value again (a re-delivered event, an operator restart): no new token
    assert (await changed(server, api, clock))["tokenGeneration"] == 2
    assert token(server) == second

    # the timer during the grace: not one request
    requests = len(server)
    body = server.body("User", "writer")
    await principals.previous_token_expiry(
        body=kopf.Body(body), namespace="ns", name="writer", memo=context(api, clock),
        patch=kopf.Patch(), status=body["status"],
    )  # fmt: skip
    assert len(server) == requests

    # past the grace: the previous token's hash leaves the ACL file and the Secret
    clock.advance(GRACE_S * 1000)
    patch = kopf.Patch()
    await principals.previous_token_expiry(
        body=kopf.Body(body), namespace="ns", name="writer", memo=context(api, clock),
        patch=patch, status=body["status"],
    )  # fmt: skip
    status = store_status(server, body, patch)
    assert accepted_hashes(server) == [acl.hash_token(second)]
    assert token(server) == second
    assert scram_accepts(server, second) and not scram_accepts(server, first)
    annotations = server.objects["v1/secrets", "ns", "writer"].raw["metadata"]["annotations"]
    assert auth.PREVIOUS_TOKEN_HASH_ANNOTATION not in annotations
    assert auth.PREVIOUS_TOKEN_SCRAM_ANNOTATION not in annotations
    assert annotations[auth.TOKEN_GENERATION_ANNOTATION] == "2"
    assert "previousTokenExpiresAt" not in status and status["tokenGeneration"] == 2
    # the expiry was a metadata merge patch, not a new token
    patches = server["patch", kmock.resource("v1/secrets")]
    assert patches[-1].headers["Content-Type"].startswith("application/merge-patch+json")
    assert principals._previous_token_pending(status) is False


async def test_a_grace_of_zero_refuses_the_previous_token_at_once(
    server: ApiServer, api: ClientApi
) -> None:
    clock = ManualClock(1_795_000_000_000)
    server.put(AUTH_CLUSTER)
    server.put(user(grace_s=0))
    status = await changed(server, api, clock)
    server.put({**user(rotate="leaked", grace_s=0), "status": status})
    status = await changed(server, api, clock)
    assert accepted_hashes(server) == [acl.hash_token(token(server))]
    assert status["tokenGeneration"] == 2 and "previousTokenExpiresAt" not in status


def test_a_tls_user_cannot_ask_for_a_token_rotation() -> None:
    body = user(rotate="x")
    body["spec"]["authentication"] = {"type": "tls", "rotateToken": "x"}
    with pytest.raises(ValueError, match="rotateToken"):
        principals.User.from_manifest(body)


async def test_the_acl_configmap_lists_a_new_token_before_its_secret_holds_it(
    server: ApiServer, api: ClientApi
) -> None:
    """The kubelet syncs the ConfigMap and the Secret volumes independently: the new
    token's hash is written to the brokers' ACL file first, so a client that reads the
    rotated token is not refused for want of it (creation and rotation alike)."""
    clock = ManualClock(1_795_000_000_000)
    server.put(AUTH_CLUSTER)

    def written() -> list[str]:
        return [
            request.url.path.rsplit("/", 2)[-2]
            for request in server
            if request.method.value not in ("GET", "HEAD")
            and request.url.path.rsplit("/", 2)[-2] in ("configmaps", "secrets")
        ]

    server.put(user())
    status = await changed(server, api, clock)
    assert written()[-2:] == ["configmaps", "secrets"]  # a creation too
    before = len(written())
    server.put({**user(rotate="ticket-1"), "status": status})
    await changed(server, api, clock)
    assert written()[before:] == ["configmaps", "secrets"]
    assert accepted_hashes(server)[0] == acl.hash_token(token(server))
