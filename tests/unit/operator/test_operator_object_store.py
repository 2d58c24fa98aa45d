"""A BrokerCluster's object store in its workload and conditions, over a fake ``KubeApi``:
the broker's URL and secretKeyRefs, a missing credentials Secret (as the kubelet reports
it on a pod: a Stalled condition until it exists), an endpoint that does not answer."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from types import SimpleNamespace
from typing import Any

from operator_fakes import CLUSTER, FakeApi

from headrace.operator import handlers, objectstores, workloads
from headrace.operator.bodies import parse_cluster
from headrace.operator.conditions import cluster_conditions
from headrace.operator.running import ClusterPorts, ClusterRuntime, DesiredObjects
from headrace.protocol.coordination import Heartbeat, PartitionReport
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.resources.clusters import ObjectStore
from tests.unit.controller.controller_fakes import ManualClock

NOW = "2026-01-01T00:00:00Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def store_spec(**extra: Any) -> dict[str, Any]:
    return {
        "endpoint": "http://127.0.0.1:9000",
        "bucket": "tiers",
        "credentialsSecret": {"name": "minio-creds"},
        **extra,
    }


def cluster(store: dict[str, Any] | None) -> dict[str, Any]:
    spec = {**CLUSTER["spec"], **({"objectStore": store} if store is not None else {})}  # type: ignore[dict-item]
    return {**CLUSTER, "spec": spec}


def secret(**data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "minio-creds", "namespace": "ns"},
        "data": data,
    }


def memo_over(api: FakeApi) -> Any:
    return SimpleNamespace(context=handlers.OperatorContext(api=api, clock=ManualClock()))


def test_the_store_becomes_the_brokers_url_without_credentials() -> None:
    def url(**extra: Any) -> str:
        return workloads.object_store_url(ObjectStore.model_validate(store_spec(**extra)))

    assert url() == "s3://127.0.0.1:9000/tiers"
    assert url(endpoint="https://s3.example.com") == "s3+https://s3.example.com/tiers"
    assert (
        url(region="eu-west-1", createBucket=True)
        == "s3://127.0.0.1:9000/tiers?create_bucket=1&region=eu-west-1"
    )


async def test_credentials_come_from_the_secret_by_reference() -> None:
    api = FakeApi(secret(user="YQ==", password="Yg=="))
    store = store_spec(
        credentialsSecret={
            "name": "minio-creds",
            "accessKeyKey": "user",
            "secretKeyKey": "password",
        }
    )
    await handlers.cluster_workload(
        body=cluster(store), namespace="ns", name="demo", memo=memo_over(api)
    )
    config, sts = api.applied[0], api.applied[-1]
    assert sts["kind"] == "StatefulSet"
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env[workloads.ACCESS_KEY_ENV] == {"secretKeyRef": {"name": "minio-creds", "key": "user"}}
    assert env[workloads.SECRET_KEY_ENV] == {
        "secretKeyRef": {"name": "minio-creds", "key": "password"}
    }
    args = container["args"]
    assert args[args.index("--object-store") + 1] == "s3://127.0.0.1:9000/tiers"
    assert '"url": "s3://127.0.0.1:9000/tiers"' in config["data"]["object-store.json"]
    assert "YQ==" not in str(api.applied)


def waiting_pod(message: str, reason: str = "CreateContainerConfigError") -> dict[str, Any]:
    return {
        "metadata": {"name": "demo-0", "labels": {workloads.POD_INDEX_LABEL: "0"}},
        "status": {
            "containerStatuses": [
                {"name": "broker", "state": {"waiting": {"reason": reason, "message": message}}}
            ]
        },
    }


def test_the_kubelet_says_when_the_secret_is_missing() -> None:
    store = ObjectStore.model_validate(store_spec())
    missing = objectstores.credentials_problem(
        store, [waiting_pod('secret "minio-creds" not found')]
    )
    assert missing is not None and "demo-0" in missing and "'accessKey'" in missing
    no_key = objectstores.credentials_problem(
        store, [waiting_pod("couldn't find key secretKey in Secret ns/minio-creds")]
    )
    assert no_key is not None
    assert (
        objectstores.credentials_problem(store, [waiting_pod('secret "other" not found')]) is None
    )
    assert objectstores.credentials_problem(store, [waiting_pod("x", "ContainerCreating")]) is None
    assert objectstores.credentials_problem(None, [waiting_pod('secret "minio-creds"')]) is None


async def test_a_missing_secret_is_a_stalled_condition_until_it_exists() -> None:
    api = FakeApi()
    body = api.put(cluster(store_spec()))
    await handlers.cluster_workload(body=body, namespace="ns", name="demo", memo=memo_over(api))
    assert "StatefulSet" in [m["kind"] for m in api.applied]  # the kubelet waits for the Secret
    api.pods = [waiting_pod('secret "minio-creds" not found')]
    runtime = ClusterRuntime(DesiredObjects(body), ClusterPorts(api, ManualClock()))
    runtime.sync(body, [])
    await runtime.step()
    conditions = {c["type"]: c for c in api.body("BrokerCluster", "demo")["status"]["conditions"]}
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == (
        "False",
        "CredentialsSecretMissing",
    )
    assert conditions["Stalled"]["status"] == "True"
    assert "minio-creds" in conditions["Ready"]["message"]

    api.pods = []  # the Secret exists: the pod started (and is not live yet)
    runtime.sync(api.body("BrokerCluster", "demo"), [])
    await runtime.step()
    conditions = {c["type"]: c for c in api.body("BrokerCluster", "demo")["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "BrokersNotLive"
    assert "Stalled" not in conditions


def test_an_unreachable_endpoint_is_a_condition_of_its_own() -> None:
    health = objectstores.StoreHealth(unreachable="http://x:9 does not answer")
    status = cluster_conditions(parse_cluster(cluster(store_spec())), {0, 1, 2}, NOW, store=health)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"  # brokers serve without the store
    reachable = conditions[objectstores.REACHABLE_CONDITION]
    assert (reachable["status"], reachable["reason"]) == ("False", "EndpointUnreachable")
    plain = cluster_conditions(parse_cluster(cluster(None)), {0, 1, 2}, NOW)
    assert [c["type"] for c in plain["conditions"]] == ["Ready"]


async def test_the_endpoint_check_connects_outside_the_step() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    checks = objectstores.StoreChecks(connect_timeout_s=1.0, failing_recheck_s=0.0)
    up = ObjectStore.model_validate(store_spec(endpoint=f"http://127.0.0.1:{port}"))
    first = await checks.check(up, [])
    assert first.endpoint_known is False  # the connect runs in its own task
    await checks.settled()
    assert await checks.check(up, []) == objectstores.StoreHealth()
    server.close()
    await server.wait_closed()
    down = ObjectStore.model_validate(store_spec(endpoint=f"http://127.0.0.1:{free_port()}"))
    await checks.check(down, [])  # a new spec: checked at once
    await checks.settled()
    health = await checks.check(down, [])
    assert health.endpoint_known and health.credentials is None
    assert "does not answer" in str(health.unreachable)
    await checks.settled()
    assert await checks.check(None, []) == objectstores.StoreHealth()


def test_an_unchecked_endpoint_keeps_the_stored_condition() -> None:
    down = objectstores.StoreHealth(unreachable="x does not answer")
    body = cluster(store_spec())
    body["status"] = cluster_conditions(parse_cluster(body), {0, 1, 2}, NOW, store=down)
    unknown = objectstores.StoreHealth(endpoint_known=False)
    again = cluster_conditions(
        parse_cluster(body), {0, 1, 2}, "2026-01-02T00:00:00Z", store=unknown
    )
    assert again == body["status"]  # an operator restart writes nothing


def test_brokers_reporting_failed_uploads_are_a_condition() -> None:
    report = PartitionReport(
        "ns/orders", 0, "leader", 1, 10, 10, upload_error="2 upload rounds in a row failed: X"
    )
    doc = report.to_json()
    assert doc["uploadError"] == report.upload_error
    assert PartitionReport.from_json(doc) == report
    assert "uploadError" not in dataclasses.replace(report, upload_error=None).to_json()

    heartbeat = Heartbeat(BrokerEndpoint(0, "10.0.0.1", 9092), partitions=(report,))
    problem = objectstores.upload_problem({0: heartbeat})
    assert problem == "broker 0: ns/orders/0: 2 upload rounds in a row failed: X"
    status = cluster_conditions(
        parse_cluster(cluster(store_spec())),
        {0, 1, 2},
        NOW,
        store=objectstores.StoreHealth(uploads=problem),
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    reachable = conditions[objectstores.REACHABLE_CONDITION]
    assert (reachable["status"], reachable["reason"]) == ("False", "UploadsFailing")
    assert conditions["Ready"]["status"] == "True"
