"""Local mode's TopicSnapshotSchedule adapter (``controller.schedules``) over the documents
in a real state directory, at schedule times passed in through its clock."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from headrace.control.snapshot_schedules import SCHEDULE_LABEL
from headrace.controller.schedules import LocalSchedules, ScheduleClock
from headrace.controller.store import SCHEDULES, SNAPSHOTS, FileStore
from tests.unit.controller.controller_fakes import ManualClock

V = "headrace.dev/v1alpha1"
JAN_1_0200 = int(dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.UTC).timestamp() * 1000)


def schedule_doc(keep: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "TopicSnapshotSchedule",
        "metadata": {
            "name": "nightly",
            "namespace": "default",
            "generation": 1,
            "creationTimestamp": "2026-01-01T01:00:00Z",
        },
        "spec": {"topicRef": {"name": "orders"}, "schedule": "0 2 * * *", "keep": keep},
    }


def snapshot_doc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "TopicSnapshot",
        "metadata": {"name": name, "namespace": "default", "labels": {SCHEDULE_LABEL: "nightly"}},
        "spec": {"topicRef": {"name": "orders"}},
    }


def test_a_due_snapshot_is_written_pending_and_one_beyond_keep_is_marked(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "controller")
    store.put(SCHEDULES, schedule_doc(keep=1))
    for name in ("nightly-202512300200", "nightly-202512310200"):
        store.put(SNAPSHOTS, snapshot_doc(name))
        store.write_status(SNAPSHOTS, f"default/{name}", {"phase": "Ready"})
    store.write_status(SCHEDULES, "default/nightly", {"lastScheduleTime": "2025-12-31T02:00:00Z"})
    schedules = LocalSchedules(store, tmp_path, ManualClock(JAN_1_0200 + 5000))
    schedules.decide()

    created = store.document(SNAPSHOTS, "default/nightly-202601010200")
    assert created is not None
    assert created["metadata"]["labels"] == {SCHEDULE_LABEL: "nightly"}
    assert created["status"]["phase"] == "Pending"
    oldest = store.document(SNAPSHOTS, "default/nightly-202512300200")
    assert oldest is not None and oldest["metadata"].get("deletionTimestamp")
    newer = store.document(SNAPSHOTS, "default/nightly-202512310200")
    assert newer is not None and not newer["metadata"].get("deletionTimestamp")
    status = store.document(SCHEDULES, "default/nightly")["status"]  # type: ignore[index]
    assert status["lastScheduleTime"] == "2026-01-01T02:00:00.000Z"
    assert status["kept"] == [{"name": "nightly-202512310200"}]

    # the next look, before the snapshot is done: nothing more is created or marked
    schedules.decide()
    assert sorted(d["metadata"]["name"] for d in store.documents(SNAPSHOTS)) == [
        "nightly-202512300200",
        "nightly-202512310200",
        "nightly-202601010200",
    ]


def test_the_schedule_clock_runs_rate_times_faster_from_its_start() -> None:
    wall = [JAN_1_0200]
    clock = ScheduleClock(rate=30.0, wall_ms=lambda: wall[0], started_ms=JAN_1_0200)
    assert clock.now_ms() == JAN_1_0200
    wall[0] += 2000
    assert clock.now_ms() == JAN_1_0200 + 60_000  # a minute of schedule time in 2 s
    assert ScheduleClock(wall_ms=lambda: wall[0], started_ms=JAN_1_0200).now_ms() == wall[0]
