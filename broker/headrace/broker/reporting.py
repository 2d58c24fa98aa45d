"""The broker's journal of partition reports: what heartbeat polls are answered with.

Building every partition's report for every poll costs the broker, and the
controller that parses it, in proportion to the partitions: a megabyte of
JSON a second per broker at 10,000. The journal keeps the last
report of each hosted partition, numbered by the change that produced it
(``seq``), and answers a poller that says what it holds (``since``) with the
reports changed after that, and the partitions no longer hosted: a delta of a
few hundred bytes when nothing moves (``protocol.coordination.ReportJournal``).

Which reports may have changed: partitions are *marked* where their state
moves, and only marked ones are rebuilt at the next poll and compared with
the journal:

    what moves                          how the journal hears of it
    ----------------------------------  -------------------------------------------
    log end (leader or follower)        the partition's append listener
    high watermark                      the partition's HW listener
    live replica set                    ``LiveReplicasChanged`` (``Broker._on_event``)
    role, epoch, replicas, cutover      a placement marks every partition
    seal, upload, reopen (tiering)      the end of each tiering task
    local log start (retention)         the retention loop, when it deleted segments
    cohort cursors                      the partition's cursor listener
    truncation, reset (follower)        the fetcher, through ``Partition.appended``

A sweep over every partition every ``sweep_s`` (and before every full
report) catches whatever no mark announced, so such a change reaches the
controller at most that late.
Marks are cheap (a set insert) and sweeps rare, so an idle broker's
heartbeat costs the same at 10 or 10,000 partitions.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable

from headrace.broker.topics import Partition
from headrace.protocol.coordination import PartitionKey, PartitionReport, ReportJournal

#: how often every partition's report is rebuilt even if nothing marked it, seconds
SWEEP_S = 30.0


class PartitionReports:
    """The journal; ``answer`` is called once per poll, ``mark`` from anywhere on the loop."""

    def __init__(
        self,
        build: Callable[[Partition], PartitionReport],
        hosted: Callable[[], Iterable[Partition]],
        lookup: Callable[[str, int], Partition | None],
        *,
        sweep_s: float = SWEEP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: a partition's report as the heartbeat carries it
        self._build = build
        #: every partition hosted here
        self._hosted = hosted
        #: the partition hosted here under a key, if any
        self._lookup = lookup
        self._sweep_s = sweep_s
        self._clock = clock
        #: this process's journal (a poller holding another one's position gets a full report)
        self.instance = secrets.token_hex(8)
        self.seq = 0
        self._reports: dict[PartitionKey, PartitionReport] = {}
        #: key -> seq of its last change, oldest change first (re-inserted on each change)
        self._changed: dict[PartitionKey, int] = {}
        #: key -> seq of its removal, oldest first
        self._removed: dict[PartitionKey, int] = {}
        #: removals up to this seq were forgotten: an older ``since`` gets a full report
        self._forgotten_through = 0
        self._marked: set[Partition] = set()
        #: the partition object whose listeners mark it, by key
        self._watched: dict[PartitionKey, Partition] = {}
        self._sweep_at = 0.0
        #: reports rebuilt, all told (a figure for tests and benchmarks)
        self.rebuilt = 0

    # ------------------------------------------------------------------ marks

    def mark(self, partition: Partition) -> None:
        """The partition's report may have changed: rebuild it at the next poll."""
        self._marked.add(partition)

    def mark_all(self) -> None:
        """Anything may have changed (a placement): sweep at the next poll."""
        self._sweep_at = 0.0

    # ------------------------------------------------------------------ answers

    def answer(
        self, since: tuple[str, int] | None
    ) -> tuple[tuple[PartitionReport, ...], tuple[PartitionKey, ...], ReportJournal]:
        """(reports, removed keys, journal) for a poller holding ``since`` (None: nothing).

        A delta when ``since`` is this journal's and not older than what it
        still remembers; otherwise every report, after a sweep (a full report
        is exact, as it was before the journal existed).
        """
        usable = (
            since is not None
            and since[0] == self.instance
            and self._forgotten_through <= since[1] <= self.seq
        )
        if not usable:
            self._sweep()
            reports = tuple(self._reports[k] for k in sorted(self._reports))
            return reports, (), ReportJournal(self.instance, self.seq, None)
        assert since is not None
        self._refresh()
        after = since[1]
        changed = _newer(self._changed, after)
        removed = _newer(self._removed, after)
        reports = tuple(self._reports[k] for k in sorted(changed))
        return reports, tuple(sorted(removed)), ReportJournal(self.instance, self.seq, after)

    # ------------------------------------------------------------------ the journal

    def _refresh(self) -> None:
        if self._clock() >= self._sweep_at:
            self._sweep()
            return
        marked, self._marked = self._marked, set()
        for p in marked:
            key = (p.topic.name, p.index)
            current = self._lookup(*key)
            if current is None:
                self._remove(key)
            else:
                self._update(key, current)

    def _sweep(self) -> None:
        self._sweep_at = self._clock() + self._sweep_s
        self._marked.clear()
        seen: set[PartitionKey] = set()
        for p in self._hosted():
            key = (p.topic.name, p.index)
            seen.add(key)
            self._update(key, p)
        for key in [k for k in self._reports if k not in seen]:
            self._remove(key)

    def _update(self, key: PartitionKey, p: Partition) -> None:
        self._watch(key, p)
        report = self._build(p)
        self.rebuilt += 1
        if self._reports.get(key) == report:
            return
        self.seq += 1
        self._reports[key] = report
        self._changed.pop(key, None)
        self._changed[key] = self.seq
        self._removed.pop(key, None)

    def _remove(self, key: PartitionKey) -> None:
        old = self._watched.pop(key, None)
        if old is not None:
            old.remove_listener(self.mark)
            old.remove_append_listener(self.mark)
            old.remove_cursor_listener(self.mark)
        if key not in self._reports:
            return
        del self._reports[key]
        self._changed.pop(key, None)
        self.seq += 1
        self._removed[key] = self.seq
        if len(self._removed) > 2 * len(self._reports) + 1024:
            # Deleted topics' tombstones would pile up forever: forget the older half.
            drop = list(self._removed)[: len(self._removed) // 2]
            self._forgotten_through = max(self._removed[k] for k in drop)
            for k in drop:
                del self._removed[k]

    def _watch(self, key: PartitionKey, p: Partition) -> None:
        held = self._watched.get(key)
        if held is p:
            return
        if held is not None:
            held.remove_listener(self.mark)
            held.remove_append_listener(self.mark)
            held.remove_cursor_listener(self.mark)
        p.add_listener(self.mark)
        p.add_append_listener(self.mark)
        p.add_cursor_listener(self.mark)
        self._watched[key] = p


def _newer(journal: dict[PartitionKey, int], after: int) -> list[PartitionKey]:
    """Keys changed after ``after``: walk back from the newest change (no full scan)."""
    found = []
    for key, seq in reversed(journal.items()):
        if seq <= after:
            break
        found.append(key)
    return found
