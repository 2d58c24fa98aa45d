"""Start, stop and inspect the test bed's control plane (I/O adapter).

``up`` is idempotent: if every daemon is running and healthy it returns at once; if
only some are (a crash, a half-finished ``up``), it stops them all and starts afresh,
because a partially restarted control plane is harder to reason about than a fresh one.
etcd's data, the certificates and PersistentVolume directories survive ``down``, so a
later ``up`` finds the same cluster; ``down --purge`` removes them.

Ports are chosen once (free loopback ports), recorded in ``<state>/run/ports.json``
and reused, so kubeconfigs stay valid and etcd's stored member URLs stay true.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from e2e.testbed import clusterdns, ipam, kubeapi, kubeconfig, pki, processes, realnode
from e2e.testbed.settings import REPO_ROOT, Settings
from headrace.files import write_atomic

#: Start order; ``down`` stops in reverse, the runner first so pods get their SIGTERM
#: while the API server can still record their end.
DAEMONS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "runner")
#: Every daemon either kind of node may have started, in the order ``down`` reverses:
#: the real node's last, so its kubelet stops first and containerd after its containers.
ALL_DAEMONS = DAEMONS + realnode.DAEMONS


def daemons(settings: Settings) -> tuple[str, ...]:
    """The daemons of this test bed: the control plane and its kind of node."""
    if settings.real_node:
        return DAEMONS[:-1] + realnode.DAEMONS
    return DAEMONS


#: The default StorageClass; its provisioner is the runner (see :mod:`.provisioning`).
STORAGE_CLASS: dict[str, Any] = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {
        "name": "standard",
        "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
    },
    "provisioner": "headrace.dev/local-dir",
    "reclaimPolicy": "Delete",
    "volumeBindingMode": "Immediate",
}


#: The Services' ClusterIPs; the first is the "kubernetes" Service's.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"


class TestbedError(Exception):
    """The test bed could not be brought to the requested state."""


@dataclass
class Ports:
    """Loopback ports of one test bed, stable across ``down``/``up``."""

    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    runner: int
    #: the real node's kube-proxy health endpoint (0 in a file written before it existed)
    kube_proxy: int = 0

    @classmethod
    def load_or_choose(cls, path: Path) -> Ports:
        try:
            ports = cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            ports = cls(*(_free_port() for _ in range(7)))
        # A recorded port that something else took since is replaced.
        for name, port in asdict(ports).items():
            if port == 0 or not _port_free(port):
                setattr(ports, name, _free_port())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(ports)) + "\n")
        return ports


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _daemon(settings: Settings, name: str) -> processes.Daemon:
    return processes.Daemon(name, settings.run_dir)


def _daemon_running_in(state_dir: Path, name: str) -> bool:
    """Whether the test bed whose state is ``state_dir`` runs daemon ``name``."""
    return processes.Daemon(name, state_dir / "run").running()


def _ports_file(settings: Settings) -> Path:
    return settings.run_dir / "ports.json"


def load_ports(settings: Settings) -> Ports:
    """Ports of the (last) running test bed; raises if it was never started."""
    try:
        return Ports(**json.loads(_ports_file(settings).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise TestbedError(f"no test bed state in {settings.state_dir}") from exc


def admin_client(settings: Settings, timeout_s: float = 30.0) -> kubeapi.Client:
    ports = load_ports(settings)
    return kubeapi.from_kubeconfig_files(
        "127.0.0.1", ports.apiserver, settings.pki_dir, "admin", timeout_s
    )


# Health ---------------------------------------------------------------------------
def _https_ok(url: str, ctx: ssl.SSLContext, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError):
        return False


def _client_ctx(settings: Settings, identity: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(settings.pki_dir / "ca.crt"))
    ctx.load_cert_chain(
        str(settings.pki_dir / f"{identity}.crt"), str(settings.pki_dir / f"{identity}.key")
    )
    return ctx


def _insecure_ctx() -> ssl.SSLContext:
    # kube-controller-manager and kube-scheduler serve /healthz with self-signed
    # certificates generated at start; on loopback there is nothing to verify.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def check(settings: Settings, name: str) -> bool:
    """One daemon's health as its own endpoint reports it (False if not running)."""
    if not _daemon(settings, name).running():
        return False
    try:
        ports = load_ports(settings)
    except TestbedError:
        return False
    if name == "etcd":
        ctx = _client_ctx(settings, "apiserver-etcd-client")
        return _https_ok(f"https://127.0.0.1:{ports.etcd}/health", ctx)
    if name == "kube-apiserver":
        ctx = _client_ctx(settings, "admin")
        return _https_ok(f"https://127.0.0.1:{ports.apiserver}/readyz", ctx)
    if name == "kube-controller-manager":
        return _https_ok(f"https://127.0.0.1:{ports.controller_manager}/healthz", _insecure_ctx())
    if name == "kube-scheduler":
        return _https_ok(f"https://127.0.0.1:{ports.scheduler}/healthz", _insecure_ctx())
    if name in ("runner", "kubelet"):
        # the real kubelet serves on the runner's port, with the same client CA
        ctx = _client_ctx(settings, "apiserver-kubelet-client")
        return _https_ok(f"https://127.0.0.1:{ports.runner}/healthz", ctx)
    if name == "containerd":
        return realnode.containerd_ok(settings)
    if name == "kube-proxy":
        return _http_ok(f"http://127.0.0.1:{ports.kube_proxy}/healthz")
    if name == "provisioner":
        return True  # running is all it shows; its passes log to provisioner.log
    raise ValueError(name)


def health(settings: Settings) -> dict[str, bool]:
    """Every daemon's :func:`check`."""
    return {name: check(settings, name) for name in daemons(settings)}


def _wait(
    what: str, check: Callable[[], bool], deadline: float, settings: Settings, log: str
) -> None:
    while not check():
        if time.monotonic() > deadline:
            tail = _tail(settings.log_dir / f"{log}.log")
            raise TestbedError(f"timed out waiting for {what}; last lines of {log}.log:\n{tail}")
        if log in ALL_DAEMONS and not _daemon(settings, log).running():
            tail = _tail(settings.log_dir / f"{log}.log")
            raise TestbedError(f"{log} exited while waiting for {what}:\n{tail}")
        time.sleep(0.2)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# Command lines --------------------------------------------------------------------
def _argv(settings: Settings, ports: Ports) -> dict[str, list[str]]:
    p, s = settings.pki_dir, settings.state_dir
    b = settings.binary
    etcd_url = f"https://127.0.0.1:{ports.etcd}"
    peer_url = f"http://127.0.0.1:{ports.etcd_peer}"
    kc = settings.state_dir / "kubeconfig"
    apiserver_address = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"]
    # The "kubernetes" Endpoints would hold 127.0.0.1, which Endpoints validation
    # rejects as loopback; in-pod clients get the address from env instead.
    endpoints = "--endpoint-reconciler-type=none"
    if settings.real_node:
        # pods reach the API server through the "kubernetes" Service (kube-proxy) at the
        # host's address, which the Endpoints may hold; the kubelet's pods are not on
        # loopback, so the server listens on every address
        apiserver_address = ["--bind-address=0.0.0.0", f"--advertise-address={realnode.host_ip()}"]
        endpoints = "--endpoint-reconciler-type=lease"
    return {
        "etcd": [
            str(b("etcd")),
            "--name=testbed",
            f"--data-dir={s / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=testbed={peer_url}",
            f"--cert-file={p / 'etcd-server.crt'}",
            f"--key-file={p / 'etcd-server.key'}",
            f"--trusted-ca-file={p / 'ca.crt'}",
            "--client-cert-auth",
            # A test bed's data is disposable; fsync would make every write wait on the disk.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(b("kube-apiserver")),
            *apiserver_address,
            f"--secure-port={ports.apiserver}",
            f"--etcd-servers={etcd_url}",
            f"--etcd-cafile={p / 'ca.crt'}",
            f"--etcd-certfile={p / 'apiserver-etcd-client.crt'}",
            f"--etcd-keyfile={p / 'apiserver-etcd-client.key'}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            # ClusterIPs are allocated from here; only a real node's kube-proxy routes them.
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            endpoints,
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={p / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
        ],
        "kube-controller-manager": [
            str(b("kube-controller-manager")),
            f"--kubeconfig={kc / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={kc / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={kc / 'controller-manager.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={s / 'controller-manager'}",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            # Each controller acts as its own service account, as in a real cluster, so
            # RBAC mistakes in bootstrap policy would show here too.
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--profiling=false",
        ],
        "kube-scheduler": [
            str(b("kube-scheduler")),
            f"--kubeconfig={kc / 'scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={kc / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={kc / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={s / 'scheduler'}",
            "--leader-elect=false",
            "--profiling=false",
        ],
        "runner": [
            sys.executable,
            "-m",
            "e2e.testbed.kubelet",
            f"--state-dir={s}",
            f"--node-name={settings.node_name}",
            f"--k8s-version={settings.k8s_version}",
            f"--pod-block={ipam.block_for(str(settings.state_dir.resolve()))}",
        ],
    }


def _write_kubeconfigs(settings: Settings, ports: Ports) -> None:
    server = f"https://127.0.0.1:{ports.apiserver}"
    p = settings.pki_dir
    kc_dir = settings.state_dir / "kubeconfig"
    kc_dir.mkdir(parents=True, exist_ok=True)
    for name in ("admin", "controller-manager", "scheduler", "runner"):
        text = kubeconfig.render(
            server,
            ca_file=p / "ca.crt",
            cert_file=p / f"{name}.crt",
            key_file=p / f"{name}.key",
            user=name,
        )
        target = settings.admin_kubeconfig if name == "admin" else kc_dir / f"{name}.kubeconfig"
        write_atomic(target, text.encode(), sync=False, mode=0o600)


# Lifecycle ------------------------------------------------------------------------
def is_up(settings: Settings) -> bool:
    return all(health(settings).values())


def up(settings: Settings, log: Callable[[str], None] = lambda _: None) -> float:
    """Bring the test bed up (idempotent); returns seconds taken. Binaries must exist.

    On failure everything started is stopped again (logs stay in ``<state>/logs``), so
    a failed ``up`` leaves no processes behind.
    """
    try:
        return _up(settings, log)
    except BaseException:
        down(settings)
        raise


def _up(settings: Settings, log: Callable[[str], None]) -> float:
    start = time.monotonic()
    if is_up(settings):
        log("test bed already up")
        return 0.0
    if any(_daemon(settings, name).running() for name in ALL_DAEMONS):
        log("test bed partly up; restarting it")
        down(settings)
    missing = [
        n
        for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
        if not settings.binary(n).exists()
    ]
    if missing:
        raise TestbedError(
            f"missing binaries {missing} in {settings.bin_dir}; run e2e/testbed/build.sh"
        )

    for d in (settings.state_dir, settings.log_dir, settings.run_dir, settings.volumes_dir):
        d.mkdir(parents=True, exist_ok=True)
    pki.ensure(settings.pki_dir)
    if settings.real_node:
        # pods dial the API server at the "kubernetes" Service's ClusterIP (and its names)
        pki.ensure_serving(
            settings.pki_dir, "apiserver", pki.APISERVER_DNS,
            ("127.0.0.1", realnode.host_ip(), KUBERNETES_SERVICE_IP),
        )  # fmt: skip
    ports = Ports.load_or_choose(_ports_file(settings))
    _write_kubeconfigs(settings, ports)
    argv = _argv(settings, ports)
    deadline = start + settings.ready_timeout_s
    # Pods inherit the runner's PATH: "the command must exist on the host" means on the
    # PATH of whoever ran `up`, plus the test bed's own kubectl and helm.
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env = {"PATH": f"{path}:{settings.bin_dir}", **settings.extra_env}

    def launch(name: str) -> None:
        log_file = settings.log_dir / f"{name}.log"
        _daemon(settings, name).start(
            argv[name], log_file=log_file, env=env, cwd=settings.state_dir
        )

    def health_of(name: str) -> Callable[[], bool]:
        return lambda: check(settings, name)

    launch("etcd")
    _wait("etcd", health_of("etcd"), deadline, settings, "etcd")
    launch("kube-apiserver")
    _wait(
        "kube-apiserver /readyz", health_of("kube-apiserver"), deadline, settings, "kube-apiserver"
    )
    for name in ("kube-controller-manager", "kube-scheduler"):
        launch(name)
    if settings.real_node:
        node = _start_real_node(settings, ports, env, deadline, log)
    else:
        node = "runner"
        runner_env = dict(env)
        runner_env.update(_python_env())
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        _daemon(settings, "runner").start(
            argv["runner"],
            log_file=settings.log_dir / "runner.log",
            env=runner_env,
            cwd=settings.state_dir,
        )
    api = admin_client(settings)
    _ensure(api, "/apis/storage.k8s.io/v1/storageclasses", STORAGE_CLASS)
    node_daemons = realnode.DAEMONS if settings.real_node else ("runner",)
    for name in ("kube-controller-manager", "kube-scheduler", *node_daemons):
        _wait(f"{name} health", health_of(name), deadline, settings, name)
    _wait("node Ready", lambda: _node_ready(api, settings.node_name), deadline, settings, node)
    if settings.real_node:
        # the cluster DNS the kubelet names to pods: up means names resolve
        for collection, obj in clusterdns.objects():
            _ensure_named(api, collection, obj)
        _wait(
            "cluster DNS (CoreDNS) ready",
            lambda: _deployment_ready(api, clusterdns.NAMESPACE, clusterdns.NAME),
            deadline, settings, "kubelet",
        )  # fmt: skip
    # Pods are rejected until their namespace's default ServiceAccount exists.
    _wait(
        "default ServiceAccount",
        lambda: _exists(api, "/api/v1/namespaces/default/serviceaccounts/default"),
        deadline,
        settings,
        "kube-controller-manager",
    )
    took = time.monotonic() - start
    log(
        f"test bed up in {took:.1f} s ({settings.node_kind} node);"
        f" KUBECONFIG={settings.admin_kubeconfig}"
    )
    return took


def _start_real_node(
    settings: Settings,
    ports: Ports,
    env: dict[str, str],
    deadline: float,
    log: Callable[[str], None],
) -> str:
    """containerd, the images it needs, then the kubelet; returns the daemon to wait for."""
    try:
        realnode.claim(settings, lambda state: _daemon_running_in(state, "kubelet"))
        realnode.prepare(settings, ports.runner)
    except realnode.NodeError as exc:
        raise TestbedError(str(exc)) from exc
    argv = realnode.argv(settings, ports.kube_proxy)
    # runc, iptables, mount and the shims live in the sbin directories
    node_env = {**env, "PATH": f"/usr/local/sbin:/usr/sbin:/sbin:{env['PATH']}"}
    for name in realnode.DAEMONS:
        if name == "kubelet":
            realnode.import_images(settings, log)
        daemon_env = {**node_env, **_python_env()} if name == "provisioner" else node_env
        log_file = settings.log_dir / f"{name}.log"
        log_start = log_file.stat().st_size if log_file.exists() else 0
        _daemon(settings, name).start(
            argv[name], log_file=log_file, env=daemon_env, cwd=settings.state_dir,
        )  # fmt: skip
        if name == "containerd":
            _wait("containerd", lambda: check(settings, "containerd"), deadline, settings, name)
            # containerd answers before its CRI service has initialized, and a kubelet
            # that finds the CRI "not initialized yet" exits at once
            _wait(
                "containerd's CRI service",
                functools.partial(realnode.cri_started, log_file, log_start),
                deadline, settings, name,
            )  # fmt: skip
    return "kubelet"


def _python_env() -> dict[str, str]:
    """Environment that lets the runner import this package from the same interpreter."""
    keep = ("VIRTUAL_ENV", "HOME", "LANG", "LC_ALL", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    # The test bed is not installed: the runner finds ``e2e`` through the repository root.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    return env


def _exists(api: kubeapi.Client, path: str) -> bool:
    try:
        api.get(path)
        return True
    except kubeapi.ApiError:
        return False


def _ensure_named(api: kubeapi.Client, collection: str, obj: dict[str, Any]) -> None:
    """Create ``obj`` unless one of its name exists: looked up first, because a create
    of a Service whose ClusterIP is taken (by itself, from an earlier ``up``) is refused
    with 422, not the 409 :func:`_ensure` expects."""
    try:
        api.get(f"{collection}/{obj['metadata']['name']}")
    except kubeapi.ApiError as exc:
        if not exc.not_found:
            raise
        _ensure(api, collection, obj)


def _deployment_ready(api: kubeapi.Client, namespace: str, name: str) -> bool:
    try:
        obj = api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    except kubeapi.ApiError:
        return False
    return int(obj.get("status", {}).get("readyReplicas") or 0) >= 1


def _node_ready(api: kubeapi.Client, node: str) -> bool:
    try:
        obj = api.get(f"/api/v1/nodes/{node}")
    except kubeapi.ApiError:
        return False
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _ensure(api: kubeapi.Client, collection: str, obj: dict[str, Any]) -> None:
    try:
        api.create(collection, obj)
    except kubeapi.ApiError as exc:
        if not exc.conflict:
            raise


def down(
    settings: Settings, purge: bool = False, log: Callable[[str], None] = lambda _: None
) -> None:
    """Stop everything (idempotent); with ``purge`` also delete all state."""
    node_ran = False
    for name in reversed(ALL_DAEMONS):
        if name == "containerd":
            # the kubelet leaves its containers running, and their shims outlive containerd
            realnode.kill_containers(settings)
        if _daemon(settings, name).stop(settings.stop_timeout_s):
            log(f"stopped {name}")
            node_ran = node_ran or name in realnode.DAEMONS
        if name == "containerd":
            # the real node's last daemon: what it leaves on the host goes now
            realnode.unmount_all(settings)
            if node_ran:
                realnode.clean_host_rules(settings)
            if purge:
                realnode.remove_bridge(settings)
            realnode.release(settings)
    _kill_leftover_pods(settings)
    if purge and settings.state_dir.exists():
        shutil.rmtree(settings.state_dir)
        log(f"removed {settings.state_dir}")


def _kill_leftover_pods(settings: Settings) -> None:
    """Kill pod process groups the runner recorded but could not stop (it was killed)."""
    record = settings.run_dir / "pod-processes"
    try:
        pgids = [int(x) for x in record.read_text().split()]
    except (OSError, ValueError):
        return
    for pgid in pgids:
        processes.kill_group(pgid, signal.SIGKILL)
    record.unlink(missing_ok=True)


def status(settings: Settings) -> dict[str, Any]:
    """Per-daemon pid, health and resident memory, plus where the kubeconfig is."""
    h = health(settings)
    by_name: dict[str, Any] = {}
    total = 0
    for name in daemons(settings):
        pid = _daemon(settings, name).pid()
        rss = processes.rss_kib(pid) if pid is not None else 0
        total += rss
        by_name[name] = {"pid": pid, "healthy": h[name], "rss_mib": round(rss / 1024, 1)}
        if name == "runner" and pid is not None:
            pods = sum(processes.rss_kib(c) for c in processes.descendants(pid))
            by_name[name]["pods_rss_mib"] = round(pods / 1024, 1)
    return {
        "up": all(h.values()),
        "kubeconfig": str(settings.admin_kubeconfig),
        "state_dir": str(settings.state_dir),
        "bin_dir": str(settings.bin_dir),
        "daemons": by_name,
        "total_rss_mib": round(total / 1024, 1),  # control plane + runner, not pods
    }
