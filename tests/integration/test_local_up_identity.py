"""`local up` checks that the processes it started are the ones answering.

A second `local up` on the addresses of a running cluster must fail with one line
and leave nothing of its own running; commands refuse a controller of another
cluster; `--port-base` lets two clusters run side by side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.testing import procs, waiting
from tests.integration.localcluster import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "first", brokers=1)
    c.up()
    try:
        yield c
    finally:
        c.down()


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text`` (a cluster's --dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def healthy(c: LocalCluster) -> bool:
    return bool(c.state()["live"])


def test_second_up_on_the_same_addresses_fails_and_cleans_up(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    second = tmp_path / "second"
    proc = cluster.cli(
        "local",
        "up",
        "--dir",
        str(second),
        "--brokers",
        "1",
        "--port",
        str(cluster.port),
        "--admin-port",
        str(cluster.admin_port),
        "--controller-port",
        str(cluster.controller_port),
        check=False,
    )
    try:
        stderr = proc.stderr.decode().strip()
        assert proc.returncode != 0, f"second local up succeeded: {stderr}"
        assert len(stderr.splitlines()) == 1, stderr
        assert "address already in use" in stderr.lower() or "not the process" in stderr, stderr
        assert not (second / "local.json").exists()
        waiting.until(
            lambda: not processes_mentioning(str(second)), 30, "the second cluster's processes gone"
        )
        cluster.wait(lambda: healthy(cluster), 30, "the first cluster healthy")
        assert cluster.cli("local", "status", "--dir", str(cluster.dir)).returncode == 0
    finally:
        if (second / "local.json").exists():
            cluster.cli("local", "down", "--dir", str(second), check=False)


def test_commands_refuse_a_controller_of_another_cluster(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    record = {**cluster.record, "instance": "local-00000000deadbeef"}
    (other / "local.json").write_text(json.dumps(record))
    for args in (
        ("local", "status", "--dir", str(other)),
        ("apply", "-f", os.devnull, "--dir", str(other)),
    ):
        proc = cluster.cli(*args, check=False)
        stderr = proc.stderr.decode().strip()
        assert proc.returncode != 0, stderr
        assert len(stderr.splitlines()) == 1, stderr
        assert "local-00000000deadbeef" in stderr, stderr
    assert cluster.cli("local", "status", "--dir", str(cluster.dir)).returncode == 0


def test_two_clusters_side_by_side_with_port_bases(cluster: LocalCluster, tmp_path: Path) -> None:
    second = tmp_path / "second"
    base = procs.free_port()
    while not all(_free(base + i) for i in range(3)):
        base = procs.free_port()
    proc = cluster.cli(
        "local", "up", "--dir", str(second), "--brokers", "1", "--port-base", str(base), check=False
    )
    try:
        assert proc.returncode == 0, proc.stderr.decode()
        record = json.loads((second / "local.json").read_text())
        assert record["controller_url"] == f"http://127.0.0.1:{base + 2}"
        assert [(b["port"], b["admin_port"]) for b in record["brokers"]] == [(base, base + 1)]
        for directory in (cluster.dir, second):
            assert cluster.cli("local", "status", "--dir", str(directory)).returncode == 0
    finally:
        cluster.cli("local", "down", "--dir", str(second), check=False)


def _free(port: int) -> bool:
    import socket

    for host in ("127.0.0.1", "127.0.0.2"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True
