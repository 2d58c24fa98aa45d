"""``make run`` as a person uses it: a local cluster comes up, and one Ctrl-C ends it all.

The terminal sends SIGINT to its whole foreground process group (make, the recipe's
shell and its ``sleep``), so the test does the same with ``killpg``. The cluster runs
on free ports so that it never meets another local cluster on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

from headrace.cli.processes import alive
from headrace.testing.procs import REPO, free_port
from headrace.testing.waiting import until

READY_LINE = "Ctrl-C here stops the cluster."


def test_one_ctrl_c_stops_make_run_and_its_cluster(tmp_path: Path) -> None:
    local_dir = tmp_path / "local"
    ports = f"--port {free_port()} --admin-port {free_port()} --controller-port {free_port()}"
    # -o: the suite runs from this venv; never reinstall it mid-run (pyproject may be newer)
    argv = ["make", "--no-print-directory", "-o", ".venv/.installed", "run"]
    make = subprocess.Popen(
        [*argv, f"LOCAL_DIR={local_dir}", f"LOCAL_ARGS={ports}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # make leads its own group, as in a terminal
        # A terminal's shell starts make with SIGINT at its default. A test runner started
        # in the background (`cmd &` in a script) ignores SIGINT, and a shell cannot trap a
        # signal ignored on entry, so restore the default as a terminal would have it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen: list[str] = []
    ready = threading.Event()

    def read_output() -> None:
        assert make.stdout is not None
        for line in make.stdout:
            seen.append(line)
            if READY_LINE in line:
                ready.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    pids: list[int] = []
    try:
        until(lambda: ready.is_set() or make.poll() is not None, 180, "make run is up")
        assert ready.is_set(), "make run ended before it was up:\n" + "".join(seen)
        record = json.loads((local_dir / "local.json").read_text())
        pids = [record["controller_pid"], *(b["pid"] for b in record["brokers"])]
        assert all(alive(p) for p in pids)
        bootstrap = ",".join(f"{b['host']}:{b['port']}" for b in record["brokers"])
        exports = f"export HEADRACE_BOOTSTRAP={bootstrap} HEADRACE_CONTROLLER="
        assert any(exports in line for line in seen), "no export line:\n" + "".join(seen)

        os.killpg(make.pid, signal.SIGINT)  # one Ctrl-C

        try:
            make.wait(timeout=60)  # make itself dies of the SIGINT, as it does in a terminal
        except subprocess.TimeoutExpired:
            raise AssertionError("make did not exit after one Ctrl-C:\n" + "".join(seen)) from None
        # The trap's `local down` sends TERM and, after a 20 s grace, KILL (`_stop`); it
        # starts only as make exits, so its own start-up on a loaded machine comes on top.
        until(lambda: not any(alive(p) for p in pids), 60, "the cluster's processes exit")
        assert not (local_dir / "local.json").exists(), "local down did not run"
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
        subprocess.run(
            [str(REPO / ".venv" / "bin" / "headrace"), "local", "down", "--dir", str(local_dir)],
            capture_output=True,
            check=False,
        )
        reader.join(timeout=10)
