"""The successes of one run-soon batch, removed from the backend together (spec/queue.md Q-170).

Rules:
- A plain execution that succeeded in the scheduler's run-soon batch is held here; its
  removal is written with the others' in one backend call (``Journal.remove_many``, C-37,
  W-79) when the batch ends, or before the next execution once ``SUCCESS_HOLD_S`` passed
  since the first one held, whichever comes first (Q-170).
- Until that write the task is ``RUNNING`` (Q-58) and keeps its slot (Q-37): nothing else
  can begin, cancel it or ask for it in between, since the batch runs in one loop
  callback. A crash before the write runs it again (at-least-once, D-2).
- ``on_succeeded`` follows the write (Q-215); its ``duration_s`` ends when ``perform``
  returned, not at the write. A storage error leaves every task of the write in the WAL:
  logged once, each execution then ends as interrupted (Q-102, Q-219).

On a shared database (``SharedSuccesses``, Q-180) the write runs in the queue's write thread
(``sharedwrites.py``): ``flush`` hands the batch to an asyncio task in the scheduler's
``work``, so ``wait_idle`` and ``stop`` wait for it as for an execution. Until the write
returned the tasks stay ``RUNNING`` and keep their slots; then each success's
``on_succeeded`` is called and the executions end on the loop, as above. A failed removal is
logged with its task's id; that execution ends as interrupted and its task stays pending
(Q-182).

Why a batch: one backend call per success cost about a microsecond of the queue's own
time per task (the WAL's lock, state and fork checks and its fsync test, each time), a
tenth of a crash-safe enqueue and completion (docs/benchmarks.md, the Queue row).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from deferq._runtime.hooks import HookSet
from deferq._runtime.journal import Journal
from deferq._runtime.scheduler import Scheduler
from deferq._runtime.sharedwrites import SharedWrites

log = logging.getLogger("deferq.queue")

# Implements Q-170: the longest a success held here waits for its removal to be written
# while later executions of its batch run (a task marked inline is meant to be quick).
SUCCESS_HOLD_S: Final = 0.005
_LOGGED_IDS_MAX: Final = 5  # ids named in the storage error's log line


class Successes:
    """Plain successes of the current run-soon batch whose removal is not written yet."""

    def __init__(self, journal: Journal, hooks: HookSet,
                 ended: Callable[[list[str]], None]) -> None:
        self._journal = journal
        self._hooks = hooks
        self._ended = ended  # the executions are over: their counts and slots (the executor's)
        # Held, in the order their performs returned. The executor appends to it, and sets
        # ``since`` for the first, itself: that is every plain success's path.
        self.ids: list[str] = []
        self.since = 0.0  # when the first one held now was added (``time.perf_counter``)

    def flush(self) -> None:
        """Write the removal of every success held, then end each execution (Q-170)."""
        ids = self.ids
        if not ids:
            return
        self.ids = []
        try:
            self._journal.remove_many(ids)
            written = True
        except Exception:  # noqa: BLE001 - storage errors must not stop the loop
            more = len(ids) - _LOGGED_IDS_MAX
            log.exception("deferred tasks %s%s: storage error; they stay in the WAL",
                          ", ".join(ids[:_LOGGED_IDS_MAX]),
                          f" and {more} more" if more > 0 else "")
            written = False
        hooks = self._hooks
        if written and hooks.executions:
            for task_id in ids:
                hooks.succeeded(task_id)
        self._ended(ids)


class SharedSuccesses(Successes):
    """``Successes`` on a shared database: the batch's removal written off the loop (Q-180)."""

    def __init__(self, journal: Journal, hooks: HookSet, ended: Callable[[list[str]], None],
                 scheduler: Scheduler, shared: SharedWrites) -> None:
        super().__init__(journal, hooks, ended)
        self._scheduler = scheduler
        self._shared = shared

    def flush(self) -> None:
        """Implements Q-180: the removal of every success held, in an asyncio task of the
        scheduler's ``work`` whose write runs in the write thread."""
        ids = self.ids
        if not ids:
            return
        self.ids = []
        scheduler = self._scheduler
        assert scheduler.loop is not None
        scheduler.work.add(scheduler.loop.create_task(
            self._write(ids), name=f"deferq-successes-of-{ids[0]}"))

    async def _write(self, ids: list[str]) -> None:
        outcomes: list[Exception | None] = []  # none when the write was cancelled (``stop``)
        try:
            outcomes = await self._shared.remove_many(ids)
        except Exception:  # noqa: BLE001 - storage errors must not stop the loop
            log.exception("deferred tasks %s: storage error; %s", _named(ids),
                          self._journal.stays)
        finally:
            job = asyncio.current_task()
            if job is not None:
                self._scheduler.work.discard(job)  # before ``ended``: it may be the last work
            self._settled(ids, outcomes)

    def _settled(self, ids: list[str], outcomes: list[Exception | None]) -> None:
        """The write returned (or was given up): each written success's ``on_succeeded``,
        each failure logged, then every execution ends (those not written as interrupted)."""
        hooks = self._hooks
        for task_id, error in zip(ids, outcomes):
            if error is not None:
                log.error("deferred task %s: storage error (%s: %s); %s", task_id,
                          type(error).__name__, error, self._journal.stays, exc_info=error)
            elif hooks.executions:
                hooks.succeeded(task_id)
        self._ended(ids)


def successes_for(journal: Journal, hooks: HookSet, ended: Callable[[list[str]], None],
                  scheduler: Scheduler) -> Successes:
    """The successes of a run-soon batch: written inline on a local backend, off the loop on
    a shared database (Q-180)."""
    if journal.shared is None:
        return Successes(journal, hooks, ended)
    return SharedSuccesses(journal, hooks, ended, scheduler, journal.shared)


def _named(ids: list[str]) -> str:
    """The first ids of a batch and how many more, for a log line."""
    more = len(ids) - _LOGGED_IDS_MAX
    return ", ".join(ids[:_LOGGED_IDS_MAX]) + (f" and {more} more" if more > 0 else "")
