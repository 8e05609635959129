"""``ManualClock``: a queue clock (``deferq.Clock``) whose time moves only when told.

Rules: ``time()`` is the clock's wall time; ``sleep(s)`` parks the caller until the clock
has been advanced past its deadline (``s <= 0`` only yields). ``advance(s)`` and
``advance_to(t)`` wake the sleepers in deadline order (ties in the order they slept),
letting the event loop run after each wake, so that what a woken task does before its next
sleep happens at the time it woke. Time never goes back.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from typing import Final

DEFAULT_START: Final = 1_800_000_000.0  # 2027-01-15T08:00:00Z: any fixed, recent epoch second
_SETTLE_ROUNDS: Final = 10


async def settle(rounds: int = _SETTLE_ROUNDS) -> None:
    """Let every ready callback and task on the loop run (``rounds`` loop turns)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class ManualClock:
    """Wall time the test controls (``deferq.Clock``)."""

    def __init__(self, now: float = DEFAULT_START) -> None:
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ValueError(f"now must be a finite number of epoch seconds, got {now!r}")
        self._now = float(now)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        """The clock's wall time, epoch seconds."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds`` (a yield for 0 or less)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live sleeper, or None when nobody sleeps."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled sleepers (a stopped queue's timers)
        return self._sleepers[0][0] if self._sleepers else None

    @property
    def sleepers(self) -> int:
        """How many callers are asleep on this clock."""
        return sum(1 for _, _, future in self._sleepers if not future.done())

    async def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``, waking every sleeper it passes."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0 \
                or not math.isfinite(seconds):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        await self.advance_to(self._now + seconds)

    async def advance_to(self, when: float) -> None:
        """Move the clock forward to ``when`` (never back), waking sleepers in deadline order."""
        await settle()
        while self._sleepers and self._sleepers[0][0] <= when:
            deadline, _, future = heapq.heappop(self._sleepers)
            if future.done():
                continue
            self._now = max(self._now, deadline)
            future.set_result(None)
            await settle()
        self._now = max(self._now, when)
        await settle()
