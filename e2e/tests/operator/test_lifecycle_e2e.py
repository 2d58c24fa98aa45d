"""Lifecycle on the test bed (and a brokerConfig change): deleting
a Topic runs its finalizer and its data goes as ``deletionPolicy`` says; a brokerConfig
change rolls the broker pods one at a time under acks=all keyed load, each broker's
leadership moved off before its pod stops, nothing acknowledged lost.

On the test bed, stand-in or real node: the tests reach the brokers on their pod IPs from
this host, and the brokers' volumes are directories of this host (the PersistentVolumes'
``hostPath`` on the stand-in, ``local`` on the real node), which the Topic test looks into.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

from e2e.support import Cluster, wait_for
from e2e.testbed.provisioning import volume_path
from e2e.tests.operator.fixtures import InstalledOperator, pod_ips
from e2e.tests.operator.test_operator_e2e import server_side_apply
from headrace.client import Producer
from headrace.testing import procs

CLUSTER_DOC: dict[str, Any] = {
    "apiVersion": "headrace.dev/v1alpha1",
    "kind": "BrokerCluster",
    "metadata": {"name": "demo"},
    "spec": {"replicas": 3, "storage": {"size": "64Mi"}},
}


def topic_doc(name: str, namespace: str, partitions: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterRef": {"name": "demo"},
            "partitions": partitions,
            "replicas": 3,
            "minInSync": 2,
            "tieredStorage": {"enabled": False},
            **spec,
        },
    }


def start_cluster(cluster: Cluster, namespace: str, *topics: dict[str, Any]) -> str:
    """Apply the BrokerCluster and ``topics``, wait for Ready; the pod-IP bootstrap."""
    doc = {**CLUSTER_DOC, "metadata": {"name": "demo", "namespace": namespace}}
    server_side_apply(cluster, [doc], namespace)
    server_side_apply(cluster, list(topics), namespace)
    for t in topics:
        cluster.kubectl_run(
            "wait",
            "--for=condition=Ready",
            f"topic/{t['metadata']['name']}",
            "-n",
            namespace,
            "--timeout=120s",
            timeout=150,
        )
    ips = wait_for("3 broker pod IPs", lambda: len(pod_ips(cluster, namespace)) == 3 or None, 60)
    assert ips
    return ",".join(f"{ip}:9092" for ip in pod_ips(cluster, namespace).values())


def heartbeat_topics(ip: str) -> set[str]:
    with urllib.request.urlopen(f"http://{ip}:9644/v1/heartbeat", timeout=5) as resp:
        return {p["topic"] for p in json.loads(resp.read())["partitions"]}


def volume(cluster: Cluster, namespace: str, broker: int) -> Path:
    claim = cluster.get("pvc", f"data-demo-{broker}", namespace)["spec"]["volumeName"]
    pv = cluster.kubectl_run("get", "pv", claim, "-o", "json")
    path = volume_path(json.loads(pv.stdout))
    assert path is not None, f"{claim} is not a volume of the test bed's provisioner"
    return path


def events(cluster: Cluster, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    out = cluster.kubectl_run(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind={kind},involvedObject.name={name}",
        "-o",
        "json",
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return sorted(items, key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")


def test_topic_deletion_deletes_or_retains_the_data_as_its_policy_says(
    cluster: Cluster, namespace: str, host_reaches_pods: None, operator: InstalledOperator
) -> None:
    try:
        bootstrap = start_cluster(
            cluster,
            namespace,
            topic_doc("dropped", namespace, 2, deletionPolicy="Delete"),
            topic_doc("kept", namespace, 2),  # the default: Retain
        )
        for name in ("dropped", "kept"):
            body = cluster.get("topic", name, namespace)
            assert "headrace.dev/topic-data" in body["metadata"]["finalizers"]
            done = procs.run_headrace(
                "produce",
                f"{namespace}/{name}",
                "--acks",
                "all",
                "--bootstrap",
                bootstrap,
                stdin="".join(f"{name}-{i}\n" for i in range(50)).encode(),
                timeout=60,
            )
            assert done.returncode == 0, done.stderr.decode()
        ips = pod_ips(cluster, namespace)
        volumes = {b: volume(cluster, namespace, b) for b in range(3)}
        for b, path in volumes.items():
            assert (path / "topics" / namespace / "dropped" / "0").is_dir(), b

        # Delete: kubectl's delete returns once the finalizer is gone
        cluster.kubectl_run(
            "delete", "topic", "dropped", "-n", namespace, "--timeout=90s", timeout=120
        )
        for b, ip in ips.items():
            assert f"{namespace}/dropped" not in heartbeat_topics(ip)
            assert not (volumes[b] / "topics" / namespace / "dropped").exists()
        # the operator posts a step's Events at the step's end: the finalizer may be gone
        # (and kubectl returned) a moment before its Event is there
        wait_for(
            "the TopicDataDeleted Event",
            lambda: (
                "TopicDataDeleted"
                in [e["reason"] for e in events(cluster, namespace, "Topic", "dropped")]
            ),
            timeout_s=30,
        )

        # Retain: the copies are closed and moved aside on every broker, not removed
        cluster.kubectl_run(
            "delete", "topic", "kept", "-n", namespace, "--timeout=90s", timeout=120
        )
        for b, ip in ips.items():
            assert f"{namespace}/kept" not in heartbeat_topics(ip)
            assert not (volumes[b] / "topics" / namespace / "kept").exists()
            (moved,) = (volumes[b] / "retained").glob(f"{namespace}.kept.*")
            segments = list(moved.glob("*/*.log"))
            assert segments and any(s.stat().st_size > 0 for s in segments), b
        wait_for(
            "the TopicDataRetained Event",
            lambda: (
                "TopicDataRetained"
                in [e["reason"] for e in events(cluster, namespace, "Topic", "kept")]
            ),
            timeout_s=30,
        )
    except BaseException:
        print(operator.logs()[-8000:])
        raise


class KeyedLoad:
    """acks=all keyed records in a thread of its own until stopped; which were acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.acked: set[str] = set()
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with Producer(self.bootstrap, acks="all", delivery_timeout_ms=20_000) as producer:
            n = 0
            while not self.stop.is_set():
                values = [f"v-{n + i}" for i in range(20)]
                receipts = [
                    await producer.send(self.topic, v.encode(), key=f"k-{(n + i) % 13}".encode())
                    for i, v in enumerate(values)
                ]
                for value, receipt in zip(values, receipts, strict=True):
                    try:
                        await receipt
                        self.acked.add(value)
                    except Exception:
                        self.failed += 1
                n += len(values)
                await asyncio.sleep(0.05)


def test_a_broker_config_change_rolls_the_pods_one_at_a_time_with_nothing_lost(
    cluster: Cluster, namespace: str, host_reaches_pods: None, operator: InstalledOperator
) -> None:
    topic = f"{namespace}/rolled"
    try:
        bootstrap = start_cluster(cluster, namespace, topic_doc("rolled", namespace, 3))
        before = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in json.loads(
                cluster.kubectl_run(
                    "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
                ).stdout
            )["items"]
        }
        assert sorted(before) == ["demo-0", "demo-1", "demo-2"]
        load = KeyedLoad(bootstrap, topic)
        load.thread.start()
        wait_for("records acknowledged before the change", lambda: len(load.acked) >= 100, 60)

        cluster.kubectl_run(
            "patch",
            "brokercluster",
            "demo",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"brokerConfig": {"flushIntervalMs": 7}}}),
        )
        # watch every partition while the pods roll: none may ever be without a leader
        offline: list[str] = []

        def rolled() -> bool:
            status = cluster.get("topic", "rolled", namespace).get("status") or {}
            offline.extend(
                f"{p['partition']}:{p['state']}"
                for p in status.get("partitions", [])
                if p["state"] == "Offline"
            )
            body = cluster.get("brokercluster", "demo", namespace)
            restarting = next(
                (c for c in body["status"].get("conditions", []) if c["type"] == "Restarting"),
                None,
            )
            return restarting is not None and restarting["reason"] == "RolloutComplete"

        wait_for("the rolling restart to complete", rolled, 300, every_s=1.0)
        wait_for("load after the restart", lambda: len(load.acked) >= 200, 60)
        load.stop.set()
        load.thread.join(60)

        after = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in json.loads(
                cluster.kubectl_run(
                    "get", "pods", "-n", namespace, "-l", "headrace.dev/cluster=demo", "-o", "json"
                ).stdout
            )["items"]
        }
        assert all(after[name] != uid for name, uid in before.items()), "every pod replaced"

        # one at a time, highest ordinal first, each leading nothing when deleted
        messages = [
            e["message"]
            for e in events(cluster, namespace, "BrokerCluster", "demo")
            if e["reason"] == "RollingRestart"
        ]
        deletes = [m for m in messages if "deleting pod" in m]
        assert [m.split("deleting pod ")[1].split(",")[0].split(";")[0] for m in deletes] == [
            "demo-2",
            "demo-1",
            "demo-0",
        ], messages
        assert all("leading nothing" in m for m in deletes), deletes
        # no election caused by a failure: every leader change was a hand-off or hand-back
        # (an event's reason is the last rule of a step's chain; the message names the rest)
        topic_events = [
            f"{e['reason']}: {e['message']}" for e in events(cluster, namespace, "Topic", "rolled")
        ]
        lost = [e for e in topic_events if "LeaderLost" in e or "CandidateLost" in e]
        assert lost == [] and offline == [], (lost, offline)
        assert any("LeaderDraining" in e for e in topic_events), topic_events

        consumed = procs.run_headrace(
            "consume",
            topic,
            "--cohort",
            "check",
            "--from-beginning",
            "--idle-timeout",
            "5",
            "--bootstrap",
            ",".join(f"{ip}:9092" for ip in pod_ips(cluster, namespace).values()),
            timeout=120,
        )
        assert consumed.returncode == 0, consumed.stderr.decode()
        missing = load.acked - set(consumed.stdout.decode().split())
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
        print(
            f"\n[e2e figure] rolling restart: {len(load.acked)} records acknowledged,"
            f" {load.failed} sends failed (retriable, not acknowledged)"
        )
    except BaseException:
        print(operator.logs()[-8000:])
        raise
