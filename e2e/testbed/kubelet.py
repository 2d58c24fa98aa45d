"""The runner: a process standing in for the kubelet (I/O adapter).

Started by ``python -m e2e.testbed up`` as ``python -m e2e.testbed.kubelet``. It

* registers a Node (``127.0.0.1`` as InternalIP, the log endpoint as kubelet port) and
  renews its Lease in ``kube-node-lease``, so the node lifecycle controller sees a
  healthy node and the scheduler binds pods to it;
* watches pods bound to that node and, in one loop thread that owns all process state,
  runs each container's ``command``/``args`` as a local process group (images are
  ignored), with the env, volumes and service-account credentials of
  :mod:`.podspec`, one loopback address per pod (:mod:`.ipam`), probes
  (:mod:`.probes`, run on a small thread pool), restarts and phases
  (:mod:`.podstatus`), ConfigMap, Secret and projected volumes kept in step with their
  sources while the pod runs (written atomically, :mod:`.projection`; ``subPath``
  mounts are pinned at container start), and graceful deletion (SIGTERM, grace period, SIGKILL, then the
  final ``DELETE`` the kubelet owes the API server);
* serves ``/containerLogs`` for ``kubectl logs`` (:mod:`.logserving`) and provisions
  PersistentVolumes (:mod:`.provisioning`).

The loop is level-triggered: every tick compares what the API says with what runs, so
a missed watch event costs at most a tick. Every container process is started through
``setpriv --pdeathsig KILL`` so that, if the runner dies, its children die too; on a
normal stop the runner terminates them itself, and it records their process groups in
``<state>/run/pod-processes`` so ``down`` can sweep up after a runner that was killed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import http.client
import json
import logging
import os
import platform
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from e2e.testbed import (
    images,
    ipam,
    kubeapi,
    logserving,
    podspec,
    podstatus,
    probes,
    projection,
    provisioning,
)
from e2e.testbed.processes import kill_group
from e2e.testbed.settings import StateLayout
from headrace.files import write_atomic

Obj = dict[str, Any]
log = logging.getLogger("e2e.testbed.kubelet")

#: Prefix that makes a container die with the runner (util-linux ``setpriv``, present
#: on every Debian system). Without it, ``down``'s sweep of recorded process groups is
#: the only guard against orphans.
PDEATHSIG = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


@dataclass(frozen=True)
class RunnerSettings(StateLayout):
    """Timings of the runner; the kubelet's defaults where they matter to controllers."""

    state_dir: Path
    node_name: str
    #: Reported as the node's kubelet version (helm charts may check it).
    k8s_version: str = "v0.0.0"
    #: Second octet of this test bed's pod addresses, 127.<block>.x.y (see :mod:`.ipam`).
    pod_block: int = 0
    #: Seconds between full passes of the loop (watch events wake it sooner).
    tick_s: float = 0.25
    #: Lease duration and renew interval (kubelet: 40 s and a quarter of it).
    lease_duration_s: int = 40
    lease_renew_s: float = 10.0
    #: Seconds between node status heartbeats (kubelet: 5 min, or on change).
    node_status_s: float = 60.0
    #: Seconds between provisioner passes.
    provision_s: float = 1.0
    #: Restart back-off: first restart immediate, then base doubling to cap. The
    #: kubelet uses 10 s and 300 s; tests would spend minutes waiting on that.
    backoff_base_s: float = 2.0
    backoff_cap_s: float = 60.0
    #: Grace period when a pod specifies none (API default 30 s).
    default_grace_s: float = 30.0
    #: Seconds given to each pod's processes on runner shutdown before SIGKILL.
    shutdown_grace_s: float = 5.0
    #: Seconds between re-reads of the ConfigMaps and Secrets behind a running pod's
    #: volumes (the kubelet: its sync period, about a minute plus its cache TTL). Short
    #: here, so a test sees an update within seconds; 0 turns updates off.
    volume_refresh_s: float = 2.0


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Probe execution (run on the pool) -------------------------------------------------
def run_probe(probe: probes.Probe, pod_ip: str, env: dict[str, str], cwd: Path) -> bool:
    """Run one probe; True on success. Never raises."""
    host = probe.host or pod_ip
    try:
        if probe.action == "tcp":
            with socket.create_connection((host, probe.port), timeout=probe.timeout_s):
                return True
        if probe.action == "http":
            conn: http.client.HTTPConnection
            if probe.scheme.upper() == "HTTPS":
                # The kubelet does not verify probe certificates either.
                ctx = ssl._create_unverified_context()
                conn = http.client.HTTPSConnection(
                    host, probe.port, timeout=probe.timeout_s, context=ctx
                )
            else:
                conn = http.client.HTTPConnection(host, probe.port, timeout=probe.timeout_s)
            try:
                headers = {"User-Agent": "kube-probe/headrace-testbed", **dict(probe.headers)}
                conn.request("GET", probe.path, headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            return 200 <= status < 400
        if probe.action == "exec":
            proc = subprocess.run(
                list(probe.command),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=probe.timeout_s,
                start_new_session=True,
                check=False,
            )
            return proc.returncode == 0
    except (OSError, subprocess.SubprocessError, http.client.HTTPException):
        return False
    return False


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return True


# Containers -------------------------------------------------------------------------
class ContainerRun:
    """One container of one pod: its process, status view and probes."""

    def __init__(self, spec: Obj, is_init: bool, previous: Obj | None) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.is_init = is_init
        restarts = int(previous.get("restartCount", 0)) if previous else 0
        self.view = podstatus.ContainerView(
            name=self.name,
            image=spec.get("image", ""),
            state="waiting",
            restart_count=restarts,
            reason="PodInitializing" if not is_init else "ContainerCreating",
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.process: podspec.Process | None = None
        self.started_mono = 0.0
        self.next_start = 0.0
        self.starts = 0
        self.kill_deadline: float | None = None
        self.pre_stop: concurrent.futures.Future[bool] | None = None
        self.term_sent = False
        self.probe_specs: dict[probes.Kind, probes.Probe] = {}
        self.probe_states: dict[probes.Kind, probes.State] = {}
        self.futures: dict[probes.Kind, concurrent.futures.Future[bool]] = {}
        #: the host file behind the container's ``terminationMessagePath`` (see
        #: ``PodRun._with_termination_file``) and the log of its current start
        self.termination_file: Path | None = None
        self.log_file: Path | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None

    def log_dir(self, pod_dir: Path) -> Path:
        return pod_dir / "logs" / self.name

    def start(self, pod_dir: Path, process: podspec.Process) -> None:
        log_dir = self.log_dir(pod_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_file = log_dir / f"{self.starts:04d}.log"
        self.log_file = log_file
        self.starts += 1
        for m in process.mounts:
            if not m.host_path.exists():  # a subPath may be a file
                m.host_path.mkdir(parents=True)
        cwd = process.cwd if process.cwd is not None else pod_dir
        cwd.mkdir(parents=True, exist_ok=True)
        started = now_rfc3339()
        self.process = process
        try:
            with log_file.open("ab") as out:
                self.proc = subprocess.Popen(
                    [*PDEATHSIG, *process.argv],
                    env=process.env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            self._record_exit(128, "StartError", started, str(exc))
            return
        self.started_mono = time.monotonic()
        self.kill_deadline = None
        self.view = replace(
            self.view,
            state="running",
            started_at=started,
            terminated=None,
            ready=False,
            started=False,
            reason="",
            message="",
            container_id=f"testbed://{self.proc.pid}",
        )
        self.probe_states = {k: probes.initial(k) for k in self.probe_specs}
        self.futures.clear()

    def _record_exit(self, code: int, reason: str, started: str | None, message: str = "") -> None:
        term = podstatus.terminated(code, started, now_rfc3339(), reason, message)
        self.view = replace(
            self.view, state="terminated", terminated=term, ready=False, started=False
        )
        self.proc = None

    def poll(self) -> bool:
        """Reap the process if it exited; True if it did."""
        if self.proc is None:
            return False
        rc = self.proc.poll()
        if rc is None:
            return False
        pgid = self.proc.pid
        # A container's exit ends everything in it, as its PID namespace would.
        kill_group(pgid, signal.SIGKILL)
        code = rc if rc >= 0 else 128 - rc
        self._record_exit(code, "", self.view.started_at, self.termination_message(code))
        return True

    def termination_message(self, code: int) -> str:
        """What the container wrote to its ``terminationMessagePath`` (at most 4 KiB, as the
        kubelet keeps), else with ``FallbackToLogsOnError`` and a failure, its log's tail."""
        text = ""
        if self.termination_file is not None and self.termination_file.exists():
            text = self.termination_file.read_bytes()[:4096].decode(errors="replace")
        policy = self.spec.get("terminationMessagePolicy", "File")
        fallback = not text.strip() and code != 0 and policy == "FallbackToLogsOnError"
        if fallback and self.log_file is not None and self.log_file.exists():
            lines = self.log_file.read_bytes()[-2048:].decode(errors="replace")
            text = "\n".join(lines.splitlines()[-80:])
        return text.strip()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid, sig)

    def stop(
        self,
        grace_s: float,
        now: float,
        pre_stop: concurrent.futures.Future[bool] | None = None,
    ) -> None:
        """Begin a graceful stop: the ``preStop`` hook (already submitted, if any), then
        SIGTERM, then SIGKILL when the grace period, which the hook's time counts
        against, runs out (see :meth:`tick_stop`)."""
        if self.proc is None or self.kill_deadline is not None:
            return
        self.kill_deadline = now + grace_s
        self.pre_stop = pre_stop
        self.term_sent = False
        self.tick_stop(now)

    def tick_stop(self, now: float) -> None:
        if self.proc is None or self.kill_deadline is None:
            return
        if not self.term_sent and (
            self.pre_stop is None or self.pre_stop.done() or now >= self.kill_deadline
        ):
            self.signal(signal.SIGTERM)
            self.term_sent = True
        if now >= self.kill_deadline:
            self.signal(signal.SIGKILL)


# Pods -------------------------------------------------------------------------------
class PodRun:
    """One pod bound to this node, from admission to the final delete."""

    def __init__(self, runner: Runner, obj: Obj) -> None:
        self.r = runner
        self.obj = obj
        meta = obj["metadata"]
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.name: str = meta["name"]
        self.dir = runner.cfg.pods_dir / f"{self.ns}_{self.name}_{self.uid}"
        status = obj.get("status", {})
        prev_ip = status.get("podIP")
        self.ip = runner.pool.allocate(self.uid, prefer=prev_ip)
        self.start_time = status.get("startTime") or now_rfc3339()
        spec = obj["spec"]
        prev = {c["name"]: c for c in status.get("initContainerStatuses", []) or []}
        self.init = [
            ContainerRun(c, True, prev.get(c["name"])) for c in spec.get("initContainers", [])
        ]
        prev = {c["name"]: c for c in status.get("containerStatuses", []) or []}
        self.containers = [
            ContainerRun(c, False, prev.get(c["name"])) for c in spec.get("containers", [])
        ]
        self.policy: podstatus.RestartPolicy = spec.get("restartPolicy", "Always")
        self.final_phase: str | None = None
        #: Finished before this runner started: never run again, never re-reported
        #: (our container views of it are empty and would claim it is Pending).
        self.adopted_terminal = status.get("phase") in ("Succeeded", "Failed")
        if self.adopted_terminal:
            self.final_phase = status["phase"]
        self.ready_to_run = False
        self.setup_error: tuple[str, str] | None = None
        self.next_setup = 0.0
        self.volume_dirs: dict[str, Path] = {}
        self.world: podspec.World | None = None
        self.token: str | None = None
        self.token_refresh_at = 0.0
        self.volume_refresh_at = 0.0
        self.extra_env: dict[str, str] = {}
        self.terminating = False
        self.last_status: Obj | None = None
        self.retry_report_at = 0.0
        self.conditions: list[Obj] = list(status.get("conditions", []) or [])
        self.deleted = False

    # Setup ----------------------------------------------------------------------
    def _fetch(self, kind: str, names: set[str]) -> dict[str, Obj]:
        out: dict[str, Obj] = {}
        for name in names:
            try:
                out[name] = self.r.api.get(f"/api/v1/namespaces/{self.ns}/{kind}/{name}")
            except kubeapi.ApiError as exc:
                if not exc.not_found:
                    raise
        return out

    def _request_token(self) -> None:
        aud_ttl = podspec.token_audience_and_ttl(self.obj)
        if aud_ttl is None:
            return
        audience, ttl = aud_ttl
        sa = self.obj["spec"].get("serviceAccountName", "default")
        spec: Obj = {
            "expirationSeconds": max(ttl, 600),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.name,
                "uid": self.uid,
            },
        }
        if audience:
            spec["audiences"] = [audience]
        resp = self.r.api.create(
            f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        self.token = str(resp["status"]["token"])
        # Refresh at 80% of the lifetime, as the kubelet does.
        self.token_refresh_at = time.monotonic() + 0.8 * max(ttl, 600)

    def _write_files(self, target: Path, files: dict[str, bytes], secret: bool) -> bool:
        try:
            return projection.write(target, files, mode=0o600 if secret else 0o644)
        except projection.PayloadError as exc:
            raise podspec.VolumeError(str(exc)) from exc

    def _materialize(self, only_updating: bool = False) -> None:
        """Write the pod's volumes; ``only_updating``: just those the kubelet keeps in
        step with their sources (ConfigMap, Secret, downwardAPI, projected)."""
        assert self.world is not None
        for v in self.obj["spec"].get("volumes", []):
            name = v["name"]
            if only_updating and not podspec.updates_in_place(v):
                continue
            files = podspec.volume_files(self.obj, v, self.world, self.token)
            if files is not None:
                d = self.dir / "volumes" / name
                written = self._write_files(d, files, secret="secret" in v or "projected" in v)
                if written and self.ready_to_run:
                    log.info("volume %s of %s/%s updated", name, self.ns, self.name)
                self.volume_dirs[name] = d
            elif "emptyDir" in v:
                d = self.dir / "volumes" / name
                d.mkdir(parents=True, exist_ok=True)
                self.volume_dirs[name] = d
            elif "hostPath" in v:
                d = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") == "DirectoryOrCreate":
                    d.mkdir(parents=True, exist_ok=True)
                self.volume_dirs[name] = d
            elif "persistentVolumeClaim" in v:
                self.volume_dirs[name] = self._claim_dir(v["persistentVolumeClaim"]["claimName"])

    def _claim_dir(self, claim_name: str) -> Path:
        try:
            claim = self.r.api.get(
                f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim_name}"
            )
        except kubeapi.ApiError as exc:
            if exc.not_found:
                raise podspec.VolumeError(
                    f'persistentvolumeclaim "{claim_name}" not found'
                ) from exc
            raise
        volume = claim.get("spec", {}).get("volumeName")
        if claim.get("status", {}).get("phase") != "Bound" or not volume:
            raise podspec.VolumeError(f'persistentvolumeclaim "{claim_name}" is not bound yet')
        pv = self.r.api.get(f"/api/v1/persistentvolumes/{volume}")
        path = provisioning.volume_path(pv)
        if path is None:
            raise podspec.VolumeError(f"volume {volume} is neither hostPath nor local")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def setup(self, now: float) -> None:
        """Prepare address, directories, env sources, token and volumes; retried until done."""
        if self.ready_to_run or now < self.next_setup:
            return
        self.next_setup = now + 1.0
        try:
            cms, secrets = podspec.referenced_names(self.obj)
            self.world = podspec.World(
                pod_ip=self.ip,
                host_ip="127.0.0.1",
                configmaps=self._fetch("configmaps", cms),
                secrets=self._fetch("secrets", secrets),
                base_env=self.r.base_env(self.obj),
                node_cpu=str(os.cpu_count() or 1),
                node_memory=f"{self.r.memory_kib}Ki",
            )
            self.dir.mkdir(parents=True, exist_ok=True)
            self._request_token()
            self._materialize()
            if self.token is not None:
                self._write_sa_kubeconfig()
            for c in [*self.init, *self.containers]:
                for kind, key in (
                    ("readiness", "readinessProbe"),
                    ("liveness", "livenessProbe"),
                    ("startup", "startupProbe"),
                ):
                    p = probes.parse(kind, c.spec.get(key), c.spec)  # type: ignore[arg-type]
                    if p is not None:
                        c.probe_specs[p.kind] = p
        except (podspec.VolumeError, podspec.ConfigError, probes.ProbeSpecError) as exc:
            reason = getattr(exc, "reason", "CreateContainerConfigError")
            self.setup_error = (reason, str(exc))
            return
        except kubeapi.ApiError as exc:
            self.setup_error = ("ContainerCreating", str(exc))
            return
        self.setup_error = None
        self.ready_to_run = True

    def _write_sa_kubeconfig(self) -> None:
        assert self.token is not None
        ca = (self.r.cfg.pki_dir / "ca.crt").read_text()
        text = podspec.service_account_kubeconfig(self.r.api_server, ca, self.token, self.ns)
        path = self.dir / "serviceaccount.kubeconfig"
        write_atomic(path, text.encode(), sync=False, mode=0o600)
        self.extra_env = {"KUBECONFIG": str(path)}

    # Running ----------------------------------------------------------------------
    def _start(self, c: ContainerRun) -> None:
        assert self.world is not None
        try:
            # ConfigMaps/Secrets are re-read for every start, as the kubelet does.
            cms, secrets = podspec.referenced_names(self.obj)
            self.world = replace(
                self.world,
                configmaps=self._fetch("configmaps", cms),
                secrets=self._fetch("secrets", secrets),
            )
            proc = podspec.process(
                self.obj,
                c.spec,
                self.world,
                self.volume_dirs,
                self.extra_env,
                os.path.exists,
                self._pin_subpaths(c),
                self.r.image_entrypoint,
            )
            proc = self._with_termination_file(c, proc)
        except podspec.ConfigError as exc:
            c.view = replace(c.view, state="waiting", reason=exc.reason, message=str(exc))
            c.next_start = time.monotonic() + 2.0
            return
        except kubeapi.ApiError:
            c.next_start = time.monotonic() + 1.0
            return
        if c.starts > 0 or c.view.last_terminated is not None:
            c.view = replace(c.view, restart_count=c.view.restart_count + 1)
        c.start(self.dir, proc)
        log.info(
            "started %s/%s:%s pid %s on %s: %s",
            self.ns,
            self.name,
            c.name,
            c.proc.pid if c.proc else "-",
            self.ip,
            " ".join(proc.argv),
        )

    def _with_termination_file(self, c: ContainerRun, proc: podspec.Process) -> podspec.Process:
        """The container's ``terminationMessagePath`` (``/dev/termination-log`` by default),
        where it appears whole in the command line or the environment, becomes a file of
        this pod's own, emptied for every start; its content is the terminated state's
        ``message``, as the kubelet reports it."""
        path = c.spec.get("terminationMessagePath") or "/dev/termination-log"
        host = self.dir / "termination" / c.name
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(b"")
        c.termination_file = host

        def swap(word: str) -> str:
            return str(host) if word == path else word

        return replace(
            proc,
            argv=[swap(w) for w in proc.argv],
            env={k: swap(v) for k, v in proc.env.items()},
        )

    def _after_exit(self, c: ContainerRun, now: float) -> None:
        term = c.view.terminated
        assert term is not None
        log.info("%s/%s:%s exited %s", self.ns, self.name, c.name, term.exit_code)
        restart = (
            (term.exit_code != 0 and self.policy != "Never")
            if c.is_init
            else podstatus.should_restart(self.policy, term.exit_code)
        )
        if restart and not self.terminating:
            # First restart at once, then base, 2*base, ... up to the cap.
            delay = podstatus.backoff_s(
                c.starts - 1, self.r.cfg.backoff_base_s, self.r.cfg.backoff_cap_s
            )
            c.next_start = now + delay
            c.view = replace(
                c.view,
                state="waiting",
                reason="CrashLoopBackOff" if delay > 0 else "ContainerCreating",
                message=f"back-off {delay:.0f}s restarting failed container" if delay else "",
                last_terminated=term,
                terminated=None,
            )

    def _probe(self, c: ContainerRun, now: float) -> None:
        if c.proc is None or c.process is None:
            return
        for kind, fut in list(c.futures.items()):
            if fut.done():
                del c.futures[kind]
                c.probe_states[kind] = probes.record(
                    c.probe_specs[kind], c.probe_states[kind], fut.result()
                )
        startup_done = "startup" not in c.probe_specs or c.probe_states["startup"].result
        for kind, spec in c.probe_specs.items():
            state = c.probe_states[kind]
            if not probes.active(kind, startup_done) or kind in c.futures:
                continue
            if probes.due(spec, state, c.started_mono, now):
                c.probe_states[kind] = probes.begin(state, now)
                c.futures[kind] = self.r.probe_pool.submit(
                    run_probe, spec, self.ip, c.process.env, c.process.cwd or self.dir
                )
        grace = self._grace()
        if "liveness" in c.probe_specs and startup_done and not c.probe_states["liveness"].result:
            log.info("%s/%s:%s failed liveness probe, restarting", self.ns, self.name, c.name)
            c.probe_states["liveness"] = probes.initial("liveness")
            c.stop(grace, now, self._pre_stop(c, grace))
        if "startup" in c.probe_specs and not startup_done:
            st = c.probe_states["startup"]
            if st.failures >= c.probe_specs["startup"].failure_threshold:
                log.info("%s/%s:%s failed startup probe, restarting", self.ns, self.name, c.name)
                c.probe_states["startup"] = probes.initial("startup")
                c.stop(grace, now)
        ready = (
            c.probe_states["readiness"].result if "readiness" in c.probe_specs else True
        ) and startup_done
        c.view = replace(c.view, ready=bool(ready and c.running), started=bool(startup_done))

    def _pre_stop(self, c: ContainerRun, grace: float) -> concurrent.futures.Future[bool] | None:
        """Submit the container's ``lifecycle.preStop`` handler, if it has one."""
        handler = (c.spec.get("lifecycle") or {}).get("preStop")
        if not handler or c.proc is None or c.process is None:
            return None
        if "sleep" in handler:
            seconds = min(float(handler["sleep"].get("seconds", 0)), grace)
            return self.r.probe_pool.submit(_sleep, seconds)
        try:
            hook = probes.parse("liveness", handler, c.spec)
        except probes.ProbeSpecError as exc:
            log.warning("%s/%s:%s preStop: %s", self.ns, self.name, c.name, exc)
            return None
        if hook is None:
            return None
        hook = replace(hook, timeout_s=grace)
        env, cwd = c.process.env, c.process.cwd or self.dir
        return self.r.probe_pool.submit(run_probe, hook, self.ip, env, cwd)

    def _grace(self) -> float:
        meta_grace = self.obj["metadata"].get("deletionGracePeriodSeconds")
        if meta_grace is not None:
            return float(meta_grace)
        spec_grace = self.obj["spec"].get("terminationGracePeriodSeconds")
        return float(spec_grace) if spec_grace is not None else self.r.cfg.default_grace_s

    def all_runs(self) -> list[ContainerRun]:
        return [*self.init, *self.containers]

    def sync(self, now: float) -> None:
        """One level-triggered step; ends with a status patch if anything changed."""
        for c in self.all_runs():
            if c.poll() and not self.terminating and self.final_phase is None:
                self._after_exit(c, now)
            c.tick_stop(now)

        if self.obj["metadata"].get("deletionTimestamp") and not self.terminating:
            self.terminating = True
            grace = self._grace()
            log.info("%s/%s deleted: stopping with grace %.0fs", self.ns, self.name, grace)
            for c in self.all_runs():
                c.stop(grace, now, self._pre_stop(c, grace))
        if self.terminating:
            if not any(c.running for c in self.all_runs()):
                self._finish_delete()
            return
        if self.final_phase is not None:
            if not self.adopted_terminal:
                self._report(now)  # retries a terminal status the API has not taken yet
            return

        self.setup(now)
        if self.ready_to_run:
            if self.token is not None and now >= self.token_refresh_at:
                try:
                    self._request_token()
                    self._materialize(only_updating=True)
                    self._write_sa_kubeconfig()
                except (kubeapi.ApiError, podspec.VolumeError) as exc:
                    log.warning("token refresh for %s/%s failed: %s", self.ns, self.name, exc)
                    self.token_refresh_at = now + 10
            self._refresh_volumes(now)
            self._run_containers(now)
        self._report(now)

    def _refresh_volumes(self, now: float) -> None:
        """Re-read the ConfigMaps and Secrets behind the pod's volumes on the refresh
        period and swap in what changed, as the kubelet's volume manager does. A source
        that is gone (and not optional) leaves the files as they were, as there."""
        period = self.r.cfg.volume_refresh_s
        if period <= 0 or now < self.volume_refresh_at or self.world is None:
            return
        self.volume_refresh_at = now + period
        volumes = [v for v in self.obj["spec"].get("volumes", []) if podspec.updates_in_place(v)]
        if not volumes:
            return
        cms, secrets = podspec.referenced_names({"spec": {"volumes": volumes}})
        try:
            self.world = replace(
                self.world,
                configmaps=self._fetch("configmaps", cms),
                secrets=self._fetch("secrets", secrets),
            )
            self._materialize(only_updating=True)
        except (kubeapi.ApiError, podspec.VolumeError, podspec.ConfigError) as exc:
            log.warning("volume refresh of %s/%s failed: %s", self.ns, self.name, exc)

    def _pin_subpaths(self, c: ContainerRun) -> dict[int, Path]:
        """Copies of the ``subPath`` mounts of updating volumes, made now: the container
        sees them as they are at its start and never after (the kubelet's bind mount)."""
        pinned: dict[int, Path] = {}
        by_name = {v["name"]: v for v in self.obj["spec"].get("volumes", [])}
        for index, vm in enumerate(c.spec.get("volumeMounts", [])):
            volume = by_name.get(vm["name"])
            sub = vm.get("subPath")
            if not sub or volume is None or not podspec.updates_in_place(volume):
                continue
            if vm["name"] not in self.volume_dirs:
                continue  # podspec.mounts reports the undefined volume
            source = self.volume_dirs[vm["name"]] / sub
            destination = self.dir / "volume-subpaths" / vm["name"] / c.name / str(index)
            pinned[index] = projection.pin(source, destination)
        return pinned

    def _run_containers(self, now: float) -> None:
        # Init containers, in order, each to success.
        for c in self.init:
            t = c.view.terminated
            if c.view.state == "terminated" and t is not None and t.exit_code == 0:
                continue
            if c.view.state == "terminated":  # failed and not restarting: pod fails
                return
            if not c.running and now >= c.next_start:
                self._start(c)
            return
        for c in self.containers:
            if not c.running and c.view.state == "waiting" and now >= c.next_start:
                self._start(c)
            self._probe(c, now)

    def _views(self) -> tuple[list[podstatus.ContainerView], list[podstatus.ContainerView]]:
        init = [c.view for c in self.init]
        regular = [c.view for c in self.containers]
        if self.setup_error is not None:
            reason, message = self.setup_error

            def waiting(v: podstatus.ContainerView) -> podstatus.ContainerView:
                return replace(v, reason=reason, message=message) if v.state == "waiting" else v

            init = [waiting(v) for v in init]
            regular = [waiting(v) for v in regular]
        return init, regular

    def _report(self, now: float) -> None:
        init, regular = self._views()
        phase = podstatus.phase(init, regular, self.policy)
        if phase in ("Succeeded", "Failed"):
            self.final_phase = phase
            for c in self.all_runs():
                c.stop(self._grace(), now)
        initialized = all(
            v.state == "terminated" and v.terminated is not None and v.terminated.exit_code == 0
            for v in init
        )
        containers_ready = bool(regular) and all(v.ready for v in regular)
        self.conditions = podstatus.conditions(
            self.conditions,
            pod_phase=phase,
            initialized=initialized,
            containers_ready=containers_ready,
            sandbox_ready=self.ready_to_run,
            now=now_rfc3339(),
        )
        status: Obj = {
            "phase": phase,
            "conditions": self.conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "containerStatuses": [v.to_api() for v in regular],
        }
        if init:
            status["initContainerStatuses"] = [v.to_api() for v in init]
        if status == self.last_status or now < self.retry_report_at:
            return
        try:
            self.r.api.request(
                "PATCH",
                f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status",
                {"metadata": {"uid": self.uid}, "status": status},
                content_type="application/strategic-merge-patch+json",
            )
            self.last_status = status
        except kubeapi.ApiError as exc:
            if exc.not_found:
                return  # deleted; the watch will tell
            log.warning("status update of %s/%s failed: %s", self.ns, self.name, exc)
            self.retry_report_at = now + 1.0

    def _finish_delete(self) -> None:
        if self.deleted:
            return
        try:
            self.r.api.delete(
                f"/api/v1/namespaces/{self.ns}/pods/{self.name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except kubeapi.ApiError as exc:
            if not (exc.not_found or exc.conflict):
                log.warning("final delete of %s/%s failed: %s", self.ns, self.name, exc)
                return
        self.deleted = True
        log.info("%s/%s deleted", self.ns, self.name)

    def kill_now(self, grace_s: float) -> None:
        """Stop every process within ``grace_s`` (used when the pod vanished or on shutdown)."""
        now = time.monotonic()
        for c in self.all_runs():
            c.stop(grace_s, now)
        deadline = now + grace_s + 2
        while any(c.running for c in self.all_runs()) and time.monotonic() < deadline:
            for c in self.all_runs():
                c.poll()
                c.tick_stop(time.monotonic())
            time.sleep(0.05)

    def cleanup(self) -> None:
        """Forget the pod: its directory (not its PVs, which live elsewhere) and address."""
        self.kill_now(2.0)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.r.pool.release(self.uid)

    def log_files(self, container: str) -> tuple[list[Path], bool]:
        for c in self.all_runs():
            if c.name == container:
                files = sorted(c.log_dir(self.dir).glob("*.log"))
                return files, c.running
        return [], False


# The runner -------------------------------------------------------------------------
class Runner:
    def __init__(self, cfg: RunnerSettings) -> None:
        self.cfg = cfg
        ports = json.loads((cfg.run_dir / "ports.json").read_text())
        self.api_port = int(ports["apiserver"])
        self.kubelet_port = int(ports["runner"])
        self.api_server = f"https://127.0.0.1:{self.api_port}"
        self.api = kubeapi.from_kubeconfig_files("127.0.0.1", self.api_port, cfg.pki_dir, "runner")
        self.watch_api = kubeapi.from_kubeconfig_files(
            "127.0.0.1", self.api_port, cfg.pki_dir, "runner"
        )
        self.pool = ipam.Pool(block=cfg.pod_block)
        self.pods: dict[str, PodRun] = {}
        self.desired: dict[str, Obj] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.probe_pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="probe")
        self.memory_kib = _memory_kib()
        self.next_lease = 0.0
        self.next_node_status = 0.0
        self.recorded_pgids: list[int] = []
        self.provisioner = provisioning.Provisioner(self.api, cfg.state_dir / "volumes")
        #: containers without ``command`` run their image's stand-in entrypoint, if known
        self.image_entrypoint = images.host_entrypoints()

    # Node -----------------------------------------------------------------------
    def base_env(self, pod: Obj) -> dict[str, str]:
        """What every container's environment starts with (service links to the API)."""
        host = pod["spec"].get("hostname") or pod["metadata"]["name"]
        return {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "HOSTNAME": host,
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port),
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{self.api_port}",
        }

    def node_status(self) -> Obj:
        cpus = str(os.cpu_count() or 1)
        mem = f"{self.memory_kib}Ki"
        cap = {"cpu": cpus, "memory": mem, "pods": "110", "ephemeral-storage": "100Gi"}
        hb = now_rfc3339()
        conds = [
            ("Ready", "True", "KubeletReady", "headrace test bed runner is posting ready status"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
            ("PIDPressure", "False", "KubeletHasSufficientPID", ""),
        ]
        return {
            "capacity": cap,
            "allocatable": cap,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": hb,
                    "lastTransitionTime": self.boot_time,
                }
                for t, s, r, m in conds
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.cfg.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": "headrace test bed (host processes)",
                "containerRuntimeVersion": "testbed://1",
                "kubeletVersion": self.cfg.k8s_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64" if platform.machine() == "x86_64" else platform.machine(),
            },
        }

    def register_node(self) -> None:
        self.boot_time = now_rfc3339()
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.cfg.node_name,
                "labels": {
                    "kubernetes.io/hostname": self.cfg.node_name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
        }
        try:
            self.api.create("/api/v1/nodes", node)
        except kubeapi.ApiError as exc:
            if not exc.conflict:
                raise
        self.post_node_status()

    def post_node_status(self) -> None:
        self.api.merge_patch(
            f"/api/v1/nodes/{self.cfg.node_name}/status", {"status": self.node_status()}
        )
        self.next_node_status = time.monotonic() + self.cfg.node_status_s

    def renew_lease(self) -> None:
        node = self.api.get(f"/api/v1/nodes/{self.cfg.node_name}")
        path = (
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.cfg.node_name}"
        )
        spec = {
            "holderIdentity": self.cfg.node_name,
            "leaseDurationSeconds": self.cfg.lease_duration_s,
            "renewTime": now_micro(),
        }
        try:
            self.api.merge_patch(path, {"spec": spec})
        except kubeapi.ApiError as exc:
            if not exc.not_found:
                raise
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.cfg.node_name,
                    "namespace": "kube-node-lease",
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": self.cfg.node_name,
                            "uid": node["metadata"]["uid"],
                        }
                    ],
                },
                "spec": spec,
            }
            self.api.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
        self.next_lease = time.monotonic() + self.cfg.lease_renew_s

    # Watching ----------------------------------------------------------------------
    def _watch_pods(self) -> None:
        selector = f"spec.nodeName={self.cfg.node_name}"
        while not self.stopping.is_set():
            try:
                listing = self.watch_api.get("/api/v1/pods", fieldSelector=selector)
                with self.lock:
                    self.desired = {p["metadata"]["uid"]: p for p in listing.get("items", [])}
                self.wake.set()
                rv = listing["metadata"]["resourceVersion"]
                while not self.stopping.is_set():
                    for kind, obj in self.watch_api.watch(
                        "/api/v1/pods", rv, 60, fieldSelector=selector
                    ):
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind == "ERROR":
                            raise kubeapi.ApiError(int(obj.get("code", 0)), "watch expired")
                        if kind == "BOOKMARK":
                            continue
                        with self.lock:
                            if kind == "DELETED":
                                self.desired.pop(obj["metadata"]["uid"], None)
                            else:
                                self.desired[obj["metadata"]["uid"]] = obj
                        self.wake.set()
            except kubeapi.ApiError as exc:
                if not self.stopping.is_set():
                    log.info("pod watch restarting: %s", exc)
                    self.stopping.wait(0.5)

    def _provision_loop(self) -> None:
        while not self.stopping.wait(self.cfg.provision_s):
            try:
                self.provisioner.sync()
            except (kubeapi.ApiError, OSError) as exc:
                log.warning("provisioner: %s", exc)

    # Main loop -----------------------------------------------------------------------
    def log_lookup(self, ns: str, pod: str, container: str) -> tuple[list[Path], bool]:
        with self.lock:
            runs = [p for p in self.pods.values() if p.ns == ns and p.name == pod]
        for p in runs:
            return p.log_files(container)
        return [], False

    def step(self) -> None:
        now = time.monotonic()
        with self.lock:
            desired = dict(self.desired)
        for uid, obj in desired.items():
            pod = self.pods.get(uid)
            if pod is None:
                pod = PodRun(self, obj)
                with self.lock:
                    self.pods[uid] = pod
            pod.obj = obj
            try:
                pod.sync(now)
            except (kubeapi.ApiError, OSError) as exc:
                log.warning("sync of %s/%s failed: %s", pod.ns, pod.name, exc)
            except Exception:  # one pod's surprise must not stall the others
                log.exception("sync of %s/%s failed", pod.ns, pod.name)
        for uid in [u for u in self.pods if u not in desired]:
            pod = self.pods[uid]
            pod.cleanup()
            with self.lock:
                del self.pods[uid]
            log.info("forgot %s/%s", pod.ns, pod.name)
        if now >= self.next_lease:
            try:
                self.renew_lease()
            except kubeapi.ApiError as exc:
                log.warning("lease renewal failed: %s", exc)
                self.next_lease = now + 1
        if now >= self.next_node_status:
            try:
                self.post_node_status()
            except kubeapi.ApiError as exc:
                log.warning("node status failed: %s", exc)
                self.next_node_status = now + 1
        self._record_pgids()

    def _record_pgids(self) -> None:
        pgids = sorted(
            c.proc.pid for p in self.pods.values() for c in p.all_runs() if c.proc is not None
        )
        if pgids != self.recorded_pgids:
            path = self.cfg.run_dir / "pod-processes"
            write_atomic(path, (" ".join(map(str, pgids)) + "\n").encode(), sync=False)
            self.recorded_pgids = pgids

    def run(self) -> None:
        self.cfg.pods_dir.mkdir(parents=True, exist_ok=True)
        # Leftovers of a previous runner that was killed: its pods get new processes.
        for stale in self.cfg.pods_dir.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        logserving.serve(self.kubelet_port, self.cfg.pki_dir, self.log_lookup, self.stopping)
        self.register_node()
        self.renew_lease()
        threading.Thread(target=self._watch_pods, name="watch", daemon=True).start()
        threading.Thread(target=self._provision_loop, name="provisioner", daemon=True).start()
        log.info("runner for node %s up; kubelet port %d", self.cfg.node_name, self.kubelet_port)
        while not self.stopping.is_set():
            self.wake.wait(self.cfg.tick_s)
            self.wake.clear()
            try:
                self.step()
            except Exception:  # the loop must survive anything one pod does
                log.exception("runner step failed")
                time.sleep(0.5)
        self.shutdown()

    def shutdown(self) -> None:
        log.info("runner stopping: terminating %d pods", len(self.pods))
        now = time.monotonic()
        for p in self.pods.values():
            for c in p.all_runs():
                c.stop(self.cfg.shutdown_grace_s, now)
        deadline = now + self.cfg.shutdown_grace_s + 2
        while time.monotonic() < deadline:
            alive = False
            for p in self.pods.values():
                for c in p.all_runs():
                    c.poll()
                    c.tick_stop(time.monotonic())
                    alive = alive or c.running
            if not alive:
                break
            time.sleep(0.05)
        self._record_pgids()
        self.probe_pool.shutdown(wait=False, cancel_futures=True)


def _memory_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 8 * 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="headrace test bed runner (kubelet stand-in)")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node-name", default="testbed-node")
    parser.add_argument("--k8s-version", default="v0.0.0")
    parser.add_argument("--pod-block", type=int, default=0)
    parser.add_argument(
        "--volume-refresh-s",
        type=float,
        default=RunnerSettings.volume_refresh_s,
        help="seconds between updates of running pods' ConfigMap/Secret volumes (0: never)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    runner = Runner(
        RunnerSettings(
            state_dir=args.state_dir,
            node_name=args.node_name,
            k8s_version=args.k8s_version,
            pod_block=args.pod_block,
            volume_refresh_s=args.volume_refresh_s,
        )
    )

    def stop(signum: int, _frame: object) -> None:
        runner.stopping.set()
        runner.wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
