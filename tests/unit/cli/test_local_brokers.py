"""``local stop|start|restart BROKER`` bookkeeping in local.json: no broker processes started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from headrace.cli import local, local_cluster, local_record, local_status, processes
from headrace.testing.waiting import until


def record(tmp_path: Path, pids: list[int | None]) -> Path:
    doc: dict[str, Any] = {
        "instance": "local-test",
        "controller_pid": None,
        "brokers": [
            {"id": i, "host": f"127.0.0.{2 + i}", "port": 9092, "admin_port": 9644, "pid": pid}
            for i, pid in enumerate(pids)
        ],
    }
    local_record.write_state(tmp_path / local_record.STATE_FILE, doc)
    return tmp_path


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stopped_broker_has_no_pid_so_down_never_signals_a_reused_one(tmp_path: Path) -> None:
    doc = json.loads((record(tmp_path, [11, None, 13]) / local_record.STATE_FILE).read_text())
    assert local_record.recorded_pids(doc) == [11, 13]


def test_status_lines_tell_running_stopped_and_exited_apart(tmp_path: Path) -> None:
    gone = exited_pid()
    record(tmp_path, [os.getpid(), None, gone])
    assert local_status.broker_lines(tmp_path, live=[0]) == [
        f"broker 0  127.0.0.2:9092  running (pid {os.getpid()})  live",
        "broker 1  127.0.0.3:9092  stopped  not live",
        f"broker 2  127.0.0.4:9092  exited (pid {gone})  not live",
    ]


def test_stopping_a_stopped_or_exited_broker_records_it_stopped(tmp_path: Path) -> None:
    gone = exited_pid()
    record(tmp_path, [None, gone])
    runner = CliRunner()
    again = runner.invoke(local.local, ["stop", "0", "--dir", str(tmp_path)])
    assert (again.exit_code, again.stderr) == (0, "broker 0 is already stopped\n")
    crashed = runner.invoke(local.local, ["stop", "1", "--dir", str(tmp_path)])
    assert crashed.exit_code == 0
    assert crashed.stderr == f"broker 1 had already exited (pid {gone})\n"
    doc = json.loads((tmp_path / local_record.STATE_FILE).read_text())
    assert [b["pid"] for b in doc["brokers"]] == [None, None]


def test_unknown_broker_running_broker_and_no_cluster_are_one_line_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    none = runner.invoke(local.local, ["start", "0", "--dir", str(tmp_path)])
    assert none.exit_code == 1 and "no local cluster recorded in" in none.stderr
    record(tmp_path, [os.getpid()])
    unknown = runner.invoke(local.local, ["stop", "4", "--dir", str(tmp_path)])
    assert unknown.exit_code == 1
    assert unknown.stderr.strip().endswith(f"no broker 4 in the local cluster in {tmp_path} (0)")
    running = runner.invoke(local.local, ["start", "0", "--dir", str(tmp_path)])
    assert running.exit_code == 1
    assert f"broker 0 is running (pid {os.getpid()})" in running.stderr
    assert len(running.stderr.strip().splitlines()) == 1


def test_status_json_records_each_broker_process(tmp_path: Path) -> None:
    record(tmp_path, [os.getpid(), None])
    assert local_status.local_brokers(tmp_path, live=[0]) == [
        {
            "id": 0,
            "address": "127.0.0.2:9092",
            "kafka": None,
            "process": "running",
            "pid": os.getpid(),
            "live": True,
        },
        {
            "id": 1,
            "address": "127.0.0.3:9092",
            "kafka": None,
            "process": "stopped",
            "pid": None,
            "live": False,
        },
    ]


def test_status_names_each_brokers_kafka_listener_and_the_kafka_bootstrap(
    tmp_path: Path,
) -> None:
    record(tmp_path, [os.getpid(), None])
    doc = json.loads((tmp_path / local_record.STATE_FILE).read_text())
    for b in doc["brokers"]:
        b["kafka_port"] = 9093
    local_record.write_state(tmp_path / local_record.STATE_FILE, doc)
    assert [b["kafka"] for b in local_status.local_brokers(tmp_path, live=[0])] == [
        "127.0.0.2:9093",
        "127.0.0.3:9093",
    ]
    lines = local_status.broker_lines(tmp_path, live=[0])
    assert lines[0].startswith("broker 0  127.0.0.2:9092  kafka 127.0.0.2:9093  running")
    assert lines[-1] == "kafka bootstrap 127.0.0.2:9093,127.0.0.3:9093"


def test_the_offsets_topic_is_replicated_as_widely_as_the_cluster_allows() -> None:
    one, three, five = (local_cluster.offsets_topic_manifest(n)["spec"] for n in (1, 3, 5))
    assert (one["replicas"], one["minInSync"]) == (1, 1)
    assert (three["replicas"], three["minInSync"]) == (3, 2)
    assert (five["replicas"], five["minInSync"]) == (3, 2)
    assert three["retention"] == {"ms": -1, "bytes": -1}, "a coordinator replays the whole log"


def test_a_zombie_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        stat = Path(f"/proc/{proc.pid}/stat")
        until(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", 10, "child exited")
        assert not processes.alive(proc.pid)
    finally:
        proc.wait()


def test_a_named_listener_gets_each_broker_a_loopback_address_of_its_own() -> None:
    assert local_cluster.parse_listeners(["external=19094", "lb=19095"]) == [
        ("external", 19094),
        ("lb", 19095),
    ]
    b = {"id": 1, "host": "127.0.0.3", "port": 9092, "admin_port": 9644}
    b["listeners"] = local_cluster.broker_listeners([("external", 19094)], 1)
    args = local_cluster.broker_args(b, Path("d"))
    assert args[args.index("--listener") + 1] == "external=127.0.1.3:19094"
    for bad in ("external", "external=port", "external=0", "internal=1", "="):
        with pytest.raises(click.BadParameter):
            local_cluster.parse_listeners([bad])
    with pytest.raises(click.BadParameter, match="twice"):
        local_cluster.parse_listeners(["a=1", "a=2"])
