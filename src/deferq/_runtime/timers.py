"""The timers of delayed tasks: one heap and one sleeper on the ``Clock`` (spec/queue.md Q-36).

Rules:
- Every delayed task of the queue waits in one binary heap ordered by (deadline, arrival);
  at most one asyncio task (the sleeper) exists for all of them, asleep on the queue's
  ``Clock`` until the earliest deadline. A task whose deadline arrives is handed to
  ``fire`` in deadline order, ties in the order they were added.
- ``cancel`` and ``clear`` never search the heap: they drop the task from ``_live`` (the
  one map of live timers, by task id), and the heap entry that is no longer the live one is
  skipped when it reaches the top (lazy deletion). So a timer costs one heap entry and one
  map entry, and ``clear`` (``stop``) costs one cancellation, whatever the count (Q-36).

Theory of operation: the deadline is the clock's time at ``add`` plus the whole seconds of
the delay, as the one-task-per-timer code slept ``int(delay)``. The sleeper sleeps for
``deadline - clock.time()``; a new timer earlier than the one it sleeps for replaces it
(a cancellation and a new sleeper). A clock's sleep may end a rounding error before the
deadline (a ``ManualClock`` adds the wait to its own time; the real clock sleeps on the
monotonic clock but tells wall time), so a timer within ``_DUE_SLACK_S`` of the clock is
due, rather than sleeping again for a microsecond. Tests that drive a ``ManualClock`` see
one sleeper whose deadline is the earliest timer's, so ``drain`` keeps working.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Final

from deferq._runtime.clock import Clock
from deferq._runtime.serialize import Context
from deferq._runtime.task import Task

# A timer this close to the clock's time is due (see the module docstring).
_DUE_SLACK_S: Final = 1e-3

# A heap entry: deadline, arrival order (ties), task id, its context and class.
_Entry = tuple[float, int, str, Context, "type[Task]"]
Fire = Callable[[str, Context, "type[Task]"], None]


class TimerHeap:
    """Delayed tasks waiting for their time: one heap, one sleeper on the clock."""

    def __init__(self, clock: Clock, fire: Fire) -> None:
        self._clock = clock
        self._fire = fire
        self._heap: list[_Entry] = []
        self._live: dict[str, _Entry] = {}  # task id -> its live heap entry
        self._order = itertools.count()
        self._sleeper: asyncio.Task[None] | None = None
        self._sleeping_until = float("inf")  # the deadline the sleeper waits for

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._live

    def add(self, loop: asyncio.AbstractEventLoop, task_id: str, context: Context,
            cls: type[Task], publish_in: float) -> None:
        """Run ``task_id`` through ``fire`` once ``int(publish_in)`` seconds have passed."""
        deadline = self._clock.time() + int(publish_in)
        entry = (deadline, next(self._order), task_id, context, cls)
        heapq.heappush(self._heap, entry)
        self._live[task_id] = entry
        if deadline < self._sleeping_until:
            # The sleeper waits for a later timer (or there is none): one for this one.
            if self._sleeper is not None:
                self._sleeper.cancel()
            self._sleeping_until = deadline
            self._sleeper = loop.create_task(self._sleep(), name="deferq-timers")

    def cancel(self, task_id: str) -> tuple[Context, type[Task]] | None:
        """Forget the timer of ``task_id``: its (context, class), or None when it has none."""
        entry = self._live.pop(task_id, None)
        if entry is None:
            return None
        return entry[3], entry[4]

    def clear(self) -> None:
        """Forget every timer and cancel the sleeper (``stop``, Q-15, Q-36)."""
        self._heap.clear()
        self._live.clear()
        if self._sleeper is not None:
            self._sleeper.cancel()
            self._sleeper = None
        self._sleeping_until = float("inf")

    def next_deadline(self) -> float | None:
        """The earliest live deadline, or None."""
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][2]) is not heap[0]:
            heapq.heappop(heap)  # cancelled, or replaced by a newer timer of the same id
        return heap[0][0] if heap else None

    async def _sleep(self) -> None:
        """The one sleeper: wait for the earliest deadline, fire what is due, repeat."""
        clock, heap, live = self._clock, self._heap, self._live
        try:
            while True:
                deadline = self.next_deadline()
                if deadline is None:
                    return
                self._sleeping_until = deadline
                wait_s = deadline - clock.time()
                if wait_s > _DUE_SLACK_S:
                    await clock.sleep(wait_s)
                    continue
                due_by = clock.time() + _DUE_SLACK_S
                while heap and heap[0][0] <= due_by:
                    entry = heapq.heappop(heap)
                    task_id = entry[2]
                    if live.get(task_id) is entry:
                        del live[task_id]
                        self._fire(task_id, entry[3], entry[4])
        finally:
            if self._sleeper is asyncio.current_task():
                self._sleeper = None
                self._sleeping_until = float("inf")

    def check_invariants(self) -> None:
        """Every live timer is in the heap; the sleeper exists when a timer is live."""
        in_heap = {id(entry) for entry in self._heap}
        assert all(id(entry) in in_heap for entry in self._live.values())
        assert not self._live or self._sleeper is not None
