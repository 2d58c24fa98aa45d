"""Scale a BrokerCluster 3 -> 4 -> 3 under acks=all keyed load.

Real API server, real kopf operator, brokers as pods. ``spec.replicas: 4``
grows the StatefulSet, and once demo-3 is live the operator moves a share of
the Topic's replicas (and leaderships) onto it: each new replica catches up as
a follower before the old copy goes (``control.moves``). ``spec.replicas: 3``
moves broker 3's replicas off first (``Ready`` reason ``ScalingDown``,
``Rebalancing=True``), and only then does the StatefulSet shrink. A producer
writes keyed records with acks=all throughout; afterwards every acknowledged
record is stored exactly once where it was acknowledged, offsets are
contiguous and each key's records are in order.

Test bed only, as ``test_operator_e2e``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from e2e.support import Cluster, wait_for
from e2e.tests.operator.test_operator_e2e import pod_ips, server_side_apply, topic_status
from headrace.testing.reading import read_partition
from tests.integration.acked_load import AckedLoad, Stored, check_stored_once, keys

PARTITIONS = 4
KEYS = keys(16)


def manifests(namespace: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "BrokerCluster",
            "metadata": {"name": "demo", "namespace": namespace},
            "spec": {"replicas": 3, "storage": {"size": "64Mi"}},
        },
        {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "orders", "namespace": namespace},
            "spec": {
                "clusterRef": {"name": "demo"},
                "partitions": PARTITIONS,
                "replicas": 3,
                "minInSync": 2,
                "tieredStorage": {"enabled": False},
            },
        },
    ]


def conditions(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    body = cluster.get("brokercluster", "demo", namespace)
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}


def scale(cluster: Cluster, namespace: str, replicas: int) -> None:
    cluster.kubectl_run(
        "patch",
        "brokercluster",
        "demo",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        f'{{"spec": {{"replicas": {replicas}}}}}',
    )


def replicas_of(cluster: Cluster, namespace: str) -> list[list[int]]:
    return [list(p["replicas"]) for p in topic_status(cluster, namespace).get("partitions", [])]


def balanced(cluster: Cluster, namespace: str, brokers: int) -> bool:
    """No move in flight, and the partitions spread over exactly brokers 0..brokers-1."""
    status = topic_status(cluster, namespace)
    parts = status.get("partitions", [])
    held = {b for p in parts for b in p["replicas"]}
    rebalancing = conditions(cluster, namespace).get("Rebalancing", {})
    return (
        bool(parts)
        and held == set(range(brokers))
        and all(not p.get("targetReplicas") and p["state"] == "Online" for p in parts)
        and rebalancing.get("status") == "False"
    )


@pytest.mark.usefixtures("host_reaches_pods", "operator")
def test_scale_3_4_3_under_acks_all_load_loses_nothing(cluster: Cluster, namespace: str) -> None:
    topic = f"{namespace}/orders"
    cluster_doc, topic_doc = manifests(namespace)
    server_side_apply(cluster, [cluster_doc], namespace)
    wait_for(
        "the BrokerCluster to be Ready",
        lambda: conditions(cluster, namespace).get("Ready", {}).get("status") == "True",
        120,
    )
    server_side_apply(cluster, [topic_doc], namespace)
    cluster.kubectl_run(
        "wait",
        "--for=condition=Ready",
        "topic/orders",
        "-n",
        namespace,
        "--timeout=120s",
        timeout=150,
    )
    ips = pod_ips(cluster, namespace)
    bootstrap = ",".join(f"{ip}:9092" for _, ip in sorted(ips.items()))
    load = AckedLoad(bootstrap, topic, KEYS, linger_ms=5, pause_s=0.05)
    load.start_thread()
    try:
        wait_for("a first acknowledged record", lambda: load.acked, 60)

        # up: the StatefulSet grows, then replicas and leaderships move onto broker 3
        scale(cluster, namespace, 4)
        wait_for("demo-3 running", lambda: 3 in pod_ips(cluster, namespace), 120)
        wait_for("replicas spread over 4 brokers", lambda: balanced(cluster, namespace, 4), 180)
        held = replicas_of(cluster, namespace)
        assert sum(3 in r for r in held) >= 2, held
        assert all(len(r) == 3 for r in held)
        at_four = len(load.acked)

        # down: broker 3's replicas move off first, then the StatefulSet shrinks
        scale(cluster, namespace, 3)
        seen_scaling_down = wait_for(
            "ScalingDown or back at 3",
            lambda: (
                conditions(cluster, namespace).get("Ready", {}).get("reason")
                in ("ScalingDown", "AllBrokersLive")
                and conditions(cluster, namespace)["Ready"]
            ),
            60,
        )
        assert seen_scaling_down["reason"] != "ScaleDownBlocked"
        wait_for("replicas back on 3 brokers", lambda: balanced(cluster, namespace, 3), 180)
        wait_for(
            "the StatefulSet back at 3",
            lambda: cluster.get("statefulset", "demo", namespace)["spec"]["replicas"] == 3,
            60,
        )
        wait_for("demo-3 gone", lambda: 3 not in pod_ips(cluster, namespace), 90)
        wait_for(
            "Ready at 3 brokers",
            lambda: (
                conditions(cluster, namespace).get("Ready", {}).get("reason") == "AllBrokersLive"
            ),
            60,
        )
        wait_for("more acknowledged records", lambda: len(load.acked) > at_four + 50, 60)
    finally:
        load.stop_thread()
    assert len(load.acked) > at_four > 0

    async def read_all(partition: int) -> Stored:
        records = await read_partition(bootstrap, topic, partition)
        return [(r.offset, r.key or b"", r.value) for r in records]

    asyncio.run(check_stored_once(read_all, PARTITIONS, load.acked))
    print(f"\n[e2e] scaled 3 -> 4 -> 3 under load: {len(load.acked)} acks=all records, none lost")

    # the Topic can still be deleted (deletionPolicy Retain waits for every broker the
    # cluster keeps, not for broker 3, which left it): its finalizer goes
    cluster.kubectl_run("delete", "topic", "orders", "-n", namespace, "--wait=false")
    cluster.kubectl_run(
        "wait", "--for=delete", "topic/orders", "-n", namespace, "--timeout=60s", timeout=90
    )
