"""The operator fault campaign: ``python -m bench.chaos.operator`` / ``make chaos-operator``.

On the Kubernetes test bed (``e2e.testbed``: a real API server, controller manager and
scheduler; pods run as host processes), in a namespace of its own:

1. MinIO on loopback; the chart installed with two operator replicas and a short Lease
   (``LEASE_S``); a tiered BrokerCluster of 3 brokers and a Topic of ``partitions``
   x 3 replicas, minInSync 2 (tiered, so that Unloads work).
2. The broker campaign's traffic (``traffic``): keyed acks=all load and a cohort of
   ``members`` consuming, through the brokers' pod IPs.
3. An observer thread polls the namespace's objects and every broker's heartbeat: each
   (partition, epoch) -> leader claimed by the Topic's status or by a broker itself, each
   broker pod's UIDs, and the StatefulSet's replica counts, in order.
4. Each round draws a target from ``random.Random(seed)`` (the seed is printed first):

   * ``kill-repartition``, ``kill-unload``, ``kill-rollout``, ``kill-scale-up``,
     ``kill-scale-down``: start the transition (a Repartition, an Unload, a brokerConfig
     edit, ``spec.replicas`` 3 -> 4 or 4 -> 3), wait until it is seen in flight, then
     kill -9 the Lease holder's process;
   * ``freeze-holder``: SIGSTOP the Lease holder; once the other replica holds the Lease,
     stop the broker leading most partitions so that the new holder must elect, resume
     that broker, and SIGCONT the old holder after more than a lease duration;
   * ``recreate-cluster``: delete the Topic's BrokerCluster (its pods go; their volumes
     stay) and apply it again; the clients start again on the new pod IPs;
   * ``spec-edit``: one to three random edits within the CRD's rules, back to back
     (Topic retention, cohort grace, ``spec.partitions``; a brokerConfig value).

   A round ends when everything has settled: both operator replicas running, the
   BrokerCluster and Topic Ready at their generation, every partition Online with a
   full live replica set, every transition the round started at its end state.
5. At the end the load stops, the cohort drains, every partition is read back from
   offset 0, and the independent checker (``checking.check`` for the records,
   ``checking.check_control`` for the control plane) gives the verdict: every
   acknowledged record stored once where it was acknowledged, per-key order, no
   partition with two leaders at one epoch, every transition finished exactly once,
   every object Ready or Stalled with a reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from bench.chaos import checking, runner
from bench.chaos.runner import Cohort, play_rounds, read_back, rounds_by_target
from bench.chaos.traffic import KeyedTraffic
from e2e.support import Cluster
from e2e.tests.operator import storage
from e2e.tests.operator.fixtures import InstalledOperator, release_stuck_topics
from e2e.tests.operator.test_lease_handover_e2e import process_of
from headrace.client import Producer
from headrace.errors import HeadraceError
from headrace.testing import procs, waiting
from headrace.testing.minio import MinioServer

log = logging.getLogger("chaos")
T = TypeVar("T")

CLUSTER = "demo"
TOPIC_NAME = "chaos"
COHORT = "chaos-readers"
#: the operators' Lease (the chart's ``operator.leaseDurationSeconds``): short, so that a
#: takeover fits in a round
LEASE_S = 6
TARGETS = (
    "kill-repartition",
    "kill-unload",
    "kill-rollout",
    "kill-scale-up",
    "kill-scale-down",
    "freeze-holder",
    "recreate-cluster",
    "spec-edit",
)
SPEC_EDITS = ("topic-retention", "topic-grace", "topic-partitions", "broker-config")


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int = 30
    seed: int = 0
    targets: tuple[str, ...] = TARGETS
    partitions: int = 3
    keys: int = 24
    #: records per tick and the pause between ticks (about 200 records/s: the test bed's
    #: control plane and the brokers share two cores)
    burst: int = 10
    tick_s: float = 0.05
    members: int = 3
    #: repartitions stay within these counts
    min_partitions: int = 2
    max_partitions: int = 6
    #: how long a round may take to settle, and a transition to be seen in flight
    settle_timeout_s: float = 300.0
    in_flight_timeout_s: float = 30.0
    drain_timeout_s: float = 120.0
    fresh_cohort_timeout_s: float = 120.0
    #: records acknowledged before the first round
    warmup_records: int = 100


@dataclass(slots=True)
class Round:
    index: int
    target: str
    victim: str = ""
    #: what the fault landed on (the transition's phase seen just before it), if seen
    mid: str | None = None
    #: from the fault to everything settled
    settled_s: float | None = None
    edits: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Snapshot:
    """The namespace as the observer last saw it."""

    topic: dict[str, Any] = field(default_factory=dict)
    brokercluster: dict[str, Any] = field(default_factory=dict)
    statefulset: dict[str, Any] = field(default_factory=dict)
    broker_pods: list[dict[str, Any]] = field(default_factory=list)
    operator_pods: list[dict[str, Any]] = field(default_factory=list)
    unloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    repartitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the operators' Lease holder (a pod name)
    holder: str | None = None
    taken_at: float = 0.0


def ready_condition(body: dict[str, Any], kind: str = "Ready") -> dict[str, Any]:
    return next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == kind), {}
    )


def pod_ready(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class Observer:
    """Polls the namespace (one ``kubectl get``) and the brokers' heartbeats in a thread."""

    def __init__(self, cluster: Cluster, namespace: str, topic: str) -> None:
        self.cluster, self.namespace, self.topic = cluster, namespace, topic
        self.latest = Snapshot()
        self.claims: set[checking.LeaderClaim] = set()
        #: broker pod name -> every UID it had, in order
        self.uids: dict[str, list[str]] = {}
        #: the StatefulSet's spec.replicas, each change appended
        self.replica_counts: list[int] = []
        self.polls = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def fresh(self, after: float) -> Snapshot:
        """Wait (blocking) for a snapshot taken after ``after``."""
        while self.latest.taken_at <= after and not self._stop.is_set():
            time.sleep(0.05)
        return self.latest

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception:  # a poll that fails is retried; the campaign counts them
                self.errors += 1
                log.debug("observer poll failed", exc_info=True)
            self._stop.wait(0.3)

    def _poll(self) -> None:
        started = time.monotonic()
        done = self.cluster.kubectl_run(
            "get", "topics,brokerclusters,statefulsets,pods,unloads,repartitions,leases",
            "-n", self.namespace, "-o", "json", check=False, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            self.errors += 1
            return
        snap = Snapshot(taken_at=started)
        for item in json.loads(done.stdout)["items"]:
            kind, name = item["kind"], item["metadata"]["name"]
            labels = item["metadata"].get("labels") or {}
            if kind == "Topic" and name == self.topic:
                snap.topic = item
            elif kind == "BrokerCluster" and name == CLUSTER:
                snap.brokercluster = item
            elif kind == "StatefulSet" and name == CLUSTER:
                snap.statefulset = item
            elif kind == "Pod" and labels.get("headrace.dev/cluster") == CLUSTER:
                snap.broker_pods.append(item)
            elif kind == "Pod" and labels.get("app.kubernetes.io/name") == "headrace-operator":
                snap.operator_pods.append(item)
            elif kind == "Unload":
                snap.unloads[name] = item
            elif kind == "Repartition":
                snap.repartitions[name] = item
            elif kind == "Lease" and name == "headrace-operator":
                snap.holder = (item.get("spec") or {}).get("holderIdentity") or None
        for p in (snap.topic.get("status") or {}).get("partitions") or []:
            if p.get("leader") is not None and p.get("leaderEpoch") is not None:
                self.claims.add(
                    checking.LeaderClaim("status", p["partition"], p["leaderEpoch"], p["leader"])
                )
        for pod in snap.broker_pods:
            name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            seen = self.uids.setdefault(name, [])
            if not seen or seen[-1] != uid:
                seen.append(uid)
            ip = (pod.get("status") or {}).get("podIP")
            if ip:
                self._heartbeat(int(name.rpartition("-")[2]), ip)
        if snap.statefulset:
            count = snap.statefulset["spec"]["replicas"]
            if not self.replica_counts or self.replica_counts[-1] != count:
                self.replica_counts.append(count)
        self.latest = snap
        self.polls += 1

    def _heartbeat(self, broker: int, ip: str) -> None:
        full = f"{self.namespace}/{self.topic}"
        try:
            with urllib.request.urlopen(f"http://{ip}:9644/v1/heartbeat", timeout=1) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return  # down, starting or stopped: it claims nothing
        for p in body.get("partitions") or []:
            if p.get("topic") == full and p.get("role") == "leader":
                self.claims.add(
                    checking.LeaderClaim(
                        f"broker {broker}", p["partition"], p["leaderEpoch"], broker
                    )
                )


class OperatorCampaign:
    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        directory: Path,
        settings: Settings,
        progress: Callable[[str], None] = print,
    ) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.dir = directory
        self.settings = settings
        self.progress = progress
        self.rng = random.Random(settings.seed)
        self.topic = f"{namespace}/{TOPIC_NAME}"
        self.operator = InstalledOperator(cluster, namespace)
        self.observer = Observer(cluster, namespace, TOPIC_NAME)
        self.traffic = KeyedTraffic(self.topic, settings.keys, settings.burst, settings.tick_s)
        self.rounds: list[Round] = []
        self.transitions: list[checking.Transition] = []
        self.partitions = settings.partitions
        self.partitions_ever = settings.partitions
        self.replicas = 3
        self.flush_interval_ms = 1000
        self.server: MinioServer | None = None
        self.producer: Producer | None = None
        self.cohort = Cohort(self.traffic, COHORT, settings.members, directory)
        self._loading: asyncio.Task[None] | None = None
        #: whatever a round left running that a later one must stop (a SIGSTOPped process)
        self._stopped: list[int] = []

    # ------------------------------------------------------------------ the run

    async def run(self) -> dict[str, Any]:
        s = self.settings
        self.progress(
            f"chaos-operator: seed {s.seed}, {s.rounds} rounds, namespace {self.ns},"
            f" directory {self.dir}"
        )
        started = time.monotonic()
        self.server = MinioServer(procs.minio_binary(), self.dir / "minio")
        self.server.start()
        try:
            await asyncio.to_thread(self._install)
            self.observer.start()
            try:
                return await self._run_rounds(started)
            finally:
                self.observer.stop()
                for pid in self._stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
        finally:
            await asyncio.to_thread(self._teardown)
            self.server.stop()

    def _cluster_doc(self) -> dict[str, Any]:
        assert self.server is not None
        doc = storage.tiered_cluster(
            self.server.endpoint, CLUSTER, self.replicas, flushIntervalMs=self.flush_interval_ms
        )
        doc["metadata"]["namespace"] = self.ns
        return doc

    def _install(self) -> None:
        assert self.server is not None
        self.operator.install(
            "--set", "operator.replicas=2", "--set", f"operator.leaseDurationSeconds={LEASE_S}"
        )  # fmt: skip
        self.cluster.apply([storage.credentials_secret(self.server)], self.ns)
        topic = storage.tiered_topic(TOPIC_NAME, CLUSTER, self.settings.partitions)
        topic["spec"].update({"replicas": 3, "minInSync": 2})
        self.cluster.apply([self._cluster_doc(), topic], self.ns)
        self.cluster.kubectl_run(
            "wait", "--for=condition=Ready", f"topic/{TOPIC_NAME}", "-n", self.ns,
            "--timeout=240s", timeout=270,
        )  # fmt: skip

    def _teardown(self) -> None:
        """While the operator runs, so that it removes its finalizers (as the e2e fixtures
        do); then the release goes."""
        for kind in ("unload", "repartition", "topic"):
            self.cluster.kubectl_run(
                "delete", kind, "--all", "-n", self.ns, "--timeout=60s", check=False, timeout=90
            )
        release_stuck_topics(self.cluster, self.ns)
        self.cluster.kubectl_run(
            "delete", "brokercluster", "--all", "-n", self.ns, "--timeout=60s",
            check=False, timeout=90,
        )  # fmt: skip
        (self.dir / "operator.log").write_text(self.operator.logs())
        self.operator.uninstall()

    def bootstrap(self) -> str:
        pods = self.observer.latest.broker_pods
        ips = [p["status"]["podIP"] for p in pods if (p.get("status") or {}).get("podIP")]
        return ",".join(f"{ip}:9092" for ip in ips)

    async def _start_clients(self) -> None:
        bootstrap = self.bootstrap()
        await self.cohort.start(bootstrap)
        self.producer = await Producer(
            bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=30_000
        ).start()
        self.traffic.stop_load = asyncio.Event()
        self._loading = asyncio.create_task(self.traffic.load(self.producer))

    async def _stop_clients(self) -> None:
        self.traffic.stop_load.set()
        if self._loading is not None:
            await self._loading
        if self.producer is not None:
            with contextlib.suppress(HeadraceError):
                await self.producer.flush()
            await self.producer.close()
        await self.cohort.stop()

    async def _run_rounds(self, started: float) -> dict[str, Any]:
        s = self.settings
        await asyncio.to_thread(self.observer.fresh, time.monotonic())
        await self._start_clients()
        await self._until(
            "records acknowledged before the first round",
            lambda: self.traffic.acked_count() >= s.warmup_records,
            120,
        )
        try:
            await play_rounds(s.rounds, self._round, self.rounds, describe, self.progress)
        finally:
            await self._stop_clients()
        acked, failed = await self.traffic.outcomes()
        self.progress(f"load stopped: {len(acked)} acknowledged, {failed} failed sends")
        bootstrap = self.bootstrap()
        # the cohort drains on fresh members (the running ones were closed with the load)
        await self.cohort.start(bootstrap)
        await self.cohort.drain(acked, s.drain_timeout_s)
        await self.cohort.stop()
        stored = await read_back(bootstrap, self.topic, self.partitions_ever, self.progress)
        verdict = checking.check(
            acked,
            stored,
            self.cohort.deliveries(),
            failed_sends=failed,
            in_order=self.traffic.delivery_order,
        )
        fresh = await self.traffic.fresh_cohort(bootstrap, acked, stored, s.fresh_cohort_timeout_s)
        objects = await asyncio.to_thread(self._object_health)
        control = checking.check_control(self.observer.claims, self.transitions, objects)
        # The running cohort's order across every cutover is judged in the verdict; a fresh
        # cohort's across every finalized repartition here (the history's holds).
        ok = (
            verdict["ok"]
            and control["ok"]
            and fresh["undelivered"] == 0
            and not fresh["key_order"]
            and all(r.settled_s is not None for r in self.rounds)
        )
        return self._report(verdict, control, fresh, ok, time.monotonic() - started)

    def _object_health(self) -> list[checking.ObjectHealth]:
        out = self.cluster.kubectl_run(
            "get", "brokerclusters,topics,unloads,repartitions", "-n", self.ns, "-o", "json",
            timeout=60,
        )  # fmt: skip
        health = []
        for item in json.loads(out.stdout)["items"]:
            ready = ready_condition(item)
            stalled = ready_condition(item, "Stalled")
            health.append(
                checking.ObjectHealth(
                    item["kind"],
                    item["metadata"]["name"],
                    ready.get("status"),
                    stalled.get("status") == "True",
                    str(stalled.get("reason") or ""),
                )
            )
        return health

    # ------------------------------------------------------------------ waiting

    async def _until(self, what: str, fn: Callable[[], T | None], timeout_s: float) -> T:
        """Poll ``fn`` (over the observer's snapshot: cheap) until truthy; TimeoutError. A
        traffic task that died ends the campaign with its error."""
        return await waiting.until_async(
            fn, timeout_s, what, poll_s=0.2, watching=[self._loading, *self.cohort.consuming]
        )

    def settled(self) -> bool:
        snap = self.observer.latest
        topic, bc, sts = snap.topic, snap.brokercluster, snap.statefulset
        if not (topic and bc and sts):
            return False
        ready = ready_condition(topic)
        bc_ready = ready_condition(bc)
        status = topic.get("status") or {}
        parts = status.get("partitions") or []
        return (
            len([p for p in snap.operator_pods if pod_ready(p)]) == 2
            and ready.get("status") == "True"
            and ready.get("observedGeneration") == topic["metadata"]["generation"]
            and bc_ready.get("status") == "True"
            and (bc.get("status") or {}).get("observedGeneration") == bc["metadata"]["generation"]
            and ready_condition(bc, "Restarting").get("status") != "True"
            and "transition" not in status
            and len(parts) >= self.partitions
            and all(
                p.get("state") == "Online"
                and p.get("leader") is not None
                and sorted(p.get("liveReplicas") or []) == sorted(p.get("replicas") or [])
                and not p.get("targetReplicas")
                for p in parts
            )
            and sts["spec"]["replicas"] == self.replicas
            and len(snap.broker_pods) == self.replicas
            and all(pod_ready(p) for p in snap.broker_pods)
            and all(
                p["metadata"]["labels"].get("controller-revision-hash")
                == (sts.get("status") or {}).get("updateRevision")
                for p in snap.broker_pods
            )
            and all(
                (u.get("status") or {}).get("phase") in ("Completed", "Failed")
                for u in snap.unloads.values()
            )
            and all(
                (r.get("status") or {}).get("phase") in ("Finalized", "Failed")
                for r in snap.repartitions.values()
            )
        )

    async def _settle(self, r: Round, since: float) -> None:
        """Wait until a snapshot taken after ``since`` (the fault) shows all settled."""
        try:
            await self._until(
                "everything settled",
                lambda: self.observer.latest.taken_at > since and self.settled(),
                self.settings.settle_timeout_s,
            )
            r.settled_s = time.monotonic() - since
        except TimeoutError as exc:
            r.note = (r.note + " " + str(exc)).strip()

    # ------------------------------------------------------------------ faults

    async def _holder_process(self) -> tuple[str, int]:
        """The Lease holder's pod and host process (waits for both: a holder whose
        container is restarting has none for a moment)."""

        def found() -> tuple[str, int] | None:
            name = self.observer.latest.holder
            if name is None:
                return None
            try:
                return name, process_of(name)
            except AssertionError:
                return None

        return await self._until("the Lease holder's process", found, 60)

    async def _kill_holder(self, r: Round) -> None:
        name, pid = await self._holder_process()
        os.kill(pid, signal.SIGKILL)
        r.victim = f"operator {name.rpartition('-')[2]}"

    def _topic_status(self) -> dict[str, Any]:
        return dict(self.observer.latest.topic.get("status") or {})

    def _kubectl(self, *args: str) -> None:
        self.cluster.kubectl_run(*args, "-n", self.ns, timeout=150)

    def _patch(self, kind: str, name: str, patch: dict[str, Any]) -> None:
        self._kubectl("patch", kind, name, "--type=merge", "-p", json.dumps(patch))

    def _apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl_run("apply", "-n", self.ns, "-f", "-", input=yaml.safe_dump(doc))

    def _catch_in_flight(
        self, r: Round, what: str, fn: Callable[[Snapshot], str | None], unload: str | None = None
    ) -> asyncio.Task[None]:
        """Start watching for the transition's phase in flight (``fn`` names it: ``r.mid``);
        the round awaits the task, then lands its fault. If the phase is never seen (over
        already, or slow), the round says so and the fault lands anyway. Started before the
        transition is asked for, and faster than the observer (the API's own client, no
        kubectl process): a small Repartition can be over within a second."""

        async def watch() -> None:
            r.mid = await asyncio.to_thread(
                self._catch, fn, unload, self.settings.in_flight_timeout_s
            )
            if r.mid is None:
                r.note = f"{what} not seen in flight"

        return asyncio.create_task(watch())

    def _catch(
        self, fn: Callable[[Snapshot], str | None], unload: str | None, timeout_s: float
    ) -> str | None:
        from kubernetes import client

        api = self.cluster.api()
        objects = client.CustomObjectsApi(api)
        apps = client.AppsV1Api(api)

        def custom(plural: str, name: str) -> dict[str, Any]:
            found: dict[str, Any] = objects.get_namespaced_custom_object(
                "headrace.dev", "v1alpha1", self.ns, plural, name
            )
            return found

        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                snap = Snapshot(taken_at=time.monotonic())
                try:
                    snap.topic = custom("topics", TOPIC_NAME)
                    snap.brokercluster = custom("brokerclusters", CLUSTER)
                    sts = apps.read_namespaced_stateful_set(
                        CLUSTER, self.ns, _preload_content=False
                    )
                    snap.statefulset = json.loads(sts.data)
                    if unload is not None:
                        snap.unloads[unload] = custom("unloads", unload)
                except client.ApiException:
                    time.sleep(0.05)  # not created yet
                    continue
                found = fn(snap)
                if found:
                    return found
                time.sleep(0.02)
            return None
        finally:
            api.close()

    def _pod_uids(self) -> dict[str, int]:
        return {name: len(uids) for name, uids in self.observer.uids.items()}

    def _rollout_transitions(self, r: Round, before: dict[str, int]) -> None:
        """One transition per broker pod that existed before the edit: replaced exactly once."""
        for name in sorted(before):
            if int(name.rpartition("-")[2]) >= self.replicas:
                continue
            replaced = len(self.observer.uids.get(name, [])) - before[name]
            self.transitions.append(
                checking.Transition(
                    r.index, "rollout", name, r.settled_s is not None, replaced, r.note
                )
            )

    async def _round(self, index: int) -> Round:
        target = self.rng.choice(self.settings.targets)
        pick = self.rng.random()
        r = Round(index, target)
        since = time.monotonic()
        try:
            if target == "kill-repartition":
                await self._repartition_round(r, pick)
            elif target == "kill-unload":
                await self._unload_round(r, pick)
            elif target == "kill-rollout":
                await self._rollout_round(r, pick)
            elif target in ("kill-scale-up", "kill-scale-down"):
                await self._scale_round(r, 4 if target == "kill-scale-up" else 3)
            elif target == "freeze-holder":
                await self._freeze_round(r, pick)
            elif target == "recreate-cluster":
                await self._recreate_round(r)
            else:
                await self._edit_round(r, pick)
        except TimeoutError as exc:
            r.note = (r.note + " " + str(exc)).strip()
            if r.settled_s is None:
                await self._settle(r, since)
        return r

    async def _repartition_round(self, r: Round, pick: float) -> None:
        s = self.settings
        grow = self.partitions < s.max_partitions and (
            self.partitions <= s.min_partitions or pick < 0.6
        )
        to = self.partitions + 1 if grow else self.partitions - 1
        name = f"chaos-{r.index}"
        version = int(self._topic_status().get("partitioningVersion", 0))
        doc = {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "Repartition",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "topicRef": {"name": TOPIC_NAME},
                "partitions": to,
                "adoptionTimeoutSeconds": 5,
            },
        }

        def phase(snap: Snapshot) -> str | None:
            marker = (snap.topic.get("status") or {}).get("transition") or {}
            if marker.get("request") == f"{self.ns}/{name}":
                return f"{marker.get('kind')}:{'drained' if marker.get('drainedMs') else 'cut'}"
            return None

        catching = self._catch_in_flight(r, f"repartition {name}", phase)
        await asyncio.to_thread(self._apply, doc)
        self.partitions_ever = max(self.partitions_ever, to)
        await catching
        await self._kill_holder(r)
        killed = time.monotonic()
        await self._settle(r, killed)
        done = self.observer.latest.repartitions.get(name) or {}
        final = (done.get("status") or {}).get("phase")
        after = int(self._topic_status().get("partitioningVersion", 0))
        if final == "Finalized":
            self.partitions = to
        self.transitions.append(
            checking.Transition(
                r.index, "repartition", name, final == "Finalized", after - version,
                f"{self.partitions} -> {to}: phase {final}",
            )
        )  # fmt: skip

    async def _unload_round(self, r: Round, pick: float) -> None:
        partition = int(pick * self.partitions)
        name = f"chaos-{r.index}"
        parts = {p["partition"]: p for p in self._topic_status().get("partitions") or []}
        moves = int(parts[partition].get("moves", 0))
        doc = {
            "apiVersion": "headrace.dev/v1alpha1",
            "kind": "Unload",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"topicRef": {"name": TOPIC_NAME}, "partitions": [partition]},
        }

        def phase(snap: Snapshot) -> str | None:
            now = (snap.unloads[name].get("status") or {}).get("phase")
            part: dict[str, Any] = next(
                (
                    p
                    for p in (snap.topic.get("status") or {}).get("partitions") or []
                    if p["partition"] == partition
                ),
                {},
            )
            if part.get("seal"):
                return "sealing"
            return now if now not in (None, "Pending") else None

        catching = self._catch_in_flight(r, f"unload {name}", phase, unload=name)
        await asyncio.to_thread(self._apply, doc)
        await catching
        await self._kill_holder(r)
        await self._settle(r, time.monotonic())
        final = ((self.observer.latest.unloads.get(name) or {}).get("status") or {}).get("phase")
        parts = {p["partition"]: p for p in self._topic_status().get("partitions") or []}
        after = int(parts[partition].get("moves", 0))
        self.transitions.append(
            checking.Transition(
                r.index, "unload", name, final == "Completed", after - moves,
                f"partition {partition}: phase {final}",
            )
        )  # fmt: skip

    async def _rollout_round(self, r: Round, pick: float) -> None:
        before = self._pod_uids()
        self.flush_interval_ms = self._other_flush_interval(pick)

        def phase(snap: Snapshot) -> str | None:
            restarting = ready_condition(snap.brokercluster, "Restarting")
            if restarting.get("status") == "True":
                return str(restarting.get("message", "restarting"))[:24]
            return None

        catching = self._catch_in_flight(r, "rolling restart", phase)
        await asyncio.to_thread(
            self._patch,
            "brokercluster",
            CLUSTER,
            {"spec": {"brokerConfig": {"flushIntervalMs": self.flush_interval_ms}}},
        )
        await catching
        await self._kill_holder(r)
        await self._settle(r, time.monotonic())
        self._rollout_transitions(r, before)

    def _other_flush_interval(self, pick: float) -> int:
        choices = [v for v in (200, 500, 1000, 2000) if v != self.flush_interval_ms]
        return choices[int(pick * len(choices))]

    async def _scale_round(self, r: Round, replicas: int) -> None:
        if self.replicas == replicas:
            # at the count already: go the other way first, unfaulted
            self.replicas = 7 - replicas
            await asyncio.to_thread(
                self._patch, "brokercluster", CLUSTER, {"spec": {"replicas": self.replicas}}
            )
            scaled = time.monotonic()
            await self._until(
                "the preparatory scale",
                lambda: self.observer.latest.taken_at > scaled and self.settled(),
                self.settings.settle_timeout_s,
            )
            r.note = f"scaled to {self.replicas} first"
        counts_before = len(self.observer.replica_counts)
        pods_before = self._pod_uids()
        self.replicas = replicas

        def phase(snap: Snapshot) -> str | None:
            moving = any(
                p.get("targetReplicas")
                for p in (snap.topic.get("status") or {}).get("partitions") or []
            )
            if replicas == 4:
                grown = snap.statefulset["spec"]["replicas"] == 4
                return ("moving-on" if moving else "sts-grown") if grown else None
            reason = ready_condition(snap.brokercluster).get("reason")
            return "moving-off" if moving or reason == "ScalingDown" else None

        catching = self._catch_in_flight(r, f"scale to {replicas}", phase)
        await asyncio.to_thread(
            self._patch, "brokercluster", CLUSTER, {"spec": {"replicas": replicas}}
        )
        await catching
        await self._kill_holder(r)
        await self._settle(r, time.monotonic())
        changes = len(self.observer.replica_counts) - counts_before
        on_gone = [
            p["partition"]
            for p in self._topic_status().get("partitions") or []
            if any(b >= self.replicas for b in p.get("replicas") or [])
        ]
        kind = "scale-up" if replicas == 4 else "scale-down"
        self.transitions.append(
            checking.Transition(
                r.index, kind, CLUSTER, r.settled_s is not None and not on_gone, changes,
                f"partitions still on a removed broker: {on_gone}" if on_gone else r.note,
            )
        )  # fmt: skip
        # a scale replaces no pod that stays
        for name, seen in sorted(pods_before.items()):
            if int(name.rpartition("-")[2]) < min(3, self.replicas):
                replaced = len(self.observer.uids.get(name, [])) - seen
                if replaced:
                    self.transitions.append(
                        checking.Transition(
                            r.index, f"{kind} (pod kept)", name, True, replaced + 1,
                            f"{name} replaced {replaced} times by a scale",
                        )
                    )  # fmt: skip

    async def _freeze_round(self, r: Round, pick: float) -> None:
        first, pid = await self._holder_process()
        os.kill(pid, signal.SIGSTOP)
        self._stopped.append(pid)
        frozen = time.monotonic()
        r.victim = f"operator {first.rpartition('-')[2]} (SIGSTOP)"
        try:
            await self._until(
                "the standby to take the Lease",
                lambda: self.observer.latest.holder not in (None, first),
                LEASE_S * 6,
            )
            r.mid = f"taken {time.monotonic() - frozen:.1f}s"
            # the new holder must act: the broker leading most partitions stops answering
            parts = self._topic_status().get("partitions") or []
            led = [p["leader"] for p in parts if p.get("leader") is not None]
            victim = max(set(led), key=led.count)
            epochs = {p["partition"]: p.get("leaderEpoch", 0) for p in parts}
            ip = next(
                p["status"]["podIP"]
                for p in self.observer.latest.broker_pods
                if p["metadata"]["name"] == f"{CLUSTER}-{victim}"
            )
            broker_pid = await asyncio.to_thread(broker_process, ip)
            os.kill(broker_pid, signal.SIGSTOP)
            self._stopped.append(broker_pid)
            try:

                def reelected() -> bool:
                    now = self._topic_status().get("partitions") or []
                    moved = [
                        p for p in now if p.get("leaderEpoch", 0) > epochs.get(p["partition"], 0)
                    ]
                    return bool(moved) and all(p.get("leader") != victim for p in moved)

                await self._until("the new holder to elect", reelected, 90)
                r.victim += f", broker {victim} paused"
            finally:
                os.kill(broker_pid, signal.SIGCONT)
                self._stopped.remove(broker_pid)
            # past the lease for certain, a random while more
            left = LEASE_S * (1.5 + pick) - (time.monotonic() - frozen)
            if left > 0:
                await asyncio.sleep(left)
        finally:
            os.kill(pid, signal.SIGCONT)
            self._stopped.remove(pid)
        await self._settle(r, time.monotonic())

    async def _recreate_round(self, r: Round) -> None:
        r.victim = f"BrokerCluster {CLUSTER}"
        await asyncio.to_thread(
            self.cluster.kubectl_run,
            "delete", "brokercluster", CLUSTER, "-n", self.ns, "--timeout=120s", timeout=150,
        )  # fmt: skip
        deleted = time.monotonic()
        await self._until(
            "the broker pods gone",
            lambda: (
                self.observer.latest.taken_at > deleted and not self.observer.latest.broker_pods
            ),
            180,
        )
        r.mid = "pods gone"
        await asyncio.to_thread(self._apply, self._cluster_doc())
        since = time.monotonic()
        await self._until(
            "the broker pods back",
            lambda: (
                len([p for p in self.observer.latest.broker_pods if pod_ready(p)]) == self.replicas
            ),
            self.settings.settle_timeout_s,
        )
        # every pod IP changed: the clients start again on the new ones (the load's key
        # sequences carry on; the cohort's cursors are on the brokers' volumes)
        await self._stop_clients()
        await self._start_clients()
        await self._settle(r, since)

    async def _edit_round(self, r: Round, pick: float) -> None:
        s = self.settings
        edits = self.rng.sample(SPEC_EDITS, 1 + int(pick * 3))
        before_pods = self._pod_uids()
        version = int(self._topic_status().get("partitioningVersion", 0))
        spec_partitions = int(self.observer.latest.topic["spec"]["partitions"])
        repartitioned_to: int | None = None
        for edit in edits:
            if edit == "topic-retention":
                ms = self.rng.choice((3_600_000, 86_400_000, 604_800_000, -1))
                patch: dict[str, Any] = {"spec": {"retention": {"ms": ms}}}
                r.edits.append(f"retention.ms={ms}")
                await asyncio.to_thread(self._patch, "topic", TOPIC_NAME, patch)
            elif edit == "topic-grace":
                grace = self.rng.choice((2_000, 5_000, 10_000, 20_000))
                r.edits.append(f"cohortGraceMs={grace}")
                await asyncio.to_thread(
                    self._patch,
                    "topic",
                    TOPIC_NAME,
                    {"spec": {"delivery": {"cohortGraceMs": grace}}},
                )
            elif edit == "topic-partitions":
                candidates = [
                    n
                    for n in (self.partitions - 1, self.partitions + 1)
                    if s.min_partitions <= n <= s.max_partitions and n != spec_partitions
                ]
                if not candidates:
                    continue
                repartitioned_to = self.rng.choice(candidates)
                r.edits.append(f"partitions={repartitioned_to}")
                self.partitions_ever = max(self.partitions_ever, repartitioned_to)
                await asyncio.to_thread(
                    self._patch, "topic", TOPIC_NAME, {"spec": {"partitions": repartitioned_to}}
                )
            else:
                self.flush_interval_ms = self._other_flush_interval(self.rng.random())
                r.edits.append(f"flushIntervalMs={self.flush_interval_ms}")
                await asyncio.to_thread(
                    self._patch,
                    "brokercluster",
                    CLUSTER,
                    {"spec": {"brokerConfig": {"flushIntervalMs": self.flush_interval_ms}}},
                )
        await self._settle(r, time.monotonic())
        if repartitioned_to is not None:
            after = int(self._topic_status().get("partitioningVersion", 0))
            count = self._topic_status().get("partitionCount") or len(
                self._topic_status().get("partitions") or []
            )
            finished = r.settled_s is not None and count == repartitioned_to
            if finished:
                self.partitions = repartitioned_to
            self.transitions.append(
                checking.Transition(
                    r.index, "repartition", "spec.partitions", finished, after - version,
                    f"-> {repartitioned_to}: routed over {count}",
                )
            )  # fmt: skip
        if "broker-config" in edits:
            self._rollout_transitions(r, before_pods)

    # ------------------------------------------------------------------ report

    def _report(
        self,
        verdict: dict[str, Any],
        control: dict[str, Any],
        fresh: dict[str, Any],
        ok: bool,
        elapsed_s: float,
    ) -> dict[str, Any]:
        return {
            "seed": self.settings.seed,
            "settings": asdict(self.settings),
            "rounds": len(self.rounds),
            "rounds_by_target": rounds_by_target(self.rounds, self.settings.targets),
            "faults_seen_in_flight": sum(1 for r in self.rounds if r.mid),
            "rounds_not_settled": sum(1 for r in self.rounds if r.settled_s is None),
            "settled_s_max": max((r.settled_s or 0.0 for r in self.rounds), default=0.0),
            "partitions_at_end": self.partitions,
            "partitions_ever": self.partitions_ever,
            "observer_polls": self.observer.polls,
            "member_errors": self.traffic.member_errors[:20],
            "elapsed_s": round(elapsed_s, 1),
            "ok": ok,
            "counts": verdict["counts"],
            "examples": verdict["examples"],
            "fresh_cohort": fresh,
            "control": control,
            "transitions": [asdict(t) for t in self.transitions],
            "round_log": [asdict(r) for r in self.rounds],
        }


def describe(r: Round) -> str:
    """A round's line in the progress."""
    return (
        f"{r.target:16s} {r.victim:22s}"
        f" mid {r.mid or '-':14s} settled"
        f" {'never' if r.settled_s is None else f'{r.settled_s:.1f}s'}"
        f"{' edits ' + ','.join(r.edits) if r.edits else ''}"
        f"{'  ' + r.note if r.note else ''}"
    )


def broker_process(ip: str) -> int:
    """The host process of the broker pod at ``ip`` (the test bed runs pods as processes)."""
    out = subprocess.run(
        ["pgrep", "-f", f"broker --cluster --broker-id [0-9]+ --host {ip} "],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if len(out) != 1:
        raise TimeoutError(f"one broker process at {ip}: found {out}")
    return int(out[0])


def table(report: dict[str, Any]) -> str:
    """The short table printed after a run (and pasted in docs/reliability.md)."""
    c = report["counts"]
    k = report["control"]["counts"]
    rows = [
        ("seed", report["seed"]),
        ("rounds", f"{report['rounds']} {report['rounds_by_target']}"),
        ("faults landed mid-transition", report["faults_seen_in_flight"]),
        ("acknowledged records", c["acknowledged"]),
        ("failed sends (not acknowledged)", c["failed_sends"]),
        ("lost", c["lost"]),
        ("duplicated", c["duplicated"]),
        ("order violations (in a partition)", c["order_violations"]),
        ("key order violations (delivery, across partitions)", c["key_order_violations"]),
        ("undelivered to the cohort", c["undelivered"]),
        ("fresh cohort: undelivered / key order", f"{report['fresh_cohort']['undelivered']} / {report['fresh_cohort']['key_order']}"),
        ("(partition, epoch) pairs seen / with two leaders", f"{k['epochs_seen']} / {k['split_epochs']}"),
        ("transitions / unfinished / not exactly once", f"{k['transitions']} / {k['unfinished_transitions']} / {k['repeated_transitions']}"),
        ("objects neither Ready nor Stalled with a reason", k["unhealthy_objects"]),
        ("rounds not settled", report["rounds_not_settled"]),
        ("longest round to settle (s)", f"{report['settled_s_max']:.1f}"),
        ("verdict", "PASS" if report["ok"] else "FAIL"),
        ("elapsed", f"{report['elapsed_s']} s"),
    ]  # fmt: skip
    width = max(len(str(name)) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@contextlib.contextmanager
def testbed_namespace() -> Iterator[tuple[Cluster, str]]:
    """The test bed (started if it is not up, and then stopped again) and a fresh namespace."""
    from e2e import support

    support.build_testbed()
    with support.testbed_cluster() as cluster:
        cluster.kubectl_run(
            "apply", "--server-side", "--force-conflicts", "-f", str(support.CHART_CRDS),
            timeout=60,
        )  # fmt: skip
        namespace = support.new_namespace(cluster, "chaos")
        try:
            yield cluster, namespace
        finally:
            cluster.kubectl_run("delete", "namespace", namespace, "--wait=false", check=False)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.operator")
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"comma-separated targets to draw rounds from (default: {','.join(TARGETS)})",
    )

    def settings(args: argparse.Namespace, seed: int) -> Settings:
        targets = tuple(t for t in args.targets.split(",") if t)
        unknown = set(targets) - set(TARGETS)
        if unknown or not targets:
            parser.error(f"unknown targets {sorted(unknown)}; choose from {TARGETS}")
        return Settings(rounds=args.rounds, seed=seed, targets=targets)

    def run(settings: Settings, directory: Path) -> dict[str, Any]:
        with testbed_namespace() as (cluster, namespace):
            return asyncio.run(OperatorCampaign(cluster, namespace, directory, settings).run())

    return runner.main(
        parser,
        rounds=30,
        out="chaos-operator.json",
        settings=settings,
        run=run,
        table=table,
        examples=lambda report: (report["examples"], report["control"]["examples"]),
        # the test bed's processes are the test bed's to stop
        kill_processes=False,
        keep_help="keep the directory and logs",
    )


if __name__ == "__main__":
    sys.exit(main())
