"""Detached daemons with pid files: start, find, stop (I/O adapter).

``up`` and ``down`` are separate CLI invocations, so the processes they manage must
outlive the one that started them and be found again from files. Each daemon runs in
its own session (its own process group), so ``down`` can signal the group and take
any helpers the daemon forked with it. A pid file records the pid *and* the process's
start time, so a recycled pid is never mistaken for our daemon.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from headrace.files import write_atomic


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; it ends at the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited; only its parent's wait() is missing
        return None
    return fields[19]


@dataclass(frozen=True)
class Daemon:
    """A named background process whose pid file lives in ``run_dir``."""

    name: str
    run_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    def pid(self) -> int | None:
        """The daemon's pid if it is running (and is the process we started)."""
        try:
            pid_s, started = self.pid_file.read_text().split()
            pid = int(pid_s)
        except (OSError, ValueError):
            return None
        return pid if _start_time(pid) == started else None

    def running(self) -> bool:
        return self.pid() is not None

    def start(
        self,
        argv: Sequence[str],
        *,
        log_file: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> int:
        """Start ``argv`` detached, output appended to ``log_file``; returns the pid."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        started = _start_time(proc.pid) or "0"
        write_atomic(self.pid_file, f"{proc.pid} {started}\n".encode(), sync=False)
        return proc.pid

    def stop(self, timeout_s: float) -> bool:
        """SIGTERM the daemon's process group, SIGKILL after ``timeout_s``.

        Returns True if something was running. Safe to call when nothing is.
        """
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        try:
            return self._stop(pid, timeout_s)
        finally:
            _reap(pid)

    def _stop(self, pid: int, timeout_s: float) -> bool:
        kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.1)
        if self.pid() is not None:
            kill_group(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.pid() is not None:
                time.sleep(0.05)
        else:
            # The leader is gone; anything left in its group is an orphan.
            kill_group(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True


def _reap(pid: int) -> None:
    """Collect the exit status if the daemon is our own child (started by this process),
    so a long-lived caller such as a test session does not accumulate zombies."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group, ignoring one that no longer exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
