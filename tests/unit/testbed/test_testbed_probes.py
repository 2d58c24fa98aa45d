"""probes: scheduling and threshold accounting with a fake clock."""

from __future__ import annotations

import pytest

from e2e.testbed import probes

CONTAINER = {"ports": [{"name": "http", "containerPort": 8080}]}


def test_parse_http_with_named_port_and_defaults() -> None:
    p = probes.parse("readiness", {"httpGet": {"port": "http", "path": "/ready"}}, CONTAINER)
    assert p is not None
    assert (p.action, p.port, p.path, p.period_s, p.timeout_s) == ("http", 8080, "/ready", 10, 1)
    assert (p.success_threshold, p.failure_threshold) == (1, 3)


def test_parse_rejects_unknown_port_and_grpc() -> None:
    with pytest.raises(probes.ProbeSpecError):
        probes.parse("liveness", {"tcpSocket": {"port": "nope"}}, CONTAINER)
    with pytest.raises(probes.ProbeSpecError):
        probes.parse("liveness", {"grpc": {"port": 1}}, CONTAINER)
    assert probes.parse("liveness", None, CONTAINER) is None


def test_initial_results_follow_the_kubelet() -> None:
    assert probes.initial("readiness").result is False
    assert probes.initial("startup").result is False
    assert probes.initial("liveness").result is True


def test_due_respects_initial_delay_period_and_in_flight() -> None:
    p = probes.Probe(kind="readiness", action="tcp", initial_delay_s=5, period_s=2)
    s = probes.initial("readiness")
    assert not probes.due(p, s, started_at=100, now=104.9)
    assert probes.due(p, s, started_at=100, now=105)
    s = probes.begin(s, 105)
    assert not probes.due(p, s, 100, 110)  # still in flight
    s = probes.record(p, s, ok=True)
    assert not probes.due(p, s, 100, 106.9)
    assert probes.due(p, s, 100, 107)


def test_thresholds_flip_the_result() -> None:
    p = probes.Probe(kind="readiness", action="tcp", success_threshold=2, failure_threshold=3)
    s = probes.initial("readiness")
    s = probes.record(p, s, True)
    assert s.result is False
    s = probes.record(p, s, True)
    assert s.result is True
    s = probes.record(p, s, False)
    s = probes.record(p, s, False)
    assert s.result is True
    s = probes.record(p, s, True)  # a success resets the failure run
    s = probes.record(p, s, False)
    s = probes.record(p, s, False)
    assert s.result is True
    s = probes.record(p, s, False)
    assert s.result is False


def test_startup_probe_gates_the_others() -> None:
    assert probes.active("startup", startup_done=False)
    assert not probes.active("liveness", startup_done=False)
    assert probes.active("readiness", startup_done=True)
