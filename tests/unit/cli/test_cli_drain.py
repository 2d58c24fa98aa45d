"""``headrace drain``: ask, then poll until nothing movable is led or the deadline passes."""

from __future__ import annotations

from typing import Any

from headrace.cli.drain import drain, drain_finished
from headrace.operator import workloads


class FakeBroker:
    def __init__(self, reports: list[dict[str, Any]]) -> None:
        self.reports = reports
        self.calls: list[tuple[str, str]] = []

    def __call__(self, url: str, method: str, timeout_s: float) -> dict[str, Any]:
        self.calls.append((method, url))
        return self.reports.pop(0) if len(self.reports) > 1 else self.reports[0]


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def report(movable: list[str], leading: list[str] | None = None) -> dict[str, Any]:
    return {"brokerId": 2, "draining": True, "movable": movable, "leading": leading or movable}


def test_it_waits_until_the_broker_leads_nothing_it_could_hand_off() -> None:
    broker = FakeBroker([report(["t/0", "t/1"]), report(["t/1"]), report([], ["solo/0"])])
    time = FakeTime()
    finished, last = drain("http://b:9644/", 10, clock=time.clock, sleep=time.sleep, call=broker)
    assert finished and last["leading"] == ["solo/0"]  # no in-sync peer: it keeps that one
    assert broker.calls[0] == ("POST", "http://b:9644/v1/drain")
    assert {m for m, _ in broker.calls[1:]} == {"GET"}


def test_it_gives_up_at_the_deadline() -> None:
    broker = FakeBroker([report(["t/0"])])
    time = FakeTime()
    finished, _ = drain("http://b:9644", 2, clock=time.clock, sleep=time.sleep, call=broker)
    assert not finished and time.now == 2


def test_not_draining_is_never_finished() -> None:
    assert not drain_finished({"draining": False, "movable": []})


def test_the_broker_pod_drains_in_its_pre_stop_hook_within_the_grace_period() -> None:
    settings = workloads.WorkloadSettings(termination_grace_seconds=30)
    command = workloads.drain_command(settings)
    assert command[:2] == ["headrace", "drain"]
    assert int(command[command.index("--timeout") + 1]) < 30
