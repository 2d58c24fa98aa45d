"""The rpk-like CLI against real processes: topics through the controller,
cohorts describe/seek, cluster health, consume formats, on a local cluster and on a
standalone broker. Every command runs as a user runs it: the ``headrace`` CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import Producer
from headrace.testing import procs, waiting
from headrace.testing.procs import BrokerProcess
from headrace.testing.waiting import until
from tests.integration.localcluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("cli") / "local")
    c.up()
    try:
        yield c
    finally:
        c.down()


def run(c: LocalCluster, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``headrace ARGS --dir DIR``: the controller and bootstrap come from the local cluster."""
    return c.cli(*args, "--dir", str(c.dir), stdin=stdin, check=False)


def ok(c: LocalCluster, *args: str, stdin: bytes = b"") -> str:
    proc = run(c, *args, stdin=stdin)
    assert proc.returncode == 0, f"{args}: {proc.stderr.decode()}"
    return proc.stdout.decode()


def applied_topics(c: LocalCluster) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"{c.controller_url}/v1/topics", timeout=5) as resp:
        docs = json.loads(resp.read())["topics"]
    return {f"{d['metadata']['namespace']}/{d['metadata']['name']}": d for d in docs}


def describe(c: LocalCluster, cohort: str) -> dict[str, Any]:
    (view,) = json.loads(ok(c, "cohorts", "describe", cohort, "--json"))
    return dict(view)


def test_topics_create_alter_delete_write_the_documents_apply_writes(cluster: LocalCluster) -> None:
    assert "created default/orders with 3 partitions, 3 replicas" in ok(
        cluster, "topics", "create", "orders", "-p", "3", "-c", "retention_ms=3600000"
    )
    proc = cluster.apply(
        "apiVersion: headrace.dev/v1alpha1\nkind: Topic\nmetadata:\n  name: orders-yaml\n"
        "  namespace: default\nspec:\n  clusterRef: {name: local}\n  partitions: 3\n"
        "  replicas: 3\n  retention: {ms: 3600000}\n"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    docs = applied_topics(cluster)
    assert docs["default/orders"]["spec"] == docs["default/orders-yaml"]["spec"]
    # Placed: every partition has a leader once create returns.
    assert all(p["leader"] is not None for p in cluster.partitions("default/orders"))

    again = run(cluster, "topics", "create", "orders")
    assert again.returncode == 1 and b"already exists" in again.stderr

    ok(
        cluster,
        "topics",
        "alter",
        "orders",
        "-c",
        "retention_ms=60000",
        "-c",
        "segment_bytes=65536",
    )
    spec = applied_topics(cluster)["default/orders"]["spec"]
    assert spec["retention"]["ms"] == 60000 and spec["segments"]["bytes"] == 65536

    # a new partition count is a live repartition, carried out by the controller
    grow = ok(cluster, "topics", "alter", "orders", "--partitions", "6")
    assert "repartitioning default/orders: 3 -> 6" in grow
    assert applied_topics(cluster)["default/orders"]["spec"]["partitions"] == 6
    waiting.until(
        lambda: (
            len(cluster.partitions("default/orders")) == 6
            and all(p["leader"] is not None for p in cluster.partitions("default/orders"))
        ),
        30,
        "the topic grown to 6 led partitions",
    )

    too_many = run(cluster, "topics", "create", "wide", "--replicas", "5")
    assert too_many.returncode == 1
    assert b"not created" in too_many.stderr and b"5 replicas need 5" in too_many.stderr
    assert "default/wide" not in applied_topics(cluster)

    assert "deleted default/orders" in ok(cluster, "topics", "delete", "orders")
    assert "default/orders" not in applied_topics(cluster)
    gone = run(cluster, "topics", "delete", "orders")
    assert gone.returncode == 1 and b"does not exist" in gone.stderr


def test_cohorts_describe_shows_lag_and_seek_rewinds_a_stopped_cohort(
    cluster: LocalCluster,
) -> None:
    ok(cluster, "topics", "create", "events", "-p", "2")
    lines = b"".join(f"k{i % 2}:v{i}\n".encode() for i in range(10))
    ok(cluster, "produce", "events", "--acks", "all", "--key-sep", ":", stdin=lines)
    first = ok(
        cluster, "consume", "events", "--cohort", "readers", "--from-beginning", "--count", "4",
        "--format", "json", "--idle-timeout", "10",
    )  # fmt: skip
    records = [json.loads(line) for line in first.splitlines()]
    assert len(records) == 4
    assert {r["key"] for r in records} <= {"k0", "k1"}
    assert set(records[0]) == {"partition", "offset", "timestamp", "key", "value", "headers"}

    view = describe(cluster, "readers")
    assert view["members"] == []
    assert sum(p["cursor"] for p in view["partitions"]) == 4
    assert sum(p["lag"] for p in view["partitions"]) == 6
    assert sum(p["high_watermark"] for p in view["partitions"]) == 10
    listed = json.loads(ok(cluster, "cohorts", "list", "--json"))
    assert {"cohort": "readers", "topic": "default/events", "members": 0, "partitions": 2,
            "lag": 6} in listed  # fmt: skip

    ok(cluster, "cohorts", "seek", "readers", "--to", "earliest")
    assert sum(p["lag"] for p in describe(cluster, "readers")["partitions"]) == 10
    again = ok(
        cluster, "consume", "events", "--cohort", "readers", "--count", "10", "--print-keys",
        "--idle-timeout", "10",
    )  # fmt: skip
    assert sorted(again.splitlines()) == sorted(f"k{i % 2}\tv{i}" for i in range(10))

    ok(cluster, "cohorts", "seek", "readers", "--to", "latest")
    assert sum(p["lag"] for p in describe(cluster, "readers")["partitions"]) == 0


def test_seek_is_refused_while_the_cohort_has_live_members(cluster: LocalCluster) -> None:
    ok(cluster, "topics", "create", "busy", "-p", "2")
    member = subprocess.Popen(
        [*procs.HEADRACE_CLI, "consume", "busy", "--cohort", "live", "--idle-timeout", "60",
         "--dir", str(cluster.dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=procs.child_env(),
    )  # fmt: skip
    try:

        def joined() -> bool:
            proc = run(cluster, "cohorts", "describe", "live", "--json")
            return proc.returncode == 0 and json.loads(proc.stdout)[0]["members"] != []

        until(joined, 30, "the consumer joins")
        refused = run(cluster, "cohorts", "seek", "live", "--to", "earliest")
        assert refused.returncode == 1
        assert b"CohortActive" in refused.stderr and b"stop them before seeking" in refused.stderr
    finally:
        member.kill()
        member.wait()


def test_cluster_health_reports_a_killed_broker_and_recovers(cluster: LocalCluster) -> None:
    ok(cluster, "topics", "create", "health", "-p", "3")
    until(lambda: run(cluster, "cluster", "health").returncode == 0, 30, "healthy")
    cluster.kill_broker(2)
    try:

        def unhealthy() -> dict[str, Any] | None:
            proc = run(cluster, "cluster", "health", "--json")
            report = json.loads(proc.stdout)
            return report if proc.returncode == 1 and report["brokersDown"] == [2] else None

        until(lambda: unhealthy() is not None, 30, "broker 2 reported down")
        report = unhealthy()
        assert report is not None and not report["healthy"]
        assert "brokers_down" in report["reasons"]
        assert report["underReplicatedPartitions"] or report["offlinePartitions"]
        text = run(cluster, "cluster", "health").stdout.decode()
        assert "brokers down:                2" in text and "unhealthy:" in text
    finally:
        cluster.restart_broker(2)
    until(lambda: run(cluster, "cluster", "health").returncode == 0, 60, "healthy again")


def test_a_standalone_broker_gets_topics_and_timestamp_seeks_without_a_controller(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    no_cluster = ["--dir", str(tmp_path / "no-local-cluster"), "--bootstrap", broker.bootstrap]

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return procs.run_headrace(*args, *no_cluster)

    created = cli("topics", "create", "clicks", "-p", "1", "-c", "retention_ms=600000")
    assert created.returncode == 0, created.stderr.decode()
    needs_controller = cli("topics", "alter", "clicks", "-c", "retention_ms=1")
    assert needs_controller.returncode == 1 and b"needs a controller" in needs_controller.stderr

    async def produce() -> None:
        producer = await Producer(broker.bootstrap, acks="leader").start()
        try:
            for ts in (1_000_000, 2_000_000, 3_000_000):
                receipt = await producer.send("clicks", f"at-{ts}".encode(), timestamp_ms=ts)
                await producer.flush()  # one batch per timestamp
                await receipt
        finally:
            await producer.close()

    asyncio.run(produce())
    consumed = cli("consume", "clicks", "--cohort", "c", "--from-beginning", "--count", "3",
                   "--idle-timeout", "10")  # fmt: skip
    assert consumed.stdout.decode().split() == ["at-1000000", "at-2000000", "at-3000000"]

    seek = cli("cohorts", "seek", "c", "--to", "@1500000")
    assert seek.returncode == 0, seek.stderr.decode()
    (view,) = json.loads(cli("cohorts", "describe", "c", "--json").stdout)
    assert [p["cursor"] for p in view["partitions"]] == [1]
    again = cli("consume", "clicks", "--cohort", "c", "--count", "2", "--idle-timeout", "10")
    assert again.stdout.decode().split() == ["at-2000000", "at-3000000"]

    health = cli("cluster", "health", "--json")
    assert health.returncode == 0, health.stdout.decode() + health.stderr.decode()
    assert json.loads(health.stdout)["underReplicatedPartitions"] is None


def test_every_client_command_speaks_tls_with_a_token(broker_factory: Any, tmp_path: Path) -> None:
    from tests.integration.test_surfaces import _serving_pair

    ca, cert, key = _serving_pair(tmp_path)
    broker: BrokerProcess = broker_factory(
        extra_args=["--tls-cert", str(cert), "--tls-key", str(key), "--auth-token", "s3cret"]
    )
    secure = [
        "--bootstrap", broker.bootstrap, "--dir", str(tmp_path / "none"),
        "--tls-ca", str(ca), "--auth-token", "s3cret",
    ]  # fmt: skip

    def cli(*args: str, stdin: bytes = b"") -> str:
        proc = procs.run_headrace(*args, *secure, stdin=stdin)
        assert proc.returncode == 0, f"{args}: {proc.stderr.decode()}"
        return proc.stdout.decode()

    cli("topics", "create", "secure", "-p", "1")
    assert "default/secure" in cli("topics", "list")
    cli("produce", "secure", stdin=b"one\ntwo\n")
    out = cli("consume", "secure", "--cohort", "c", "--from-beginning", "--count", "2",
              "--idle-timeout", "10")  # fmt: skip
    assert out.split() == ["one", "two"]
    assert json.loads(cli("cohorts", "describe", "c", "--json"))[0]["partitions"][0]["cursor"] == 2
    cli("cohorts", "seek", "c", "--to", "earliest")
    cli("cluster", "health")
    cli("bench", "secure", "--records", "100", "--value-bytes", "10")
    # Without the CA the broker's certificate is not trusted; without TLS no handshake.
    untrusted = procs.run_headrace(
        "topics", "list", "--bootstrap", broker.bootstrap, "--tls", "--auth-token", "s3cret",
        timeout=60,
    )  # fmt: skip
    assert untrusted.returncode == 1 and b"certificate" in untrusted.stderr.lower()
