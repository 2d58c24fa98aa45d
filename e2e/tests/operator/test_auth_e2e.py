"""Authentication on Kubernetes end to end: a BrokerCluster with ``spec.auth.enabled``
and its ``User`` objects, whose tokens the clients present.

The chart installs the operator (``operator`` fixture). Two Users, then a 3-broker
BrokerCluster with auth on, then a Topic are applied. The Topic becomes Ready: the
operator's heartbeat polls and topology pushes reach brokers that run with
``--acl-file``, so they authenticate (with the replication token from the Secret
``<cluster>-cluster-auth`` the operator made; a push without the ``cluster`` grant is
refused and no Topic would ever be placed). Each User becomes Ready with its Secret named
in its status. With the ``writer`` User's token (read from its Secret, as an application
would mount it) records are produced and consumed; with no token the connection is
refused (``AuthenticationFailed``), and with the ``reader`` User's token, whose grant is
consume on another topic, a produce is ``ProduceDenied``.

The Users are applied before the cluster, so the ACL file is complete when the pods
start; Users added, changed, deleted and rotated on a running cluster are
``test_user_live_e2e.py``'s.

On the test bed, stand-in or real node: the test reaches the brokers' pod IPs from this
host.
"""

from __future__ import annotations

import base64
import time

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import (
    InstalledOperator,
    cluster_manifests,
    condition,
    figure,
    pod_ips,
    wait_ready,
)
from headrace.testing import procs


def user(name: str, operations: list[str], topics: list[str]) -> dict[str, object]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "User",
        "metadata": {"name": name},
        "spec": {
            "clusterRef": {"name": "demo"},
            "authentication": {"type": "token"},
            "authorization": {"grants": [{"operations": operations, "topics": topics}]},
        },
    }


def token_of(cluster: Cluster, namespace: str, secret: str) -> str:
    data = cluster.get("secret", secret, namespace)["data"]
    return base64.b64decode(data["token"]).decode()


def produce(bootstrap: str, topic: str, values: list[str], token: str | None) -> tuple[int, str]:
    env = {"HEADRACE_AUTH_TOKEN": token} if token else {}
    done = procs.run_headrace(
        "produce", topic, "--acks", "all", "--bootstrap", bootstrap,
        stdin="".join(f"{v}\n" for v in values).encode(), timeout=60, env=env,
    )  # fmt: skip
    return done.returncode, done.stderr.decode()


def test_users_get_token_secrets_and_only_their_grants(
    cluster: Cluster, namespace: str, host_reaches_pods: None, operator: InstalledOperator
) -> None:
    started = time.monotonic()
    docs = cluster_manifests(namespace, partitions=1)
    docs[0]["spec"]["auth"] = {"enabled": True}
    cluster.apply(
        [
            user("writer", ["produce", "consume"], [f"{namespace}/orders"]),
            user("reader", ["consume"], [f"{namespace}/other"]),
            *docs,
        ],
        namespace,
    )
    # placed and Ready: the operator's polls and pushes authenticated
    wait_ready(cluster, "topic", "orders", namespace, timeout=120)
    figure("auth cluster: apply to Topic Ready", time.monotonic() - started)
    secret = cluster.get("secret", "demo-cluster-auth", namespace)
    assert set(secret["data"]) == {"replicationToken", "clusterKey"}
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "BrokerCluster"
    acl_text = cluster.get("configmap", "demo-acl", namespace)["data"]["acl.json"]

    statuses = {}
    for name in ("writer", "reader"):
        wait_ready(cluster, "user", name, namespace, timeout=60)
        statuses[name] = cluster.get("user", name, namespace)["status"]
        assert statuses[name]["secret"] == {"name": name}
        assert statuses[name]["principal"] == f"{namespace}:{name}"
    writer = token_of(cluster, namespace, "writer")
    reader = token_of(cluster, namespace, "reader")
    assert writer not in acl_text and reader not in acl_text  # hashes only

    bootstrap = f"{wait_for('a broker pod IP', lambda: pod_ips(cluster, namespace), 60)[0]}:9092"
    topic = f"{namespace}/orders"
    values = [f"v{i}" for i in range(10)]
    # accepted: so the broker knows the topic, which only the operator's topology push
    # (``cluster`` grant: the replication token) can have told it
    code, err = produce(bootstrap, topic, values, writer)
    assert code == 0, err
    done = procs.run_headrace(
        "consume", topic, "--cohort", "check", "--from-beginning", "--idle-timeout", "5",
        "--bootstrap", bootstrap, timeout=60, env={"HEADRACE_AUTH_TOKEN": writer},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert set(done.stdout.decode().split()) == set(values)

    code, err = produce(bootstrap, topic, ["x"], None)
    assert code != 0 and "AuthenticationFailed" in err, err
    code, err = produce(bootstrap, topic, ["x"], reader)
    assert code != 0 and "ProduceDenied" in err, err
    assert reader not in err and writer not in err
    user_ready = condition(cluster.get("user", "writer", namespace))
    assert user_ready is not None and user_ready["reason"] == "Provisioned"
