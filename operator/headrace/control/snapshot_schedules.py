"""TopicSnapshotSchedule -> the TopicSnapshot to create, the ones to delete, and the
schedule's status (pure: one decision from the parsed schedule, its snapshots as stored
and the time passed in). Both controllers run it: the kopf operator on a timer
(``operator.snapshot_handlers``), local mode's controller on its own clock
(``controller.schedules``); each only lists, creates, deletes and writes what ``tick``
says.

**When.** At each tick the latest time the cron schedule fired (``resources.cron``) is
due if it is later than the schedule's ``lastScheduleTime`` (or, before its first
snapshot, its creation): a schedule takes the latest time it missed, once, as a
CronJob does. The TopicSnapshot it creates is named after the schedule and that time
(``<schedule>-<YYYYMMDDHHMM>``, UTC), so creating it again (a restart between the create
and the status write) is a no-op, never a second snapshot. It is labelled with the
schedule and not owned by it: deleting the schedule keeps the snapshots taken.

**How many.** The newest ``keep`` Ready snapshots of the schedule stay; older Ready ones
are deleted (deleting one deletes its document, so its objects are no longer pinned). Of
the failed ones only the most recent stays, to say why. Pending ones are left alone, and
while one is, a due time is skipped (``ScheduleTick.skipped_for``), as a CronJob's
``Forbid`` skips a run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from headrace.control.documents import API_VERSION, condition, condition_time, epoch_ms, rfc3339
from headrace.resources.cron import latest_fire
from headrace.resources.snapshots import SnapshotPhase, TopicSnapshotSchedule

SCHEDULE_LABEL: Final = "headrace.dev/topic-snapshot-schedule"


@dataclass(frozen=True, slots=True)
class ScheduledSnapshot:
    """One TopicSnapshot of a schedule, as the decision reads it."""

    name: str
    #: its status's phase; None before anything ran it
    phase: SnapshotPhase | None
    #: being deleted: neither kept nor deleted again
    deleting: bool = False
    #: its Ready condition's message (a failed one's reason)
    why: str = ""


@dataclass(frozen=True, slots=True)
class ScheduleTick:
    """What one tick of a schedule does."""

    #: the scheduled time (ms) due now, taken or skipped; None: none is due
    fire_ms: int | None
    #: the TopicSnapshot to create (None: none due, skipped, or it exists already)
    create: dict[str, Any] | None
    #: the pending snapshot a due time was skipped for
    skipped_for: str | None
    #: the names of the snapshots to delete
    delete: list[str]
    #: the schedule's new status
    status: dict[str, Any]


def _ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


def due(
    schedule: TopicSnapshotSchedule, last_schedule_ms: int | None, created_ms: int, now_ms: int
) -> int | None:
    """The scheduled time (ms) of the snapshot to take now, if one is due."""
    if schedule.spec.suspend:
        return None
    fired = latest_fire(schedule.spec.schedule, dt.datetime.fromtimestamp(now_ms / 1000, dt.UTC))
    if fired is None:
        return None
    floor = last_schedule_ms if last_schedule_ms is not None else created_ms
    return _ms(fired) if _ms(fired) > floor else None


def unfinished(snapshots: Sequence[ScheduledSnapshot]) -> str | None:
    """The name of a snapshot of the schedule that is neither Ready nor Failed yet: a due
    time is skipped while one is (as a CronJob's ``Forbid``), so a topic that cannot be
    snapshotted (missing, its cluster down) does not pile up a snapshot a tick."""
    for snapshot in _by_time(snapshots):
        if snapshot.phase not in (SnapshotPhase.READY, SnapshotPhase.FAILED):
            return snapshot.name
    return None


def snapshot_name(schedule_name: str, fire_ms: int) -> str:
    when = dt.datetime.fromtimestamp(fire_ms / 1000, dt.UTC)
    return f"{schedule_name}-{when:%Y%m%d%H%M}"


def snapshot_manifest(schedule: TopicSnapshotSchedule, fire_ms: int) -> dict[str, Any]:
    """The TopicSnapshot of the schedule's time ``fire_ms``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "TopicSnapshot",
        "metadata": {
            "name": snapshot_name(schedule.metadata.name, fire_ms),
            "namespace": schedule.metadata.namespace,
            "labels": {SCHEDULE_LABEL: schedule.metadata.name},
        },
        "spec": {"topicRef": {"name": schedule.spec.topic_ref.name}},
    }


def _by_time(snapshots: Sequence[ScheduledSnapshot]) -> list[ScheduledSnapshot]:
    # the names end in the scheduled time, fixed-width: their order is the time order
    return sorted(snapshots, key=lambda s: s.name)


def to_delete(snapshots: Sequence[ScheduledSnapshot], keep: int) -> list[str]:
    """The schedule's snapshots to delete: Ready ones beyond the newest ``keep``, failed ones
    but the most recent."""
    ordered = _by_time([s for s in snapshots if not s.deleting])
    ready = [s.name for s in ordered if s.phase == SnapshotPhase.READY]
    failed = [s.name for s in ordered if s.phase == SnapshotPhase.FAILED]
    return ready[: max(0, len(ready) - keep)] + failed[:-1]


def schedule_status(
    schedule: TopicSnapshotSchedule,
    generation: int,
    previous_ready: Mapping[str, Any] | None,
    snapshots: Sequence[ScheduledSnapshot],
    fired_ms: int | None,
    now: str,
) -> dict[str, Any]:
    """The schedule's status: its latest time and snapshot, the Ready ones it keeps (of
    ``snapshots``: those that stay), and whether its latest finished snapshot failed."""
    status: dict[str, Any] = {"observedGeneration": generation}
    scheduled = None if schedule.status is None else schedule.status.last_schedule_time
    last = None if scheduled is None else rfc3339(epoch_ms(scheduled.isoformat()))
    if fired_ms is not None and (last is None or epoch_ms(last) < fired_ms):
        last = rfc3339(fired_ms)
    if last is not None:
        status["lastScheduleTime"] = last
    ordered = _by_time(snapshots)
    if ordered:
        status["lastSnapshot"] = {"name": ordered[-1].name}
    status["kept"] = [{"name": s.name} for s in ordered if s.phase == SnapshotPhase.READY]
    finished = [s for s in ordered if s.phase in (SnapshotPhase.READY, SnapshotPhase.FAILED)]
    if finished and finished[-1].phase == SnapshotPhase.FAILED:
        status["lastFailure"] = f"{finished[-1].name}: {finished[-1].why}"[:4096]
        ready = ("False", "LastSnapshotFailed", status["lastFailure"])
    elif schedule.spec.suspend:
        ready = ("True", "Suspended", "takes no new snapshots while suspended")
    else:
        spec = schedule.spec
        what = f"{spec.topic_ref.name} at {spec.schedule!r} (UTC), the newest {spec.keep} kept"
        ready = ("True", "Scheduled", f"snapshots of {what}")
    status["conditions"] = [condition("Ready", *ready, generation, previous_ready, now)]
    return status


def tick(
    schedule: TopicSnapshotSchedule,
    generation: int,
    previous_ready: Mapping[str, Any] | None,
    snapshots: Sequence[ScheduledSnapshot],
    created_ms: int,
    now_ms: int,
) -> ScheduleTick:
    """One look at ``schedule`` at ``now_ms``, given its ``snapshots`` (those labelled with
    it) and when it was created: the snapshot to create if one is due and none is pending,
    the ones to delete, and the status to write (``previous_ready``: its stored Ready
    condition, whose transition time stays while its status does)."""
    last = None if schedule.status is None else schedule.status.last_schedule_time
    fire_ms = due(
        schedule, None if last is None else epoch_ms(last.isoformat()), created_ms, now_ms
    )
    skipped_for = None if fire_ms is None else unfinished(snapshots)
    create = None
    after = list(snapshots)
    if fire_ms is not None and skipped_for is None:
        name = snapshot_name(schedule.metadata.name, fire_ms)
        if all(s.name != name for s in snapshots):
            create = snapshot_manifest(schedule, fire_ms)
            after.append(ScheduledSnapshot(name, None))
    doomed = to_delete(after, schedule.spec.keep)
    # those being deleted are gone as far as the status says
    staying = [s for s in after if s.name not in doomed and not s.deleting]
    status = schedule_status(
        schedule, generation, previous_ready, staying, fire_ms, condition_time(now_ms)
    )
    return ScheduleTick(fire_ms, create, skipped_for, doomed, status)
