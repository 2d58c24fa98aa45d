"""The runner's termination messages: what a container writes to its
``terminationMessagePath`` (mapped to a file of the pod's) is its terminated state's
``message``; with ``FallbackToLogsOnError`` a failed container without one gets its
log's tail."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from e2e.testbed import podspec
from e2e.testbed.kubelet import ContainerRun


def run(tmp_path: Path, script: str, **spec: Any) -> str:
    container = ContainerRun({"name": "job", **spec}, is_init=False, previous=None)
    container.termination_file = tmp_path / "termination" / "job"
    container.termination_file.parent.mkdir(parents=True, exist_ok=True)
    container.termination_file.write_bytes(b"")
    process = podspec.Process(
        ["sh", "-c", script.replace("RESULT", str(container.termination_file))], {}, None, []
    )
    container.start(tmp_path, process)
    deadline = time.monotonic() + 10
    while not container.poll():
        assert time.monotonic() < deadline, "the container did not exit"
        time.sleep(0.01)
    assert container.view.terminated is not None
    return container.view.terminated.message


def test_the_message_file_is_the_terminated_message(tmp_path: Path) -> None:
    assert run(tmp_path, "printf '{\"ok\": true}' > RESULT") == '{"ok": true}'


def test_a_failure_without_a_message_falls_back_to_the_log(tmp_path: Path) -> None:
    script = "echo starting; echo boom >&2; exit 2"
    assert run(tmp_path, script, terminationMessagePolicy="FallbackToLogsOnError") == (
        "starting\nboom"
    )
    assert run(tmp_path, script) == ""  # File policy: the file alone
