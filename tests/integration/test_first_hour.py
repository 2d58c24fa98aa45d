"""A new user's first hour, typed into real terminals and kept as a transcript.

Two shells on pseudo-terminals (``pexpect``), as a person would have two terminal tabs:

- tab 1: clone the repository, ``make run``; at the end one Ctrl-C (the terminal's own
  ^C, delivered by the pty to make's foreground process group) ends everything;
- tab 2: paste the ``export`` line ``make run`` printed, then create a topic with the CLI,
  produce, consume with two cohort members, ``cohorts describe`` the lag, kill -9 a
  broker, ``cluster health`` it, ``local restart`` it, and see leadership rebalanced.

Every command goes through the shell exactly as typed, and the transcript (commands and
what they printed) is written to ``test-artifacts/first-hour.txt`` so that a person can
read what a new user sees. The cluster runs on a free port range so that it never meets
another local cluster on this machine.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from headrace.cli.processes import alive
from headrace.testing.procs import REPO, free_port
from headrace.testing.waiting import until

ARTIFACTS = REPO / "test-artifacts"
VENV = REPO / ".venv"
#: A prompt no command prints, so output cannot be mistaken for it (no ``\$``: as root
#: bash would show ``#``).
PROMPT = "first-hour> "
TOPIC = "events"
COHORT = "readers"
RECORDS = 600
MORE = 150


class Terminal:
    """One interactive bash on a pty. ``run`` types a command and returns its output and
    exit code; everything is appended to the shared transcript."""

    def __init__(self, name: str, cwd: Path, transcript: list[str]) -> None:
        self.name = name
        self.transcript = transcript
        env = {
            "PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(cwd),
            "TERM": "dumb",
            "PS1": PROMPT,
            "LANG": "C.UTF-8",
        }
        self.shell = pexpect.spawn(
            "bash",
            ["--norc", "--noprofile", "-i"],
            cwd=str(cwd),
            env=env,
            encoding="utf-8",
            codec_errors="replace",
            timeout=180,
            dimensions=(50, 200),
            # A terminal's shell starts with SIGINT at its default; a test runner in the
            # background may have it ignored, which the shell would inherit.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.shell.expect_exact(PROMPT, timeout=30)
        self.shell.setecho(False)
        self._type("stty -echo; bind 'set enable-bracketed-paste off' 2>/dev/null; true")

    def _type(self, line: str) -> str:
        self.shell.sendline(line)
        self.shell.expect_exact(PROMPT)
        return str(self.shell.before).replace("\r\n", "\n")

    def run(self, command: str, timeout: float = 180, record: bool = True) -> tuple[str, int]:
        """``record=False`` for the polls of a wait, so the transcript shows the command
        once, when it has what was waited for."""
        self.shell.sendline(command)
        self.shell.expect_exact(PROMPT, timeout=timeout)
        output = str(self.shell.before).replace("\r\n", "\n").strip("\n")
        code = int(self._type("echo $?").strip().splitlines()[-1])
        if record:
            self.transcript.append(f"[{self.name}] $ {command}\n{output}\n[exit {code}]\n")
        return output, code

    def ok(self, command: str, timeout: float = 180, record: bool = True) -> str:
        output, code = self.run(command, timeout, record)
        assert code == 0, f"{command!r} exited {code}:\n{output}"
        return output

    def start(self, command: str) -> None:
        """Type a command that keeps the terminal (``make run``)."""
        self.transcript.append(f"[{self.name}] $ {command}\n")
        self.shell.sendline(command)

    def close(self) -> None:
        self.shell.close(force=True)


@pytest.fixture
def transcript() -> Iterator[list[str]]:
    lines: list[str] = []
    try:
        yield lines
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "first-hour.txt").write_text("\n".join(lines))


def _state(tab: Terminal) -> dict[str, Any]:
    return dict(json.loads(tab.ok("headrace local status --json", record=False)))


def _partitions(state: dict[str, Any]) -> list[dict[str, Any]]:
    topics = state["cluster"].get("topics", [])
    return [p for t in topics if t["name"].endswith(TOPIC) for p in t["partitions"]]


def _preferred_leaders(state: dict[str, Any]) -> bool:
    parts = _partitions(state)
    return bool(parts) and all(p["leader"] == p["replicas"][0] for p in parts)


def test_the_first_hour(tmp_path: Path, transcript: list[str]) -> None:
    clone = tmp_path / "headrace"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    local_dir = clone / "var" / "local"
    port_base = free_port()
    # The clone uses the suite's venv (`-o` keeps make from reinstalling it): the first
    # hour is about the commands, not about pip.
    make_run = (
        f"make --no-print-directory -o {VENV}/.installed run VENV={VENV}"
        f" LOCAL_ARGS='--port-base {port_base}'"
    )
    tab1 = Terminal("tab 1", tmp_path, transcript)
    tab2: Terminal | None = None
    pids: list[int] = []
    try:
        tab1.ok(f"cd {shlex.quote(str(clone))}")
        tab1.start(make_run)
        tab1.shell.expect_exact("Ctrl-C here stops the cluster.", timeout=240)
        banner = str(tab1.shell.before).replace("\r\n", "\n")
        transcript.append(banner + "Ctrl-C here stops the cluster.\n")
        export = re.search(
            r"^\s*(export HEADRACE_BOOTSTRAP=\S+ HEADRACE_CONTROLLER=\S+)", banner, re.M
        )
        assert export, f"make run printed no export line:\n{banner}"

        tab2 = Terminal("tab 2", clone, transcript)
        tab2.ok(export.group(1))
        record = json.loads((local_dir / "local.json").read_text())
        pids = [record["controller_pid"], *(b["pid"] for b in record["brokers"])]

        # a topic, from the command line: no YAML
        tab2.ok(f"headrace topics create {TOPIC} --partitions 3 --replicas 3")
        described = tab2.ok(f"headrace topics describe {TOPIC}")
        assert described.count("\n") >= 3, described

        # keyed (user-0 .. user-19), so the records spread over the partitions by key
        keyed = 'awk \'{print "user-" $1 % 20 ":" $1}\''
        produced = tab2.ok(
            f"seq 1 {RECORDS} | {keyed} | headrace produce {TOPIC} --acks all --key-sep :"
        )
        assert str(RECORDS) in produced, produced

        # two members of one cohort, side by side; each stops once the topic is quiet
        consume = (
            f"headrace consume {TOPIC} --cohort {COHORT} --from-beginning --idle-timeout 5"
            " --print-offsets"
        )
        tab2.ok(f"{consume} --member-id a > a.out & {consume} --member-id b > b.out & wait")
        values = [
            line.split(" ", 1)[-1].split("\t")[-1]
            for name in ("a.out", "b.out")
            for line in (clone / name).read_text().splitlines()
            if line
        ]
        assert set(values) == {str(i) for i in range(1, RECORDS + 1)}, "a record was missed"
        tab2.ok("wc -l a.out b.out")

        tab2.ok(f"seq 1 {MORE} | {keyed} | headrace produce {TOPIC} --acks all --key-sep :")

        def total_lag() -> int:
            described = tab2.ok(f"headrace cohorts describe {COHORT} --json", record=False)
            views = json.loads(described)
            return sum(p["lag"] or 0 for view in views for p in view["partitions"])

        until(lambda: total_lag() == MORE, 30, f"the cohort lags by the {MORE} new records")
        described = tab2.ok(f"headrace cohorts describe {COHORT}")
        assert f"lag {MORE}" in described, described

        # kill -9 the leader of partition 0, and see it in cluster health
        victim = _partitions(_state(tab2))[0]["leader"]
        tab2.ok("headrace local status")
        victim_pid = next(b["pid"] for b in record["brokers"] if b["id"] == victim)
        tab2.ok(f"kill -9 {victim_pid}")

        def broker_down() -> bool:
            health, code = tab2.run("headrace cluster health", record=False)
            return code != 0 and re.search(rf"brokers down:\s+{victim}\b", health) is not None

        until(broker_down, 60, "cluster health reports the killed broker down")
        _, code = tab2.run("headrace cluster health")
        assert code != 0

        tab2.ok(f"headrace local restart {victim}")
        until(lambda: tab2.run("headrace cluster health", record=False)[1] == 0, 120, "healthy")
        tab2.ok("headrace cluster health")
        until(
            lambda: _preferred_leaders(_state(tab2)), 120, "leadership back on preferred replicas"
        )
        tab2.ok(f"headrace topics describe {TOPIC}")
        record = json.loads((local_dir / "local.json").read_text())
        pids = [record["controller_pid"], *(b["pid"] for b in record["brokers"])]

        # one Ctrl-C in tab 1 ends the cluster and make
        transcript.append("[tab 1] ^C")
        tab1.shell.sendintr()
        tab1.shell.expect_exact(PROMPT, timeout=90)
        transcript.append(str(tab1.shell.before).replace("\r\n", "\n"))
        until(lambda: not any(alive(p) for p in pids), 30, "every process has exited")
        assert not (local_dir / "local.json").exists(), "local down did not run"
    finally:
        for tab in (tab1, tab2):
            if tab is not None:
                tab.close()
        subprocess.run(
            [str(VENV / "bin" / "headrace"), "local", "down", "--dir", str(local_dir)],
            capture_output=True,
            check=False,
        )
