"""A BrokerCluster's auth Secret, its Users' Secrets and ACL file, its pods' mounts.

The API is a small in-memory fake that stores what is applied (``StoringApi``): what is
checked here is what the operator decides to write, not the wire (the e2e suite
``e2e/tests/operator/test_auth_e2e.py`` runs it against an API server and brokers).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from headrace.fleet.clock import SystemClock
from headrace.fleet.http import HttpFleet
from headrace.operator import auth, principals, workloads
from headrace.operator.bodies import parse_cluster
from headrace.operator.handlers import OperatorContext
from headrace.operator.kube import ObjectRef
from headrace.resources import BrokerCluster
from headrace.security import acl
from tests.unit.controller.controller_fakes import ManualClock
from tests.unit.operator.operator_fakes import CLUSTER, FakeApi

NOW_MS = 1_795_000_000_000
AUTH_CLUSTER = {**CLUSTER, "spec": {"replicas": 3, "auth": {"enabled": True}}}


def user(name: str, cluster: str = "demo", kind: str = "token") -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "User",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "clusterRef": {"name": cluster},
            "authentication": {"type": kind},
            "authorization": {"grants": [{"operations": ["produce"], "topics": ["orders"]}]},
        },
    }


class StoringApi(FakeApi):
    """``FakeApi`` whose server-side apply stores the object and whose list finds Users."""

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # a real read yields: concurrent callers interleave here
        return await super().get(ref)

    async def apply(self, manifest: Mapping[str, Any]) -> None:
        await asyncio.sleep(0)
        await super().apply(manifest)
        self.put(manifest)

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        if kind != "User":
            return await super().list(api_version, kind, namespace, label_selector)
        return [
            copy.deepcopy(o)
            for ref, o in self.objects.items()
            if ref.kind == "User" and ref.namespace == namespace
        ]


def secret(api: FakeApi, name: str) -> dict[str, Any]:
    return api.objects[ObjectRef("v1", "Secret", "ns", name)]


def test_the_auth_secret_is_made_once_and_never_overwritten() -> None:
    api = StoringApi(AUTH_CLUSTER)
    first = asyncio.run(auth.replication_token(api, parse_cluster(AUTH_CLUSTER)))
    stored = copy.deepcopy(secret(api, "demo-cluster-auth"))
    again = asyncio.run(auth.replication_token(api, parse_cluster(AUTH_CLUSTER)))
    assert again == first and len(first) >= 40
    assert secret(api, "demo-cluster-auth") == stored
    assert [w for w in api.writes if w[1] == "Secret"] == [("APPLY", "Secret", "demo-cluster-auth")]
    key = auth.secret_value(stored, auth.CLUSTER_KEY_KEY)
    assert key is not None and re.fullmatch(r"[0-9a-f]{64}\n", key)
    owner = stored["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("BrokerCluster", "demo", "uid-1")


def test_concurrent_callers_get_one_token() -> None:
    """The workload handler and the control loop both ask when a cluster is created."""
    api = StoringApi(AUTH_CLUSTER)

    async def both() -> list[str]:
        return list(
            await asyncio.gather(
                auth.replication_token(api, parse_cluster(AUTH_CLUSTER)),
                auth.replication_token(api, parse_cluster(AUTH_CLUSTER)),
            )
        )

    first, second = asyncio.run(both())
    assert first == second
    # made once: a second apply would replace a token one caller may already hold
    assert [w for w in api.writes if w[1] == "Secret"] == [("APPLY", "Secret", "demo-cluster-auth")]
    assert auth.secret_value(secret(api, "demo-cluster-auth"), "replicationToken") == first


def test_a_clusters_users_become_principals_of_its_acl_file_with_token_hashes_only() -> None:
    api = StoringApi(AUTH_CLUSTER, user("writer"), user("ops", kind="tls"), user("x", "other"))
    synced = asyncio.run(auth.sync_acl(api, parse_cluster(AUTH_CLUSTER), NOW_MS))
    assert synced.principals == {"writer": "ns:writer", "ops": "ns:ops"}
    assert synced.secrets == {"writer": "writer"}  # tls users have no token
    token = auth.secret_value(secret(api, "writer"), auth.USER_TOKEN_KEY)
    assert token
    assert secret(api, "writer")["metadata"]["ownerReferences"][0]["uid"] == "uid-writer"
    config = api.objects[ObjectRef("v1", "ConfigMap", "ns", "demo-acl")]
    text = config["data"][auth.ACL_KEY]
    assert token not in text
    parsed = acl.parse_acl(json.loads(text))
    by_name = {p.name: p for p in parsed.principals}
    assert set(by_name) == {"ns:writer", "ns:ops"}
    assert by_name["ns:writer"].tokens == [acl.hash_token(token)]
    assert by_name["ns:ops"].certificates == ["ops"]
    # a second pass keeps the token (the Secret is not drawn again)
    asyncio.run(auth.sync_acl(api, parse_cluster(AUTH_CLUSTER), NOW_MS))
    assert auth.secret_value(secret(api, "writer"), auth.USER_TOKEN_KEY) == token


def test_broker_pods_load_the_acl_file_the_key_and_the_replication_token_from_files() -> None:
    settings = workloads.WorkloadSettings()
    plain = workloads.statefulset(BrokerCluster.from_manifest(CLUSTER), "uid-1", "ns", settings)
    # only the scratch emptyDir: no ACL, key or token volume
    assert [v["name"] for v in plain["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    assert "--acl-file" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]

    sts = workloads.statefulset(BrokerCluster.from_manifest(AUTH_CLUSTER), "uid-1", "ns", settings)
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--acl-file") + 1] == "/etc/headrace/acl/acl.json"
    assert args[args.index("--cluster-key-file") + 1] == "/etc/headrace/auth/cluster.key"
    token_file = "/etc/headrace/auth/replication.token"
    assert args[args.index("--replication-token-file") + 1] == token_file
    env = {e["name"]: e for e in container["env"]}
    # the token itself is in no env var (a running pod never sees one change): the preStop
    # hook's ``headrace drain`` is told where the broker's file is
    assert "HEADRACE_REPLICATION_TOKEN" not in env
    assert env["HEADRACE_REPLICATION_TOKEN_FILE"] == {
        "name": "HEADRACE_REPLICATION_TOKEN_FILE",
        "value": token_file,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["auth"]["secret"]["secretName"] == "demo-cluster-auth"
    assert {"key": "replicationToken", "path": "replication.token"} in volumes["auth"]["secret"][
        "items"
    ]
    # mounted as a directory, never with subPath: the kubelet's updates must reach the pod
    assert all("subPath" not in m for m in container["volumeMounts"])
    assert volumes["acl"]["configMap"]["name"] == "demo-acl"
    assert volumes["auth"]["secret"]["defaultMode"] == 0o400  # the broker refuses 0o44x
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["acl"] == "/etc/headrace/acl" and mounts["auth"] == "/etc/headrace/auth"


def test_a_running_fleet_takes_a_new_token_for_its_next_requests() -> None:
    """``spec.auth`` turned on (or off) while the cluster's loop runs."""

    async def run() -> list[str | None]:
        fleet = HttpFleet([], SystemClock(), 1000)
        await fleet.start()
        try:
            assert fleet._session is not None
            seen = [fleet._session.headers.get("Authorization")]
            fleet.set_auth_token("t1")
            seen.append(fleet._session.headers.get("Authorization"))
            fleet.set_auth_token(None)
            seen.append(fleet._session.headers.get("Authorization"))
            return seen
        finally:
            await fleet.close()

    assert asyncio.run(run()) == [None, "Bearer t1", None]


def test_a_user_is_ready_with_its_secret_only_once_its_cluster_has_auth() -> None:
    def handle(api: StoringApi, body: dict[str, Any]) -> dict[str, Any]:
        memo = SimpleNamespace(context=OperatorContext(api=api, clock=ManualClock()))
        patch = kopf.Patch()
        call = principals.user_changed(
            body=kopf.Body(body), namespace="ns", name=body["metadata"]["name"], memo=memo,
            patch=patch,
        )  # fmt: skip
        try:
            asyncio.run(call)
        except kopf.TemporaryError:
            pass
        return dict(patch["status"])

    writer = user("writer")
    missing = handle(StoringApi(writer), writer)
    assert missing["conditions"][0]["reason"] == "ClusterNotFound"
    disabled = handle(StoringApi(CLUSTER, writer), writer)
    assert disabled["conditions"][0]["reason"] == "AuthDisabled"
    api = StoringApi(AUTH_CLUSTER, writer)
    ready = handle(api, writer)
    assert ready["conditions"][0]["status"] == "True"
    assert ready["secret"] == {"name": "writer"} and ready["principal"] == "ns:writer"
    assert ObjectRef("v1", "ConfigMap", "ns", "demo-acl") in api.objects
    bad = {**writer, "spec": {**writer["spec"], "authentication": {"type": "password"}}}
    refused = principals.user_changed(
        body=kopf.Body(bad),
        namespace="ns",
        name="writer",
        memo=SimpleNamespace(context=OperatorContext(api=api, clock=ManualClock())),
        patch=kopf.Patch(),
    )
    with pytest.raises(kopf.PermanentError):
        asyncio.run(refused)


def test_a_secret_someone_else_owns_is_never_adopted() -> None:
    """A User named after an existing Secret (say a service account token) must not turn its
    value into a broker credential; the other Users still get their ACL entries."""
    api = StoringApi(AUTH_CLUSTER, user("alice"), user("sa-token"))
    squatted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "sa-token", "namespace": "ns"},
        "data": {auth.USER_TOKEN_KEY: "c2VjcmV0"},
    }
    api.put(squatted)
    squatted = copy.deepcopy(secret(api, "sa-token"))  # as stored (with its resourceVersion)
    synced = asyncio.run(auth.sync_acl(api, parse_cluster(AUTH_CLUSTER), NOW_MS))
    assert (
        "sa-token" in synced.refused and "not owned by User sa-token" in synced.refused["sa-token"]
    )
    assert set(synced.principals) == {"alice"}
    assert secret(api, "sa-token") == squatted  # untouched
    with pytest.raises(auth.ForeignSecret):
        asyncio.run(
            auth.ensure_secret(api, {**auth.new_auth_secret(parse_cluster(AUTH_CLUSTER)), "metadata": {
                **auth.new_auth_secret(parse_cluster(AUTH_CLUSTER))["metadata"], "name": "sa-token"}})
        )  # fmt: skip
