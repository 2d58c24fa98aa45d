"""Unload documents: the CR shape, times, exact round trips, and the local state store."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.control import documents
from headrace.control.looping import ControlLoop
from headrace.control.model import (
    MovePhase,
    MoveProgress,
    RecoverySource,
    UnloadPhase,
    UnloadProgress,
)
from headrace.controller.store import FileStore
from headrace.errors import InvalidRequest
from headrace.resources import Unload

NOW = "2026-01-02T03:04:05Z"


def document(progress: UnloadProgress) -> dict[str, Any]:
    return {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "Unload",
        "metadata": {"name": "move", "namespace": "default", "generation": 1},
        "spec": {"topicRef": {"name": "orders"}, "partitions": [0, 1], "targetBroker": 2},
        "status": documents.unload_status(progress, 1, None, NOW),
    }


RICH = UnloadProgress(
    "default/move",
    UnloadPhase.MOVING,
    (
        MoveProgress(
            0,
            MovePhase.COMPLETED,
            from_broker=0,
            to_broker=2,
            sealed_offset=21,
            moves=1,
            verified=False,
            verification_message="stored segments end at 20, sealed at 21",
            checked_ms=1_767_323_045_123,
        ),
        MoveProgress(
            1,
            MovePhase.SEALING,
            from_broker=1,
            moves=4,
            recovery_source=RecoverySource.OBJECT_STORE,
            recovery_message="owner 1 died mid-seal; ...",
            deadline_ms=1_767_323_050_001,
            message="no live replica can seal it",
        ),
        MoveProgress(2),
    ),
    started_ms=1_767_323_040_000,
    message="1 of 3 partition(s) moved",
)


def test_the_status_has_the_unload_status_shape_and_validates() -> None:
    doc = document(RICH)
    resource = Unload.from_manifest(doc)
    assert resource.status is not None
    assert resource.status.phase is not None and resource.status.phase.value == "Moving"
    status = doc["status"]
    assert status["startedAt"] == "2026-01-02T03:04:00.000Z"
    assert "completedAt" not in status
    assert status["conditions"] == [
        {
            "type": "Ready",
            "status": "False",
            "observedGeneration": 1,
            "reason": "Moving",
            "message": "1 of 3 partition(s) moved",
            "lastTransitionTime": NOW,
        }
    ]
    assert status["moves"][0] == {
        "partition": 0,
        "fromBroker": 0,
        "toBroker": 2,
        "sealedOffset": 21,
        "phase": "Completed",
        "moves": 1,
        "verification": {
            "result": "Failed",
            "checkedAt": "2026-01-02T03:04:05.123Z",
            "message": "stored segments end at 20, sealed at 21",
        },
    }
    assert status["moves"][1]["recovery"] == {
        "source": "ObjectStore",
        "message": "owner 1 died mid-seal; ...",
    }
    assert status["moves"][1]["recoveryDeadline"] == "2026-01-02T03:04:10.001Z"
    assert status["moves"][2] == {"partition": 2, "phase": "Pending"}


def test_status_and_progress_round_trip_exactly() -> None:
    doc = document(RICH)
    assert documents.progress_of("default/move", doc["status"]) == RICH


def test_ready_keeps_its_transition_time_while_its_status_holds() -> None:
    first = documents.unload_status(RICH, 1, None, NOW)["conditions"][0]
    later = documents.unload_status(RICH, 1, first, "2030-01-01T00:00:00Z")["conditions"][0]
    assert later["lastTransitionTime"] == NOW
    done = UnloadProgress("default/move", UnloadPhase.COMPLETED, completed_ms=5)
    flipped = documents.unload_status(done, 1, first, "2030-01-01T00:00:00Z")["conditions"][0]
    assert (flipped["status"], flipped["lastTransitionTime"]) == ("True", "2030-01-01T00:00:00Z")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 253_402_300_799_999))  # through 9999-12-31
def test_millisecond_times_round_trip(ms: int) -> None:
    text = documents.rfc3339(ms)
    assert text.endswith("Z")
    assert documents.epoch_ms(text) == ms


def test_times_without_an_offset_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="no UTC offset"):
        documents.epoch_ms("2026-01-02T03:04:05")
    with pytest.raises(InvalidRequest, match="not an RFC 3339 time"):
        documents.epoch_ms("yesterday")


def test_an_unreadable_status_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequest, match="unload default/x: unreadable status"):
        documents.progress_of("default/x", {"phase": "Dancing"})


def test_the_request_of_a_document() -> None:
    doc = document(RICH)
    request = documents.unload_request(doc)
    assert (request.name, request.topic, request.partitions, request.target) == (
        "default/move",
        "default/orders",
        (0, 1),
        2,
    )
    assert not request.cancelled
    doc["metadata"]["deletionTimestamp"] = NOW
    assert documents.unload_request(doc).cancelled


class _NoFleet:
    async def poll(self) -> dict[int, Any]:
        return {}

    async def push(self, broker_id: int, topology: Any) -> int | None:
        return None


class _Clock:
    def now_ms(self) -> int:
        return 0


def loop_over(path: Any) -> ControlLoop:
    return ControlLoop(FileStore(path), _NoFleet(), _Clock())


async def test_saved_documents_are_loaded_back(tmp_path: Any) -> None:
    doc = document(RICH)
    resource = {k: v for k, v in doc.items() if k != "status"}
    FileStore(tmp_path).put("unloads", resource)
    s = loop_over(tmp_path)
    s.progress["default/move"] = RICH
    await s.save_unloads(documents.epoch_ms(NOW))
    written = (tmp_path / "unloads" / "default.move.json").stat().st_mtime_ns
    await s.save_unloads(documents.epoch_ms("2031-01-01T00:00:00Z"))
    assert (tmp_path / "unloads" / "default.move.json").stat().st_mtime_ns == written, (
        "an unchanged document is not rewritten"
    )
    again = loop_over(tmp_path)
    resources, progress = again.unloads, again.progress
    assert resources == {"default/move": resource}
    assert progress == {"default/move": RICH}
    await s.store.release_unload("default/move")
    assert not (tmp_path / "unloads" / "default.move.json").exists()
