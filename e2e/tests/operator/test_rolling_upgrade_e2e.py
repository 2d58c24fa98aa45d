"""A rolling upgrade on Kubernetes: ``helm upgrade`` from the previous release's chart and
image to this checkout's, under load (real node only).

The previous release (``upgrading.PREVIOUS_RELEASE``, the commit the local-mode test
``tests/integration/test_rolling_upgrade.py`` starts from) is installed as a platform
team installed it: its own chart (``git archive`` of ``charts/headrace`` at that commit)
with its own image (``REF=<commit> tools/image/build.sh``: that commit's code, today's
Containerfile; built before the tests, cached by commit). Its chart, not this one: a
release ships the two together, and this chart's operator Deployment probes ``/livez``,
which the previous operator does not serve (the kubelet would restart it in a loop).
Two things that release needs are given to it (the real node found both; both fixed
since): its operator's root filesystem is writable (that chart has no ``/tmp`` volume,
and its operator cannot start on a read-only root), and the brokers' volumes are owned
by the image's user (its brokers have no ``fsGroup``; ``writable_claims``).
The CRDs are this checkout's throughout, applied before the upgrade as the upgrade
procedure says (docs/operations.md: Helm never upgrades CRDs), so the previous operator
runs against the newer CRDs for the whole first half.

Its operator brings up a 3-broker BrokerCluster and a Topic (4 partitions, RF 3, minInSync
2). A producer writes keyed records with acks=all and a cohort consumes them, from this
host on the brokers' pod IPs, the whole time, neither ever restarted. Then ``helm
upgrade`` to this chart with this checkout's image (``make image``): the operator's
Deployment is replaced (``Recreate``), and the new operator's StatefulSet has a new pod
template (the image), which it rolls one pod at a time (``OnDelete``; drained first).

Checked: the operator and every broker pod run the new image; broker pods were replaced
one at a time (never two of three down at once, as polled); then every acknowledged
record is stored once where it was acknowledged, each key in order, every one delivered
to the consumer with each key's first deliveries in order; both clients ran from start
to end. The figures (acknowledged, lost, redelivered, longest produce stall) are printed
and written to ``test-artifacts/rolling-upgrade-kubernetes.json``.

Only on the real node (``E2E_NODE=real``, ``make e2e-node``): the stand-in runner ignores
images, so there the "upgrade" would run this checkout's code on both sides.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.support import (
    Cluster,
    ensure_headrace_image,
    release_image,
    release_image_errors,
    wait_for,
)
from e2e.testbed import provisioning, realnode
from e2e.testbed.settings import Settings
from e2e.tests.operator.fixtures import (
    CHART,
    InstalledOperator,
    cluster_manifests,
    operator_values,
    pod_ips,
    remove_release,
    wait_ready,
)
from headrace.operator.workloads import IMAGE_UID
from headrace.testing import procs
from headrace.testing.reading import read_partition
from tests.integration.acked_load import AckedLoad, Stored, keys
from tests.integration.upgrading import PREVIOUS_RELEASE, Cohort, check_upgrade

PARTITIONS = 4
BROKERS = 3
#: acknowledged records before the upgrade and after it (some seconds of load)
LOAD_PER_STEP = 200
#: the BrokerCluster's pods
BROKER_SELECTOR = "headrace.dev/cluster=demo"
#: each broker's volume
STORAGE = "64Mi"


@pytest.fixture
def previous_image(cluster: Cluster) -> str:
    """The previous release's image, imported into the real node's containerd."""
    if not cluster.real_node:
        pytest.skip("needs the real node (E2E_NODE=real): the stand-in runner ignores images")
    if PREVIOUS_RELEASE in release_image_errors:
        pytest.fail(release_image_errors[PREVIOUS_RELEASE])
    image = release_image(PREVIOUS_RELEASE)
    log = lambda m: print(f"\n[e2e] {m}", file=sys.stderr)  # noqa: E731
    try:
        realnode.import_local_image(Settings.from_env(), image, log=log)
    except realnode.NodeError as exc:
        raise AssertionError(str(exc)) from exc
    ensure_headrace_image(cluster)  # this checkout's, for the upgrade
    return image


@pytest.fixture
def previous_chart(tmp_path: Path) -> Path:
    """The previous release's chart directory."""
    procs.export_ref(PREVIOUS_RELEASE, tmp_path, roots=("charts/headrace",))
    return tmp_path / "charts" / "headrace"


@pytest.fixture
def release(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    namespace: str,
    previous_image: str,
    previous_chart: Path,
) -> Iterator[InstalledOperator]:
    """The previous release's chart installed with its image (this checkout's CRDs are on
    the test bed already: ``--skip-crds``); removed after the test as the ``operator``
    fixture's release is."""
    installed = InstalledOperator(cluster, namespace)
    repository, _, tag = previous_image.rpartition(":")
    try:
        installed.helm(
            "install", installed.release, str(previous_chart), "--skip-crds",
            "--set-json", f"rbac.watchNamespaces={json.dumps([namespace])}",
            "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=IfNotPresent",
            # that chart's operator has a read-only root and no /tmp, and the Kubernetes
            # client writes its discovery cache there: "No usable temporary directory
            # found" at start on a real node (fixed since: an emptyDir on /tmp)
            "--set", "operator.securityContext.readOnlyRootFilesystem=false",
            "--wait", "--timeout", "3m",
        )  # fmt: skip
        yield installed
    finally:
        report = getattr(request.node, "report_call", None)
        remove_release(installed, failed=report is None or report.failed)


def writable_claims(cluster: Cluster, namespace: str) -> None:
    """The brokers' claims (``data-demo-<n>``, as the StatefulSet names them), made before
    the BrokerCluster, their volumes' directories owned by the image's user.

    The previous release's operator sets no pod ``securityContext``: its brokers run as
    the image's user (10001) without an ``fsGroup`` and cannot write a volume whose root
    is ``root:root 0755``, as the test bed's (and a fresh cloud disk's) is ("Permission
    denied: '/var/lib/headrace/topics'"; fixed since: ``fsGroup``). That release ran only
    on storage its user could write; this gives it such storage. The StatefulSet adopts
    claims of its names; the test process runs on the real node's host, where the local
    volumes' directories are."""
    names = [f"data-demo-{b}" for b in range(BROKERS)]
    claims = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": {"headrace.dev/cluster": "demo"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": STORAGE}},
            },
        }
        for name in names
    ]
    cluster.apply(claims, namespace)
    for name in names:
        volume = wait_for(
            f"claim {name} bound",
            lambda name=name: cluster.get("pvc", name, namespace)["spec"].get("volumeName"),
            60,
        )
        pv = cluster.kubectl_run("get", "pv", volume, "-o", "json").stdout
        path = provisioning.volume_path(json.loads(pv))
        assert path is not None and path.is_dir(), f"volume {volume} has no local directory"
        os.chown(path, IMAGE_UID, IMAGE_UID)


def broker_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    out = cluster.kubectl_run("get", "pods", "-n", namespace, "-l", BROKER_SELECTOR, "-o", "json")
    return list(json.loads(out.stdout)["items"])


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def image_of(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["image"])


@dataclass
class Rollout:
    """What polling the broker pods (every second, on a thread, from ``start`` to
    ``stop``) saw: each replacement (a pod name with a new uid), in order, and the most
    brokers down (not Ready, or missing) at once."""

    cluster: Cluster
    namespace: str
    uids: dict[str, str] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)
    most_down: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def observe(self) -> list[dict[str, Any]]:
        pods = broker_pods(self.cluster, self.namespace)
        for pod in pods:
            name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            if self.uids.setdefault(name, uid) != uid:
                self.uids[name] = uid
                self.replaced.append(name)
        self.most_down = max(self.most_down, BROKERS - sum(ready(p) for p in pods))
        return pods

    def start(self) -> None:
        self.observe()

        def poll() -> None:
            while not self._stop.wait(1.0):
                try:
                    self.observe()
                except (AssertionError, subprocess.TimeoutExpired):
                    pass  # an API hiccup: the next poll sees the pods again

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def all_on(cluster: Cluster, namespace: str, image: str) -> bool:
    """Every broker pod there, Ready and of ``image``."""
    pods = broker_pods(cluster, namespace)
    return len(pods) == BROKERS and all(ready(p) and image_of(p) == image for p in pods)


@pytest.mark.timeout(1800)
def test_helm_upgrade_to_a_new_image_rolls_the_brokers_one_at_a_time_under_load(
    cluster: Cluster, namespace: str, release: InstalledOperator, previous_image: str
) -> None:
    topic = f"{namespace}/upgrade"
    writable_claims(cluster, namespace)
    docs = cluster_manifests(
        namespace,
        replicas=BROKERS,
        storage=STORAGE,
        topic="upgrade",
        partitions=PARTITIONS,
        min_in_sync=2,
    )
    cluster.apply(docs, namespace)
    wait_ready(cluster, "brokercluster", "demo", namespace, timeout=300)
    wait_ready(cluster, "topic", "upgrade", namespace, timeout=180)
    wait_for(
        "3 Ready broker pods of the previous image",
        lambda: all_on(cluster, namespace, previous_image),
        180,
    )
    assert [image_of(p) for p in release.pods()] == [previous_image]

    bootstrap = ",".join(f"{ip}:9092" for _, ip in sorted(pod_ips(cluster, namespace).items()))
    load = AckedLoad(bootstrap, topic, keys(12), linger_ms=5, pause_s=0.05)
    cohort = Cohort(bootstrap, topic, "upgrading")
    rollout = Rollout(cluster, namespace)
    cohort.start_thread()
    load.start_thread()
    try:
        wait_for(
            "acknowledged records before the upgrade", lambda: len(load.acked) >= LOAD_PER_STEP, 120
        )
        old_operator = release.pod()["metadata"]["name"]
        rollout.start()
        release.helm(
            "upgrade", release.release, str(CHART), *operator_values(cluster, namespace),
            "--wait", "--timeout", "5m", timeout=400,
        )  # fmt: skip
        wait_for(
            "the new operator pod, of the new image",
            lambda: (
                (pod := release.pod())["metadata"]["name"] != old_operator
                and image_of(pod) == cluster.image
            ),
            180,
        )
        wait_for(
            "every broker pod replaced by one of the new image, Ready",
            lambda: all_on(cluster, namespace, cluster.image),
            900,
        )
        rollout.stop()
        wait_ready(cluster, "brokercluster", "demo", namespace, timeout=300)
        wait_ready(cluster, "topic", "upgrade", namespace, timeout=180)
        upgraded_at = len(load.acked)
        wait_for(
            "acknowledged records after the upgrade",
            lambda: len(load.acked) >= upgraded_at + LOAD_PER_STEP,
            120,
        )
        assert load.running() and cohort.running(), "a client stopped during the upgrade"
    finally:
        rollout.stop()
        load.stop_thread()
    try:
        wanted = {value for _, _, _, value in load.acked}
        wait_for(
            "every acknowledged record delivered to the consumer",
            lambda: wanted <= cohort.received(),
            180,
        )
    finally:
        cohort.stop_thread()

    assert sorted(rollout.replaced) == [f"demo-{b}" for b in range(BROKERS)], rollout.replaced
    assert rollout.most_down <= 1, f"{rollout.most_down} brokers down at once"
    new_bootstrap = ",".join(f"{ip}:9092" for _, ip in sorted(pod_ips(cluster, namespace).items()))

    async def read(partition: int) -> Stored:
        records = await read_partition(new_bootstrap, topic, partition)
        return [(r.offset, r.key or b"", r.value) for r in records]

    asyncio.run(
        check_upgrade(
            read,
            PARTITIONS,
            load.acked,
            cohort.deliveries,
            mode="kubernetes",
            longest_stall_s=load.longest_stall_s(),
            what_ran={
                "previous_image": previous_image,
                "image": cluster.image,
                "chart": "previous release's, helm upgrade to this checkout's",
                "brokers_replaced_in_order": rollout.replaced,
                "most_brokers_down_at_once": rollout.most_down,
                "acknowledged_before_the_upgrade_finished": upgraded_at,
            },
        )
    )
