"""``Queue.cancel``: take back a task this queue holds (spec/queue.md Q-40).

Rules:
- A task not begun (delayed, waiting for a slot, due in the run-soon batch, or an asyncio
  task that has not taken its first step) never begins.
- A running execution's asyncio task is cancelled: an async perform is interrupted; a
  plain perform in the pool cannot be (its thread runs on). ``cancel`` waits at most
  ``STOP_GRACE_S`` on the clock for it to end, as ``stop`` does (Q-35).
- A task whose outcome is being written off the loop (a shared database, Q-183) is left
  alone: ``cancel`` returns False.
- Either way no outcome of the execution is ever written (no retry, no give-up, no
  removal: the ``cancelled`` mark the executor checks), and ``cancel`` itself removes the
  task from the WAL and logs it. Anything else (an unknown id, a task already finished, a
  queue not running) is False and changes nothing.

Theory of operation: the scheduler withdraws what has not begun; the executor's ``jobs``
says whether a running asyncio task took its first step (one that did not is only marked,
and ends at its first step without running).
"""

from __future__ import annotations

import asyncio
import logging

from deferq._runtime.clock import Clock
from deferq._runtime.executor import Executor
from deferq._runtime.hooks import HookSet
from deferq._runtime.journal import Journal
from deferq._runtime.scheduler import STOP_GRACE_S, Scheduler

log = logging.getLogger("deferq.queue")


class Canceller:
    """Cancels one task of a running queue (Q-40)."""

    def __init__(self, scheduler: Scheduler, executor: Executor, journal: Journal,
                 clock: Clock, hooks: HookSet | None = None) -> None:
        self._hooks = HookSet(()) if hooks is None else hooks
        self._scheduler = scheduler
        self._executor = executor
        self._journal = journal
        self._clock = clock

    async def cancel(self, task_id: str) -> bool:
        """Implements Q-40: True when ``task_id`` was held here and is now cancelled."""
        if not isinstance(task_id, str):
            raise TypeError(f"task_id must be a str, got {type(task_id).__name__}")
        scheduler = self._scheduler
        if not scheduler.running:
            return False
        shared = self._journal.shared
        if shared is not None and task_id in shared.writing:
            # Implements Q-183: its outcome is being written (off the loop): too late.
            log.info("deferred task %s was not cancelled: its outcome is being written",
                     task_id)
            return False
        withdrawn = scheduler.withdraw(task_id)
        where, context = (None, None) if withdrawn is None else withdrawn
        if where is None:
            job = scheduler.job_of(task_id)
            if job is None:
                return False
            where = "running"
            scheduler.cancelled.add(task_id)
            if self._executor.jobs.get(task_id) is job:
                job.cancel()
                if await self._ended(job):
                    scheduler.cancelled.discard(task_id)
            # else: it has not taken its first step; it ends there without running.
        removed = (self._journal.remove_checked(task_id) if shared is None
                   else await shared.remove_held(task_id))  # off the loop
        if not removed:
            # Implements Q-229: another worker holds it (this worker's lease ran out) or it is
            # gone; this worker stopped what it ran of it, and reports that as interrupted.
            log.warning("deferred task %s was not cancelled: another worker holds it (this "
                        "worker's lease on it ran out) or it is gone; that worker decides its "
                        "fate", task_id)
            if where == "running" and self._hooks.executions and task_id in self._hooks.open:
                self._hooks.ended(task_id)
            return False
        log.info("deferred task %s cancelled (it was %s); removed from the WAL", task_id, where)
        if self._hooks.executions:
            # Implements Q-102: one not begun, or a running one that took its first step
            # (one that did not is reported by the executor when it ends at that step).
            self._hooks.cancelled(task_id, where, context)
        return True

    async def _ended(self, job: asyncio.Task[None]) -> bool:
        """Wait at most ``STOP_GRACE_S`` on the clock for a cancelled job; whether it ended."""
        grace = asyncio.ensure_future(self._clock.sleep(STOP_GRACE_S))
        try:
            await asyncio.wait((job, grace), return_when=asyncio.FIRST_COMPLETED)
        finally:
            grace.cancel()
        if job.done() and not job.cancelled():
            job.exception()  # retrieved: the outcome is not recorded
        return job.done()
