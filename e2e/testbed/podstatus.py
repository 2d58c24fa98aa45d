"""Pod phase, conditions, container statuses and restart decisions (pure).

These follow the kubelet (``pkg/kubelet/kubelet_pods.go`` ``getPhase`` and the status
manager) closely enough that controllers see what they would see in a cluster:

* Init containers must all succeed, in order, before regular containers start; until
  then the pod is ``Pending`` (``Failed`` if one failed and ``restartPolicy`` is Never).
* A regular container waiting for its first start keeps the pod ``Pending``; any
  running container makes it ``Running``; when all have stopped, ``restartPolicy``
  decides between ``Running`` (they will restart), ``Succeeded`` and ``Failed``.
* Restarts back off exponentially (kubelet: 10 s doubling to 300 s; the test bed's
  defaults are shorter, see :class:`e2e.testbed.kubelet.RunnerSettings`).
* A condition's ``lastTransitionTime`` changes only when its status does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Obj = dict[str, Any]
RestartPolicy = Literal["Always", "OnFailure", "Never"]


@dataclass(frozen=True)
class Terminated:
    exit_code: int
    reason: str  # Completed, Error, OOMKilled (never here), ContainerCannotRun
    started_at: str | None
    finished_at: str
    message: str = ""
    signal: int | None = None

    def to_api(self) -> Obj:
        out: Obj = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "finishedAt": self.finished_at,
        }
        if self.started_at:
            out["startedAt"] = self.started_at
        if self.message:
            out["message"] = self.message
        if self.signal is not None:
            out["signal"] = self.signal
        return out


@dataclass(frozen=True)
class ContainerView:
    """The runner's knowledge of one container, enough to report its status."""

    name: str
    image: str
    state: Literal["waiting", "running", "terminated"]
    restart_count: int = 0
    reason: str = "ContainerCreating"  # when waiting
    message: str = ""
    started_at: str | None = None  # when running
    terminated: Terminated | None = None  # when terminated
    last_terminated: Terminated | None = None
    ready: bool = False
    started: bool = False
    container_id: str = ""

    def to_api(self) -> Obj:
        if self.state == "running":
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated" and self.terminated is not None:
            state = {"terminated": self.terminated.to_api()}
        else:
            waiting: Obj = {"reason": self.reason}
            if self.message:
                waiting["message"] = self.message
            state = {"waiting": waiting}
        out: Obj = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "state": state,
            "lastState": {"terminated": self.last_terminated.to_api()}
            if self.last_terminated
            else {},
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


def terminated(
    code: int, started_at: str | None, finished_at: str, reason: str = "", message: str = ""
) -> Terminated:
    """A termination record; exit codes above 128 mean death by signal ``code - 128``."""
    return Terminated(
        exit_code=code,
        reason=reason or exit_reason(code),
        started_at=started_at,
        finished_at=finished_at,
        message=message,
        signal=code - 128 if code > 128 else None,
    )


def should_restart(policy: RestartPolicy, exit_code: int) -> bool:
    """Whether a regular container that exited with ``exit_code`` is started again."""
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def backoff_s(restart_count: int, base_s: float, cap_s: float) -> float:
    """Delay before restart number ``restart_count + 1`` (0 for the first restart)."""
    if restart_count <= 0:
        return 0.0
    return float(min(cap_s, base_s * (2 ** (restart_count - 1))))


def _stopped(c: ContainerView) -> Terminated | None:
    if c.state == "terminated":
        return c.terminated
    if c.state == "waiting":
        return c.last_terminated
    return None


def phase(
    init: Sequence[ContainerView],
    regular: Sequence[ContainerView],
    policy: RestartPolicy,
) -> str:
    """The pod phase from its containers (see the module docstring)."""
    for c in init:
        done = c.state == "terminated" and c.terminated is not None
        if done and c.terminated is not None and c.terminated.exit_code == 0:
            continue
        if done and policy == "Never":
            return "Failed"
        return "Pending"
    running = waiting = succeeded = failed = 0
    for c in regular:
        if c.state == "running":
            running += 1
            continue
        t = _stopped(c)
        if t is None:
            waiting += 1
        elif t.exit_code == 0:
            succeeded += 1
        else:
            failed += 1
    stopped = succeeded + failed
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if stopped > 0:
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if policy == "OnFailure":
            return "Running"
        return "Failed"
    return "Pending"


def conditions(
    previous: Sequence[Obj],
    *,
    pod_phase: str,
    initialized: bool,
    containers_ready: bool,
    sandbox_ready: bool,
    now: str,
) -> list[Obj]:
    """Pod conditions, keeping ``lastTransitionTime`` of those whose status is unchanged.

    ``PodScheduled`` (written by the scheduler) and any condition we do not own are
    passed through untouched.
    """
    terminal = pod_phase in ("Succeeded", "Failed")
    ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
    desired: list[tuple[str, bool, str]] = [
        ("PodReadyToStartContainers", sandbox_ready and not terminal, ""),
        ("Initialized", initialized, "" if initialized else "ContainersNotInitialized"),
        ("ContainersReady", containers_ready and not terminal, ready_reason),
        ("Ready", containers_ready and not terminal, ready_reason),
    ]
    if terminal and initialized:
        desired[1] = ("Initialized", True, "PodCompleted")
    ours = {name for name, _, _ in desired}
    prev = {c.get("type"): c for c in previous}
    out = [c for c in previous if c.get("type") not in ours]
    for name, ok, reason in desired:
        status = "True" if ok else "False"
        old = prev.get(name)
        cond: Obj = {"type": name, "status": status, "lastProbeTime": None}
        cond["lastTransitionTime"] = (
            old.get("lastTransitionTime") if old and old.get("status") == status else now
        )
        # Always present (None when there is none): a strategic merge patch would keep
        # a stale reason from an earlier status otherwise.
        keep = (not ok and reason) or reason == "PodCompleted"
        cond["reason"] = reason if keep else None
        out.append(cond)
    return out
