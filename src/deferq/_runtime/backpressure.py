"""Backpressure: high and low water marks on the backlog of immediate tasks (spec/queue.md Q-11).

Rules: every value is validated when it is built (``Backpressure`` raises ``ValueError``
naming the bad field, Q-29). A wait for room sleeps on the queue's clock as Q-11 says, and
also looks at the backlog each time an execution ends (``nap``, Q-185), so that it returns
when executions made room even if that clock does not move (a test's ``ManualClock``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from deferq._core.limits import BACKPRESSURE_TIMEOUT_MAX_S
from deferq._runtime.clock import Clock
from deferq._runtime.errors import PushTimeout

BACKPRESSURE_SLEEP_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class Backpressure:
    """High/low water marks on the backlog of immediate tasks, and the wait timeout (s)."""

    high_water_mark: int = 1000
    low_water_mark: int | None = None  # default round(0.8 * high)
    timeout: float = 2.0

    def __post_init__(self) -> None:
        high, low, timeout = self.high_water_mark, self.low, self.timeout
        if isinstance(high, bool) or not isinstance(high, int) or high <= 0:
            raise ValueError(f"high_water_mark must be a positive int, got {high!r}")
        if isinstance(low, bool) or not isinstance(low, int) or not 0 <= low <= high:
            raise ValueError(f"low_water_mark must be an int in [0, high_water_mark], got {low!r}")
        if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not math.isfinite(timeout) or not 0 <= timeout <= BACKPRESSURE_TIMEOUT_MAX_S):
            # Implements Q-29: a larger timeout would overflow the wait loop's count.
            raise ValueError(f"timeout must be a finite number of seconds from 0 to "
                             f"{BACKPRESSURE_TIMEOUT_MAX_S:g}, got {timeout!r}")

    @property
    def low(self) -> int:
        """The effective low water mark."""
        if self.low_water_mark is None:
            return round(0.8 * self.high_water_mark)
        return self.low_water_mark

    @property
    def iterations(self) -> int:
        """How many ``BACKPRESSURE_SLEEP_S`` sleeps the timeout allows."""
        return round(self.timeout / BACKPRESSURE_SLEEP_S)


async def wait_for_room(bp: Backpressure, clock: Clock, freed: asyncio.Event,
                        backlog: Callable[[], int]) -> None:
    """Implements Q-11: sleep ``BACKPRESSURE_SLEEP_S`` at a time until ``backlog()`` is at
    most the low water mark, and raise ``PushTimeout`` after ``bp.iterations`` sleeps; each
    sleep ends early once it is (Q-185, ``nap``)."""
    low = bp.low
    for _ in range(bp.iterations):
        if backlog() <= low:
            return
        await nap(clock, freed, lambda: backlog() <= low)
    if backlog() > low:
        raise PushTimeout(f"could not enqueue deferred task within {bp.timeout} seconds")


async def nap(clock: Clock, freed: asyncio.Event, room: Callable[[], bool]) -> None:
    """Implements Q-185: one ``BACKPRESSURE_SLEEP_S`` sleep on ``clock`` (one of Q-11's),
    cut short once ``room()`` is true, looked at each time ``freed`` is set (an execution
    ended and gave its slot back, or the queue is stopping)."""
    sleep = asyncio.ensure_future(clock.sleep(BACKPRESSURE_SLEEP_S))
    try:
        while not sleep.done() and not room():
            freed.clear()
            woken = asyncio.ensure_future(freed.wait())
            try:
                await asyncio.wait((sleep, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
    finally:
        sleep.cancel()
