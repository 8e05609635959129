"""The queue's injectable parts: the clock, backpressure settings, the backend protocol and
the queue's errors (spec/queue.md).

Rules: every value is validated when it is built (``Backpressure`` raises
``ValueError`` naming the bad field); the clock is the only source of time the
queue uses, so a test clock makes timers and backpressure deterministic.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from deferq._errors import DeferqError
from deferq._types import DeadTask, PendingTask

BACKPRESSURE_SLEEP_S: Final = 0.05


class PushTimeout(DeferqError, TimeoutError):
    """The backlog stayed above the low water mark for the whole backpressure timeout."""


class UnloadableTaskError(DeferqError):
    """Recorded as the exception of a task that could not be loaded at replay (Q-9)."""


class Clock(Protocol):
    """Wall time and sleeping, injectable for tests."""

    def time(self) -> float:
        """Seconds since the epoch."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (at most a yield for 0 or less)."""


class SystemClock:
    """The real clock: ``time.time`` and ``asyncio.sleep``."""

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class QueueBackend(Protocol):
    """What the queue needs from a backend; ``Disk`` and ``Nil`` both fit."""

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None) -> str | None: ...

    def remove_task(self, task_id: str) -> None: ...

    def pending_tasks(self) -> list[PendingTask]: ...

    def sync(self) -> None: ...

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int) -> str | None: ...

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]: ...

    def find_dead_task(self, task_id: str) -> DeadTask | None: ...

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int: ...


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
                or not math.isfinite(timeout) or timeout < 0):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")

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
