"""Two operator replicas, and the Lease holder frozen past its lease: the other takes over,
and the frozen one, when it wakes, acts no more. No partition ever has two leaders at one
epoch, and no acknowledged record is lost.

The chart runs two operator replicas with a 6 s Lease (renew deadline 4 s). The holder is
stopped with SIGSTOP (a frozen VM, a long GC pause, a hung node) while keyed acks=all load
runs; the standby takes the Lease once its own observation of the record is 6 s old, and
then must act: a broker that leads partitions is paused (SIGSTOP), and the new holder
elects new leaders. The old holder is then resumed (SIGCONT): its renew deadline passed while it was
stopped, so it writes nothing (``FencedApi``) and exits once it finds the Lease taken; its
container restarts as a standby.

Throughout, the Topic's status is polled, and every (partition, epoch) seen must name one
leader only. On the test bed, stand-in or real node: every pod's process is a process of
this host, which the test signals from outside the pod. A signal through ``kubectl exec``
cannot do it: a container's PID 1 ignores SIGSTOP sent from inside its PID namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

import pytest

from e2e.support import Cluster, wait_for
from e2e.tests.operator.fixtures import InstalledOperator, pod_ips
from e2e.tests.operator.test_lifecycle_e2e import KeyedLoad, start_cluster, topic_doc
from headrace.testing import procs

LEASE_S = 6
TWO_REPLICAS = ("--set", "operator.replicas=2", "--set", f"operator.leaseDurationSeconds={LEASE_S}")


def holder(cluster: Cluster, namespace: str) -> str | None:
    lease = cluster.get("lease", "headrace-operator", namespace)
    return lease.get("spec", {}).get("holderIdentity") or None


def process_of(pod: str) -> int:
    """The host process of operator pod ``pod`` (the stand-in's pods are host processes, a
    real node's containers are too, in their own PID namespaces)."""
    out = subprocess.run(
        ["pgrep", "-f", f"headrace.operator --identity {pod} "],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert len(out) == 1, f"one process for {pod}: {out}"
    return int(out[0])


class LeaderWatch:
    """Polls the Topic's status in a thread; every (partition, epoch) -> the leaders seen."""

    def __init__(self, cluster: Cluster, namespace: str, topic: str) -> None:
        self.cluster, self.namespace, self.topic = cluster, namespace, topic
        self.seen: dict[tuple[int, int], set[Any]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            done = self.cluster.kubectl_run(
                "get", "topic", self.topic, "-n", self.namespace, "-o", "json", check=False
            )
            if done.returncode == 0:
                for p in json.loads(done.stdout).get("status", {}).get("partitions", []):
                    if p.get("leader") is not None and p.get("leaderEpoch") is not None:
                        key = (p["partition"], p["leaderEpoch"])
                        self.seen.setdefault(key, set()).add(p["leader"])
            self.stop.wait(0.2)

    def epochs(self) -> int:
        return len(self.seen)


@pytest.mark.parametrize("operator", [TWO_REPLICAS], indirect=True)
def test_a_frozen_lease_holder_is_replaced_and_acts_no_more_when_it_wakes(
    cluster: Cluster, namespace: str, host_reaches_pods: None, operator: InstalledOperator
) -> None:
    topic = f"{namespace}/handover"
    stopped: int | None = None
    try:
        bootstrap = start_cluster(cluster, namespace, topic_doc("handover", namespace, 4))
        wait_for("two operator replicas running", lambda: len(operator.pods()) == 2, 120)
        first = wait_for("a Lease holder", lambda: holder(cluster, namespace), 60)
        watch = LeaderWatch(cluster, namespace, "handover")
        watch.thread.start()
        load = KeyedLoad(bootstrap, topic)
        load.thread.start()
        wait_for("records acknowledged before the freeze", lambda: len(load.acked) >= 100, 60)

        stopped = process_of(first)
        os.kill(stopped, signal.SIGSTOP)
        frozen_at = time.monotonic()
        second = wait_for(
            "the standby to take the Lease",
            lambda: (h := holder(cluster, namespace)) not in (None, first) and h,
            LEASE_S * 6,
        )
        took_over_s = time.monotonic() - frozen_at
        # the new holder must act: a broker leading partitions stops answering (SIGSTOP: a
        # killed one's container would be back before its liveness lapsed), it elects new
        # leaders
        status = cluster.get("topic", "handover", namespace)["status"]
        led = [p["leader"] for p in status["partitions"] if p.get("leader") is not None]
        victim = max(set(led), key=led.count)
        epochs_before = {p["partition"]: p["leaderEpoch"] for p in status["partitions"]}
        ip = pod_ips(cluster, namespace)[victim]
        victim_pid = subprocess.run(
            ["pgrep", "-f", f"broker --cluster --broker-id [0-9]+ --host {ip} "],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        assert len(victim_pid) == 1, victim_pid
        paused_broker = int(victim_pid[0])
        os.kill(paused_broker, signal.SIGSTOP)

        def reelected() -> bool:
            parts = cluster.get("topic", "handover", namespace)["status"]["partitions"]
            moved = [p for p in parts if p["leaderEpoch"] > epochs_before[p["partition"]]]
            return bool(moved) and all(p.get("leader") not in (None, victim) for p in moved)

        try:
            wait_for("the new holder elected new leaders", reelected, 90)
        finally:
            os.kill(paused_broker, signal.SIGCONT)
        at_wake = len(load.acked)
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        # the woken replica exits on finding the Lease taken; its container restarts
        wait_for(
            "the woken replica restarted as a standby",
            lambda: any(
                p["metadata"]["name"] == first
                and sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
                for p in operator.pods()
            ),
            120,
        )
        assert holder(cluster, namespace) == second
        wait_for("load after the wake", lambda: len(load.acked) >= at_wake + 100, 90)
        load.stop.set()
        load.thread.join(60)
        watch.stop.set()
        watch.thread.join(30)

        split = {k: v for k, v in watch.seen.items() if len(v) > 1}
        assert not split, f"two leaders at one epoch: {split}"
        consumed = procs.run_headrace(
            "consume", topic, "--cohort", "check", "--from-beginning", "--idle-timeout", "5",
            "--bootstrap", ",".join(f"{ip}:9092" for ip in pod_ips(cluster, namespace).values()),
            timeout=120,
        )  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr.decode()
        missing = load.acked - set(consumed.stdout.decode().split())
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
        print(
            f"\n[e2e figure] Lease handover: the standby took over {took_over_s:.1f} s after"
            f" the freeze (lease {LEASE_S} s); {watch.epochs()} (partition, epoch) pairs seen,"
            f" none with two leaders; {len(load.acked)} acknowledged, 0 lost,"
            f" {load.failed} sends failed (retriable, not acknowledged)"
        )
    except BaseException:
        print(operator.logs()[-8000:])
        raise
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
