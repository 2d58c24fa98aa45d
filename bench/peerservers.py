"""The peer servers the comparison bench starts: Kafka (KRaft), NATS JetStream, and a
3-broker headrace local cluster.

Kafka and NATS come from ``bench/peers/build.sh`` (cached in
``~/.cache/headrace``; built on first use). Every process is started through
``procs.spawn`` (its own process group, killed by ``procs.kill_all``), binds to
loopback ports the OS picked, and keeps its data in a fresh temp dir.

Kafka runs from its jars with the JVM flags of its own start scripts
(``kafka-server-start.sh`` and ``kafka-run-class.sh``): a 1 GiB fixed heap, G1
with a 20 ms pause goal. Its tools (``ProducerPerformance`` and friends) get the
512 MiB heap their scripts give them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.testing import procs, waiting

BUILD = procs.REPO / "bench" / "peers" / "build.sh"

#: kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS
KAFKA_JVM_PERFORMANCE = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]
#: kafka-server-start.sh's KAFKA_HEAP_OPTS
KAFKA_SERVER_HEAP = ["-Xmx1G", "-Xms1G"]
#: kafka-producer-perf-test.sh / kafka-consumer-perf-test.sh's KAFKA_HEAP_OPTS
KAFKA_TOOL_HEAP = ["-Xmx512M"]

#: Kafka flush settings: "interval" matches headrace --fsync interval (fsync every ~1 s;
#: the scheduler must run as often, or the interval is never checked), "default" is
#: Kafka's out-of-the-box page-cache-only durability (replication is its durability)
KAFKA_FLUSH = {
    "interval": {"log.flush.interval.ms": "1000", "log.flush.scheduler.interval.ms": "1000"},
    "default": {},
}

_BUILT: dict[str, Path] = {}
#: the paths each argument of build.sh prints
_PEER_PATHS = {
    "kafka": ("kafka_libs",),
    "nats": ("nats_server", "nats_cli"),
    "all": ("kafka_libs", "nats_server", "nats_cli"),
}


def peer_paths(peer: str = "all") -> dict[str, Path]:
    """``kafka_libs``, ``nats_server`` and ``nats_cli``, built by ``bench/peers/build.sh`` if
    missing; ``peer`` (``kafka``, ``nats``) builds only that one, so a bench that runs Kafka
    alone needs no Go toolchain."""
    if not all(name in _BUILT for name in _PEER_PATHS[peer]):
        out = subprocess.run(
            ["bash", str(BUILD), peer],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
            timeout=3600,
        ).stdout
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                _BUILT[key] = Path(value)
    return _BUILT


def kafka_version() -> str:
    env = (procs.REPO / "bench" / "peers" / "versions.env").read_text()
    for line in env.splitlines():
        if line.startswith("KAFKA_VERSION="):
            return line.split("=", 1)[1]
    return "?"


def nats_version() -> str:
    env = (procs.REPO / "bench" / "peers" / "versions.env").read_text()
    for line in env.splitlines():
        if line.startswith("NATS_VERSION="):
            return line.split("=", 1)[1]
    return "?"


def _java_argv(main: str, *args: str, heap: list[str], extra: list[str] | None = None) -> list[str]:
    libs = peer_paths("kafka")["kafka_libs"]
    return [
        "java",
        *heap,
        *KAFKA_JVM_PERFORMANCE,
        *(extra or []),
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def java_tool_argv(main: str, *args: str) -> list[str]:
    """The command line of one of Kafka's Java tools, as its script would run it."""
    return _java_argv(main, *args, heap=KAFKA_TOOL_HEAP)


def kafka_tool(main: str, *args: str, timeout: float) -> tuple[str, float]:
    """Run one of Kafka's Java tools to completion; (stdout, its CPU seconds)."""
    return procs.run_tool(_java_argv(main, *args, heap=KAFKA_TOOL_HEAP), timeout=timeout)


def _log4j_config(path: Path, log_file: Path) -> Path:
    """INFO to a file (what Kafka's distribution logs by default), nothing to stdout."""
    path.write_text(
        "\n".join(
            [
                "Configuration:",
                "  Appenders:",
                "    File:",
                "      name: file",
                f"      fileName: {log_file}",
                "      PatternLayout:",
                '        pattern: "[%d] %p %m (%c)%n"',
                "  Loggers:",
                "    Root:",
                "      level: INFO",
                "      AppenderRef:",
                "        - ref: file",
                "",
            ]
        )
    )
    return path


@dataclass
class KafkaNode:
    node_id: int
    home: Path
    port: int = field(default_factory=procs.free_port)
    controller_port: int = field(default_factory=procs.free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"{procs.LOOPBACK}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def kafka_cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A random cluster id as Kafka's own ``Uuid.randomUuid`` makes them: URL-safe
    base64 of 16 random bytes, drawn again when it would start with ``-``, which the
    storage tool's argument parser takes for an option (one id in 64 did, and the
    tool failed with "argument --cluster-id/-t: expected one argument")."""
    while True:
        text = base64.urlsafe_b64encode(draw()).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


class KafkaCluster:
    """``nodes`` Kafka processes in KRaft combined mode (each broker and controller).

    ``flush``: a key of ``KAFKA_FLUSH``. Internal topics get the cluster's
    replication factor; topics are created through confluent-kafka's admin client.
    """

    def __init__(self, home: Path, nodes: int = 1, flush: str = "interval") -> None:
        self.home = home
        self.flush = flush
        self.nodes = [KafkaNode(i + 1, home / f"node-{i + 1}") for i in range(nodes)]
        self.cluster_id = kafka_cluster_id()

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.alive]

    def _properties(self, node: KafkaNode) -> Path:
        rf = min(3, len(self.nodes))
        voters = ",".join(f"{n.node_id}@{procs.LOOPBACK}:{n.controller_port}" for n in self.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{procs.LOOPBACK}:{node.port},"
            f"CONTROLLER://{procs.LOOPBACK}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{procs.LOOPBACK}:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(node.home / "data"),
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": str(rf),
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": str(min(2, rf)),
            "share.coordinator.state.topic.replication.factor": str(rf),
            "share.coordinator.state.topic.min.isr": str(min(2, rf)),
            "group.initial.rebalance.delay.ms": "0",
            **KAFKA_FLUSH[self.flush],
        }
        path = node.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def start(self, timeout: float = 90.0) -> None:
        for node in self.nodes:
            node.home.mkdir(parents=True, exist_ok=True)
            config = self._properties(node)
            procs.run_tool(
                _java_argv(
                    "kafka.tools.StorageTool",
                    "format",
                    "--cluster-id",
                    self.cluster_id,
                    "--config",
                    str(config),
                    heap=KAFKA_TOOL_HEAP,
                ),
                timeout=120,
            )
        for node in self.nodes:
            self.spawn(node)
        self.wait_ready(timeout)

    def spawn(self, node: KafkaNode) -> None:
        log4j = _log4j_config(node.home / "log4j2.yaml", node.home / "server.log")
        argv = _java_argv(
            "kafka.Kafka",
            str(node.home / "server.properties"),
            heap=KAFKA_SERVER_HEAP,
            extra=[f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={node.home}"],
        )
        node.proc = procs.spawn(argv, node.home / "stdout.log")

    def wait_ready(self, timeout: float) -> None:
        """Every live node registered with the controller and answering metadata."""
        from confluent_kafka.admin import AdminClient

        want = {n.node_id for n in self.nodes if n.alive}

        def ready() -> bool:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"kafka node {node.node_id} exited: {self.log_tail(node)}")
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
            meta = admin.list_topics(timeout=2)
            return set(meta.brokers) >= want

        waiting.until(ready, timeout, "kafka ready", retry_on=(Exception,), poll_s=0.5)

    def log_tail(self, node: KafkaNode, lines: int = 30) -> str:
        out = []
        for name in ("stdout.log", "server.log"):
            with contextlib.suppress(OSError):
                out += (node.home / name).read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def create_topic(
        self, name: str, partitions: int, replicas: int = 1, min_insync: int | None = None
    ) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        config = {"min.insync.replicas": str(min_insync)} if min_insync else {}
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        futures = admin.create_topics(
            [NewTopic(name, partitions, replicas, config=config)], operation_timeout=30
        )
        for fut in futures.values():
            fut.result(60)

        def leaders() -> bool:
            meta = admin.list_topics(name, timeout=2)
            topic = meta.topics.get(name)
            return (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(
                    p.leader >= 0 and len(p.isrs) == replicas for p in topic.partitions.values()
                )
            )

        waiting.until(leaders, 60, f"kafka topic {name} led", retry_on=(Exception,), poll_s=0.2)

    def delete_topic(self, name: str) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        for fut in admin.delete_topics([name], operation_timeout=30).values():
            fut.result(60)

    def records(self, topic: str) -> int:
        """Stored records: the sum of high watermarks minus low ones."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "bench-count", "log_level": 0}
        )
        try:
            meta = c.list_topics(topic, timeout=10)
            total = 0
            for p in meta.topics[topic].partitions:
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high - low
            return total
        finally:
            c.close()

    def leader_of(self, topic: str, partition: int = 0) -> int:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        leader: int = (
            admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
        )
        return leader

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def kill9(self, node: KafkaNode) -> None:
        if node.proc is not None:
            procs.reap(node.proc)

    def stop(self) -> None:
        for node in self.nodes:
            self.kill9(node)


class NatsServer:
    """nats-server with JetStream, file storage in a temp dir, ``sync_interval`` as asked."""

    def __init__(self, home: Path, sync_interval: str = "1s") -> None:
        self.home = home
        self.sync_interval = sync_interval
        self.port = procs.free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"nats://{procs.LOOPBACK}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / "nats.conf"
        conf.write_text(
            f"listen: {procs.LOOPBACK}:{self.port}\n"
            "max_payload: 8MB\n"
            "jetstream {\n"
            f"  store_dir: {json.dumps(str(self.home / 'js'))}\n"
            f"  sync_interval: {self.sync_interval}\n"
            "}\n"
        )
        binary = peer_paths("nats")["nats_server"]
        self.proc = procs.spawn([str(binary), "-c", str(conf)], self.home / "nats.log")

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError((self.home / "nats.log").read_text(errors="replace")[-2000:])
            with socket.create_connection((procs.LOOPBACK, self.port), 1) as conn:
                greeting: bytes = conn.recv(4)
                return greeting.startswith(b"INFO")

        waiting.until(ready, timeout, "nats-server ready", retry_on=(OSError,), poll_s=0.05)

    def stop(self) -> None:
        if self.proc is not None:
            procs.reap(self.proc)
            self.proc = None


class HeadraceLocal:
    """``headrace local up``: a controller and ``brokers`` brokers on 127.0.0.2.., the
    same processes a user gets. Pids come from the cluster's ``local.json``."""

    def __init__(self, home: Path, brokers: int = 3, fsync: str = "interval") -> None:
        self.dir = home
        self.brokers = brokers
        self.fsync = fsync
        self.port = procs.free_port()
        self.admin_port = procs.free_port()
        self.controller_port = procs.free_port()
        #: every broker's Kafka listener (docs/kafka.md): a port of its own, not the
        #: default 9093, so that clusters run side by side
        self.kafka_port = procs.free_port()

    def _cli(self, *args: str, timeout: float = 120.0) -> str:
        proc = procs.run_headrace(*args, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"headrace {' '.join(args)}: {proc.stderr.decode()[-2000:]}")
        return proc.stdout.decode()

    def start(self) -> None:
        self._cli(
            "local",
            "up",
            "--dir",
            str(self.dir),
            "--brokers",
            str(self.brokers),
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            "--controller-port",
            str(self.controller_port),
            "--kafka-port",
            str(self.kafka_port),
            "--fsync",
            self.fsync,
        )

    @property
    def record(self) -> dict[str, Any]:
        return dict(json.loads((self.dir / "local.json").read_text()))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{b['host']}:{b['port']}" for b in self.record["brokers"])

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka listener, for a Kafka client."""
        return ",".join(f"{b['host']}:{b['kafka_port']}" for b in self.record["brokers"])

    @property
    def controller_url(self) -> str:
        return f"http://127.0.0.1:{self.controller_port}"

    @property
    def pids(self) -> dict[str, int]:
        """The controller's and every broker's pid, named for a ``procs.CpuMeter``."""
        return {
            "server_controller": int(self.record["controller_pid"]),
            **{f"server_broker{bid}": pid for bid, pid in self.broker_pids().items()},
        }

    def broker_pids(self) -> dict[int, int]:
        return {int(b["id"]): int(b["pid"]) for b in self.record["brokers"]}

    def create_topic(
        self,
        name: str,
        partitions: int,
        replicas: int,
        min_in_sync: int,
        timeout: float = 120.0,
        wait: bool = True,
        tiered: bool = True,
    ) -> None:
        """``headrace topics create``: returns once every partition has a leader (``wait``;
        the CLI gives up after 15 s), or once applied (then see ``led``). ``tiered``: a
        local cluster tiers every topic to its object store unless told not to."""
        self._cli(
            "topics",
            "create",
            name,
            *([] if wait else ["--no-wait"]),
            *([] if tiered else ["--config", "tiered=false"]),
            "--partitions",
            str(partitions),
            "--replicas",
            str(replicas),
            "--min-in-sync",
            str(min_in_sync),
            "--controller",
            self.controller_url,
            "--bootstrap",
            self.bootstrap,
            "--dir",
            str(self.dir),
            timeout=timeout,
        )

    def led(self, topics: list[str], partitions: int) -> bool:
        """Whether ``topics`` hold ``partitions`` partitions in all, each with a leader."""
        status, doc = procs.http_json(f"{self.controller_url}/v1/state", timeout=30)
        if status != 200:
            return False
        names = set(topics) | {f"default/{t}" for t in topics}
        found = [
            p
            for t in doc["cluster"].get("topics", [])
            if t["name"] in names
            for p in t["partitions"]
        ]
        return len(found) == partitions and all(p.get("leader") is not None for p in found)

    def partitions(self, topic: str) -> list[dict[str, Any]]:
        status, doc = procs.http_json(f"{self.controller_url}/v1/state")
        if status != 200:
            return []
        for t in doc["cluster"].get("topics", []):
            if t["name"] in (topic, f"default/{topic}"):
                return list(t["partitions"])
        return []

    def records(self, topic: str) -> int:
        """Stored records on each partition's leader."""
        total = 0
        for b in self.record["brokers"]:
            status, doc = procs.http_json(
                f"http://{b['host']}:{b['admin_port']}/v1/topics/default/{topic}"
            )
            if status != 200:
                continue
            for p in doc.get("partition_details", []):
                if p.get("role") == "leader":
                    total += p["log_end_offset"] - p["log_start_offset"]
        return total

    def kill9(self, broker_id: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.broker_pids()[broker_id], signal.SIGKILL)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            procs.run_headrace("local", "down", "--dir", str(self.dir), timeout=60)
        record: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            record = self.record
        for pid in [
            *(b.get("pid") for b in record.get("brokers", [])),
            record.get("controller_pid"),
        ]:
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(pid), signal.SIGKILL)


def wait_s(seconds: float) -> None:
    """A pause between measurements (memory handed back, see ``procs.page_touch_cost``)."""
    time.sleep(seconds)
