"""The control loop tells when a cohort has no member on a partition's leader for long."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from headrace.control.looping import UNCOVERED_WARN_MS, ControlLoop
from headrace.controller.store import FileStore


class _NoFleet:
    async def poll(self) -> dict[int, Any]:
        return {}

    async def push(self, broker_id: int, topology: Any) -> int | None:
        return None


class _Clock:
    def now_ms(self) -> int:
        return 0


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_lasting_gap_is_warned_once_naming_the_partitions_and_their_leaders(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loop = ControlLoop(FileStore(tmp_path), _NoFleet(), _Clock())
    gap = {"default/orders:billing": {0: [0, 3], 2: [2]}}
    with caplog.at_level(logging.INFO, logger="headrace.control.looping"):
        loop._note_uncovered(gap, 1_000)
        loop._note_uncovered(gap, 1_000 + UNCOVERED_WARN_MS - 1)
        assert warnings_of(caplog) == [], "a leader change causes a moment of this"
        loop._note_uncovered(gap, 1_000 + UNCOVERED_WARN_MS)
        loop._note_uncovered(gap, 1_000 + 2 * UNCOVERED_WARN_MS)
        (warning,) = warnings_of(caplog)
        assert "cohort default/orders:billing" in warning
        assert "partitions 0, 3 (leader broker 0)" in warning
        assert "partitions 2 (leader broker 2)" in warning
        loop._note_uncovered({"default/orders:billing": {0: [0, 3]}}, 1_000 + 3 * UNCOVERED_WARN_MS)
        assert len(warnings_of(caplog)) == 2, "what is missing changed: said again"
        loop._note_uncovered({}, 1_000 + 4 * UNCOVERED_WARN_MS)
        assert any("on every partition's leader again" in r.getMessage() for r in caplog.records)
        loop._note_uncovered(gap, 1_000 + 5 * UNCOVERED_WARN_MS)
        assert len(warnings_of(caplog)) == 2, "a new gap waits out the delay again"
