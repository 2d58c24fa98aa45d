"""Cron schedules as a CronJob reads them: the grammar (``check_cron``, the ``CronSchedule``
field type) and when a schedule fires (``latest_fire``).

Pure: no clock (the caller passes the time), no I/O. Five fields, ``minute hour
day-of-month month day-of-week``, each ``*``, a number or name, a range ``a-b``, a step
``/n`` and lists ``a,b``; ``?`` for any day; the macros ``@hourly`` ... ``@yearly``. As in
cron (and Kubernetes' CronJob controller), when both day fields are restricted a day
matches if either does; times are UTC.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Final

from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

#: the descriptors a CronJob accepts in place of five fields
CRON_MACROS: Final = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
#: what the API server checks; the Python check below is stricter (ranges, names, steps)
CRON_PATTERN: Final = rf"^(@({'|'.join(sorted(m[1:] for m in CRON_MACROS))})|\S+(\s+\S+){{4}})$"

_MONTHS: Final = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_DAYS: Final = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}


class _CronField:
    __slots__ = ("high", "low", "name", "names", "question_mark")

    def __init__(
        self, name: str, low: int, high: int, names: dict[str, int], question_mark: bool
    ) -> None:
        self.name = name
        self.low = low
        self.high = high
        self.names = names
        self.question_mark = question_mark

    def value(self, text: str) -> int:
        number = self.names.get(text.lower())
        if number is None:
            if not text.isdigit():
                raise ValueError(f"{self.name} {text!r} is not a number")
            number = int(text)
        if not self.low <= number <= self.high:
            raise ValueError(f"{self.name} {text!r} is out of range {self.low}-{self.high}")
        return number

    def check(self, text: str) -> None:
        for item in text.split(","):
            span, _, step = item.partition("/")
            if step and (not step.isdigit() or int(step) == 0):
                raise ValueError(f"{self.name} step {step!r} is not a positive number")
            if span == "*" or (span == "?" and self.question_mark):
                continue
            low, dash, high = span.partition("-")
            first = self.value(low)
            if dash and self.value(high) < first:
                raise ValueError(f"{self.name} range {span!r} runs backwards")


_CRON_FIELDS: Final = (
    _CronField("minute", 0, 59, {}, False),
    _CronField("hour", 0, 23, {}, False),
    _CronField("day of month", 1, 31, {}, True),
    _CronField("month", 1, 12, _MONTHS, False),
    _CronField("day of week", 0, 7, _DAYS, True),
)


def check_cron(schedule: str) -> str:
    """``schedule`` if it is a schedule a CronJob accepts, else a field-level error."""
    try:
        if schedule.startswith("@"):
            if schedule not in CRON_MACROS:
                raise ValueError(f"unknown macro; use one of {', '.join(sorted(CRON_MACROS))}")
        elif not re.fullmatch(CRON_PATTERN[1:-1], schedule):
            raise ValueError(
                f"expected 5 fields (minute hour day-of-month month day-of-week), "
                f"got {len(schedule.split())}"
            )
        else:
            for field, text in zip(_CRON_FIELDS, schedule.split(), strict=True):
                field.check(text)
    except ValueError as exc:
        raise PydanticCustomError(
            "invalid_cron",
            "'{schedule}' is not a cron schedule: {problem}",
            {"schedule": schedule, "problem": str(exc)},
        ) from None
    return schedule


CronSchedule = Annotated[
    str,
    AfterValidator(check_cron),
    WithJsonSchema({"type": "string", "pattern": CRON_PATTERN, "maxLength": 256}),
]


#: what each macro stands for
_MACRO_FIELDS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: how far back ``latest_fire`` looks: a schedule that has not fired for this long
#: (a 29 February at a weekday, say) counts as not firing
LOOKBACK_DAYS: Final = 5 * 366


def _values(field: _CronField, text: str) -> frozenset[int]:
    """Every value ``text`` (a checked field) stands for."""
    values: set[int] = set()
    for item in text.split(","):
        span, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if span in ("*", "?"):
            low, high = field.low, field.high
        else:
            first, dash, last = span.partition("-")
            low = field.value(first)
            high = field.value(last) if dash else (field.high if step_text else low)
        values.update(range(low, high + 1, step))
    return frozenset(values)


def latest_fire(schedule: str, now: dt.datetime) -> dt.datetime | None:
    """The latest minute at or before ``now`` (UTC) at which ``schedule`` (a checked one)
    fires; None if it has not fired within ``LOOKBACK_DAYS``."""
    fields = _MACRO_FIELDS.get(schedule, schedule).split()
    minutes, hours, days, months, weekdays = (
        _values(f, text) for f, text in zip(_CRON_FIELDS, fields, strict=True)
    )
    weekdays = frozenset(d % 7 for d in weekdays)  # 7 is Sunday too
    any_day = fields[2].startswith(("*", "?"))
    any_weekday = fields[4].startswith(("*", "?"))
    now = now.astimezone(dt.UTC).replace(second=0, microsecond=0)
    for back in range(LOOKBACK_DAYS):
        day = (now - dt.timedelta(days=back)).date()
        if day.month not in months:
            continue
        by_day, by_weekday = day.day in days, (day.isoweekday() % 7) in weekdays
        # one restricted day field: it alone decides; both restricted: either one
        either = not (any_day or any_weekday)
        if not ((by_day or by_weekday) if either else (by_day and by_weekday)):
            continue
        last_minute = now.hour * 60 + now.minute if back == 0 else 24 * 60 - 1
        times = [h * 60 + m for h in hours for m in minutes if h * 60 + m <= last_minute]
        if times:
            at = max(times)
            return dt.datetime(day.year, day.month, day.day, at // 60, at % 60, tzinfo=dt.UTC)
    return None
