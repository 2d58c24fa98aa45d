"""Test bed settings: where things live and how long to wait, read from the environment once.

Every path the test bed uses derives from two roots: the cache (built binaries, outside
the repository, shared by all checkouts) and the state directory (certificates, etcd
data, logs, pod directories and volumes of one running test bed).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: This package's directory, which also holds the build script, the versions and the Go
#: wrapper modules. The test bed only exists in a source checkout; nothing installs it.
SOURCE_DIR = Path(__file__).resolve().parent
#: The repository root: on the runner's PYTHONPATH so that ``python -m e2e.testbed.kubelet``
#: imports this package.
REPO_ROOT = SOURCE_DIR.parents[1]


def read_versions(path: Path = SOURCE_DIR / "versions.env") -> dict[str, str]:
    """Parse ``versions.env`` (``KEY=value`` lines), the one place versions are recorded."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


#: ``E2E_NODE``'s values: the stand-in runner (:mod:`.kubelet`) or a real node (:mod:`.realnode`).
NODES = ("stand-in", "real")


class StateLayout:
    """Where things live in a test bed's state directory: one definition each, so the
    CLI, the runner and the tests agree."""

    state_dir: Path

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def run_dir(self) -> Path:
        """Pid files and the runtime description (ports) of the running test bed."""
        return self.state_dir / "run"

    @property
    def pods_dir(self) -> Path:
        return self.state_dir / "pods"


@dataclass(frozen=True)
class Settings(StateLayout):
    """Where the test bed keeps its files and how patient it is.

    Build one with :meth:`from_env` at start-up and pass it down; nothing deeper reads
    the environment.
    """

    #: Root of everything the test bed writes; default ``~/.cache/headrace``
    #: (``HEADRACE_CACHE``). Outside the repository so ``git clean`` keeps the build.
    cache_dir: Path
    #: Directory holding etcd, kube-* and helm binaries (``TESTBED_BIN``); default
    #: ``<cache>/testbed/<k8s-version>/bin``, the same default as ``e2e/testbed/build.sh``.
    bin_dir: Path
    #: State of the running test bed (``HEADRACE_TESTBED_STATE``); default
    #: ``<cache>/testbed/state``. The admin kubeconfig is ``<state>/admin.kubeconfig``.
    state_dir: Path
    #: Kubernetes version from ``versions.env``, e.g. ``v1.36.3``.
    k8s_version: str
    #: Name of the Node the runner registers.
    node_name: str = "testbed-node"
    #: Seconds ``up`` waits for every component to become healthy. The issue's budget
    #: is 60 s from start to ready on a 2-core machine; we wait a bit longer before
    #: declaring failure so a loaded machine is slow rather than broken.
    ready_timeout_s: float = 120.0
    #: Seconds ``down`` waits after SIGTERM before SIGKILL for each component.
    stop_timeout_s: float = 20.0
    #: Extra environment for child processes (tests use it to pass a PATH).
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: Run pods on a real node (containerd, runc, CNI and the kubelet: ``E2E_NODE=real``,
    #: :mod:`.realnode`) instead of the stand-in runner (``E2E_NODE=stand-in``, the default).
    real_node: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read ``HEADRACE_CACHE``, ``TESTBED_BIN``, ``HEADRACE_TESTBED_STATE`` and
        ``E2E_NODE``."""
        env = os.environ if env is None else env
        versions = read_versions()
        k8s = versions["K8S_VERSION"]
        cache = Path(env.get("HEADRACE_CACHE") or Path.home() / ".cache" / "headrace")
        bin_dir = Path(env.get("TESTBED_BIN") or cache / "testbed" / k8s / "bin")
        state = Path(env.get("HEADRACE_TESTBED_STATE") or cache / "testbed" / "state")
        node = env.get("E2E_NODE") or "stand-in"
        if node not in NODES:
            raise ValueError(f"E2E_NODE must be one of {', '.join(NODES)}, not {node!r}")
        return cls(
            cache_dir=cache,
            bin_dir=bin_dir,
            state_dir=state,
            k8s_version=k8s,
            real_node=node == "real",
        )

    @property
    def node_kind(self) -> str:
        """``real`` or ``stand-in``: what ``E2E_NODE`` chose, for messages."""
        return "real" if self.real_node else "stand-in"

    # Derived paths (and those of StateLayout).
    @property
    def admin_kubeconfig(self) -> Path:
        """The admin (``system:masters``) kubeconfig, the one file tests point at."""
        return self.state_dir / "admin.kubeconfig"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def volumes_dir(self) -> Path:
        """PersistentVolume directories; they outlive pods and ``down``."""
        return self.state_dir / "volumes"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def build(settings: Settings) -> Path:
    """Run ``e2e/testbed/build.sh`` (idempotent; a no-op when everything is built), with
    the real node's pieces when the settings ask for it."""
    env = {**os.environ, "TESTBED_BIN": str(settings.bin_dir)}
    if settings.real_node:
        env["TESTBED_NODE"] = "1"
    env.setdefault("HEADRACE_CACHE", str(settings.cache_dir))
    subprocess.run(["bash", str(SOURCE_DIR / "build.sh")], check=True, env=env, stdout=2)
    return settings.bin_dir
