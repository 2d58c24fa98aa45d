"""Produce and consume rates and lag over the last minutes, sampled from heartbeats (pure).

Where the numbers come from: every controller step polls each broker's
heartbeat, and a leader's ``PartitionReport`` carries the partition's high
watermark and every cohort's cursor (the next offset it will deliver).
``RateHistory.observe`` takes those at most once per ``interval_ms``:

* **produce rate** of a topic: the rise of its partitions' high watermarks since
  the previous sample, per second (committed records; what acks=all producers
  have had acknowledged);
* **consume rate** of a cohort: the rise of its cursors, per second;
* **lag** of a cohort: the sum over partitions of high watermark minus cursor, now.

A partition counts in a rate only when both samples have a leader report for it
(an offline partition adds nothing rather than a jump), and a fall (a new
incarnation after an unload, a cohort seeking back) counts as no progress, not
as a negative rate. The points live in a ring buffer of ``window_ms /
interval_ms`` entries, so memory is bounded whatever runs for how long; they are
lost on a controller restart, which is fine for a picture of the last minutes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from headrace.protocol.coordination import Heartbeat, PartitionReport

#: (topic, partition)
PartitionKey = tuple[str, int]
#: (topic, cohort, partition)
CursorKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Offsets:
    """The leaders' offsets at one moment."""

    at_ms: int
    high_watermarks: Mapping[PartitionKey, int] = field(default_factory=dict)
    cursors: Mapping[CursorKey, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Point:
    """One sample of the charts: rates over the interval that ends at ``at_ms``."""

    at_ms: int
    #: topic -> committed records per second
    produce: Mapping[str, float]
    #: series name of a cohort (``cohort_series``) -> records per second
    consume: Mapping[str, float]
    #: series name of a cohort -> records behind the high watermark
    lag: Mapping[str, int]


def cohort_series(topic: str, cohort: str) -> str:
    """The name of a cohort's line on the consume and lag charts."""
    return f"{topic} · {cohort}"


def leader_reports(heartbeats: Iterable[Heartbeat]) -> dict[PartitionKey, PartitionReport]:
    """Each partition's leader report; of two that claim it (one stale), the higher epoch."""
    leaders: dict[PartitionKey, PartitionReport] = {}
    for hb in heartbeats:
        for report in hb.partitions:
            if report.role != "leader":
                continue
            key = (report.topic, report.partition)
            held = leaders.get(key)
            if held is None or report.leader_epoch > held.leader_epoch:
                leaders[key] = report
    return leaders


def offsets_of(heartbeats: Iterable[Heartbeat], at_ms: int) -> Offsets:
    leaders = leader_reports(heartbeats)
    return Offsets(
        at_ms,
        {key: r.high_watermark for key, r in leaders.items()},
        {
            (topic, cohort, partition): cursor
            for (topic, partition), r in leaders.items()
            for cohort, cursor in r.cursors.items()
        },
    )


def point_between(before: Offsets, after: Offsets) -> Point:
    """The rates from ``before`` to ``after`` and the lag at ``after`` (see the module)."""
    seconds = max(after.at_ms - before.at_ms, 1) / 1000
    produce: dict[str, float] = {}
    for (topic, partition), hw in after.high_watermarks.items():
        produce.setdefault(topic, 0.0)
        previous = before.high_watermarks.get((topic, partition))
        if previous is not None:
            produce[topic] += max(hw - previous, 0) / seconds
    consume: dict[str, float] = {}
    lag: dict[str, int] = {}
    for (topic, cohort, partition), cursor in after.cursors.items():
        series = cohort_series(topic, cohort)
        consume.setdefault(series, 0.0)
        previous = before.cursors.get((topic, cohort, partition))
        if previous is not None:
            consume[series] += max(cursor - previous, 0) / seconds
        end = after.high_watermarks.get((topic, partition))
        lag[series] = lag.get(series, 0) + (max(end - cursor, 0) if end is not None else 0)
    return Point(after.at_ms, produce, consume, lag)


class RateHistory:
    """The ring buffer of chart points; ``observe`` after every controller step."""

    def __init__(self, window_ms: int = 300_000, interval_ms: int = 1_000) -> None:
        """``window_ms``: how far back the charts reach (5 minutes: "the last minutes");
        ``interval_ms``: the least time between points (1 s: the controller's poll)."""
        if interval_ms <= 0 or window_ms < interval_ms:
            raise ValueError("need 0 < interval_ms <= window_ms")
        self.window_ms = window_ms
        self.interval_ms = interval_ms
        self.points: deque[Point] = deque(maxlen=window_ms // interval_ms)
        self._last: Offsets | None = None
        #: the heartbeats' reports ``_last`` was taken from
        self._reports: list[tuple[PartitionReport, ...]] = []

    def observe(self, now_ms: int, heartbeats: Iterable[Heartbeat]) -> Point | None:
        """Take a sample if ``interval_ms`` has passed since the last; the new point, if any."""
        if self._last is not None and now_ms - self._last.at_ms < self.interval_ms:
            return None
        heartbeats = list(heartbeats)
        # Each broker's reports as they came: the controller's fleet hands back the same
        # report objects for partitions that did not change, so while nothing moves this
        # compares pointers, and the sample is the last one again, with zero rates, at no
        # cost per partition (it walked every partition twice a second: most of an idle
        # controller's CPU at 10,000 partitions).
        reports = [hb.partitions for hb in heartbeats]
        previous = self._last
        point: Point | None
        if previous is not None and self.points and reports == self._reports:
            offsets = replace(previous, at_ms=now_ms)
            last = self.points[-1]  # the point that ended at ``previous``
            point = Point(
                now_ms, dict.fromkeys(last.produce, 0.0), dict.fromkeys(last.consume, 0.0), last.lag
            )
        else:
            offsets = offsets_of(heartbeats, now_ms)
            point = point_between(previous, offsets) if previous is not None else None
        self._last, self._reports = offsets, reports
        if point is not None:
            self.points.append(point)
        return point

    def charts(self, now_ms: int) -> dict[str, Any]:
        """The charts' part of the view model: per chart, its series of ``[age_ms, value]``.

        ``age_ms`` is how long before ``now_ms`` the point was taken (the page draws
        the window ending now); points older than the window are left out.
        """
        recent = [p for p in self.points if now_ms - p.at_ms <= self.window_ms]

        def chart(title: str, unit: str, pick: str) -> dict[str, Any]:
            names = sorted({name for p in recent for name in getattr(p, pick)})
            return {
                "title": title,
                "unit": unit,
                "series": [
                    {
                        "name": name,
                        "points": [
                            [now_ms - p.at_ms, round(getattr(p, pick)[name], 3)]
                            for p in recent
                            if name in getattr(p, pick)
                        ],
                    }
                    for name in names
                ],
            }

        return {
            "windowMs": self.window_ms,
            "intervalMs": self.interval_ms,
            "produce": chart("Produce", "records/s", "produce"),
            "consume": chart("Consume", "records/s", "consume"),
            "lag": chart("Lag", "records", "lag"),
        }
