"""Users changed on a running, chart-installed cluster, and token rotation.

The test bed's kubelet keeps a running pod's ConfigMap and Secret volumes in step with
their sources, as a real kubelet does (``e2e/testbed/projection.py``), so the ACL file
the operator renders reaches running brokers, which reload it. Nothing here restarts a
broker pod: each test records the pods' UIDs and restart counts first and checks them
last.

* ``test_a_user_created_changed_and_deleted_takes_effect_without_restarts``: a User
  applied to a cluster that runs with auth and no Users produces with its token; with its
  produce grant removed, its next produce is ``ProduceDenied``; deleted, its token is
  ``AuthenticationFailed``.
* ``test_a_rotated_token_is_accepted_during_its_grace_and_refused_after``: a new
  ``rotateToken`` value gives the User a new token in its Secret; the previous token
  still produces after the new one reached the brokers (the default grace, 10 minutes,
  leaves no room for a slow machine to turn this into a race). Then the grace is
  shortened to end a few seconds ahead, which applies to the rotation under way: the
  operator's expiry timer drops the previous token and it is refused.

Every wait is a condition with a deadline. On the test bed, stand-in or real node: the
test reaches the brokers' pod IPs from this host.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import (
    InstalledOperator,
    cluster_manifests,
    figure,
    pod_ips,
    wait_ready,
)
from e2e.tests.operator.test_auth_e2e import produce, token_of, user
from headrace.control.documents import epoch_ms

#: how far ahead of the shortening the rotation test's grace ends, in s: the expiry is
#: then the operator's timer's (``principals.previous_token_expiry``), not the update's
SHORTENED_AHEAD_S = 10
#: how long a changed ACL ConfigMap or Secret may take to reach a running pod's volume: a
#: real kubelet rewrites it on its periodic sync of the pod (``syncFrequency``, 1 min by
#: default), so the waits on it allow two syncs and the propagation
VOLUME_REFRESH_S = 150


def broker_pods(cluster: Cluster, namespace: str) -> dict[str, tuple[str, int]]:
    """Pod name -> (UID, restart count) of the cluster's broker pods."""
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
    )
    return {
        pod["metadata"]["name"]: (
            pod["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or []),
        )
        for pod in json.loads(out.stdout)["items"]
    }


def start_cluster(cluster: Cluster, namespace: str) -> str:
    """A 3-broker cluster with auth and no User, its Topic Ready; a bootstrap address."""
    docs = cluster_manifests(namespace, partitions=1)
    docs[0]["spec"]["auth"] = {"enabled": True}
    cluster.apply(docs, namespace)
    wait_ready(cluster, "topic", "orders", namespace, timeout=120)
    ips = wait_for("the broker pods' IPs", lambda: pod_ips(cluster, namespace), 60)
    wait_for("3 broker pods", lambda: len(pod_ips(cluster, namespace)) == 3, 60)
    return f"{ips[0]}:9092"


def refused_with(bootstrap: str, topic: str, token: str, error: str) -> str | None:
    code, err = produce(bootstrap, topic, ["probe"], token)
    return err if code != 0 and error in err else None


def accepted(bootstrap: str, topic: str, token: str) -> bool:
    return produce(bootstrap, topic, ["probe"], token)[0] == 0


def test_a_user_created_changed_and_deleted_takes_effect_without_restarts(
    cluster: Cluster,
    namespace: str,
    host_reaches_pods: None,
    crds: None,
    operator: InstalledOperator,
) -> None:
    bootstrap = start_cluster(cluster, namespace)
    topic = f"{namespace}/orders"
    pods = broker_pods(cluster, namespace)

    started = time.monotonic()
    cluster.apply([user("late", ["produce", "consume"], [topic])], namespace)
    wait_ready(cluster, "user", "late", namespace, timeout=60)
    token = token_of(cluster, namespace, "late")
    wait_for(
        "the new User's token to produce",
        lambda: accepted(bootstrap, topic, token),
        VOLUME_REFRESH_S,
    )
    figure("User applied to its first accepted produce", time.monotonic() - started)

    started = time.monotonic()
    cluster.apply([user("late", ["consume"], [topic])], namespace)
    err = wait_for(
        "a produce without the grant to be refused",
        lambda: refused_with(bootstrap, topic, token, "ProduceDenied"),
        VOLUME_REFRESH_S,
    )
    figure("produce grant removed to the first ProduceDenied", time.monotonic() - started)
    assert token not in err

    started = time.monotonic()
    cluster.kubectl_run("delete", "user", "late", "-n", namespace, "--timeout=60s")
    wait_for(
        "the deleted User's token to be refused",
        lambda: refused_with(bootstrap, topic, token, "AuthenticationFailed"),
        VOLUME_REFRESH_S,
    )
    figure("User deleted to the first AuthenticationFailed", time.monotonic() - started)
    assert broker_pods(cluster, namespace) == pods  # same pods, not restarted


def test_a_rotated_token_is_accepted_during_its_grace_and_refused_after(
    cluster: Cluster,
    namespace: str,
    host_reaches_pods: None,
    crds: None,
    operator: InstalledOperator,
) -> None:
    bootstrap = start_cluster(cluster, namespace)
    topic = f"{namespace}/orders"
    manifest: dict[str, Any] = user("rotating", ["produce"], [topic])
    cluster.apply([manifest], namespace)
    wait_ready(cluster, "user", "rotating", namespace, timeout=60)
    first = token_of(cluster, namespace, "rotating")
    wait_for(
        "the first token to produce", lambda: accepted(bootstrap, topic, first), VOLUME_REFRESH_S
    )
    assert cluster.get("user", "rotating", namespace)["status"]["tokenGeneration"] == 1
    pods = broker_pods(cluster, namespace)

    started = time.monotonic()
    manifest["spec"]["authentication"]["rotateToken"] = "ticket-1"
    cluster.apply([manifest], namespace)

    def rotated() -> dict[str, Any] | None:
        status: dict[str, Any] = cluster.get("user", "rotating", namespace).get("status", {})
        return status if status.get("tokenGeneration") == 2 else None

    status = wait_for("the User's status to show generation 2", rotated, 60)
    rotated_at = epoch_ms(status["rotatedAt"])
    assert epoch_ms(status["previousTokenExpiresAt"]) == rotated_at + 600_000  # the default
    second = token_of(cluster, namespace, "rotating")
    assert second != first
    wait_for(
        "the new token to produce", lambda: accepted(bootstrap, topic, second), VOLUME_REFRESH_S
    )
    figure("rotateToken changed to the new token's first produce", time.monotonic() - started)
    assert accepted(bootstrap, topic, first), "the previous token was refused within its grace"

    # a shorter grace applies to the rotation under way: it now ends a few seconds ahead
    grace_s = math.ceil(time.time() - rotated_at / 1000) + SHORTENED_AHEAD_S
    manifest["spec"]["authentication"]["previousTokenGracePeriodSeconds"] = grace_s
    cluster.apply([manifest], namespace)
    wait_for(
        "the status to show the shortened grace",
        lambda: (
            cluster.get("user", "rotating", namespace)["status"].get("previousTokenExpiresAt")
            != status["previousTokenExpiresAt"]
        ),
        60,
    )
    started = time.monotonic()
    err = wait_for(
        "the previous token to be refused after its grace",
        lambda: refused_with(bootstrap, topic, first, "AuthenticationFailed"),
        SHORTENED_AHEAD_S + VOLUME_REFRESH_S,
    )
    figure("grace shortened to the previous token's refusal", time.monotonic() - started)
    assert first not in err and second not in err
    assert accepted(bootstrap, topic, second)
    status = cluster.get("user", "rotating", namespace)["status"]
    assert "previousTokenExpiresAt" not in status and status["tokenGeneration"] == 2
    secret = cluster.get("secret", "rotating", namespace)
    assert set(secret["data"]) == {"token"}
    assert "headrace.dev/previous-token-hash" not in secret["metadata"]["annotations"]
    reasons = cluster.kubectl_run(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=rotating",
        "-o", "jsonpath={.items[*].reason}",
    ).stdout.split()  # fmt: skip
    assert {"TokenRotated", "PreviousTokenExpired"} <= set(reasons), reasons
    assert broker_pods(cluster, namespace) == pods
