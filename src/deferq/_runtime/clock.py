"""The queue's only source of time: wall time for ``publish_at`` and sleeping for timers and
backpressure (spec/queue.md). A test clock makes both deterministic.
"""

from __future__ import annotations

import asyncio
import time as _time
from typing import Protocol


class Clock(Protocol):
    """Wall time and sleeping, injectable for tests."""

    def time(self) -> float:
        """Seconds since the epoch."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (at most a yield for 0 or less)."""


class SystemClock:
    """The real clock: ``time.time`` and ``asyncio.sleep``."""

    # ``time.time`` itself, no Python frame around it: every enqueue reads it.
    time = staticmethod(_time.time)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
