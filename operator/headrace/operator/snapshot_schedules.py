"""TopicSnapshotSchedule -> TopicSnapshots, the ones to delete, and the schedule's status
(pure: decisions from the parsed schedule, its snapshots as stored and the time passed in;
``snapshot_handlers`` applies them on a kopf timer).

**When.** At each tick the latest time the cron schedule fired (``resources.cron``) is
due if it is later than the schedule's ``lastScheduleTime`` (or, before its first
snapshot, its creation): a schedule takes the latest time it missed, once, as a
CronJob does. The TopicSnapshot it creates is named after the schedule and that time
(``<schedule>-<YYYYMMDDHHMM>``, UTC), so creating it again (a restart between the create
and the status write) is a no-op, never a second snapshot. It is labelled with the
schedule and not owned by it: deleting the schedule keeps the snapshots taken.

**How many.** The newest ``keep`` Ready snapshots of the schedule stay; older Ready ones
are deleted (their finalizer deletes the documents). Of the failed ones only the most
recent stays, to say why. Pending ones are left alone, and while one is, a due time is
skipped (Event ``SnapshotSkipped``), as a CronJob's ``Forbid`` skips a run.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Final

from headrace.control.documents import API_VERSION, condition, epoch_ms, rfc3339
from headrace.operator import bodies
from headrace.operator.bodies import Parsed
from headrace.resources.cron import latest_fire
from headrace.resources.meta import READY
from headrace.resources.snapshots import SnapshotPhase, TopicSnapshot, TopicSnapshotSchedule

SCHEDULE_LABEL: Final = "headrace.dev/topic-snapshot-schedule"
#: seconds between two looks at a schedule (a snapshot is taken at most this late)
TICK_S: Final = 10.0


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


def unfinished(snapshots: Sequence[Parsed[TopicSnapshot]]) -> str | None:
    """The name of a snapshot of the schedule that is neither Ready nor Failed yet: a due
    time is skipped while one is (as a CronJob's ``Forbid``), so a topic that cannot be
    snapshotted (missing, its cluster down) does not pile up a snapshot a tick."""
    for snapshot in _by_time(snapshots):
        if _phase(snapshot) not in (SnapshotPhase.READY, SnapshotPhase.FAILED):
            return snapshot.meta.name
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


def _phase(snapshot: Parsed[TopicSnapshot]) -> SnapshotPhase | None:
    status = None if snapshot.resource is None else snapshot.resource.status
    return None if status is None else status.phase


def _by_time(snapshots: Sequence[Parsed[TopicSnapshot]]) -> list[Parsed[TopicSnapshot]]:
    # the names end in the scheduled time, fixed-width: their order is the time order
    return sorted(snapshots, key=lambda s: s.meta.name)


def to_delete(snapshots: Sequence[Parsed[TopicSnapshot]], keep: int) -> list[str]:
    """The schedule's snapshots to delete: Ready ones beyond the newest ``keep``, failed ones
    but the most recent."""
    ordered = _by_time([s for s in snapshots if not s.meta.deleting])
    ready = [s.meta.name for s in ordered if _phase(s) == SnapshotPhase.READY]
    failed = [s.meta.name for s in ordered if _phase(s) == SnapshotPhase.FAILED]
    return ready[: max(0, len(ready) - keep)] + failed[:-1]


def schedule_status(
    stored: Parsed[TopicSnapshotSchedule],
    schedule: TopicSnapshotSchedule,
    snapshots: Sequence[Parsed[TopicSnapshot]],
    fired_ms: int | None,
    now: str,
) -> dict[str, Any]:
    """The schedule's status: its latest time and snapshot, the Ready ones it keeps (of
    ``snapshots``: those that stay), and whether its latest finished snapshot failed."""
    generation = stored.meta.generation
    status: dict[str, Any] = {"observedGeneration": generation}
    scheduled = None if schedule.status is None else schedule.status.last_schedule_time
    last = None if scheduled is None else rfc3339(epoch_ms(scheduled.isoformat()))
    if fired_ms is not None and (last is None or epoch_ms(last) < fired_ms):
        last = rfc3339(fired_ms)
    if last is not None:
        status["lastScheduleTime"] = last
    ordered = _by_time(snapshots)
    if ordered:
        status["lastSnapshot"] = {"name": ordered[-1].meta.name}
    status["kept"] = [{"name": s.meta.name} for s in ordered if _phase(s) == SnapshotPhase.READY]
    finished = [s for s in ordered if _phase(s) in (SnapshotPhase.READY, SnapshotPhase.FAILED)]
    failed = bool(finished) and _phase(finished[-1]) == SnapshotPhase.FAILED
    if failed:
        last_status = bodies.stored_status(finished[-1])
        ready_now = None if last_status is None else last_status.condition(READY)
        why = "" if ready_now is None else ready_now.message
        status["lastFailure"] = f"{finished[-1].meta.name}: {why}"[:4096]
        ready = ("False", "LastSnapshotFailed", status["lastFailure"])
    elif schedule.spec.suspend:
        ready = ("True", "Suspended", "takes no new snapshots while suspended")
    else:
        spec = schedule.spec
        what = f"{spec.topic_ref.name} at {spec.schedule!r} (UTC), the newest {spec.keep} kept"
        ready = ("True", "Scheduled", f"snapshots of {what}")
    previous = bodies.stored_condition(stored, READY)
    status["conditions"] = [condition("Ready", *ready, generation, previous, now)]
    return status
