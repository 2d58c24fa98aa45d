"""Probe scheduling and result accounting, as the kubelet does it (pure).

A probe runs first ``initialDelaySeconds`` after the container started, then every
``periodSeconds``; a run that takes longer than ``timeoutSeconds`` fails. The probe's
*result* flips only after ``successThreshold`` consecutive successes or
``failureThreshold`` consecutive failures. Initial results follow the kubelet:
readiness starts failed (a container is not Ready until a probe says so), liveness
starts succeeded, startup starts failed and, until it succeeds, holds the other two off.

Time is passed in (monotonic seconds), so all of this is tested without sleeping.
Executing a probe (HTTP, TCP, exec) is the runner's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

Obj = dict[str, Any]
Kind = Literal["readiness", "liveness", "startup"]


class ProbeSpecError(Exception):
    """A probe the test bed cannot run (grpc, or a named port that does not exist)."""


@dataclass(frozen=True)
class Probe:
    """A parsed probe; ``action`` says how to run it, the rest when and how to judge."""

    kind: Kind
    action: Literal["http", "tcp", "exec"]
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    # http / tcp
    host: str | None = None
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    # exec
    command: tuple[str, ...] = field(default_factory=tuple)


def _port(value: Any, container: Obj) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    for p in container.get("ports", []):
        if p.get("name") == value:
            return int(p["containerPort"])
    raise ProbeSpecError(f"named port {value!r} not found in container ports")


def parse(kind: Kind, spec: Obj | None, container: Obj) -> Probe | None:
    """Parse a container's probe spec (``None`` if it has none)."""
    if not spec:
        return None
    common: dict[str, Any] = {
        "kind": kind,
        "initial_delay_s": float(spec.get("initialDelaySeconds", 0)),
        "period_s": float(spec.get("periodSeconds", 10)),
        "timeout_s": float(spec.get("timeoutSeconds", 1)),
        # Liveness and startup probes must have successThreshold 1 (API validation).
        "success_threshold": int(spec.get("successThreshold", 1)),
        "failure_threshold": int(spec.get("failureThreshold", 3)),
    }
    if "httpGet" in spec:
        h = spec["httpGet"]
        headers = tuple((x["name"], x["value"]) for x in h.get("httpHeaders", []))
        return Probe(
            action="http",
            host=h.get("host"),
            port=_port(h["port"], container),
            path=h.get("path", "/") or "/",
            scheme=h.get("scheme", "HTTP"),
            headers=headers,
            **common,
        )
    if "tcpSocket" in spec:
        t = spec["tcpSocket"]
        return Probe(action="tcp", host=t.get("host"), port=_port(t["port"], container), **common)
    if "exec" in spec:
        return Probe(action="exec", command=tuple(spec["exec"].get("command", [])), **common)
    raise ProbeSpecError(f"unsupported {kind} probe {sorted(spec)} (grpc is not implemented)")


@dataclass(frozen=True)
class State:
    """What the runner remembers about one probe of one container run."""

    result: bool
    successes: int = 0
    failures: int = 0
    last_run: float | None = None
    in_flight: bool = False


def initial(kind: Kind) -> State:
    return State(result=kind == "liveness")


def due(probe: Probe, state: State, started_at: float, now: float) -> bool:
    """Should the probe run now? Never while a run is in flight."""
    if state.in_flight or now < started_at + probe.initial_delay_s:
        return False
    return state.last_run is None or now >= state.last_run + probe.period_s


def begin(state: State, now: float) -> State:
    return replace(state, in_flight=True, last_run=now)


def record(probe: Probe, state: State, ok: bool) -> State:
    """Account one finished run; the result flips only at a threshold."""
    if ok:
        successes, failures = state.successes + 1, 0
        result = True if successes >= probe.success_threshold else state.result
    else:
        successes, failures = 0, state.failures + 1
        result = False if failures >= probe.failure_threshold else state.result
    return State(result, successes, failures, state.last_run, in_flight=False)


def active(kind: Kind, startup_done: bool) -> bool:
    """Readiness and liveness probes are held off until the startup probe succeeds."""
    return kind == "startup" or startup_done
