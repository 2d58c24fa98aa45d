"""Live repartition through the operator on the test bed (the Kubernetes half).

A 3-broker BrokerCluster and a Topic of 4 partitions (RF 3, minInSync 2) carry a
keyed acks=all load (``tests.integration.keyed``: every key with its own sequence
numbers) read by a 3-member cohort through the pod IPs. Then:

1. ``kubectl apply`` of a Repartition 4 -> 8, with the cohort paused so that both
   sides of the cutover have a backlog: the Repartition shows Draining; a second
   Repartition of the busy topic waits (Pending, naming the one in flight); the
   cohort resumes and the first one reaches Finalized; the waiting one then fails,
   since the topic already has 8 partitions.
2. ``kubectl patch`` of ``Topic.spec.partitions`` 8 -> 12, the GitOps way: the same
   transition runs (the Topic's transition marker, then 12 partitions at partitioning
   version 3, Ready again at the new generation).
3. A Repartition 12 -> 6: the shrink retires partitions 6..11 at finalize (for routing:
   they stay in the Topic's status, readable; ``activePartitions`` is 6).
4. The checker: every acknowledged record delivered, each key strictly in sequence
   across all three cutovers, nothing twice.

Bad input on Kubernetes: a Repartition of a missing topic fails with a condition
saying so; ``partitions: 0`` is refused at admission (the CRD's ``minimum``); one to
the count the topic has fails with a condition (step 1).

Figures (printed, never asserted): apply (or patch) to Finalized of each transition.
On the test bed, stand-in or real node: the operator (installed with the chart, the
``operator`` fixture) and the brokers run as pods, and the load reaches the brokers' pod
IPs from this host.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from e2e.support import Cluster
from e2e.tests.operator.fixtures import InstalledOperator, cluster_manifests, figure, pod_ips
from headrace.client.producer import Producer
from headrace.protocol import messages as msg
from headrace.testing.waiting import until_async
from tests.integration.keyed import KeyedCohort, KeyedLoad, check_keyed_order

T = TypeVar("T")

TOPIC = "keyed"
KEYS = 200


def topic_manifest(namespace: str, partitions: int) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": TOPIC, "namespace": namespace},
        "spec": {
            "clusterRef": {"name": "demo"},
            "partitions": partitions,
            "replicas": 3,
            "minInSync": 2,
            "tieredStorage": {"enabled": False},
        },
    }


def repartition_manifest(
    namespace: str, name: str, partitions: int, topic: str = TOPIC
) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Repartition",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "topicRef": {"name": topic},
            "partitions": partitions,
            "adoptionTimeoutSeconds": 30,
        },
    }


def status_of(cluster: Cluster, kind: str, name: str, namespace: str) -> dict[str, Any]:
    return dict(cluster.get(kind, name, namespace).get("status") or {})


def ready_of(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


def kubectl_apply(cluster: Cluster, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl_run("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)


async def until(
    what: str, fn: Callable[[], T | None], tasks: list[asyncio.Task[Any]], timeout_s: float = 120
) -> T:
    """Poll ``fn`` (blocking: kubectl) until it returns something truthy, failing at once
    if a load or cohort task died; any error of ``fn`` (the API server's transient ones)
    counts as "not yet"."""
    return await until_async(
        fn, timeout_s, what, retry_on=(Exception,), poll_s=0.2, in_thread=True, watching=tasks
    )


async def test_grow_by_repartition_then_by_spec_edit_keeps_every_key_in_order(
    cluster: Cluster,
    namespace: str,
    host_reaches_pods: None,
    operator: InstalledOperator,
) -> None:
    topic = f"{namespace}/{TOPIC}"
    try:
        cluster.apply(
            [cluster_manifests(namespace, topic=None)[0], topic_manifest(namespace, 4)], namespace
        )
        cluster.kubectl_run(
            "wait",
            "--for=condition=Ready",
            f"topic/{TOPIC}",
            "-n",
            namespace,
            "--timeout=180s",
            timeout=200,
        )
        # the count it has: fails with a reason, changes nothing
        assert kubectl_apply(cluster, repartition_manifest(namespace, "same", 4)).returncode == 0
        same = await until(
            "the same-count Repartition to fail",
            lambda: (
                (s := status_of(cluster, "repartition", "same", namespace)).get("phase") == "Failed"
                and s
            ),
            [],
            60,
        )
        assert ready_of(same)["message"] == f"topic {topic} already has 4 partitions"
        assert status_of(cluster, "topic", TOPIC, namespace)["partitioningVersion"] == 1

        bootstrap = ",".join(f"{ip}:9092" for ip in pod_ips(cluster, namespace).values())
        producer = await Producer(bootstrap, acks=msg.Acks.ALL, linger_ms=2).start()
        cohort = KeyedCohort(bootstrap, topic)
        await cohort.start()
        load = KeyedLoad(producer, topic, KEYS)
        tasks = [asyncio.create_task(load.run())]
        tasks += [asyncio.create_task(cohort.run(m)) for m in cohort.members]
        try:
            await until("the first rounds", lambda: load.rounds >= 2, tasks)

            # 1. a Repartition 4 -> 8, the cohort lagging across the cutover
            cohort.running.clear()
            start = load.rounds
            await until("a backlog before the cutover", lambda: load.rounds >= start + 1, tasks)
            applied = time.monotonic()
            done = kubectl_apply(cluster, repartition_manifest(namespace, "grow-8", 8))
            assert done.returncode == 0, done.stderr
            await until(
                "grow-8 cut over and draining",
                lambda: (
                    status_of(cluster, "repartition", "grow-8", namespace).get("phase")
                    == "Draining"
                ),
                tasks,
            )
            # one transition at a time: a second request of the busy topic waits
            assert (
                kubectl_apply(cluster, repartition_manifest(namespace, "second", 8)).returncode == 0
            )
            second = await until(
                "the second Repartition to wait",
                lambda: (
                    (s := status_of(cluster, "repartition", "second", namespace)).get("phase")
                    == "Pending"
                    and "is repartitioning" in ready_of(s).get("message", "")
                    and s
                ),
                tasks,
            )
            assert ready_of(second)["message"] == (
                f"waiting: {namespace}/grow-8 is repartitioning {topic}"
            )
            keyed = status_of(cluster, "topic", TOPIC, namespace)
            assert ready_of(keyed)["reason"] == "Repartitioning"
            assert keyed["transition"]["request"] == f"{namespace}/grow-8"
            start = load.rounds
            await until("a backlog after the cutover", lambda: load.rounds >= start + 2, tasks)
            resumed = time.monotonic()
            cohort.running.set()
            grow = await until(
                "grow-8 finalized",
                lambda: (
                    (s := status_of(cluster, "repartition", "grow-8", namespace)).get("phase")
                    == "Finalized"
                    and s
                ),
                tasks,
            )
            finalized = time.monotonic()
            figure(
                "Repartition 4->8: kubectl apply to Finalized (cohort paused)", finalized - applied
            )
            figure("Repartition 4->8: cohort resumed to Finalized", finalized - resumed)
            print(f"[e2e figure] grow-8 status: {json.dumps(grow)}", file=sys.stderr)
            assert (grow["fromPartitions"], grow["toPartitions"]) == (4, 8)
            assert (grow["fromVersion"], grow["toVersion"]) == (1, 2)
            assert grow["finalizedBy"] in ("Adopted", "AdoptionTimedOut")
            assert grow["adoptionGeneration"] >= 1
            keyed = status_of(cluster, "topic", TOPIC, namespace)
            assert len(keyed["partitions"]) == 8 and "transition" not in keyed
            # ... and the waiting one, free to start now, asks for the count the topic has
            second = await until(
                "the second Repartition to fail",
                lambda: (
                    (s := status_of(cluster, "repartition", "second", namespace)).get("phase")
                    == "Failed"
                    and s
                ),
                tasks,
            )
            assert ready_of(second)["message"] == f"topic {topic} already has 8 partitions"

            # 2. an edit of Topic.spec.partitions 8 -> 12 drives the same transition
            patched = time.monotonic()
            cluster.kubectl_run(
                "patch",
                "topic",
                TOPIC,
                "-n",
                namespace,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"partitions": 12}}),
            )

            def grown_to_12() -> dict[str, Any] | None:
                s = status_of(cluster, "topic", TOPIC, namespace)
                whole = len(s.get("partitions", [])) == 12 and "transition" not in s
                ready = ready_of(s)
                return (
                    s
                    if whole and ready.get("status") == "True" and ready["observedGeneration"] == 2
                    else None
                )

            keyed = await until("the spec edit finalized at 12 partitions", grown_to_12, tasks)
            figure(
                "Topic.spec.partitions 8->12: kubectl patch to Finalized (cohort running)",
                time.monotonic() - patched,
            )
            assert keyed["partitioningVersion"] == 3 and keyed["specPartitions"] == 12
            start = load.rounds
            await until("rounds under the new routing", lambda: load.rounds >= start + 2, tasks)

            # 3. a shrink 12 -> 6 by Repartition: partitions 6..11 retire at finalize (for
            # routing only: they stay placed and readable)
            applied = time.monotonic()
            done = kubectl_apply(cluster, repartition_manifest(namespace, "shrink-6", 6))
            assert done.returncode == 0, done.stderr
            shrink = await until(
                "shrink-6 finalized",
                lambda: (
                    (s := status_of(cluster, "repartition", "shrink-6", namespace)).get("phase")
                    == "Finalized"
                    and s
                ),
                tasks,
            )
            figure("Repartition 12->6: kubectl apply to Finalized", time.monotonic() - applied)
            assert (shrink["fromVersion"], shrink["toVersion"]) == (3, 4)
            keyed = status_of(cluster, "topic", TOPIC, namespace)
            assert len(keyed["partitions"]) == 12 and keyed["activePartitions"] == 6
            assert "transition" not in keyed
            start = load.rounds
            await until("rounds after the shrink", lambda: load.rounds >= start + 2, tasks)
            load.stop.set()
            await tasks[0]
            assert not load.failures, load.failures[:3]
            await until(
                "every acked record delivered",
                lambda: len(cohort.log) >= load.total_acked,
                tasks[1:],
            )
        finally:
            load.stop.set()
            cohort.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await cohort.close()
            await producer.close()
        check_keyed_order(cohort.log, load.acked)
        print(
            f"[e2e figure] {load.total_acked} records acked over {KEYS} keys,"
            f" {len(cohort.log)} delivered",
            file=sys.stderr,
        )

        # the surfaces: printer columns and the Events on the Topic
        table = cluster.kubectl_run("get", "repartitions", "-n", namespace).stdout
        header, *rows = table.splitlines()
        assert header.split()[:5] == ["NAME", "TOPIC", "FROM", "TO", "PHASE"], header
        assert any(r.split()[:5] == ["grow-8", TOPIC, "4", "8", "Finalized"] for r in rows), table
        events = json.loads(
            cluster.kubectl_run(
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                f"involvedObject.kind=Topic,involvedObject.name={TOPIC}",
                "-o",
                "json",
            ).stdout
        )["items"]
        finals = [e for e in events if e["reason"] == "RepartitionFinalized"]
        assert len(finals) >= 1, [e["reason"] for e in events]
    except BaseException:
        print(operator.logs()[-8000:], file=sys.stderr)
        raise


async def test_bad_repartitions_are_refused_with_a_reason(
    cluster: Cluster, namespace: str, operator: InstalledOperator
) -> None:
    try:
        # partitions <= 0: the CRD schema refuses it at admission
        zero = kubectl_apply(cluster, repartition_manifest(namespace, "zero", 0))
        assert zero.returncode != 0
        assert "spec.partitions" in zero.stderr and "greater than or equal to 1" in zero.stderr
        # a missing topic: the operator fails it with a condition saying so
        assert (
            kubectl_apply(cluster, repartition_manifest(namespace, "lost", 4, "nowhere")).returncode
            == 0
        )
        cluster.kubectl_run(
            "wait",
            "--for=jsonpath={.status.phase}=Failed",
            "repartition/lost",
            "-n",
            namespace,
            "--timeout=60s",
            timeout=90,
        )
        lost = status_of(cluster, "repartition", "lost", namespace)
        ready = ready_of(lost)
        assert (ready["status"], ready["reason"]) == ("False", "Failed")
        assert ready["message"] == f"topic {namespace}/nowhere does not exist"
    except BaseException:
        print(operator.logs()[-4000:], file=sys.stderr)
        raise
