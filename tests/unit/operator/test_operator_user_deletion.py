"""A deleted User leaves its cluster's ACL file even when the first write fails,
against kmock's API server (``kube_server``).

The User's delete handler runs under kopf's finalizer: kopf keeps the User until the
handler succeeds and retries it after a failure, which an event handler (what the
operator had) never is.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import kmock
import kopf
import pytest
from kube_server import ApiServer
from operator_fakes import CLUSTER
from test_operator_kopf import kopf_running, until

from headrace.operator import auth, handlers, principals
from headrace.operator.kube import ClientApi
from headrace.security import acl
from tests.unit.controller.controller_fakes import ManualClock

USERS = "headrace.dev/v1alpha1/users"
AUTH_CLUSTER = {**CLUSTER, "spec": {"replicas": 3, "auth": {"enabled": True}}}
FINALIZER = f"{handlers.ANNOTATION_PREFIX}/finalizer"


def user(name: str, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "User",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            **metadata,
        },
        "spec": {
            "clusterRef": {"name": "demo"},
            "authentication": {"type": "tls"},  # no Secret to make
            "authorization": {"grants": [{"operations": ["produce"], "topics": ["orders"]}]},
        },
    }


def serve_users(server: ApiServer, *users: dict[str, Any]) -> None:
    server.resources[USERS] = kmock.ResourceInfo(
        kind="User",
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "patch", "update"},
    )
    for body in users:
        server.objects[USERS, "ns", body["metadata"]["name"]] = body


def acl_principals(server: ApiServer) -> set[str]:
    config = server.body("ConfigMap", auth.acl_config_name("demo"))
    document = acl.AclFile.model_validate_json(config["data"][auth.ACL_KEY])
    return {p.name for p in document.principals}


async def test_a_failed_acl_write_is_retried_until_the_deleted_user_is_out(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(AUTH_CLUSTER)
    leaving = user("bob", deletionTimestamp="2026-11-24T14:00:00Z", finalizers=[FINALIZER])
    serve_users(server, user("alice"), leaving)
    memo = SimpleNamespace(context=handlers.OperatorContext(api=api, clock=ManualClock()))
    configmaps = kmock.resource("v1/configmaps")
    server["patch", configmaps][:1] << kmock.KubernetesError(500, "InternalError", "etcd down")

    with pytest.raises(kopf.TemporaryError, match="still names the deleted User") as failed:
        await principals.user_removed(body=kopf.Body(leaving), namespace="ns", memo=memo)
    assert failed.value.delay == principals.RETRY_S, "kopf tries again, soon"

    await principals.user_removed(body=kopf.Body(leaving), namespace="ns", memo=memo, retry=1)
    assert acl_principals(server) == {"ns:alice"}


async def test_kopf_holds_every_user_with_its_finalizer_existing_ones_too(
    server: ApiServer, api: ClientApi
) -> None:
    # a User made before the delete handler existed has no finalizer: kopf adds it
    serve_users(server, user("carol"))
    async with kopf_running(server, api):
        await until(
            "kopf's finalizer on the User",
            lambda: (
                FINALIZER
                in server.objects[USERS, "ns", "carol"].raw["metadata"].get("finalizers", [])
            ),
        )
