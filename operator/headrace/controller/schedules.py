"""TopicSnapshotSchedules in local mode: the controller's adapter over
``control.snapshot_schedules.tick``, as ``operator.snapshot_handlers`` is the kopf one.

Every ``TICK_S`` it reads the schedules and their TopicSnapshots from the state directory
(``controller.store``: ``apply -f`` writes them there), asks ``tick`` what to do at the
schedule clock's time, and does it:

* a snapshot that is due is written there as a TopicSnapshot (labelled with its schedule,
  phase ``Pending``) and run as ``headrace apply -f -`` against the local cluster's
  directory, in a process of its own, as the operator runs a Job: the CLI takes it
  (``cli.snapshots``, idempotent: ``take_once``) and writes its status. A process that
  exits without having written Ready or Failed leaves it Failed, naming the log
  (``<dir>/logs/schedules.log``);
* one to delete is marked (``metadata.deletionTimestamp``, as a finalizer would keep it)
  and deleted by ``headrace delete -f -``, which deletes its document in the store (its
  objects are no longer pinned) and then the resource;
* the schedule's status is written.

A schedule's snapshot left Pending or marked for deletion with no process running for it
(the controller restarted mid-run, a delete that failed) is run again at the next tick.

The clock: the wall clock, or one ``rate`` times faster from the controller's start
(``--schedule-clock-rate``, for tests: a minutely schedule then fires every few seconds).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from headrace.aio import cancel_and_wait
from headrace.control import snapshot_schedules
from headrace.control.documents import condition, condition_time, epoch_ms, full_name
from headrace.control.looping import Clock
from headrace.controller.store import SCHEDULES, SNAPSHOTS, FileStore, admitted
from headrace.resources.meta import READY
from headrace.resources.snapshots import SnapshotPhase, TopicSnapshot, TopicSnapshotSchedule

log = logging.getLogger(__name__)

#: seconds between two looks at the schedules (a snapshot is taken at most this late); a
#: look reads a few files
TICK_S: Final = 1.0
#: where the snapshot and delete processes write, under the local cluster's directory
LOG_FILE: Final = Path("logs") / "schedules.log"


def _wall_ms() -> float:
    return time.time() * 1000


@dataclass(frozen=True, slots=True)
class ScheduleClock:
    """Schedule time in ms: the wall clock (``wall_ms``) when ``rate`` is 1, else running
    ``rate`` times faster from ``started_ms``."""

    rate: float = 1.0
    wall_ms: Callable[[], float] = _wall_ms
    started_ms: int = field(default_factory=lambda: int(_wall_ms()))

    def now_ms(self) -> int:
        real = self.wall_ms()
        return int(self.started_ms + (real - self.started_ms) * self.rate)


def _phase(doc: dict[str, Any]) -> SnapshotPhase | None:
    raw = (doc.get("status") or {}).get("phase")
    return None if raw is None else SnapshotPhase(raw)


def _ready_message(doc: dict[str, Any]) -> str:
    conditions = (doc.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == READY), None)
    return "" if ready is None else str(ready.get("message", ""))


def scheduled(doc: dict[str, Any]) -> snapshot_schedules.ScheduledSnapshot:
    """A schedule's TopicSnapshot document as the schedule's decision reads it."""
    return snapshot_schedules.ScheduledSnapshot(
        doc["metadata"]["name"],
        _phase(doc),
        deleting=bool(doc["metadata"].get("deletionTimestamp")),
        why=_ready_message(doc),
    )


def _schedule_of(doc: dict[str, Any]) -> str | None:
    """'namespace/schedule' of a TopicSnapshot one took, None for one applied by hand."""
    meta = doc.get("metadata", {})
    schedule = (meta.get("labels") or {}).get(snapshot_schedules.SCHEDULE_LABEL)
    return None if schedule is None else f"{meta.get('namespace', 'default')}/{schedule}"


def _manifest(doc: dict[str, Any]) -> dict[str, Any]:
    """What ``apply -f`` and ``delete -f`` are given: the resource without its status."""
    meta = doc["metadata"]
    return {
        "apiVersion": doc["apiVersion"],
        "kind": doc["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace", "default"),
            "labels": meta.get("labels") or {},
        },
        "spec": doc["spec"],
    }


class LocalSchedules:
    """Runs the TopicSnapshotSchedules of ``store`` against the cluster in ``local_dir``."""

    def __init__(self, store: FileStore, local_dir: Path, clock: Clock) -> None:
        self.store = store
        self.local_dir = local_dir
        self.clock = clock
        #: the process running for each TopicSnapshot ('namespace/name')
        self.running: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._loop, *self.running.values()) if t is not None]
        for task in tasks:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            try:
                self.step()
            except Exception:
                log.exception("TopicSnapshotSchedules: a tick failed")
            await asyncio.sleep(TICK_S)

    def step(self) -> None:
        """One look at every schedule, then a process for each of their snapshots that
        needs one and has none."""
        self.decide()
        self.launch()

    def decide(self) -> None:
        """Tick every schedule at the clock's time: write the snapshots due, mark the ones
        to delete, write the schedules' statuses (no process is started)."""
        now_ms = self.clock.now_ms()
        snapshots = self.store.documents(SNAPSHOTS)
        for doc in self.store.documents(SCHEDULES):
            self._tick(doc, [s for s in snapshots if _schedule_of(s) == full_name(doc)], now_ms)

    def launch(self) -> None:
        """A process for each schedule's snapshot that waits for one: to take it (Pending)
        or to delete it (marked)."""
        for doc in self.store.documents(SNAPSHOTS):
            name = full_name(doc)
            if _schedule_of(doc) is None or name in self.running:
                continue
            if doc["metadata"].get("deletionTimestamp"):
                self._launch(name, "delete", doc)
            elif _phase(doc) in (None, SnapshotPhase.PENDING):
                self._launch(name, "apply", doc)

    def _tick(self, doc: dict[str, Any], snapshots: list[dict[str, Any]], now_ms: int) -> None:
        name = full_name(doc)
        try:
            schedule = TopicSnapshotSchedule.model_validate(doc)
        except ValidationError:
            log.warning("TopicSnapshotSchedule %s does not parse: not run", name)
            return
        meta = doc["metadata"]
        conditions = (doc.get("status") or {}).get("conditions") or []
        created = meta.get("creationTimestamp")
        decided = snapshot_schedules.tick(
            schedule,
            int(meta.get("generation", 1)),
            next((c for c in conditions if c.get("type") == READY), None),
            [scheduled(s) for s in snapshots],
            epoch_ms(created) if created else now_ms,
            now_ms,
        )
        real_now = condition_time(int(time.time() * 1000))
        if decided.create is not None:
            created_doc = admitted(decided.create, None, real_now)
            snapshot = full_name(created_doc)
            self.store.put(SNAPSHOTS, created_doc)
            self.store.write_status(
                SNAPSHOTS, snapshot, _pending(created_doc, "scheduled", real_now)
            )
            log.info("TopicSnapshotSchedule %s: TopicSnapshot %s created", name, snapshot)
        elif decided.skipped_for is not None:
            log.info(
                "TopicSnapshotSchedule %s: a due time skipped, %s is not done",
                name,
                decided.skipped_for,
            )
        for old in decided.delete:
            found = self.store.document(SNAPSHOTS, f"{meta.get('namespace', 'default')}/{old}")
            if found is not None:
                found["metadata"]["deletionTimestamp"] = real_now
                self.store.put(SNAPSHOTS, found)
        self.store.write_status(SCHEDULES, name, decided.status)

    def _launch(self, name: str, verb: str, doc: dict[str, Any]) -> None:
        self.running[name] = asyncio.create_task(self._process(name, verb, doc))

    async def _process(self, name: str, verb: str, doc: dict[str, Any]) -> None:
        """``headrace VERB -f -`` of the TopicSnapshot; a snapshot the process left
        unfinished is Failed, naming the log."""
        log_path = self.local_dir / LOG_FILE
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log_path.open("ab") as out:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "headrace.cli.main",
                    verb,
                    "-f",
                    "-",
                    "--dir",
                    str(self.local_dir),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                )
                await process.communicate(json.dumps(_manifest(doc)).encode())
            status = process.returncode
            if verb == "apply" and status != 0:
                now = self.store.document(SNAPSHOTS, name)
                if now is not None and _phase(now) in (None, SnapshotPhase.PENDING):
                    why = f"headrace apply exited {status}; see {log_path}"
                    self.store.write_status(
                        SNAPSHOTS, name, _failed(now, why, condition_time(int(time.time() * 1000)))
                    )
            elif status != 0:
                log.warning("TopicSnapshot %s: headrace delete exited %s", name, status)
        finally:
            self.running.pop(name, None)


def _status(doc: dict[str, Any], phase: SnapshotPhase, message: str, now: str) -> dict[str, Any]:
    generation = int(doc["metadata"].get("generation", 1))
    conditions = (doc.get("status") or {}).get("conditions") or []
    previous = next((c for c in conditions if c.get("type") == READY), None)
    ready = "True" if phase is SnapshotPhase.READY else "False"
    status = {
        "observedGeneration": generation,
        "phase": str(phase),
        "conditions": [condition(READY, ready, str(phase), message, generation, previous, now)],
    }
    TopicSnapshot.model_validate({**doc, "status": status})  # the operator's shape
    return status


def _pending(doc: dict[str, Any], message: str, now: str) -> dict[str, Any]:
    return _status(doc, SnapshotPhase.PENDING, message, now)


def _failed(doc: dict[str, Any], message: str, now: str) -> dict[str, Any]:
    return _status(doc, SnapshotPhase.FAILED, message, now)
