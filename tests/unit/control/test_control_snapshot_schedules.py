"""The TopicSnapshotSchedule decision both controllers run (``control.snapshot_schedules``),
driven by the time passed in: no cron minute is waited for."""

from __future__ import annotations

import datetime as dt
from typing import Any

from headrace.control.snapshot_schedules import (
    SCHEDULE_LABEL,
    ScheduledSnapshot,
    snapshot_name,
    tick,
)
from headrace.resources.snapshots import SnapshotPhase, TopicSnapshotSchedule

CREATED_MS = int(dt.datetime(2026, 1, 1, 1, 30, tzinfo=dt.UTC).timestamp() * 1000)
JAN_1_0200 = int(dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.UTC).timestamp() * 1000)
DAY_MS = 86_400_000


def schedule(
    keep: int = 2, suspend: bool = False, last: str | None = None
) -> TopicSnapshotSchedule:
    doc: dict[str, Any] = {
        "apiVersion": "headrace.dev/v1alpha1",
        "kind": "TopicSnapshotSchedule",
        "metadata": {"name": "nightly", "namespace": "ns"},
        "spec": {"topicRef": {"name": "orders"}, "schedule": "0 2 * * *", "keep": keep},
    }
    if suspend:
        doc["spec"]["suspend"] = True
    if last is not None:
        doc["status"] = {"lastScheduleTime": last}
    return TopicSnapshotSchedule.model_validate(doc)


def ready(name: str) -> ScheduledSnapshot:
    return ScheduledSnapshot(name, SnapshotPhase.READY)


def test_nothing_is_due_before_the_first_time_after_creation() -> None:
    decided = tick(schedule(), 1, None, [], CREATED_MS, JAN_1_0200 - 60_000)
    assert decided.fire_ms is None and decided.create is None and decided.delete == []
    assert decided.status["conditions"][0]["reason"] == "Scheduled"
    assert "lastScheduleTime" not in decided.status


def test_the_due_time_makes_one_labelled_snapshot_named_after_it() -> None:
    decided = tick(schedule(), 1, None, [], CREATED_MS, JAN_1_0200 + 5000)
    assert decided.fire_ms == JAN_1_0200
    assert decided.create is not None
    assert decided.create["metadata"] == {
        "name": "nightly-202601010200",
        "namespace": "ns",
        "labels": {SCHEDULE_LABEL: "nightly"},
    }
    assert decided.create["spec"] == {"topicRef": {"name": "orders"}}
    assert decided.status["lastScheduleTime"] == "2026-01-01T02:00:00.000Z"
    assert decided.status["lastSnapshot"] == {"name": "nightly-202601010200"}
    assert decided.status["kept"] == []  # the new one is not Ready yet


def test_a_time_already_taken_is_not_taken_again() -> None:
    last = "2026-01-01T02:00:00Z"
    taken = [ready("nightly-202601010200")]
    for later in (JAN_1_0200 + 60_000, JAN_1_0200 + DAY_MS - 60_000):
        decided = tick(schedule(last=last), 1, None, taken, CREATED_MS, later)
        assert decided.create is None
    decided = tick(schedule(last=last), 1, None, taken, CREATED_MS, JAN_1_0200 + DAY_MS)
    assert decided.create is not None
    assert decided.create["metadata"]["name"] == "nightly-202601020200"


def test_only_the_newest_keep_ready_ones_and_the_last_failure_stay() -> None:
    snapshots = [
        ready(snapshot_name("nightly", JAN_1_0200 + day * DAY_MS)) for day in (0, 2, 3)
    ] + [
        ScheduledSnapshot(snapshot_name("nightly", JAN_1_0200 + DAY_MS), SnapshotPhase.FAILED),
        ScheduledSnapshot(
            snapshot_name("nightly", JAN_1_0200 + 4 * DAY_MS), SnapshotPhase.FAILED, why="gone"
        ),
        ScheduledSnapshot(snapshot_name("nightly", JAN_1_0200 + 5 * DAY_MS), None),
    ]
    decided = tick(schedule(suspend=True), 1, None, snapshots, CREATED_MS, JAN_1_0200 + 6 * DAY_MS)
    assert decided.create is None
    assert sorted(decided.delete) == ["nightly-202601010200", "nightly-202601020200"]
    assert decided.status["kept"] == [
        {"name": "nightly-202601030200"},
        {"name": "nightly-202601040200"},
    ]
    assert decided.status["lastFailure"] == "nightly-202601050200: gone"
    assert decided.status["conditions"][0]["reason"] == "LastSnapshotFailed"


def test_one_being_deleted_is_neither_deleted_again_nor_kept() -> None:
    snapshots = [
        ScheduledSnapshot("nightly-202601010200", SnapshotPhase.READY, deleting=True),
        ready("nightly-202601020200"),
        ready("nightly-202601030200"),
    ]
    decided = tick(schedule(suspend=True), 1, None, snapshots, CREATED_MS, JAN_1_0200)
    assert decided.delete == []
    assert [k["name"] for k in decided.status["kept"]] == [
        "nightly-202601020200",
        "nightly-202601030200",
    ]


def test_a_due_time_is_skipped_while_a_snapshot_is_pending() -> None:
    pending = [ScheduledSnapshot("nightly-202512310200", SnapshotPhase.PENDING)]
    decided = tick(schedule(), 1, None, pending, CREATED_MS, JAN_1_0200 + 5000)
    assert decided.fire_ms == JAN_1_0200
    assert decided.create is None
    assert decided.skipped_for == "nightly-202512310200"
    assert decided.status["lastScheduleTime"] == "2026-01-01T02:00:00.000Z"  # skipped, not owed


def test_the_ready_condition_keeps_its_transition_time_while_its_status_stays() -> None:
    first = tick(schedule(), 3, None, [], CREATED_MS, JAN_1_0200 - 60_000)
    previous = first.status["conditions"][0]
    later = tick(schedule(), 3, previous, [], CREATED_MS, JAN_1_0200 - 1000)
    assert later.status["conditions"][0]["lastTransitionTime"] == previous["lastTransitionTime"]
    assert later.status["observedGeneration"] == 3
