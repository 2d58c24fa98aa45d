"""A `headrace local up` cluster for tests: real controller and broker processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from headrace.cli.local_access import access_args, controller_access_args
from headrace.cli.local_cluster import broker_args, object_store_args
from headrace.cli.processes import spawn_headrace
from headrace.objectstore.minio_store import MinioSettings, MinioStore
from headrace.testing import procs, waiting
from headrace.testing.procs import free_port
from headrace.tiered.layout import partition_prefix
from headrace.tiered.manifest import Manifest
from headrace.tiered.tier import PartitionTier
from tests.integration.objectstore import servers


class LocalCluster:
    def __init__(
        self,
        directory: Path,
        brokers: int = 3,
        object_store: str = "dir",
        src: Path | None = None,
    ) -> None:
        self.dir = directory
        #: the headrace its CLI runs (and so every process ``local`` starts): an exported
        #: release (``procs.export_ref``); None for the one under test
        self.src = src
        self.count = brokers
        self.object_store = object_store
        self.port = free_port()
        self.admin_port = free_port()
        self.controller_port = free_port()
        #: every broker's Kafka listener (its own port, so clusters run side by side)
        self.kafka_port = free_port()
        #: the CLI's token (``$HEADRACE_AUTH_TOKEN``) when the cluster has ACLs
        self.api_token: str | None = None

    def cli(
        self, *args: str, stdin: bytes = b"", check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        env = {"HEADRACE_AUTH_TOKEN": self.api_token} if self.api_token else None
        proc = procs.run_headrace(*args, stdin=stdin, env=env, src=self.src)
        if check and proc.returncode != 0:
            raise AssertionError(f"headrace {' '.join(args)} failed: {proc.stderr.decode()}")
        return proc

    def up(self, *extra: str) -> None:
        """``headrace local up`` with this cluster's ports, and ``extra`` options."""
        # an exported release from before the Kafka listener has no --kafka-port
        kafka = [] if self.src is not None else ["--kafka-port", str(self.kafka_port)]
        self.cli(
            "local",
            "up",
            *extra,
            *kafka,
            "--dir",
            str(self.dir),
            "--brokers",
            str(self.count),
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            "--controller-port",
            str(self.controller_port),
            "--object-store",
            self.object_store,
        )

    def down(self) -> None:
        self.cli("local", "down", "--dir", str(self.dir), check=False)

    @property
    def record(self) -> dict[str, Any]:
        return dict(json.loads((self.dir / "local.json").read_text()))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{b['host']}:{b['port']}" for b in self.record["brokers"])

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(
            f"{b['host']}:{b['kafka_port']}" for b in self.record["brokers"] if "kafka_port" in b
        )

    @property
    def controller_url(self) -> str:
        return f"http://127.0.0.1:{self.controller_port}"

    def apply(self, manifest: str) -> subprocess.CompletedProcess[bytes]:
        path = self.dir / f"manifest-{time.monotonic_ns()}.yaml"
        path.write_text(manifest)
        return self.cli("apply", "-f", str(path), "--controller", self.controller_url, check=False)

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.controller_url}/v1/state", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def log_ends(self, topic: str, partition: int) -> dict[int, int]:
        """Broker id -> its replica's log end offset as the controller last heard it (what
        an election ranks candidates by)."""
        query = urllib.parse.urlencode({"topic": topic})
        url = f"{self.controller_url}/v1/replicas?{query}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc = json.loads(resp.read())
        for p in doc["topics"].get(topic, []):
            if p["partition"] == partition:
                return {int(b): int(end) for b, end in p["logEndOffsets"].items()}
        return {}

    def cohort_partitions(self, topic: str, cohort: str) -> dict[int, dict[str, Any]]:
        """Partition -> what its leader says of the cohort there (``headrace cohorts describe``):
        ``cursor`` (the next offset it delivers; every record below it acknowledged),
        ``high_watermark``, ``holder``. Empty while the cohort is unknown."""
        proc = self.cli(
            "cohorts", "describe", cohort, "--json", "--dir", str(self.dir), check=False
        )
        if proc.returncode != 0:
            return {}
        for view in json.loads(proc.stdout):
            if view["topic"] == topic:
                return {int(p["partition"]): p for p in view["partitions"]}
        return {}

    def cursor(self, topic: str, cohort: str, partition: int) -> int | None:
        found = self.cohort_partitions(topic, cohort).get(partition)
        return None if found is None or found["cursor"] is None else int(found["cursor"])

    def partitions(self, topic: str) -> list[dict[str, Any]]:
        for t in self.state()["cluster"].get("topics", []):
            if t["name"] == topic:
                return list(t["partitions"])
        return []

    def creation_id(self, topic: str) -> str:
        """The creation id the controller gave ``topic``: its objects' prefix."""
        for t in self.state()["cluster"].get("topics", []):
            if t["name"] == topic:
                return str(t.get("creationId", ""))
        raise AssertionError(f"{topic} is not placed")

    def kill_broker(self, broker_id: int) -> None:
        pid = next(b["pid"] for b in self.record["brokers"] if b["id"] == broker_id)
        os.killpg(pid, signal.SIGKILL)

    def restart_broker(self, broker_id: int) -> None:
        """Start broker ``broker_id`` again with its data directory and addresses (after a kill)."""
        record = self.record
        b = next(b for b in record["brokers"] if b["id"] == broker_id)
        store_args, env = object_store_args(record, self.dir)
        b["pid"] = spawn_headrace(
            [*broker_args(b, self.dir), *store_args],
            self.dir / "logs" / f"broker-{b['id']}.log",
            env,
        )
        (self.dir / "local.json").write_text(json.dumps(record))

    def signal_broker(self, broker_id: int, sig: signal.Signals) -> None:
        pid = next(b["pid"] for b in self.record["brokers"] if b["id"] == broker_id)
        os.killpg(pid, sig)

    def broker_partition(self, broker_id: int, topic: str, partition: int) -> dict[str, Any]:
        """What broker ``broker_id``'s own heartbeat says of its copy of the partition (the
        broker asked directly, whatever the controller has heard); {} if it hosts none."""
        b = next(b for b in self.record["brokers"] if b["id"] == broker_id)
        url = f"http://{b['host']}:{b['admin_port']}/v1/heartbeat"
        with urllib.request.urlopen(url, timeout=5) as resp:
            heartbeat = json.loads(resp.read())
        return next(
            (
                p
                for p in heartbeat.get("partitions", [])
                if p["topic"] == topic and p["partition"] == partition
            ),
            {},
        )

    def signal_controller(self, sig: signal.Signals) -> None:
        os.killpg(self.record["controller_pid"], sig)

    def kill_controller(self) -> None:
        os.killpg(self.record["controller_pid"], signal.SIGKILL)

    def restart_controller(self) -> None:
        """Start a fresh controller process with the same state directory and brokers."""
        record = self.record
        args = [
            "controller",
            "--state-dir",
            str(self.dir / "controller"),
            "--local-dir",
            str(self.dir),
            "--admin-port",
            str(self.controller_port),
            *(["--instance", record["instance"]] if "instance" in record else []),
            *record.get("controller_args", []),
            *controller_access_args(record),
            *[
                a
                for b in record["brokers"]
                for a in ("--broker", f"{b['id']}={b['host']}:{b['admin_port']}")
            ],
        ]
        _, env = access_args(record, self.dir)  # the replication token, for the brokers
        record["controller_pid"] = spawn_headrace(args, self.dir / "logs" / "controller.log", env)
        (self.dir / "local.json").write_text(json.dumps(record))

    def wait(self, predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
        waiting.until(predicate, timeout, what, retry_on=(OSError,), poll_s=0.1)


@contextlib.contextmanager
def running_cluster(directory: Path, *up_args: str, **options: Any) -> Iterator[LocalCluster]:
    """A local cluster (``LocalCluster(directory, **options)``) up with ``up_args``; down
    again after. One with ``object_store="minio"`` builds MinIO first (cold builds take
    minutes)."""
    if options.get("object_store") == "minio":
        servers.minio_binary()
    c = LocalCluster(directory, **options)
    c.up(*up_args)
    try:
        yield c
    finally:
        c.down()


@contextlib.contextmanager
def minio_cluster(directory: Path) -> Iterator[LocalCluster]:
    """A local cluster up in ``directory`` whose tiered topics upload to a MinIO server
    started for it; down again after."""
    with running_cluster(directory, object_store="minio") as c:
        yield c


def store_of(c: LocalCluster) -> MinioStore:
    """The bucket of a cluster's MinIO, with its root credentials."""
    m = c.record["minio"]
    return MinioStore(
        MinioSettings(
            endpoint=f"{m['host']}:{m['port']}",
            bucket=m["bucket"],
            access_key=m["access_key"],
            secret_key=m["secret_key"],
        )
    )


def manifest_of(c: LocalCluster, topic: str, partition: int) -> Manifest:
    prefix = partition_prefix("local", topic, partition, c.creation_id(topic))
    tier = PartitionTier(store_of(c), prefix)
    return tier.manifest(refresh=True)


def topic_manifest(
    name: str,
    partitions: int,
    replicas: int = 3,
    min_in_sync: int = 2,
    *,
    upload_interval_s: int | None = None,
    local_retention_bytes: int | None = None,
    segment_bytes: int | None = None,
) -> str:
    """``upload_interval_s`` tiers the topic; ``local_retention_bytes`` then bounds what
    stays on the brokers' disks once uploaded."""
    tiered = ""
    if upload_interval_s is not None:
        tiered = f"  tieredStorage:\n    uploadIntervalSeconds: {upload_interval_s}\n"
        if local_retention_bytes is not None:
            tiered += f"    localRetentionBytes: {local_retention_bytes}\n"
    segments = f"  segments: {{bytes: {segment_bytes}}}\n" if segment_bytes is not None else ""
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata:
  name: {name}
spec:
  clusterRef: {{name: local}}
  partitions: {partitions}
  replicas: {replicas}
  minInSync: {min_in_sync}
{segments}{tiered}"""


async def until(predicate: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll ``predicate`` off the event loop (it may do blocking HTTP) until it holds; a
    controller that does not answer (busy, restarting) counts as not yet."""
    await waiting.until_async(predicate, timeout, what, retry_on=(OSError,), in_thread=True)


def all_in_sync(c: LocalCluster, topic: str, partitions: int, replicas: int = 3) -> bool:
    """Every partition of ``topic`` Online with all its replicas in the live replica set."""
    parts = c.partitions(topic)
    return len(parts) == partitions and all(
        p["state"] == "Online" and len(p["liveReplicas"]) == replicas for p in parts
    )
