"""Providers and helpers for end-to-end tests against a real Kubernetes API server.

``E2E_PROVIDER`` picks the cluster:

* ``testbed`` (default): the local test bed (``python -m e2e.testbed``), built from Go
  modules on first use; pods run as host processes, images are ignored.
* ``kind``: a kind cluster (needs Docker and ``kind``, ``kubectl``, ``helm`` on PATH);
  pods run in real containers from ``E2E_PYTHON_IMAGE`` (default ``python:3.12-slim``).
* ``current``: whatever cluster ``KUBECONFIG`` (or ``~/.kube/config``) points at, used as
  it is: nothing is started or deleted; ``kubectl`` and ``helm`` from PATH (or
  ``E2E_KUBECTL``, ``E2E_HELM``); pods as with ``kind``.

Tests talk to either through :class:`Cluster` and must pass on both; checks that only
the test bed can make (host processes, PV directories) ask ``cluster.is_testbed``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from headrace.testing.waiting import until

if TYPE_CHECKING:
    from e2e.testbed.settings import Settings

T = TypeVar("T")

#: Upper bound for anything a test waits on unless it says otherwise.
WAIT_S = 120.0
#: the CRDs of this checkout (the chart's copy of ``crds/``)
CHART_CRDS = Path(__file__).resolve().parent.parent / "charts" / "headrace" / "crds"


def wait_for(
    what: str, fn: Callable[[], T | None], timeout_s: float = WAIT_S, every_s: float = 0.5
) -> T:
    """Poll ``fn`` until it returns something truthy, and return that; fail the test after
    ``timeout_s``. Any error counts as "not yet": the API server has transient ones."""
    return until(fn, timeout_s, what, retry_on=(Exception,), poll_s=every_s)


@dataclass
class Cluster:
    """One Kubernetes cluster and the tools to drive it."""

    provider: str
    kubeconfig: Path
    kubectl: str
    helm: str
    #: argv prefix that runs Python 3 inside a pod, and the image that provides it.
    python: list[str]
    image: str
    bin_dir: Path | None = None
    state_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: the test bed with a real node (``E2E_NODE=real``): pods are containers, not host
    #: processes, so the stand-in's host-process shortcuts do not apply
    real_node: bool = False

    @property
    def is_testbed(self) -> bool:
        """The test bed with its stand-in runner: pods are host processes of this checkout."""
        return self.provider == "testbed" and not self.real_node

    @property
    def host_reaches_pod_ips(self) -> bool:
        """This host dials pod IPs: the stand-in's are its loopback addresses, a real
        node's are on its bridge; a kind node's are inside Docker's network."""
        return self.provider == "testbed"

    @property
    def node_kind(self) -> str:
        """What runs the pods, for the run's header: a real node, the stand-in or the provider's."""
        if self.provider != "testbed":
            return f"{self.provider}'s nodes"
        return "real node (containerd, runc, kubelet)" if self.real_node else "stand-in runner"

    def run(
        self, *argv: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            list(argv), input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def kubectl_run(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(self.kubectl, *args, **kw)

    def apply(self, docs: list[dict[str, Any]], namespace: str) -> None:
        text = yaml.safe_dump_all(docs)
        self.kubectl_run("apply", "-n", namespace, "-f", "-", input=text)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        out = self.kubectl_run("get", kind, name, "-n", namespace, "-o", "json").stdout
        return json.loads(out)  # type: ignore[no-any-return]

    def logs(self, pod: str, namespace: str, *extra: str) -> str:
        return self.kubectl_run("logs", pod, "-n", namespace, *extra).stdout

    def api(self) -> Any:
        """An official ``kubernetes`` client (an implementation independent of ours)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


def python_container(cluster: Cluster, name: str, script: str, *args: str) -> dict[str, Any]:
    """A container that runs ``script`` with ``args`` under the provider's Python."""
    ensure_headrace_image(cluster)
    return {
        "name": name,
        "image": cluster.image,
        "command": [*cluster.python, "-u", "-c", script],
        "args": list(args),
    }


_imported: set[str] = set()


def ensure_headrace_image(cluster: Cluster) -> None:
    """On a real node, import the headrace image (``make image``) into containerd once a
    session: nothing is pulled there. A missing image fails the test saying so."""
    ensure_local_image(cluster, cluster.image)


def ensure_spark_image(cluster: Cluster) -> None:
    """On a real node, import the Spark image (``make image-spark``: Compactions' drivers
    and executors) into containerd once a session; only the tests that run a Compaction
    ask for it (it is the large one, with Java and Spark)."""
    ensure_local_image(cluster, spark_image())


def ensure_local_image(cluster: Cluster, ref: str) -> None:
    """Import ``ref`` from buildah's store into a real node's containerd once a session."""
    if not cluster.real_node or ref in _imported:
        return
    from e2e.testbed import realnode
    from e2e.testbed.settings import Settings

    try:
        realnode.import_local_image(
            Settings.from_env(), ref, log=lambda m: print(f"\n[e2e] {m}", file=sys.stderr)
        )
    except realnode.NodeError as exc:
        raise AssertionError(str(exc)) from exc
    _imported.add(ref)


def minio_image(cluster: Cluster) -> str:
    """On a real node, the MinIO image (``tools/minio/image.sh``: the server built from its
    Go module, alone), built if missing and imported into containerd; its reference."""
    assert cluster.real_node, "the MinIO image is for a real node (the stand-in ignores images)"
    repo = Path(__file__).resolve().parent.parent
    built = subprocess.run(
        ["bash", str(repo / "tools" / "minio" / "image.sh")],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        raise AssertionError(f"tools/minio/image.sh exited {built.returncode}: {built.stderr}")
    ref = built.stdout.split()[-1]
    if ref not in _imported:
        from e2e.testbed import realnode
        from e2e.testbed.settings import Settings

        realnode.import_local_image(
            Settings.from_env(), ref, log=lambda m: print(f"\n[e2e] {m}", file=sys.stderr)
        )
        _imported.add(ref)
    return ref


# Providers --------------------------------------------------------------------------
def build_testbed() -> None:
    """Build the test bed binaries if needed (idempotent; slow only the first time)."""
    from e2e.testbed.settings import Settings, build

    start = time.monotonic()
    build(Settings.from_env())
    took = time.monotonic() - start
    if took > 5:
        print(f"\n[e2e] test bed build took {took:.0f} s", file=sys.stderr)


def headrace_image(real_node: bool = False) -> str:
    """The headrace image pods run off the stand-in: ``E2E_HEADRACE_IMAGE``, else what
    ``make image`` tags on a real node (``localhost/headrace:<version>``), else
    ``headrace:e2e``."""
    if "E2E_HEADRACE_IMAGE" in os.environ:
        return os.environ["E2E_HEADRACE_IMAGE"]
    if real_node:
        import importlib.metadata

        return f"localhost/headrace:{importlib.metadata.version('headrace')}"
    return "headrace:e2e"


def spark_image() -> str:
    """The Spark image Compactions run off the stand-in: ``E2E_SPARK_IMAGE`` (``make
    e2e-node`` passes build/image/spark-ref), else what ``make image-spark`` tags
    (``localhost/headrace-spark:<version>``). The stand-in ignores it: it runs the chart's
    default, mapped to the host's java and pyspark (``e2e/testbed/images.py``)."""
    if "E2E_SPARK_IMAGE" in os.environ:
        return os.environ["E2E_SPARK_IMAGE"]
    import importlib.metadata

    return f"localhost/headrace-spark:{importlib.metadata.version('headrace')}"


def release_image(sha: str) -> str:
    """The image of commit ``sha`` of this repository (``REF=<sha> tools/image/build.sh``)."""
    return f"localhost/headrace:git-{sha[:12]}"


#: commit -> why building its image failed (the tests that need it report it)
release_image_errors: dict[str, str] = {}


def build_release_image(ref: str) -> None:
    """Build the image of commit ``ref`` (``release_image``) with buildah, unless its tag
    is in buildah's store already (a commit's code never changes). Minutes when cold; a
    failure is kept in ``release_image_errors``."""
    repo = Path(__file__).resolve().parent.parent
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(repo / "tools" / "image" / "build.sh")],
        env={**os.environ, "REF": ref, "PY": sys.executable},
        cwd=repo, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        release_image_errors[ref] = (
            f"REF={ref} tools/image/build.sh exited {done.returncode}: {done.stderr[-2000:]}"
        )
        return
    took = time.monotonic() - start
    if took > 5:
        print(f"\n[e2e] image of {ref[:12]} built in {took:.0f} s", file=sys.stderr)


def client_of_testbed(settings: Settings) -> Cluster:
    """The :class:`Cluster` that drives the test bed ``settings`` describe (up already)."""
    return Cluster(
        provider="testbed",
        kubeconfig=settings.admin_kubeconfig,
        kubectl=str(settings.binary("kubectl")),
        helm=str(settings.binary("helm")),
        # on a real node, Python is the headrace image's
        python=["python3"] if settings.real_node else [sys.executable],
        image=headrace_image(True) if settings.real_node else "ignored.invalid/python:any",
        real_node=settings.real_node,
        bin_dir=settings.bin_dir,
        state_dir=settings.state_dir,
        env={
            "HELM_CACHE_HOME": str(settings.state_dir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(settings.state_dir / "helm" / "config"),
            "HELM_DATA_HOME": str(settings.state_dir / "helm" / "data"),
        },
    )


@contextmanager
def testbed_cluster() -> Iterator[Cluster]:
    from e2e.testbed import controlplane
    from e2e.testbed.settings import Settings

    settings = Settings.from_env()
    was_up = controlplane.is_up(settings)
    took = controlplane.up(settings)
    state = "already up" if was_up else f"up in {took:.1f} s"
    print(f"\n[e2e] test bed {state}, {settings.node_kind} node", file=sys.stderr)
    try:
        yield client_of_testbed(settings)
    finally:
        if not was_up and os.environ.get("E2E_KEEP") != "1":
            controlplane.down(settings)


@contextmanager
def kind_cluster() -> Iterator[Cluster]:
    """A kind cluster named ``E2E_KIND_CLUSTER`` (default ``headrace-e2e``)."""
    for tool in ("kind", "docker", "kubectl", "helm"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"E2E_PROVIDER=kind needs {tool} on PATH")
    name = os.environ.get("E2E_KIND_CLUSTER", "headrace-e2e")
    kubeconfig = Path(os.environ.get("E2E_KIND_KUBECONFIG", f"/tmp/{name}.kubeconfig"))
    existing = subprocess.run(
        ["kind", "get", "clusters"], capture_output=True, text=True, check=True
    ).stdout.split()
    created = name not in existing
    if created:
        subprocess.run(
            [
                "kind",
                "create",
                "cluster",
                "--name",
                name,
                "--wait",
                "180s",
                "--kubeconfig",
                str(kubeconfig),
            ],
            check=True,
            timeout=600,
        )
    else:
        kubeconfig.write_text(
            subprocess.run(
                ["kind", "get", "kubeconfig", "--name", name],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
    try:
        yield Cluster(
            provider="kind",
            kubeconfig=kubeconfig,
            kubectl="kubectl",
            helm="helm",
            python=["python3"],
            image=os.environ.get("E2E_PYTHON_IMAGE", "python:3.12-slim"),
        )
    finally:
        if created and os.environ.get("E2E_KEEP") != "1":
            subprocess.run(["kind", "delete", "cluster", "--name", name], check=False, timeout=300)


def current_cluster() -> Cluster:
    """The cluster of the current kubeconfig, as it is (``E2E_PROVIDER=current``)."""
    kubeconfig = Path(
        os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube" / "config"
    )
    if not kubeconfig.is_file():
        raise RuntimeError(f"E2E_PROVIDER=current needs a kubeconfig: {kubeconfig} is not a file")
    kubectl = os.environ.get("E2E_KUBECTL", "kubectl")
    helm = os.environ.get("E2E_HELM", "helm")
    for tool in (kubectl, helm):
        if shutil.which(tool) is None:
            raise RuntimeError(f"E2E_PROVIDER=current needs {tool} on PATH")
    return Cluster(
        provider="current",
        kubeconfig=kubeconfig,
        kubectl=kubectl,
        helm=helm,
        python=["python3"],
        image=os.environ.get("E2E_PYTHON_IMAGE", "python:3.12-slim"),
    )


def new_namespace(cluster: Cluster, prefix: str = "e2e") -> str:
    """Create a namespace and wait for its default ServiceAccount (pods need it)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl_run("create", "namespace", name)
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: (
            cluster.kubectl_run("get", "sa", "default", "-n", name, check=False).returncode == 0
        ),
        60,
    )
    return name
