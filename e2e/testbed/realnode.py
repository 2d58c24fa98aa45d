"""A real node for the test bed: containerd, runc, CNI and the kubelet (I/O adapter).

Chosen with ``E2E_NODE=real`` in place of the stand-in runner (:mod:`.kubelet`). The
binaries come from ``e2e/testbed/build.sh`` with ``TESTBED_NODE=1``: the kubelet from
the control plane's ``k8s.io/kubernetes`` module, containerd, runc and the CNI plugins
from Debian, and the pause and busybox images built from source
(``e2e/testbed/node/build.sh``) and imported into containerd, which never pulls.

Everything of the node lives in ``<state>/node``: containerd's root, state, socket and
config, the CNI configuration and its address leases, and the kubelet's root directory
and config. The host keeps what a node needs of it: the pod bridge, the cgroups under
``/kubepods`` and the pod network namespaces; so one real node runs on a machine at a
time (a second one's kubelet would share ``/kubepods``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e.testbed import clusterdns, ipam, pki
from e2e.testbed.settings import Settings
from headrace.files import write_atomic

#: The node's daemons, in start order (``down`` stops them in reverse): the runtime, the
#: kubelet, kube-proxy (Services' ClusterIPs and NodePorts, in the host's iptables) and
#: the provisioner of ``local`` PersistentVolumes (the stand-in runner's, as a daemon).
DAEMONS = ("containerd", "kubelet", "kube-proxy", "provisioner")

#: The images ``e2e/testbed/node/build.sh`` builds, by archive name, and their references.
PAUSE_IMAGE = "localhost/testbed-pause:1"
BUSYBOX_IMAGE = "localhost/testbed-busybox:1"
IMAGE_ARCHIVES = {
    "pause.tar": PAUSE_IMAGE,
    "busybox.tar": BUSYBOX_IMAGE,
    "coredns.tar": clusterdns.IMAGE,
}

#: Debian's runc and CNI plugins.
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"
#: containerd's namespace for the CRI's containers and images.
CRI_NAMESPACE = "k8s.io"


class NodeError(Exception):
    """The real node cannot run here; the message says what is missing."""


@dataclass(frozen=True)
class NodeLayout:
    """Where the real node's files live: all under ``<state>/node``."""

    root: Path

    @classmethod
    def of(cls, settings: Settings) -> NodeLayout:
        return cls(settings.state_dir / "node")

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_state(self) -> Path:
        # shims put their sockets under here: keep it short (a socket path has 108 bytes)
        return self.root / "run"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni-leases"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.json"


@dataclass(frozen=True)
class PodNetwork:
    """The node's pod network: one bridge and one /24, both derived from the state
    directory like the stand-in's loopback block, so two test beds' names differ."""

    block: int

    @classmethod
    def of(cls, settings: Settings) -> PodNetwork:
        return cls(ipam.block_for(str(settings.state_dir.resolve())))

    @property
    def bridge(self) -> str:
        return f"hrtb{self.block}"

    @property
    def subnet(self) -> str:
        return f"10.244.{self.block}.0/24"

    @property
    def gateway(self) -> str:
        return f"10.244.{self.block}.1"


def host_ip() -> str:
    """The address the host's default route leaves from: the node's InternalIP (the
    kubelet refuses a loopback node IP). A UDP connect sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("198.51.100.1", 9))
        return str(s.getsockname()[0])


def images_dir(settings: Settings) -> Path:
    """The image archives ``e2e/testbed/node/build.sh`` writes, beside the binaries."""
    return settings.bin_dir.parent / "images"


def missing_pieces(settings: Settings) -> list[str]:
    """What the real node needs and does not find (empty when it can start)."""
    missing = [
        str(settings.binary(b))
        for b in ("kubelet", "kube-proxy")
        if not settings.binary(b).exists()
    ]
    for program in ("containerd", "ctr", RUNC, f"{CNI_BIN_DIR}/bridge", "iptables"):
        if shutil.which(program) is None:
            missing.append(program)
    missing += [
        str(images_dir(settings) / a)
        for a in IMAGE_ARCHIVES
        if not (images_dir(settings) / a).exists()
    ]
    return missing


# Configuration ----------------------------------------------------------------------
def containerd_config(layout: NodeLayout) -> str:
    """containerd 1.6's config (version 2): its own root, state and socket, runc with
    cgroupfs (this machine has no systemd), the CNI config of this node, and the pause
    image built here as the sandbox image."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f'root = "{layout.containerd_root}"',
            f'state = "{layout.containerd_state}"',
            "[grpc]",
            f'  address = "{layout.containerd_socket}"',
            "[ttrpc]",
            f'  address = "{layout.containerd_socket}.ttrpc"',
            f"[{cri}]",
            f'  sandbox_image = "{PAUSE_IMAGE}"',
            # no CAP_SYS_RESOURCE here: runc cannot lower oom_score_adj (the sandbox's
            # -998, guaranteed pods' -997) and fails the container; clamp to containerd's
            "  restrict_oom_score_adj = true",
            # the streaming server (exec, attach, port-forward) on loopback, any free port
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            f'  BinaryName = "{RUNC}"',
            f"[{cri}.cni]",
            f'  bin_dir = "{CNI_BIN_DIR}"',
            f'  conf_dir = "{layout.cni_conf_dir}"',
            "",
        ]
    )


def cni_config(layout: NodeLayout, net: PodNetwork) -> dict[str, object]:
    """A bridge with the node's /24 (host-local leases in the node's directory), masquerade
    for traffic leaving it, and portmap for hostPorts. containerd adds loopback itself."""
    return {
        "cniVersion": "0.4.0",
        "name": "testbed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.cni_ipam_dir),
                    "ranges": [[{"subnet": net.subnet, "gateway": net.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(settings: Settings, layout: NodeLayout, port: int) -> dict[str, object]:
    """The KubeletConfiguration. ``failCgroupV1: false``: this machine has cgroup v1
    (hybrid), which the kubelet refuses from 1.35 unless told. Its server uses the
    test bed's CA for client certificates (the API server's kubelet client) and allows
    every authenticated caller, as the stand-in does. Eviction thresholds are low so a
    shared machine's disk does not evict test pods."""
    p = settings.pki_dir
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": "0.0.0.0",
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "tlsCertFile": str(p / "node-server.crt"),
        "tlsPrivateKeyFile": str(p / "node-server.key"),
        "authentication": {
            "x509": {"clientCAFile": str(p / "ca.crt")},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDomain": clusterdns.CLUSTER_DOMAIN,
        # every pod's nameserver (dnsPolicy ClusterFirst): CoreDNS's Service (clusterdns)
        "clusterDNS": [clusterdns.CLUSTER_DNS_IP],
        "resolvConf": "/etc/resolv.conf",
        "failSwapOn": False,
        # its own -999 would need CAP_SYS_RESOURCE, which this machine does not grant
        "oomScoreAdj": 0,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False,
        "registerNode": True,
        # containers' logs with the node's state, not in the host's /var/log/pods
        "podLogsDir": str(layout.root / "pod-logs"),
    }


def prepare(settings: Settings, kubelet_port: int) -> None:
    """Write the node's configuration and its serving certificate (idempotent)."""
    missing = missing_pieces(settings)
    if missing:
        raise NodeError(f"the real node lacks {missing}; run TESTBED_NODE=1 e2e/testbed/build.sh")
    layout, net = NodeLayout.of(settings), PodNetwork.of(settings)
    for d in (layout.root, layout.cni_conf_dir, layout.kubelet_root):
        d.mkdir(parents=True, exist_ok=True)
    node_ip = host_ip()
    pki.ensure_serving(
        settings.pki_dir, "node-server", ("localhost", settings.node_name), ("127.0.0.1", node_ip)
    )
    write_atomic(layout.containerd_config, containerd_config(layout).encode(), sync=False)
    conflist = json.dumps(cni_config(layout, net), indent=2) + "\n"
    write_atomic(layout.cni_conf_dir / "10-testbed.conflist", conflist.encode(), sync=False)
    config = json.dumps(kubelet_config(settings, layout, kubelet_port), indent=2) + "\n"
    write_atomic(layout.kubelet_config, config.encode(), sync=False)


def argv(settings: Settings, kube_proxy_port: int) -> dict[str, list[str]]:
    layout = NodeLayout.of(settings)
    kubeconfig = settings.state_dir / "kubeconfig" / "runner.kubeconfig"
    return {
        "containerd": ["containerd", f"--config={layout.containerd_config}"],
        "kubelet": [
            str(settings.binary("kubelet")),
            f"--config={layout.kubelet_config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={layout.kubelet_root}",
            f"--hostname-override={settings.node_name}",
            f"--node-ip={host_ip()}",
            "--v=1",
        ],
        "kube-proxy": [
            str(settings.binary("kube-proxy")),
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={settings.node_name}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={PodNetwork.of(settings).subnet}",
            f"--healthz-bind-address=127.0.0.1:{kube_proxy_port}",
            "--metrics-bind-address=",
            # leave the host's conntrack table size alone (it is shared)
            "--conntrack-max-per-core=0",
            "--v=1",
        ],
        "provisioner": [
            sys.executable,
            "-m",
            "e2e.testbed.provisioning",
            f"--state-dir={settings.state_dir}",
            f"--node-name={settings.node_name}",
        ],
    }


# containerd -------------------------------------------------------------------------
def ctr(settings: Settings, *args: str, timeout_s: float = 60.0) -> str:
    """``ctr`` against this node's containerd, in the CRI's namespace."""
    sock = NodeLayout.of(settings).containerd_socket
    out = subprocess.run(
        ["ctr", "--address", str(sock), "--namespace", CRI_NAMESPACE, *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return out.stdout


def containerd_ok(settings: Settings) -> bool:
    try:
        ctr(settings, "version", timeout_s=5)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return False
    return True


#: What containerd 1.6's CRI service logs last before it marks itself initialized (the
#: next statement); until then its every call answers "server is not initialized yet".
CRI_STARTED = 'msg="Start streaming server"'


def cri_started(log_file: Path, since: int) -> bool:
    """Whether the containerd that logs to ``log_file`` from byte ``since`` on (this start;
    the log is appended to) has started its CRI service. containerd 1.6 has no call that
    says so but the CRI's own, which ``ctr`` does not make."""
    try:
        with log_file.open("rb") as f:
            f.seek(since)
            return CRI_STARTED.encode() in f.read()
    except OSError:
        return False


def import_images(settings: Settings, log: Callable[[str], None] = lambda _: None) -> None:
    """Import the built image archives that containerd does not have yet."""
    have = set(ctr(settings, "images", "list", "--quiet").split())
    for archive, ref in IMAGE_ARCHIVES.items():
        if ref not in have:
            ctr(settings, "images", "import", str(images_dir(settings) / archive), timeout_s=300)
            log(f"imported {ref} into containerd")


def kill_containers(settings: Settings) -> None:
    """SIGKILL every container's task and delete it: the kubelet leaves its pods running
    when it stops, and containerd's shims outlive containerd. Sandboxes whose task is
    gone are torn down (CNI included) by the next kubelet, or deleted with the state."""
    if not containerd_ok(settings):
        return
    tasks = [
        line.split()[0] for line in ctr(settings, "tasks", "list").splitlines()[1:] if line.strip()
    ]
    for task in tasks:
        subprocess.run(
            ["ctr", "--address", str(NodeLayout.of(settings).containerd_socket),
             "--namespace", CRI_NAMESPACE, "tasks", "kill", "--signal", "SIGKILL", task],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
    for task in tasks:
        subprocess.run(
            ["ctr", "--address", str(NodeLayout.of(settings).containerd_socket),
             "--namespace", CRI_NAMESPACE, "tasks", "delete", "--force", task],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip


def buildah_storage() -> list[str]:
    """``buildah`` on the store ``make image`` builds into (vfs unless ``STORAGE_DRIVER``)."""
    return ["buildah", "--storage-driver", os.environ.get("STORAGE_DRIVER", "vfs")]


def buildah_image_id(ref: str) -> str:
    """``sha256:<id>`` of ``ref`` in buildah's store: the config digest containerd reports
    as a container's ``imageID`` once imported."""
    found = subprocess.run(
        [*buildah_storage(), "images", "--no-trunc", "--format", "{{.ID}}", ref],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found.returncode != 0 or not found.stdout.strip():
        raise NodeError(
            f"image {ref} is not in buildah's store; build it with `make image` (`make image-spark`)"
        )
    image_id = found.stdout.split()[0]
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def config_digest(settings: Settings, ref: str) -> str | None:
    """The config digest (buildah's image id) of the image containerd names ``ref``, or
    None if it has no image of that name."""
    rows = ctr(settings, "images", "list", f"name=={ref}").splitlines()[1:]
    if not rows or not rows[0].strip():
        return None
    manifest = json.loads(ctr(settings, "content", "get", rows[0].split()[2]))
    config = manifest.get("config", {}).get("digest")
    return str(config) if config else None


def import_local_image(
    settings: Settings, ref: str, log: Callable[[str], None] = lambda _: None
) -> None:
    """Import ``ref`` from buildah's store (``make image``) into containerd, unless
    containerd has that image under that name already (same config digest, which is
    buildah's image id). The same image under another tag is not enough: a pod names
    ``ref``, and the node never pulls."""
    digest = buildah_image_id(ref)
    if config_digest(settings, ref) == digest:
        return
    storage = buildah_storage()
    archive = images_dir(settings) / "local-image.tar"
    archive.unlink(missing_ok=True)
    subprocess.run(
        [*storage, "push", "--quiet", ref, f"docker-archive:{archive}:{ref}"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    try:
        ctr(settings, "images", "import", str(archive), timeout_s=600)
    finally:
        archive.unlink(missing_ok=True)
    log(f"imported {ref} into containerd")


# One real node per machine ----------------------------------------------------------
#: Which state directory's real node runs on this machine: two would share the cgroups
#: under /kubepods and fight over kube-proxy's iptables chains (seen: a second node's
#: kube-proxy sent the first's pods' "kubernetes" Service to its own API server, gone
#: with it: "Connection refused").
CLAIM = Path("/run/headrace-testbed-real-node")


def claim(settings: Settings, running: Callable[[Path], bool]) -> None:
    """Record this test bed as the machine's real node, unless another one's still runs
    (``running(state_dir)`` tells)."""
    mine = str(settings.state_dir.resolve())
    try:
        holder = CLAIM.read_text().strip()
    except OSError:
        holder = ""
    if holder and holder != mine and running(Path(holder)):
        raise NodeError(
            f"the real node of {holder} runs on this machine; one real node per machine "
            f"(bring it down first: HEADRACE_TESTBED_STATE={holder} python -m e2e.testbed down)"
        )
    write_atomic(CLAIM, f"{mine}\n".encode(), sync=False)


def release(settings: Settings) -> None:
    with contextlib.suppress(OSError):
        if CLAIM.read_text().strip() == str(settings.state_dir.resolve()):
            CLAIM.unlink()


def unmount_all(settings: Settings) -> None:
    """Unmount what the kubelet left mounted under the node's directory (its root dir's
    bind mount, pods' secret and token tmpfs): it unmounts nothing when it stops, and
    ``down --purge`` could not remove them ("Device or resource busy")."""
    root = str(NodeLayout.of(settings).root.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # field 5 is the mount point, with space, tab, newline and backslash octal-escaped
        point = line.split()[4].encode().decode("unicode_escape")
        if point == root or point.startswith(root + "/"):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        done = subprocess.run(["umount", point], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


#: The kubelet's own iptables chains (per table), which it keeps while it runs and leaves
#: behind; its KUBE-FIREWALL drops packets to 127.0.0.0/8 from other sources, on the host.
KUBELET_CHAINS = {
    "filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY"),
    "mangle": ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"),
    "nat": ("KUBE-KUBELET-CANARY",),
}


def clean_host_rules(settings: Settings) -> None:
    """Take the node's iptables rules off the host once it has stopped: kube-proxy's (its
    own ``--cleanup``) and the kubelet's."""
    if settings.binary("kube-proxy").exists():
        subprocess.run(
            [str(settings.binary("kube-proxy")), "--cleanup", "--proxy-mode=iptables"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue

        def rule(*args: str, tool: str = tool) -> None:
            subprocess.run([tool, "-w", *args], capture_output=True, timeout=30, check=False)

        for hook in ("INPUT", "OUTPUT"):
            rule("-t", "filter", "-D", hook, "-j", "KUBE-FIREWALL")
        for table, chains in KUBELET_CHAINS.items():
            for chain in chains:
                rule("-t", table, "-F", chain)
                rule("-t", table, "-X", chain)


def remove_bridge(settings: Settings) -> None:
    """Delete the node's pod bridge (kept between ``up``s; gone with the state)."""
    subprocess.run(
        ["ip", "link", "delete", PodNetwork.of(settings).bridge],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
