"""A headrace cluster whose controller and brokers each live in a network namespace.

Real partitions need real links: loopback cannot drop one broker's packets.
``NetnsCluster`` gives every node (``c`` the controller, ``1``..``N`` the
brokers) a namespace ``hrnet-<pid>x<n>-<node>`` (``n`` counts the clusters this
process made, so a cluster never meets links of the one before) joined by a veth pair to one
bridge, which also carries an address in the root namespace (``.1``) so the
test's clients reach every node and are never cut off themselves.

Faults are nftables rules inside a node's namespace (an ``inet headrace``
table with an input and an output chain): ``cut(a, b)`` drops both
directions between two nodes, ``cut(a, b, one_way=True)`` only ``a -> b``,
``lossy(node, percent)`` drops that share of everything the node sends or
receives (``numgen random``), ``heal()`` flushes every rule.

``delay(node, ms)`` holds every packet the node receives for ``ms``: the kernel
here has no ``sch_netem``, so an iptables ``NFQUEUE`` rule in the node's
namespace queues its incoming packets and ``bench/delayline.py``, running in
that namespace, releases each one ``ms`` after it arrived (that module says why
the incoming side). ``heal()`` removes the rule and lets the forwarder release
what it still holds before it exits. ``connect_s`` times a TCP connect from the
root namespace: the round trip the delay lengthens.

Processes are started exactly as ``headrace local up`` starts them
(``broker_args`` and the controller's options) under ``ip netns exec``.
``close()`` (also on ``__exit__``, and from ``atexit``) kills every process
and deletes the namespaces and the bridge, even after a failure; ``up()``
first removes namespaces left by a run whose process is gone.

Needs root, ``ip`` and ``nft``; ``unavailable()`` says why not, for a skip.
``delay`` also needs ``iptables`` with the ``NFQUEUE`` target and the kernel's
``nfnetlink_queue``; ``delay_unavailable()`` says why not.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.cli.local_cluster import broker_args
from headrace.cli.local_record import CLUSTER_ID
from headrace.testing import procs, waiting

NS_PREFIX = "hrnet-"
DATA_PORT = 9092
ADMIN_PORT = 9644
CONTROLLER_PORT = 9700
CONTROLLER = "c"
#: the netfilter queue ``delay`` uses; queues belong to a namespace, so one number serves all
DELAY_QUEUE = 14
#: the iptables rule ``delay`` adds in a node's namespace (``-A`` to add, ``-D`` to remove)
_DELAY_RULE = ("INPUT", "-i", "eth0", "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE))


def unavailable() -> str | None:
    """Why namespaces and nft rules cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "not root: network namespaces and nft rules need CAP_NET_ADMIN"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} missing (Debian packages iproute2, nftables)"
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "nft", "add", "table", "inet", "probe")
    except RuntimeError as exc:
        return f"cannot make a namespace with an nft table: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


@functools.cache
def delay_unavailable() -> str | None:
    """Why ``NetnsCluster.delay`` cannot work here, or None when it can (probed once)."""
    reason = unavailable()
    if reason is not None:
        return reason
    if shutil.which("iptables") is None:
        return "iptables missing (Debian package iptables): the NFQUEUE target delays packets"
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "iptables", "-A", *_DELAY_RULE)
        # binding a queue proves nfnetlink_queue answers; the probe namespace routes nothing
        _run(*_in_namespace(probe), "-c", _PROBE_BIND)
    except RuntimeError as exc:
        return f"no NFQUEUE delay here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


_PROBE_BIND = (
    f"import sys; sys.path.insert(0, {str(procs.REPO)!r}); from bench import delayline;"
    f" delayline.open_queue({DELAY_QUEUE}).close()"
)


def _in_namespace(namespace: str) -> list[str]:
    """This Python, run in ``namespace`` (the repository root is its working directory)."""
    return ["ip", "netns", "exec", namespace, sys.executable]


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


class Delay:
    """``bench.delayline`` holding every packet that arrives on ``eth0`` in ``namespace``
    for ``ms``, and the iptables rule that queues them (module docstring)."""

    def __init__(self, namespace: str, ms: float, log_path: Path) -> None:
        self.namespace = namespace
        self.ms = ms
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.rule_added = False

    def start(self) -> None:
        argv = [*_in_namespace(self.namespace), "-m", "bench.delayline"]
        argv += ["--queue", str(DELAY_QUEUE), "--delay-ms", str(self.ms)]
        self.proc = procs.spawn(argv, self.log_path)
        # the rule comes second: a queued packet with no program bound would be dropped
        waiting.until(self._bound, 15, f"delayline bound in {self.namespace}")
        _run("ip", "netns", "exec", self.namespace, "iptables", "-A", *_DELAY_RULE)
        self.rule_added = True

    def _bound(self) -> bool:
        assert self.proc is not None
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        if self.proc.poll() is not None:
            raise RuntimeError(f"delayline in {self.namespace} exited: {text[-2000:]}")
        return "bound queue" in text

    def held(self) -> int:
        """Packets the kernel holds for the program right now."""
        table = _run(
            "ip", "netns", "exec", self.namespace, "cat", "/proc/net/netfilter/nfnetlink_queue"
        )
        for line in table.splitlines():
            fields = line.split()  # queue, port id, packets queued, copy mode, range, ...
            if fields and int(fields[0]) == DELAY_QUEUE:
                return int(fields[2])
        return 0

    def stop(self) -> None:
        """Remove the rule, then let the program release what it holds (each packet at its
        time) and exit."""
        try:
            if self.rule_added:
                _run("ip", "netns", "exec", self.namespace, "iptables", "-D", *_DELAY_RULE)
                self.rule_added = False
        finally:
            if self.proc is not None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                finally:
                    self.kill()

    def kill(self) -> None:
        if self.proc is not None:
            procs.reap(self.proc)
            self.proc = None


def remove_stale() -> None:
    """Delete namespaces (and bridges) of earlier runs whose process no longer exists."""
    names = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line]
    for name in names:
        if not name.startswith(NS_PREFIX):
            continue
        tag = name[len(NS_PREFIX) :].split("-")[0]
        owner = tag.split("x")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", f"hr{tag}br"], capture_output=True, check=False)


def _free_subnet() -> str:
    """A 10.x.y/24 that no route here uses yet: one per run, so two runs at once (or the
    machine's own network) never share addresses."""
    routes = _run("ip", "-4", "route")
    while True:
        subnet = f"10.{random.randrange(100, 250)}.{random.randrange(1, 250)}"
        if f"{subnet}." not in routes and not routes.startswith("default via 10."):
            return subnet


#: numbers the clusters this process makes (their tags): the links of a closed cluster
#: go away asynchronously when a process still holds its namespace
_clusters_made = itertools.count()


@dataclass
class Node:
    name: str
    address: str
    namespace: str
    proc: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)
    log_path: Path = Path()
    #: the ``bench.delayline`` forwarder while ``delay`` holds this node's packets
    delayer: Delay | None = None


class NetnsCluster:
    """A controller and ``brokers`` brokers, each in its own namespace, on one bridge."""

    def __init__(
        self,
        root: Path,
        brokers: int = 3,
        *,
        broker_options: tuple[str, ...] = (),
        controller_options: tuple[str, ...] = (),
        fsync: str = "interval",
    ) -> None:
        self.root = root
        self.tag = f"{os.getpid()}x{next(_clusters_made)}"
        self.subnet = _free_subnet()
        self.bridge = f"hr{self.tag}br"
        self.broker_ids = list(range(1, brokers + 1))
        self.broker_options = broker_options
        self.controller_options = controller_options
        self.fsync = fsync
        self.nodes: dict[str, Node] = {}
        for i, name in enumerate([CONTROLLER, *map(str, self.broker_ids)]):
            self.nodes[name] = Node(
                name, f"{self.subnet}.{10 + i}", f"{NS_PREFIX}{self.tag}-{name}"
            )
        self._closed = False

    # ---------------------------------------------------------------- addresses

    @property
    def host_address(self) -> str:
        return f"{self.subnet}.1"

    def address(self, node: str | int) -> str:
        return self.nodes[str(node)].address

    @property
    def controller_url(self) -> str:
        return f"http://{self.address(CONTROLLER)}:{CONTROLLER_PORT}"

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.address(b)}:{DATA_PORT}" for b in self.broker_ids)

    def admin_url(self, broker: int) -> str:
        return f"http://{self.address(broker)}:{ADMIN_PORT}"

    def data_dir(self, broker: int) -> Path:
        return self.root / f"broker-{broker}"

    # ---------------------------------------------------------------- life cycle

    def __enter__(self) -> NetnsCluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def up(self) -> None:
        remove_stale()
        atexit.register(self.close)
        try:
            self._up()
        except BaseException:
            self.close()  # ``__exit__`` does not run when ``__enter__`` fails
            raise

    def _up(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for node in self.nodes.values():
            self._plumb(node)
        for b in self.broker_ids:
            self._spawn_broker(b)
        for b in self.broker_ids:
            self.wait(lambda b=b: self._ready(self.admin_url(b)), 30, f"broker {b} ready")
        self._spawn_controller()
        self.wait(lambda: self._ready(self.controller_url), 30, "controller ready")

    def _host_side(self, node: Node) -> str:
        """The root namespace's end of ``node``'s veth pair (at most 15 characters)."""
        return f"hr{self.tag}{node.name}"

    def _plumb(self, node: Node) -> None:
        host_side = self._host_side(node)
        ns = node.namespace
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host_side, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", host_side, "master", self.bridge)
        _run("ip", "link", "set", host_side, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        self._nft(
            node,
            "add table inet headrace\n"
            "add chain inet headrace input { type filter hook input priority 0; }\n"
            "add chain inet headrace output { type filter hook output priority 0; }\n",
        )

    def _nft(self, node: Node, script: str) -> None:
        proc = subprocess.run(
            ["ip", "netns", "exec", node.namespace, "nft", "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"nft in {node.namespace}: {proc.stderr.strip()}\n{script}")

    def _spawn(self, node: Node, args: list[str]) -> None:
        node.argv = ["ip", "netns", "exec", node.namespace, *procs.HEADRACE_CLI, *args]
        node.log_path = self.root / f"{node.name}.log"
        node.proc = procs.spawn(node.argv, node.log_path)

    def _spawn_broker(self, broker: int) -> None:
        record = {
            "id": broker,
            "host": self.address(broker),
            "port": DATA_PORT,
            "admin_port": ADMIN_PORT,
        }
        args = broker_args(record, self.root, self.fsync)
        self._spawn(self.nodes[str(broker)], [*args, *self.broker_options])

    def _spawn_controller(self) -> None:
        args = [
            "controller",
            "--state-dir",
            str(self.root / "controller"),
            "--admin-host",
            self.address(CONTROLLER),
            "--admin-port",
            str(CONTROLLER_PORT),
            "--cluster-id",
            CLUSTER_ID,
            *self.controller_options,
        ]
        for b in self.broker_ids:
            args += ["--broker", f"{b}={self.address(b)}:{ADMIN_PORT}"]
        self._spawn(self.nodes[CONTROLLER], args)

    def _ready(self, url: str) -> bool:
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is not None:
                tail = node.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{node.name} exited ({node.proc.returncode}):\n{tail}")
        status, _ = procs.http_json(f"{url}/healthz", timeout=1.0)
        return status == 200

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for node in self.nodes.values():
            if node.proc is not None:
                procs.reap(node.proc)
            if node.delayer is not None:
                node.delayer.kill()
        for node in self.nodes.values():
            # deleting one end of a veth pair deletes both at once; a namespace goes only
            # when no process holds it any more
            subprocess.run(
                ["ip", "link", "del", self._host_side(node)], capture_output=True, check=False
            )
            subprocess.run(["ip", "netns", "del", node.namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.close)

    def kill(self, node: str | int) -> None:
        n = self.nodes[str(node)]
        if n.proc is not None:
            procs.reap(n.proc)
            n.proc = None

    def restart(self, node: str | int) -> None:
        n = self.nodes[str(node)]
        self.kill(node)
        n.proc = procs.spawn(n.argv, n.log_path)

    # ---------------------------------------------------------------- faults

    def cut(self, a: str | int, b: str | int, *, one_way: bool = False) -> None:
        """Drop what ``a`` sends to ``b`` (and, unless ``one_way``, what ``b`` sends ``a``)."""
        na, nb = self.nodes[str(a)], self.nodes[str(b)]
        self._nft(na, f"add rule inet headrace output ip daddr {nb.address} drop\n")
        self._nft(nb, f"add rule inet headrace input ip saddr {na.address} drop\n")
        if not one_way:
            self.cut(b, a, one_way=True)

    def isolate(self, node: str | int) -> None:
        """Cut ``node`` from every other node (the test's own clients still reach it)."""
        for other in self.nodes:
            if other != str(node):
                self.cut(node, other)

    def lossy(self, node: str | int, percent: int) -> None:
        """Drop ``percent`` % of the packets ``node`` sends and of those it receives."""
        n = self.nodes[str(node)]
        self._nft(
            n,
            f"add rule inet headrace input numgen random mod 100 < {percent} drop\n"
            f"add rule inet headrace output numgen random mod 100 < {percent} drop\n",
        )

    def delay(self, node: str | int, ms: float) -> None:
        """Hold every packet ``node`` receives for ``ms`` milliseconds, in order (module
        docstring): each round trip through it gets ``ms`` longer."""
        n = self.nodes[str(node)]
        if n.delayer is not None:
            raise RuntimeError(f"{n.name} is already delayed; heal() first")
        n.delayer = Delay(n.namespace, ms, self.root / f"delay-{n.name}.log")
        try:
            n.delayer.start()
        except BaseException:
            n.delayer.kill()
            n.delayer = None
            raise

    def _undelay(self, n: Node) -> None:
        if n.delayer is not None:
            try:
                n.delayer.stop()
            finally:
                n.delayer = None

    def heal(self) -> None:
        for node in self.nodes.values():
            self._nft(node, "flush chain inet headrace input\nflush chain inet headrace output\n")
            self._undelay(node)

    def connect_s(self, node: str | int, port: int = ADMIN_PORT) -> float:
        """Seconds one TCP connect from the root namespace to ``node`` takes: a round trip
        (SYN in, SYN-ACK out), so ``delay`` adds its whole length to it."""
        started = time.perf_counter()
        with socket.create_connection((self.address(node), port), timeout=10):
            return time.perf_counter() - started

    # ---------------------------------------------------------------- observing

    def wait(self, predicate: Any, timeout: float, what: str) -> None:
        waiting.until(predicate, timeout, what, retry_on=(OSError, ValueError), poll_s=0.1)

    def cli(self, *args: str) -> str:
        proc = procs.run_headrace(*args, "--controller", self.controller_url)
        if proc.returncode != 0:
            raise RuntimeError(f"headrace {' '.join(args)}: {proc.stderr.decode()}")
        return proc.stdout.decode()

    def apply(self, manifest: str) -> None:
        path = self.root / f"manifest-{time.monotonic_ns()}.yaml"
        path.write_text(manifest)
        self.cli("apply", "-f", str(path))

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.controller_url}/v1/state", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def partition(self, topic: str, index: int) -> dict[str, Any]:
        for t in self.state()["cluster"].get("topics", []):
            if t["name"] == topic:
                for p in t["partitions"]:
                    if p["partition"] == index:
                        return dict(p)
        return {}

    def heartbeat(self, broker: int, timeout: float = 2.0) -> dict[str, Any]:
        status, doc = procs.http_json(f"{self.admin_url(broker)}/v1/heartbeat", timeout=timeout)
        if status != 200 or not isinstance(doc, dict):
            raise ValueError(f"broker {broker} heartbeat: HTTP {status}")
        return doc

    def report(self, broker: int, topic: str, index: int) -> dict[str, Any] | None:
        """Broker ``broker``'s own view of one partition (from its heartbeat), or None."""
        for p in self.heartbeat(broker).get("partitions", []):
            if p["topic"] == topic and p["partition"] == index:
                return dict(p)
        return None


def read_replica(data_dir: Path, topic: str, index: int) -> dict[int, bytes]:
    """One replica's copy of a partition, read from its segment files: offset -> value.

    Independent of the broker (it may be running: only whole batches are read)."""
    from headrace.records import batch as rb

    namespace, _, name = topic.rpartition("/")
    pdir = data_dir / "topics" / (namespace or "default") / name / str(index)
    out: dict[int, bytes] = {}
    for segment in sorted(pdir.glob("*.log")):
        data = segment.read_bytes()
        for pos, header in rb.scan(data):
            batch = data[pos : pos + header.batch_length + rb.LENGTH_OVERHEAD]
            out.update({r.offset: r.value for r in rb.decode(batch).records()})
    return out
