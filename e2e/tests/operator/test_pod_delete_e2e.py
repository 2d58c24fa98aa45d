"""A plain pod deletion is a controlled shutdown (``kubectl delete pod``, or a node drain's
eviction through the Eviction API, which deletes the pod the same way once the
PodDisruptionBudget allows it): the kubelet runs the broker's ``preStop`` hook
(``headrace drain``), the operator keeps polling the terminating pod, sees it ``draining``
and hands its leadership away (rule ``LeaderDraining``) before SIGTERM; no partition goes
Offline, no election is a failover (``LeaderLost``: before the fix the operator stopped
polling the pod at its ``deletionTimestamp`` and failed its partitions over after the
liveness TTL), nothing acknowledged is lost, and the StatefulSet's new pod rejoins.

On the test bed, stand-in or real node: it reaches the brokers on their pod IPs from this
host and reads the operator's Events the same way the rolling-restart test does
(``test_lifecycle_e2e``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import InstalledOperator, pod_ips
from e2e.tests.operator.test_lifecycle_e2e import (
    KeyedLoad,
    events,
    heartbeat_topics,
    start_cluster,
    topic_doc,
)
from headrace.testing import procs


def broker_pods(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    out = cluster.kubectl_run(
        "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
    ).stdout
    return {p["metadata"]["name"]: p for p in json.loads(out)["items"]}


def evict(cluster: Cluster, namespace: str, name: str) -> bool:
    """Ask the Eviction API to evict ``name`` (what ``kubectl drain`` does for each pod on a
    node); False while the PodDisruptionBudget refuses it (429)."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    done = cluster.kubectl_run(
        "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", "-f", "-",
        input=json.dumps(body), check=False,
    )  # fmt: skip
    refused = "TooManyRequests" in done.stderr or "disruption budget" in done.stderr
    if done.returncode != 0 and not refused:
        raise AssertionError(f"eviction of {name} failed: {done.stderr}")
    return done.returncode == 0


def take_down_the_busiest(cluster: Cluster, namespace: str, topic: str, how: str) -> str:
    """Delete (``how="delete"``) or evict (``"evict"``) the pod leading the most partitions;
    wait until the StatefulSet's new pod is back and in every partition's live replica set.
    What went Offline meanwhile, if anything, is returned in the figure line."""
    partitions = cluster.get("topic", "deleted", namespace)["status"]["partitions"]
    led = Counter(p["leader"] for p in partitions if p.get("leader") is not None)
    victim, leading = led.most_common(1)[0]
    name = f"demo-{victim}"
    old_uid = broker_pods(cluster, namespace)[name]["metadata"]["uid"]
    if how == "delete":
        # a plain delete with the pod's own grace period, as ``kubectl delete pod`` does; not
        # waited for, so the partitions can be watched meanwhile
        cluster.kubectl_run("delete", "pod", name, "-n", namespace, "--wait=false")
    else:
        # the budget (maxUnavailable 1) lets one broker go at a time: it may refuse until
        # the disruption controller has counted every pod healthy again
        wait_for(f"the eviction of {name}", lambda: evict(cluster, namespace, name), 60)

    offline: list[str] = []

    def rejoined() -> bool:
        status = cluster.get("topic", "deleted", namespace).get("status") or {}
        offline.extend(
            f"{p['partition']}:{p['state']}"
            for p in status.get("partitions", [])
            if p["state"] == "Offline"
        )
        pod = broker_pods(cluster, namespace).get(name)
        if pod is None or pod["metadata"]["uid"] == old_uid:
            return False
        ip = (pod.get("status") or {}).get("podIP")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        if not ip or not ready:
            return False
        try:
            serving = topic in heartbeat_topics(ip)
        except OSError:
            return False
        # rejoined: the new pod replicates the topic again and is in every partition's
        # live replica set
        return serving and all(
            victim in p.get("liveReplicas", []) for p in status.get("partitions", [])
        )

    wait_for(f"{name} to come back and rejoin after the {how}", rejoined, 90, every_s=0.5)
    assert offline == [], (how, offline)
    return f"{how} of broker {victim} (leading {leading} of 6)"


def test_deleting_or_evicting_the_busiest_broker_pod_drains_it_first_and_loses_nothing(
    cluster: Cluster, namespace: str, host_reaches_pods: None, operator: InstalledOperator
) -> None:
    topic = f"{namespace}/deleted"
    try:
        bootstrap = start_cluster(cluster, namespace, topic_doc("deleted", namespace, 6))
        load = KeyedLoad(bootstrap, topic)
        load.thread.start()
        wait_for("records acknowledged before the deletion", lambda: len(load.acked) >= 100, 60)

        done = [
            take_down_the_busiest(cluster, namespace, topic, how) for how in ("delete", "evict")
        ]
        at_rejoin = len(load.acked)
        wait_for("load after the rejoin", lambda: len(load.acked) >= at_rejoin + 50, 60)
        load.stop.set()
        load.thread.join(60)

        # each broker's leadership moved by hand-off, not by a failure election (an
        # event's reason is the last rule of a step's chain; the message names the rest)
        topic_events = [
            f"{e['reason']}: {e['message']}" for e in events(cluster, namespace, "Topic", "deleted")
        ]
        lost = [e for e in topic_events if "LeaderLost" in e or "CandidateLost" in e]
        assert lost == [], (lost, topic_events)
        assert any("LeaderDraining" in e for e in topic_events), topic_events

        consumed = procs.run_headrace(
            "consume", topic, "--cohort", "check", "--from-beginning", "--idle-timeout", "5",
            "--bootstrap", ",".join(f"{ip}:9092" for ip in pod_ips(cluster, namespace).values()),
            timeout=120,
        )  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr.decode()
        missing = load.acked - set(consumed.stdout.decode().split())
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
        print(
            f"\n[e2e figure] {'; '.join(done)}: {len(load.acked)} records acknowledged,"
            f" {load.failed} sends failed (retriable, not acknowledged)"
        )
    except BaseException:
        print(operator.logs()[-8000:])
        raise
