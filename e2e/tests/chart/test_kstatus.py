"""kstatus (what Flux judges health with) on live headrace objects.

Each recorded status in ``tests/unit/charts/health_fixtures`` is written to a live
object's status subresource on the test bed's API server (no operator runs in the
test's namespace, so the status stays as written), and ``tools/kstatus`` (a Go program
on ``sigs.k8s.io/cli-utils/pkg/kstatus``) must compute the status the fixture records:
``Current`` for Ready objects, ``InProgress`` for progressing ones and stale
generations, ``Failed`` for a ``Stalled`` one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.support import Cluster

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = sorted((ROOT / "tests" / "unit" / "charts" / "health_fixtures").glob("*.json"))


@pytest.fixture(scope="module")
def kstatus() -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "kstatus" / "build.sh")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    # create, never replace: a concurrent suite may have installed a newer definition
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        done = cluster.kubectl_run("create", "-f", str(crd), check=False)
        assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr
    cluster.kubectl_run(
        "wait", "--for=condition=Established", "-f", str(ROOT / "crds"), "--timeout=60s"
    )


def computed(cluster: Cluster, kstatus: str, kind: str, name: str, namespace: str) -> str:
    obj = cluster.kubectl_run("get", kind.lower(), name, "-n", namespace, "-o", "json").stdout
    done = subprocess.run([kstatus], input=obj, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["status"])


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_kstatus_of_live_object(
    fixture: Path, cluster: Cluster, namespace: str, crds: None, kstatus: str
) -> None:
    doc = json.loads(fixture.read_text())
    recorded: dict[str, Any] = doc["object"]
    kind, name = recorded["kind"], recorded["metadata"]["name"]
    obj = {
        "apiVersion": recorded["apiVersion"],
        "kind": kind,
        "metadata": {"name": name},
        "spec": recorded["spec"],
    }
    cluster.apply([obj], namespace)
    # a recorded generation past 1: change the spec until the server's generation is there
    # (the recorded status then lags it, as when the operator has not caught up yet)
    for bump in range(1, recorded["metadata"]["generation"]):
        cluster.kubectl_run(
            "patch", kind.lower(), name, "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"partitions": recorded["spec"]["partitions"] + bump}}),
        )  # fmt: skip
    live = cluster.get(kind.lower(), name, namespace)
    assert live["metadata"]["generation"] == recorded["metadata"]["generation"]
    if "status" in recorded:
        cluster.kubectl_run(
            "patch", kind.lower(), name, "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": recorded["status"]}),
        )  # fmt: skip
    assert computed(cluster, kstatus, kind, name, namespace) == doc["kstatus"]


def test_kstatus_follows_a_status_from_progressing_to_ready(
    cluster: Cluster, namespace: str, crds: None, kstatus: str
) -> None:
    progressing = json.loads((FIXTURES[0].parent / "topic-waiting-for-brokers.json").read_text())
    ready = json.loads((FIXTURES[0].parent / "topic-ready.json").read_text())
    obj = progressing["object"]
    cluster.apply(
        [{k: obj[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": "orders"}}],
        namespace,
    )
    for doc, expected in ((progressing, "InProgress"), (ready, "Current")):
        cluster.kubectl_run(
            "patch", "topic", "orders", "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": doc["object"]["status"]}),
        )  # fmt: skip
        assert computed(cluster, kstatus, "Topic", "orders", namespace) == expected
