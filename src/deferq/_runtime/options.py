"""Enqueue options given apart from a task's arguments: ``task.options(...)`` (spec/queue.md Q-50..Q-54).

Rules:
- ``queue.defer(task, *args, **kwargs)`` passes every keyword to the task: options never
  share a namespace with arguments (Q-50). Options are given on the task instead:
  ``queue.defer(send_email.options(delay=timedelta(minutes=5), key="welcome-42"), to)``.
- ``delay`` is seconds (an ``int`` or finite ``float``, not ``bool``) or a ``timedelta``,
  >= 0 and at most ``DELAY_S_MAX``; ``at`` is a timezone-aware ``datetime``. At most one
  of them. Both are checked when ``options`` is called, so a bad value fails where it was
  written, naming the option (Q-51). Times are whole seconds, as the WAL stores them.
- ``key`` is a unique key (Q-54): a non-empty ``str`` of at most ``TASK_KEY_BYTES_MAX``
  UTF-8 bytes.

Typing: ``TaskFunction[P, R].options`` and ``Task.options`` return ``ConfiguredTask[P]``,
and ``Queue.defer`` takes ``TaskFunction[P, R] | type[Performs[P]] | ConfiguredTask[P]``
followed by ``*args: P.args, **kwargs: P.kwargs``. For a ``Task`` subclass, mypy infers
``P`` from its ``perform`` through the ``Performs`` protocol, so both kinds of task are
checked against their signature.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Final, Generic, ParamSpec, Protocol

from deferq._runtime.ctxfields import check_meta

P = ParamSpec("P")

# The longest delay: about 317 years, far inside the WAL's publish_at range (C-7).
DELAY_S_MAX: Final = 10_000_000_000
TASK_KEY_BYTES_MAX: Final = 1024


class Performs(Protocol[P]):
    """What a ``Task`` subclass is to the type checker: a ``perform`` with parameters ``P``."""

    def perform(self, *args: P.args, **kwargs: P.kwargs) -> object:
        """The task's work."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeferOptions:
    """Checked options: a delay in whole seconds or an epoch second to run at, and a key."""

    delay_s: int | None = None
    at_s: int | None = None
    key: str | None = None
    meta: dict[str, str] | None = None  # checked, a copy, None when empty

    def timing(self, now_s: int) -> tuple[int | None, int | None]:
        """(publish_at, publish_in) at ``now_s``; (None, None) runs the task at once."""
        if self.delay_s is not None and self.delay_s > 0:
            return now_s + self.delay_s, self.delay_s
        if self.at_s is not None and self.at_s > now_s:
            return self.at_s, self.at_s - now_s
        return None, None


NO_OPTIONS: Final = DeferOptions()


def check_options(delay: object, at: object, key: object, meta: object = None) -> DeferOptions:
    """Implements Q-51: the options, or ``ValueError`` naming the bad one."""
    if delay is not None and at is not None:
        raise ValueError("give delay= or at=, not both")
    delay_s: int | None = None
    if isinstance(delay, datetime.timedelta):
        seconds = delay.total_seconds()
        delay_s = _delay_seconds(seconds, delay)
    elif delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise ValueError(f"delay must be seconds (int or float) or a timedelta, got "
                             f"{type(delay).__name__} {delay!r}")
        delay_s = _delay_seconds(delay, delay)
    at_s: int | None = None
    if at is not None:
        if not isinstance(at, datetime.datetime):
            raise ValueError(f"at must be a timezone-aware datetime, got {type(at).__name__} "
                             f"{at!r} (for a number of seconds use delay=)")
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError(f"at must be a timezone-aware datetime, got the naive {at!r}: "
                             f"add a tzinfo, e.g. datetime.now(timezone.utc)")
        at_s = int(at.timestamp())
    return DeferOptions(delay_s=delay_s, at_s=at_s, key=check_key(key), meta=check_meta(meta))


def _delay_seconds(seconds: float, given: object) -> int:
    if not math.isfinite(seconds) or seconds < 0 or seconds > DELAY_S_MAX:
        raise ValueError(f"delay must be finite, >= 0 and at most {DELAY_S_MAX} s, got {given!r}")
    return int(seconds)


def check_key(key: object) -> str | None:
    """A unique key as given, or ``ValueError`` naming what is wrong with it."""
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty str, got {type(key).__name__} {key!r}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"key must be valid Unicode text (no lone surrogates), got {key!r}"
                         ) from None
    if size > TASK_KEY_BYTES_MAX:
        raise ValueError(f"key must be at most {TASK_KEY_BYTES_MAX} UTF-8 bytes, got {size}")
    return key


class ConfiguredTask(Generic[P]):
    """A task with its enqueue options, for ``Queue.defer``: what ``task.options(...)`` returns.

    ``task`` is the ``Task`` subclass or ``@task`` function it was made from.
    """

    __slots__ = ("task", "settings")

    def __init__(self, task: object, settings: DeferOptions) -> None:
        self.task = task
        self.settings = settings

    def __repr__(self) -> str:
        return f"<deferq task {self.task!r} with {self.settings!r}>"


def seconds_value(value: object, name: str) -> float:
    """A finite number of seconds (not ``bool``), or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


def enqueue_timing(delay: object, delay_until: object, now: int
                   ) -> tuple[int | None, int | None]:
    """Implements Q-7: ``enqueue``'s (publish_at, publish_in) as in the reference; ``delay``
    wins over ``delay_until`` when it is not None; (None, None) runs the task at once."""
    if delay is not None:
        seconds = int(seconds_value(delay, "delay"))
        return (now + seconds, seconds) if seconds > 0 else (None, None)
    if delay_until is not None:
        if isinstance(delay_until, datetime.datetime):
            if delay_until.tzinfo is None:
                raise ValueError("delay_until must be an aware datetime (with a tzinfo)")
            when = int(delay_until.timestamp())
        else:
            when = int(seconds_value(delay_until, "delay_until"))
        return (when, when - now) if when > now else (None, None)
    return None, None
