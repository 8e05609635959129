"""The due times of periodic schedules and their record file (spec/queue.md Q-120..Q-123,
spec/format.md F-43..F-45).

Goal: ``next_due``/``latest_due`` never skip nor invent a due time, the cron subset is parsed
exactly and a bad expression is refused naming its field, and the record file's codec round-
trips and drops damage. Method: Hypothesis builds expressions from the grammar of Q-120 and
compares the day-walking functions with a minute-by-minute reference over ``datetime`` (a
different implementation of the calendar), within a window of a few days.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferq._core.cron import (CRON_SEARCH_DAYS, Cron, civil_month_day, interval_latest_due,
                               interval_next_due, latest_due, next_due, parse_cron)
from deferq._core.frame import frame
from deferq._core.schedcodec import decode_schedules, encode_schedules, schedule_name_problem

BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
UTC = datetime.timezone.utc


@st.composite
def field_text(draw: st.DrawFn, low: int, high: int) -> str:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["*", "n", "range", "star-step", "range-step", "n-step"]))
        a = draw(st.integers(low, high))
        b = draw(st.integers(a, high))
        step = draw(st.integers(1, high - low + 1))
        items.append({"*": "*", "n": f"{a}", "range": f"{a}-{b}", "star-step": f"*/{step}",
                      "range-step": f"{a}-{b}/{step}", "n-step": f"{a}/{step}"}[kind])
    return ",".join(items)


def expressions() -> st.SearchStrategy[str]:
    return st.tuples(*(field_text(low, high) for low, high in BOUNDS)).map(" ".join)


def ref_values(text: str, low: int, high: int) -> set[int]:
    """Q-120's field grammar, written out independently of the parser."""
    out: set[int] = set()
    for item in text.split(","):
        base, _, step = item.partition("/")
        s = int(step) if step else 1
        if base == "*":
            a, b = low, high
        elif "-" in base:
            a, b = (int(x) for x in base.split("-"))
        else:
            a = int(base)
            b = high if step else a
        out.update(range(a, b + 1, s))
    return out


def ref_due(text: str) -> Callable[[datetime.datetime], bool]:
    """Whether a minute is due, by Q-120 read literally."""
    f = text.split()
    minutes, hours, doms, months, dows = (ref_values(t, lo, hi) for t, (lo, hi) in zip(f, BOUNDS))
    dows = {d % 7 for d in dows}
    restricted = not f[2].startswith("*") and not f[4].startswith("*")

    def due(when: datetime.datetime) -> bool:
        return (when.minute in minutes and when.hour in hours and when.month in months
                and day_ok(when.day in doms, when.isoweekday() % 7 in dows))

    def day_ok(dom_ok: bool, dow_ok: bool) -> bool:
        return (dom_ok or dow_ok) if restricted else (dom_ok and dow_ok)
    return due


WINDOW_MIN = 2 * 24 * 60


@pytest.mark.spec("Q-120", "Q-121", "Q-226")
@settings(max_examples=100, deadline=None)
@given(expressions(), st.integers(0, 4_000_000_000))
def test_next_and_latest_due_agree_with_a_minute_by_minute_reference(text: str, at: int) -> None:
    try:
        cron = parse_cron(text)
    except ValueError as exc:
        assert "never due" in str(exc)
        return
    start = datetime.datetime.fromtimestamp(at // 60 * 60, UTC)
    due = ref_due(text)
    forward = [m for m in range(1, WINDOW_MIN) if due(start + datetime.timedelta(minutes=m))]
    nxt = next_due(cron, at)
    assert nxt is not None
    if forward:
        assert nxt == at // 60 * 60 + forward[0] * 60
    else:
        assert nxt >= at // 60 * 60 + WINDOW_MIN * 60
    backward = [m for m in range(0, WINDOW_MIN) if due(start - datetime.timedelta(minutes=m))]
    last = latest_due(cron, at)
    if backward:
        assert last == at // 60 * 60 - backward[0] * 60
    else:
        assert last is None or last <= at // 60 * 60 - WINDOW_MIN * 60


@pytest.mark.spec("Q-121")
def test_rare_expressions_are_found_years_away() -> None:
    leap = parse_cron("0 0 29 2 *")
    t = int(datetime.datetime(2097, 3, 1, tzinfo=UTC).timestamp())
    nxt = next_due(leap, t)  # 2100 is not a leap year: the next 29 February is in 2104
    assert nxt == int(datetime.datetime(2104, 2, 29, tzinfo=UTC).timestamp())
    assert latest_due(leap, t) == int(datetime.datetime(2096, 2, 29, tzinfo=UTC).timestamp())
    assert CRON_SEARCH_DAYS > (datetime.date(2104, 2, 29) - datetime.date(2096, 2, 29)).days
    # Either day field matches when both are restricted; Sunday is 0 and 7.
    both = parse_cron("0 12 13 * 5")
    fri = int(datetime.datetime(2026, 12, 4, 12, tzinfo=UTC).timestamp())  # a Friday
    assert next_due(both, fri - 1) == fri
    assert parse_cron("0 0 * * 7").weekdays == parse_cron("0 0 * * 0").weekdays == frozenset({0})


@pytest.mark.spec("Q-120")
@given(st.integers(-719_162, 2_900_000))
def test_the_calendar_agrees_with_datetime(day: int) -> None:
    date = datetime.date(1970, 1, 1) + datetime.timedelta(days=day)
    assert civil_month_day(day) == (date.month, date.day)


@pytest.mark.spec("Q-122")
@pytest.mark.parametrize(("text", "words"), [
    ("* * * *", "4 field(s); expected 5"),
    ("60 * * * *", "field minute has the value 60, outside 0 to 59"),
    ("* 24 * * *", "field hour has the value 24"),
    ("* * 0 * *", "field day-of-month has the value 0, outside 1 to 31"),
    ("* * * 13 *", "field month has the value 13"),
    ("* * * * 8", "field day-of-week has the value 8"),
    ("*/0 * * * *", "field minute has the step 0"),
    ("5-1 * * * *", "field minute has the range '5-1', which runs backwards"),
    ("* * * JAN *", "field month has the value 'JAN'"),
    ("1,,2 * * * *", "field minute has the value ''"),
    ("-1 * * * *", "field minute has the value ''"),
    ("0 0 31 2 *", "never due"),
    ("0 0 30,31 2 *", "never due"),
])
def test_a_bad_expression_is_refused_naming_its_field(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_cron(text)
    assert isinstance(parse_cron("0 0 31 1,2 *"), Cron)  # one month with a 31st suffices


@pytest.mark.spec("Q-123")
@given(st.integers(1, 10 ** 6), st.integers(0, 2 ** 40))
def test_interval_due_times_are_the_epoch_multiples(every: int, at: int) -> None:
    nxt, last = interval_next_due(every, at), interval_latest_due(every, at)
    assert nxt % every == 0 and last % every == 0
    assert last <= at < nxt and nxt - last == every


NAMES = st.text(alphabet="abcXYZ019_.:-", min_size=1, max_size=128)


@pytest.mark.spec("F-43", "F-44", "F-45")
@given(st.dictionaries(NAMES, st.integers(0, 10 ** 12 - 1), max_size=8))
def test_the_record_file_round_trips_in_name_order(fired: dict[str, int]) -> None:
    data = encode_schedules(fired)
    assert decode_schedules(data) == (fired, 0)
    names = [line.split(b" ")[1].decode() for line in data.splitlines()]
    assert names == sorted(names)


@pytest.mark.spec("F-43", "F-45")
def test_damaged_or_ungrammatical_lines_are_dropped_and_counted() -> None:
    good = encode_schedules({"a": 60, "b": 0})
    assert good == frame(b"fired a 60") + frame(b"fired b 0")
    flipped = good.replace(b"fired a 60", b"fired a 61")  # a CRC mismatch
    assert decode_schedules(flipped) == ({"b": 0}, 1)
    bad = [b"fired a 060", b"fired a -1", b"fired a 1 2", b"fire a 1", b"fired a b 1",
           b"fired  1", b"fired a 1234567890123", b"fired \xff 1"]
    assert decode_schedules(b"".join(frame(b) for b in bad)) == ({}, len(bad))
    assert decode_schedules(b"") == ({}, 0)
    assert decode_schedules(good[:-5]) == ({"a": 60}, 1)  # a torn line (not written by L-12)


@pytest.mark.spec("F-44")
@pytest.mark.parametrize("name", ["", "a b", "x" * 129, "é", "a\n", 7])
def test_a_bad_schedule_name_is_named(name: object) -> None:
    problem = schedule_name_problem(name)
    assert problem is not None
    assert schedule_name_problem("x" * 128) is None
