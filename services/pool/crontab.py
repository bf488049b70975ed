"""CronTab scheduling ("Crondor", seed 003): a job's next DeferralTime from its cron_* fields.

HTCondor's own rules (condor_utils/condor_crontab.cpp), kept where they surprise:
- a step selects the values of the range that are multiples of it (`10-30/5` -> 10,15,..,30;
  `1-31/2` gives the even days), not every n-th value from the start;
- `*` in cron_day_of_week selects nothing: the day is day_of_month's days, plus the days of
  the month falling on the listed weekdays when day_of_week is given (7 is Sunday, as 0);
  with day_of_month left `*` and day_of_week given, only those weekdays;
- the search starts at the next whole minute strictly after `now`, so a job never runs in the
  minute it was scheduled in.
Times are UTC (the simulated pool has no local time zone).
"""
from __future__ import annotations

import calendar
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from services.pool.errors import PoolError

#: submit command -> (job ad attribute, lowest, highest value)
FIELDS: dict[str, tuple[str, int, int]] = {
    "minute": ("CronMinute", 0, 59),
    "hour": ("CronHour", 0, 23),
    "day_of_month": ("CronDayOfMonth", 1, 31),
    "month": ("CronMonth", 1, 12),
    "day_of_week": ("CronDayOfWeek", 0, 7),
}
_TOKEN = re.compile(r"(\*|\d+|\d+-\d+)(?:/(\d+))?\Z")
_YEARS = 30  # a schedule such as Feb 30th never matches: give up after this many years


class CronTabError(PoolError):
    """A cron_* value is not HTCondor crontab syntax or is outside the field's range."""

    def __init__(self, field: str, value: str, reason: str) -> None:
        self.field = field
        super().__init__(f"cron_{field} = {value!r}: {reason}")


def _expand(field: str, text: str) -> frozenset[int]:
    _, low, high = FIELDS[field]
    values: set[int] = set()
    for raw in text.replace(" ", "").split(","):
        m = _TOKEN.match(raw)
        if m is None:
            raise CronTabError(field, text, f"bad item {raw!r} (use *, N, N-M, with an optional /step)")
        item, step_text = m.group(1), m.group(2)
        step = int(step_text) if step_text else 1
        if step == 0:
            raise CronTabError(field, text, "a step must be positive")
        if item == "*":
            if field == "day_of_week":
                continue  # HTCondor: a weekday wildcard adds no days (see the module doc)
            first, last = low, high
        elif "-" in item:
            first, last = (int(x) for x in item.split("-"))
            if first > last:
                raise CronTabError(field, text, f"range {item} runs backwards")
        else:
            first = last = int(item)
        if first < low or last > high:
            raise CronTabError(field, text, f"values must lie within {low}-{high}")
        values.update((0 if field == "day_of_week" and v == 7 else v)
                      for v in range(first, last + 1) if v % step == 0)
    return frozenset(values)


@dataclass(frozen=True, slots=True)
class CronTab:
    """A parsed schedule; unspecified fields are `*`."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]
    dom_wildcard: bool

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> CronTab:
        """From submit commands without the `cron_` prefix (minute, hour, ...)."""
        for name in fields:
            if name not in FIELDS:
                raise CronTabError(name, str(fields[name]), f"unknown field (one of {', '.join(FIELDS)})")
        sets = {f: _expand(f, str(fields.get(f, "*"))) for f in FIELDS}
        return cls(sets["minute"], sets["hour"], sets["day_of_month"], sets["month"],
                   sets["day_of_week"], len(sets["day_of_month"]) == 31)

    def _days(self, year: int, month: int) -> list[int]:
        first_wday = (calendar.weekday(year, month, 1) + 1) % 7  # 0 = Sunday
        ndays = calendar.monthrange(year, month)[1]
        weekdays = {d for d in range(1, ndays + 1) if (first_wday + d - 1) % 7 in self.days_of_week}
        if self.dom_wildcard and self.days_of_week:
            days = weekdays
        else:
            days = {d for d in self.days_of_month if d <= ndays} | weekdays
        return sorted(days)

    def next_run(self, now: float) -> int:
        """The first scheduled minute strictly after `now`'s minute (epoch seconds, UTC)."""
        start = int(now) + 60 - int(now) % 60
        y, mo, d, h, mi = _split(start)
        hours, minutes = sorted(self.hours), sorted(self.minutes)
        for year in range(y, y + _YEARS):
            for month in sorted(self.months):
                if (year, month) < (y, mo):
                    continue
                for day in self._days(year, month):
                    if (year, month, day) < (y, mo, d):
                        continue
                    today = (year, month, day) == (y, mo, d)
                    for hour in hours:
                        if today and hour < h:
                            continue
                        for minute in minutes:
                            if today and hour == h and minute < mi:
                                continue
                            return calendar.timegm((year, month, day, hour, minute, 0))
        raise CronTabError("day_of_month", ",".join(map(str, sorted(self.days_of_month))),
                           f"the schedule never matches within {_YEARS} years")


def _split(t: int) -> tuple[int, int, int, int, int]:
    tm = time.gmtime(t)
    return tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min
