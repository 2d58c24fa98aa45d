"""When a cron schedule fires (``resources.cron.latest_fire``), as a CronJob reads it."""

from __future__ import annotations

import datetime as dt

import pytest

from headrace.resources.cron import latest_fire


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("schedule", "now", "fired"),
    [
        ("*/15 * * * *", "2026-03-04 10:44:59", "2026-03-04 10:30"),
        ("*/15 * * * *", "2026-03-04 10:45:00", "2026-03-04 10:45"),
        ("0 2 * * *", "2026-03-04 01:59", "2026-03-03 02:00"),
        ("0 2 * * *", "2026-03-04 02:00", "2026-03-04 02:00"),
        ("@hourly", "2026-03-04 10:44", "2026-03-04 10:00"),
        ("@daily", "2026-03-04 10:44", "2026-03-04 00:00"),
        ("@weekly", "2026-03-04 10:44", "2026-03-01 00:00"),  # the Sunday before
        ("@monthly", "2026-03-04 10:44", "2026-03-01 00:00"),
        ("@yearly", "2026-03-04 10:44", "2026-01-01 00:00"),
        ("30 9 * * mon-fri", "2026-03-08 12:00", "2026-03-06 09:30"),  # Sunday -> Friday
        ("0 0 * * 7", "2026-03-04 10:44", "2026-03-01 00:00"),  # 7 is Sunday
        ("0 12 1 jan,jul ?", "2026-03-04 10:44", "2026-01-01 12:00"),
        ("10-20/5 8 * * *", "2026-03-04 08:17", "2026-03-04 08:15"),
        ("5/20 8 * * *", "2026-03-04 08:50", "2026-03-04 08:45"),
        # both day fields restricted: either one (the 13th or a Friday)
        ("0 0 13 * fri", "2026-03-12 10:00", "2026-03-06 00:00"),
        ("0 0 13 * fri", "2026-03-13 10:00", "2026-03-13 00:00"),
        ("0 0 29 2 *", "2026-03-04 10:44", "2024-02-29 00:00"),
    ],
)
def test_the_latest_time_a_schedule_fired(schedule: str, now: str, fired: str) -> None:
    assert latest_fire(schedule, at(now)) == at(fired)


def test_a_schedule_that_never_fires_in_the_lookback_says_so() -> None:
    assert latest_fire("0 0 31 2 *", at("2026-03-04 10:44")) is None
