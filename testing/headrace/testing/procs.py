"""Processes the tests and the bench start: brokers, redis-servers, client workers, and
CPU meters.

Every process is started in its own session (process group) and recorded in
``_LIVE``; ``kill_all()`` (called from the bench entry points' ``finally``) kills
every group still alive, so an exception or Ctrl-C never leaves a broker or a
redis-server behind. Everything binds to 127.0.0.1 on ports the OS picks.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.transports import free_port as free_port

#: the repository root (this file is testing/headrace/testing/procs.py)
REPO = Path(__file__).resolve().parents[3]
LOOPBACK = "127.0.0.1"
_CLK_TCK = os.sysconf("SC_CLK_TCK")

_LIVE: list[subprocess.Popen[bytes]] = []
_TEMP_DIRS: list[Path] = []
#: the folders that hold the ``headrace`` namespace package (the two planes)
CODE_ROOTS = ("broker", "operator")
#: when set (``bench.run --ref``), brokers and workers import headrace from its code roots
#: (the harness itself, ``testing/``, stays the checkout's own)
HEADRACE_SRC: Path | None = None
#: the ``headrace`` command line, from the headrace on the children's path
HEADRACE_CLI = (sys.executable, "-m", "headrace.cli.main")


def child_env(src: Path | None = None) -> dict[str, str]:
    """The environment for every child: PYTHONPATH first names the headrace under test
    (``src``, else ``HEADRACE_SRC``; neither: the installed one)."""
    env = dict(os.environ)
    src = src or HEADRACE_SRC
    if src is not None:
        roots = [str(src / root) for root in CODE_ROOTS]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*roots, env.get("PYTHONPATH", "")) if p)
    return env


def export_ref(ref: str, into: Path, roots: tuple[str, ...] = CODE_ROOTS) -> str:
    """Export ``roots`` (the code roots unless told) at git ``ref`` of this repository into
    ``into`` (no worktree; .git untouched); the commit's sha. Children run that headrace
    with ``child_env(into)``."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha, *roots],
        cwd=REPO,
        capture_output=True,
        timeout=120,
        check=True,
    ).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as fh:
        fh.write(archive)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(into, filter="data")
    return sha


# ---------------------------------------------------------------------------- housekeeping


def temp_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"headrace-bench-{prefix}-"))
    _TEMP_DIRS.append(path)
    return path


def remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(ValueError):
        _TEMP_DIRS.remove(path)


def run_headrace(
    *args: str,
    stdin: bytes = b"",
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    src: Path | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run the ``headrace`` CLI of the headrace under test to completion (output captured;
    the caller checks the return code). ``env``: added to its environment (secrets);
    ``src``: run the headrace exported there instead (``export_ref``)."""
    return subprocess.run(
        [*HEADRACE_CLI, *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
        env={**child_env(src), **(env or {})},
    )


def spawn(argv: list[str], log_path: Path | None = None, **kwargs: Any) -> subprocess.Popen[bytes]:
    out: Any = subprocess.DEVNULL
    if log_path is not None:
        out = open(log_path, "ab")  # noqa: SIM115 -- owned by the child; closed below
    try:
        proc = subprocess.Popen(
            argv,
            stdout=kwargs.pop("stdout", out),
            stderr=kwargs.pop("stderr", out if log_path is not None else subprocess.DEVNULL),
            start_new_session=True,
            cwd=REPO,
            env=kwargs.pop("env", None) or child_env(),
            **kwargs,
        )
    finally:
        if log_path is not None:
            out.close()
    _LIVE.append(proc)
    return proc


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def reap(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Kill the group and wait for the leader."""
    kill_group(proc)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)
    forget(proc)


def forget(proc: subprocess.Popen[bytes]) -> None:
    """``proc`` has exited and was waited for: ``kill_all`` must not signal its old pid."""
    with contextlib.suppress(ValueError):
        _LIVE.remove(proc)


def kill_all() -> None:
    for proc in list(_LIVE):
        reap(proc, 5.0)
    for path in list(_TEMP_DIRS):
        remove_dir(path)


# ---------------------------------------------------------------------------- CPU accounting


_PF_KTHREAD = 0x00200000


def _cpu_times() -> tuple[int, int, int]:
    """Machine-wide jiffies: (task time user+nice+system, irq+softirq, steal)."""
    with open("/proc/stat") as fh:
        fields = fh.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return user + nice + system, irq + softirq, steal


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            raw = fh.read()
    except OSError:
        return None
    # fields after "pid (comm) ": state is [0], flags [6], utime [11] ... cstime [14]
    return raw[raw.rindex(")") + 2 :].split()


def _kernel_thread_jiffies() -> dict[str, int]:
    """CPU of every kernel thread (writeback, kworkers, ksoftirqd), by pid."""
    out: dict[str, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is not None and int(fields[6]) & _PF_KTHREAD:
            out[name] = int(fields[11]) + int(fields[12])
    return out


def process_cpu_s(pid: int) -> float:
    """user+system CPU seconds of ``pid`` (all threads) and its waited-for children."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _CLK_TCK


def process_runq_wait_s(pid: int) -> float:
    """Seconds the threads of ``pid`` spent runnable but waiting for a core (the run-queue
    delay of ``/proc/PID/task/*/schedstat``). Beside CPU time it tells a process that
    waits for CPU (other load) from one that waits for I/O or a peer (idle)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return total / 1e9


@dataclass(slots=True)
class CpuMeter:
    """Where the CPU went over a window: our processes, the kernel, everything else.

    ``foreign_cores`` is machine-wide task time minus our processes minus
    kernel threads: other engineers' builds and tests. It is the number to
    look at before trusting a result on this shared 2-core box.
    ``kernel_cores`` (interrupts, softirq -- loopback TCP -- and kernel threads
    such as page-cache writeback) is work our processes cause but are not
    charged for. ``steal_cores`` is time the hypervisor gave to other VMs.
    """

    pids: dict[str, int]
    started: float = 0.0
    times0: tuple[int, int, int] = (0, 0, 0)
    kthreads0: dict[str, int] = field(default_factory=dict)
    cpu0: dict[str, float] = field(default_factory=dict)
    runq0: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self.cpu0 = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        self.runq0 = {name: process_runq_wait_s(pid) for name, pid in self.pids.items()}
        self.kthreads0 = _kernel_thread_jiffies()
        self.times0 = _cpu_times()
        self.started = time.perf_counter()

    def stop(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        tasks1, irq1, steal1 = _cpu_times()
        kthreads1 = _kernel_thread_jiffies()
        tasks = (tasks1 - self.times0[0]) / _CLK_TCK
        irq = (irq1 - self.times0[1]) / _CLK_TCK
        steal = (steal1 - self.times0[2]) / _CLK_TCK
        kthreads = (
            sum(j - self.kthreads0[pid] for pid, j in kthreads1.items() if pid in self.kthreads0)
            / _CLK_TCK
        )
        out: dict[str, float] = {}
        ours = 0.0
        for name, pid in self.pids.items():
            used = process_cpu_s(pid) - self.cpu0.get(name, 0.0)
            ours += used
            out[f"{name}_cores"] = round(used / elapsed, 3)
            # named so that no "server*" sum (peerbench) picks it up as CPU
            # threads that ended in between take their wait with them (the sum can
            # fall): a lower bound, never below zero
            waited = process_runq_wait_s(pid) - self.runq0.get(name, 0.0)
            out[f"runq_{name}_cores"] = round(max(0.0, waited) / elapsed, 3)
        out["kernel_cores"] = round((irq + kthreads) / elapsed, 3)
        out["foreign_cores"] = round(max(0.0, tasks - ours - kthreads) / elapsed, 3)
        out["steal_cores"] = round(steal / elapsed, 3)
        out["machine_cores"] = round((tasks + irq) / elapsed, 3)
        return out


def machine_busy_cores(sample_s: float = 1.0) -> float:
    """Cores busy with other processes right now (kernel threads not counted)."""
    meter = CpuMeter({})
    meter.start()
    time.sleep(sample_s)
    return meter.stop()["foreign_cores"]


def page_touch_cost(directory: Path, megabytes: int = 512) -> dict[str, float]:
    """Write throughput per CPU-second into memory the guest has not touched lately vs reused.

    On this VM (Firecracker, virtio-balloon free page reporting) memory freed
    for a few seconds goes back to the host, and the first touch of each page
    afterwards costs a host page fault: page-cache writes into such memory cost
    several times more CPU than writes into just-freed pages. Both systems pay
    it; measured once per run so the numbers can be read with it in mind.
    """
    chunk = os.urandom(1 << 20)
    out: dict[str, float] = {}
    path = directory / "page-touch.dat"
    for label in ("cold", "warm"):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            cpu0 = time.thread_time()
            for i in range(megabytes):
                os.pwrite(fd, chunk, i << 20)
            cpu = max(time.thread_time() - cpu0, 1e-6)
        finally:
            os.close(fd)
            path.unlink()
        out[f"{label}_mb_per_cpu_s"] = round(megabytes * 1.048576 / cpu, 1)
    return out


# ---------------------------------------------------------------------------- HTTP


def http_json(
    url: str, body: dict[str, Any] | None = None, method: str | None = None, timeout: float = 5.0
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw) if raw else None
        except ValueError:
            return exc.code, raw[:500].decode(errors="replace")


# ---------------------------------------------------------------------------- headrace broker


@dataclass
class BrokerProcess:
    """A headrace broker on loopback with one data dir, restartable: the bench's and the
    integration tests'. ``mode`` is ``standalone``, or ``cluster`` (then ``broker_id``
    matters and someone must push a topology)."""

    data_dir: Path
    fsync: str = "interval"
    mode: str = "standalone"
    broker_id: int = 0
    extra_args: list[str] = field(default_factory=list)
    #: extra environment (object-store credentials, say): not on the command line
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    #: how long ``start`` waits for /readyz (the bench's large recoveries take longer)
    ready_timeout_s: float = 30.0
    proc: subprocess.Popen[bytes] | None = None
    #: ``time.perf_counter()`` at the last spawn: ``wait_ready`` reports ``ready_s`` from it
    spawned_at: float = 0.0

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{LOOPBACK}:{self.admin_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        argv = [
            *HEADRACE_CLI,
            "broker",
            f"--{self.mode}",
            "--broker-id",
            str(self.broker_id),
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            "--fsync",
            self.fsync,
            *self.extra_args,
        ]
        self.spawned_at = time.perf_counter()
        self.proc = spawn(argv, self.log_path, env={**child_env(), **self.env})

    def wait_ready(self, timeout: float | None = None, poll_s: float = 0.005) -> dict[str, Any]:
        """Poll /readyz until 200; returns its JSON plus ``ready_s`` since spawn."""
        assert self.proc is not None
        timeout = self.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"broker exited with {self.proc.returncode}; {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                status, doc = http_json(f"{self.admin_url}/readyz", timeout=1.0)
            except (OSError, ValueError):
                status, doc = 0, None
            if status == 200 and isinstance(doc, dict):
                doc["ready_s"] = time.perf_counter() - self.spawned_at
                return doc
            time.sleep(poll_s)
        raise TimeoutError(
            f"broker not ready within {timeout}s; {self.log_path}:\n{self.log_tail()}"
        )

    def start(self, *, wait: bool = True) -> dict[str, Any]:
        """Spawn, and (``wait``) wait until ready: then the /readyz document, else ``{}``."""
        self.spawn()
        return self.wait_ready() if wait else {}

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    def get_json(self, path: str) -> dict[str, object]:
        with urllib.request.urlopen(f"{self.admin_url}{path}", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def post_json(self, path: str, doc: object) -> dict[str, object]:
        req = urllib.request.Request(
            f"{self.admin_url}{path}",
            data=json.dumps(doc).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def create_topic(self, name: str, partitions: int) -> None:
        status, doc = http_json(
            f"{self.admin_url}/v1/topics", {"name": name, "partitions": partitions}, "POST"
        )
        if status != 201:
            raise RuntimeError(f"create topic {name}: HTTP {status} {doc}")

    def delete_topic(self, name: str) -> None:
        ns, _, short = name.rpartition("/")
        status, doc = http_json(
            f"{self.admin_url}/v1/topics/{ns or 'default'}/{short}", None, "DELETE"
        )
        if status != 200:
            raise RuntimeError(f"delete topic {name}: HTTP {status} {doc}")

    def pause(self) -> None:
        """SIGSTOP: the process is alive but silent (a network partition, from outside)."""
        if self.alive:
            assert self.proc is not None
            kill_group(self.proc, signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive:
            assert self.proc is not None
            kill_group(self.proc, signal.SIGCONT)

    def kill9(self) -> None:
        """SIGKILL (a crash; a paused broker too). Safe to call again, or on a stopped one."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_group(self.proc, signal.SIGCONT)
            reap(self.proc)
        else:
            forget(self.proc)

    def stop(self, timeout: float = 20.0) -> float | None:
        """SIGTERM (clean shutdown: final sync and recovery point); the seconds until it
        exited, or None if it had not after ``timeout`` and was killed."""
        if not self.alive:
            return 0.0
        assert self.proc is not None
        started = time.perf_counter()
        kill_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return None
        forget(self.proc)
        return time.perf_counter() - started

    def restart(self, *, crash: bool) -> None:
        if crash:
            self.kill9()
        else:
            self.stop()
        self.start()


# ---------------------------------------------------------------------------- redis


def redis_version() -> str:
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"
    return out.strip()


class RedisProcess:
    """A redis-server with AOF on, in its own temp dir, on a free loopback port."""

    def __init__(self, data_dir: Path, appendfsync: str) -> None:
        self.data_dir = data_dir
        self.appendfsync = appendfsync
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def config(self) -> str:
        return "\n".join(
            [
                f"port {self.port}",
                f"bind {LOOPBACK}",
                "protected-mode yes",
                "daemonize no",
                f"dir {self.data_dir}",
                f"logfile {self.data_dir / 'redis.log'}",
                "appendonly yes",
                f"appendfsync {self.appendfsync}",
                # AOF is the durability mechanism under test: no RDB snapshots, and no
                # background AOF rewrite forking a child onto the second core mid-run.
                'save ""',
                "auto-aof-rewrite-percentage 0",
                "",
            ]
        )

    def start(self, timeout: float = 30.0) -> None:
        import redis

        conf = self.data_dir / "redis.conf"
        conf.write_text(self.config())
        self.proc = spawn(["redis-server", str(conf)])
        deadline = time.monotonic() + timeout
        client = redis.Redis(host=LOOPBACK, port=self.port)
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited; see {self.data_dir / 'redis.log'}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.ConnectionError:
                    time.sleep(0.02)
            raise TimeoutError("redis-server did not answer PING")
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            reap(self.proc)
            self.proc = None


# ---------------------------------------------------------------------------- MinIO


def minio_binary() -> Path:
    """The MinIO server binary, built from its Go module by ``tools/minio/build.sh``
    if missing (minutes the first time on a machine; idempotent after that)."""
    override = os.environ.get("HEADRACE_MINIO_BIN")
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(REPO / "tools" / "minio" / "build.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=3600,
    ).stdout
    return Path(out.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- client workers


def run_worker(
    spec: dict[str, Any],
    timeout: float,
    env: dict[str, str] | None = None,
    module: str = "bench.worker",
) -> dict[str, Any]:
    """Run one client workload in a fresh interpreter (``module``: ``bench.worker``, or
    ``bench.peerworker`` for the peers' clients); returns its JSON.

    ``env`` adds variables to the worker's environment (secrets: not on its command line).
    """
    proc = spawn(
        [sys.executable, "-m", module, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**child_env(), **(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"worker {spec.get('kind')} exceeded {timeout}s") from exc
    finally:
        reap(proc)
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(
            f"worker {spec.get('kind')} failed ({proc.returncode}):\n" + "\n".join(tail)
        )
    lines = out.decode().strip().splitlines()
    if not lines:
        raise RuntimeError(f"worker {spec.get('kind')} printed nothing")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_tool(argv: list[str], timeout: float) -> tuple[str, float]:
    """Run a command-line tool (redis-benchmark) to completion; (stdout, its CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"{argv[0]} exceeded {timeout}s") from exc
    finally:
        reap(proc)
    if proc.returncode != 0:
        # the tool's own last words (both streams: Java tools log errors to stdout)
        said = (out + err).decode(errors="replace").strip().splitlines()[-15:]
        raise RuntimeError(f"{argv[0]} exited with {proc.returncode}:\n" + "\n".join(said))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out.decode(errors="replace"), cpu
