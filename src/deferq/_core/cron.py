"""PURE: the schedules of periodic tasks, a cron subset and fixed intervals (spec/queue.md Q-120..Q-126).

Theory of operation: a schedule is a set of *due times*, whole epoch seconds in UTC. A
cron expression has five fields, ``minute hour day-of-month month day-of-week``, each a
comma list of ``*``, ``N``, ``N-M``, ``*/S``, ``N-M/S`` or ``N/S`` (N to the field's top,
step S); nothing else (no names, no ``L``/``W``/``#``, no seconds). Day of week 0 and 7
are Sunday. A minute is due when its minute, hour and month match and its day matches:
when both day fields are restricted (neither starts with ``*``) either may match, else
both must (Vixie cron's rule). An interval schedule is due at every multiple of its
length since the epoch, so every worker computes the same due times without talking.

``next_due`` and ``latest_due`` walk days, not minutes, and stop after ``CRON_SEARCH_DAYS``
(past any gap a valid expression has: a 29 February can be eight years away); a
parse that finds no due time in that span is refused, so every accepted expression has
one. Errors are ``ValueError`` naming the field and what is wrong with it.

This module imports nothing that does I/O; the tests check it against a minute-by-minute
reference with Hypothesis.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Final

MINUTE_S: Final = 60
DAY_S: Final = 86_400
# Implements Q-121: the longest gap between due times any valid expression has is
# under 8 years (29 February, skipping 2100); the search goes a little past it.
CRON_SEARCH_DAYS: Final = 366 * 9
_FIELDS: Final = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31),
                  ("month", 1, 12), ("day-of-week", 0, 7))


@dataclass(frozen=True, slots=True, kw_only=True)
class Cron:
    """A parsed cron expression: the values each field allows, and its source text."""

    text: str
    minutes_of_day: tuple[int, ...]  # sorted hour * 60 + minute
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    def day_matches(self, day: int) -> bool:
        """Whether the ``day``-th day since 1970-01-01 is one this expression is due on
        (Q-120's day rule)."""
        month, day_of_month = civil_month_day(day)
        if month not in self.months:
            return False
        dom = day_of_month in self.days
        dow = (day + 4) % 7 in self.weekdays  # 1970-01-01 was a Thursday (4)
        if self.days_restricted and self.weekdays_restricted:
            return dom or dow
        return dom and dow


def civil_month_day(day: int) -> tuple[int, int]:
    """(month, day of month) of the ``day``-th day since 1970-01-01, proleptic Gregorian
    (H. Hinnant's ``civil_from_days``), without the clock-reading ``datetime`` module.

    post: 1 <= __return__[0] <= 12 and 1 <= __return__[1] <= 31
    """
    z = day + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    return (mp + 3 if mp < 10 else mp - 9), doy - (153 * mp + 2) // 5 + 1


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    if not text:
        raise ValueError(f"cron field {name} is empty")
    for item in text.split(","):
        span, slash, step_text = item.partition("/")
        step = 1
        if slash:
            step = _number(step_text, name, 1, high - low + 1, "step")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = _number(a, name, low, high), _number(b, name, low, high)
            if first > last:
                raise ValueError(f"cron field {name} has the range {span!r}, which runs backwards")
        else:
            first = _number(span, name, low, high)
            last = high if slash else first
        values.update(range(first, last + 1, step))
    return frozenset(values)


def _number(text: str, name: str, low: int, high: int, what: str = "value") -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 2:
        raise ValueError(f"cron field {name} has the {what} {text!r}; "
                         f"expected a number from {low} to {high}")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"cron field {name} has the {what} {value}, "
                         f"outside {low} to {high}")
    return value


def parse_cron(text: object) -> Cron:
    """Implements Q-120: parse a five-field cron expression, or raise ``ValueError``
    naming the field (Q-122).

    post: __return__.minutes_of_day == tuple(sorted(__return__.minutes_of_day))
    """
    if not isinstance(text, str):
        raise ValueError(f"cron must be a str, got {type(text).__name__}")
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(f"cron expression {text!r} has {len(parts)} field(s); expected 5: "
                         "minute hour day-of-month month day-of-week")
    sets = [_field(part, name, low, high) for part, (name, low, high) in zip(parts, _FIELDS)]
    minutes, hours, days, months, weekdays = sets
    cron = Cron(text=text, minutes_of_day=tuple(sorted(h * 60 + m for h in hours for m in minutes)),
                days=days, months=months, weekdays=frozenset(d % 7 for d in weekdays),
                days_restricted=not parts[2].startswith("*"),
                weekdays_restricted=not parts[4].startswith("*"))
    if next_due(cron, 0) is None:
        raise ValueError(f"cron expression {text!r} is never due: no day-of-month "
                         "in its months exists")
    return cron


def next_due(cron: Cron, after_s: int) -> int | None:
    """Implements Q-121: the first due time strictly after ``after_s``, None past the search.

    post: __return__ is None or (__return__ > after_s and __return__ % 60 == 0)
    """
    start = (after_s // MINUTE_S + 1) * MINUTE_S
    day, minute = divmod(start, DAY_S)
    for offset in range(CRON_SEARCH_DAYS):
        if cron.day_matches(day + offset):
            times = cron.minutes_of_day
            index = bisect.bisect_left(times, minute // MINUTE_S if offset == 0 else 0)
            if index < len(times):
                return (day + offset) * DAY_S + times[index] * MINUTE_S
    return None


def latest_due(cron: Cron, at_s: int) -> int | None:
    """Implements Q-121: the last due time at or before ``at_s``, None past the search.

    post: __return__ is None or (__return__ <= at_s and __return__ % 60 == 0)
    """
    day, second = divmod(at_s, DAY_S)
    for offset in range(CRON_SEARCH_DAYS):
        if cron.day_matches(day - offset):
            times = cron.minutes_of_day
            index = bisect.bisect_right(times, second // MINUTE_S if offset == 0 else 1440)
            if index > 0:
                return (day - offset) * DAY_S + times[index - 1] * MINUTE_S
    return None


def interval_next_due(every_s: int, after_s: int) -> int:
    """Implements Q-123: the first multiple of ``every_s`` strictly after ``after_s``.

    pre: every_s > 0
    post: __return__ > after_s and __return__ % every_s == 0
    """
    return (after_s // every_s + 1) * every_s


def interval_latest_due(every_s: int, at_s: int) -> int:
    """Implements Q-123: the last multiple of ``every_s`` at or before ``at_s``.

    pre: every_s > 0
    post: __return__ <= at_s and __return__ % every_s == 0
    """
    return at_s // every_s * every_s
