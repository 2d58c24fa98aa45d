"""podstatus: phases, restart decisions, conditions."""

from __future__ import annotations

import pytest

from e2e.testbed import podstatus
from e2e.testbed.podstatus import ContainerView, Terminated


def running(name: str = "c") -> ContainerView:
    return ContainerView(name=name, image="i", state="running", started_at="t")


def waiting(name: str = "c", last: Terminated | None = None) -> ContainerView:
    return ContainerView(name=name, image="i", state="waiting", last_terminated=last)


def done(code: int, name: str = "c") -> ContainerView:
    t = podstatus.terminated(code, "t0", "t1")
    return ContainerView(name=name, image="i", state="terminated", terminated=t)


@pytest.mark.parametrize(
    ("init", "regular", "policy", "expected"),
    [
        ([], [waiting()], "Always", "Pending"),
        ([], [running(), waiting("d")], "Always", "Pending"),
        ([], [running()], "Never", "Running"),
        ([], [done(0)], "Never", "Succeeded"),
        ([], [done(1)], "Never", "Failed"),
        ([], [done(0), done(1, "d")], "Never", "Failed"),
        ([], [done(1)], "OnFailure", "Running"),
        ([], [done(0)], "OnFailure", "Succeeded"),
        ([], [done(0)], "Always", "Running"),
        ([], [running(), done(1, "d")], "Never", "Running"),
        ([], [waiting(last=Terminated(1, "Error", None, "t"))], "Always", "Running"),
        ([running("i")], [waiting()], "Always", "Pending"),
        ([done(1, "i")], [waiting()], "Never", "Failed"),
        ([done(1, "i")], [waiting()], "OnFailure", "Pending"),
        ([done(0, "i")], [running()], "Always", "Running"),
    ],
)
def test_phase(
    init: list[ContainerView],
    regular: list[ContainerView],
    policy: podstatus.RestartPolicy,
    expected: str,
) -> None:
    assert podstatus.phase(init, regular, policy) == expected


def test_restart_decisions_and_backoff() -> None:
    assert podstatus.should_restart("Always", 0)
    assert podstatus.should_restart("OnFailure", 2)
    assert not podstatus.should_restart("OnFailure", 0)
    assert not podstatus.should_restart("Never", 1)
    assert [podstatus.backoff_s(n, 2, 10) for n in range(5)] == [0, 2, 4, 8, 10]


def test_conditions_keep_transition_times_and_foreign_conditions() -> None:
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"}
    first = podstatus.conditions(
        [scheduled],
        pod_phase="Running",
        initialized=True,
        containers_ready=False,
        sandbox_ready=True,
        now="t1",
    )
    by = {c["type"]: c for c in first}
    assert by["PodScheduled"] == scheduled
    assert by["Ready"]["status"] == "False"
    assert by["Ready"]["reason"] == "ContainersNotReady"
    second = podstatus.conditions(
        first,
        pod_phase="Running",
        initialized=True,
        containers_ready=True,
        sandbox_ready=True,
        now="t2",
    )
    by2 = {c["type"]: c for c in second}
    assert by2["Ready"] == {
        "type": "Ready",
        "status": "True",
        "lastProbeTime": None,
        "lastTransitionTime": "t2",
        "reason": None,
    }
    assert by2["Initialized"]["lastTransitionTime"] == "t1"
    final = podstatus.conditions(
        second,
        pod_phase="Succeeded",
        initialized=True,
        containers_ready=True,
        sandbox_ready=True,
        now="t3",
    )
    assert {c["type"]: c for c in final}["Ready"]["reason"] == "PodCompleted"


def test_container_status_shapes() -> None:
    assert running().to_api()["state"] == {"running": {"startedAt": "t"}}
    api = done(137).to_api()
    assert api["state"]["terminated"]["exitCode"] == 137
    assert api["state"]["terminated"]["signal"] == 9
    assert waiting(last=Terminated(1, "Error", None, "t")).to_api()["lastState"] == {
        "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "t"}
    }
