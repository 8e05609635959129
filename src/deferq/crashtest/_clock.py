"""The simulated machine's clock and timers.

Rules: time only moves when a test calls ``SimDisk.advance`` or simulated code calls
``Env.sleep`` (which advances the shared clock at once; nothing really sleeps). Timers
registered with ``Env.call_every`` never fire by themselves: ``fire_due`` calls the due
callbacks, in registration order, when the test asks. Like the real ticker, a timer
fires at most once per call and is next due one interval after it fired, and an
``Exception`` from a callback is caught (the real ticker's thread would swallow it) and
returned to the caller so a test can look at it.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

START_TIME_S: Final = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
START_MONOTONIC_S: Final = 1_000.0


class SimClock:
    """Wall clock and monotonic clock of one simulated machine."""

    def __init__(self, time_s: float = START_TIME_S, monotonic_s: float = START_MONOTONIC_S) -> None:
        self.time_s = time_s
        self.monotonic_s = monotonic_s

    def advance(self, seconds: float) -> None:
        """Move both clocks forward."""
        if not seconds >= 0:
            raise ValueError(f"time only moves forward; got {seconds!r} seconds")
        self.time_s += seconds
        self.monotonic_s += seconds

    def step_wall_clock(self, seconds: float) -> None:
        """Step the wall clock only (e.g. NTP moving it back); monotonic time is unchanged."""
        self.time_s += seconds

    def local_date(self) -> str:
        """The date of the wall clock in UTC (the simulated machine's time zone) as YYYYMMDD."""
        return _time.strftime("%Y%m%d", _time.gmtime(self.time_s))

    def copy(self) -> SimClock:
        return SimClock(self.time_s, self.monotonic_s)


@dataclass(slots=True, eq=False)
class Timer:
    """A periodic callback of one simulated process; also its ``Cancel`` handle."""

    interval_s: float
    callback: Callable[[], None]
    due_s: float
    pid: int
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """Every live timer of one machine."""

    def __init__(self) -> None:
        self._timers: list[Timer] = []

    def add(self, clock: SimClock, interval_s: float, callback: Callable[[], None],
            pid: int) -> Timer:
        if not interval_s > 0:
            raise ValueError(f"interval must be positive, got {interval_s!r}")
        timer = Timer(interval_s, callback, clock.monotonic_s + interval_s, pid)
        self._timers.append(timer)
        return timer

    def drop_process(self, pid: int) -> None:
        """A dead process's timers never fire again."""
        for timer in self._timers:
            if timer.pid == pid:
                timer.cancelled = True
        self._prune()

    def fire_due(self, clock: SimClock, pid: int | None = None) -> list[Exception]:
        """Call every due timer (of ``pid`` only, if given); return the exceptions caught."""
        errors: list[Exception] = []
        for timer in list(self._timers):
            if timer.cancelled or (pid is not None and timer.pid != pid):
                continue
            if clock.monotonic_s >= timer.due_s:
                timer.due_s = clock.monotonic_s + timer.interval_s
                try:
                    timer.callback()
                except Exception as exc:  # noqa: BLE001 - mirrors the real ticker thread.
                    errors.append(exc)
        self._prune()
        return errors

    def live(self) -> int:
        """How many timers are registered and not cancelled."""
        self._prune()
        return len(self._timers)

    def _prune(self) -> None:
        self._timers = [t for t in self._timers if not t.cancelled]
