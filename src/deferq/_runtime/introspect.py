"""What a queue says about its work: its counts, ``wait_idle`` and a task's status (Q-58).

Theory of operation: a mixin of ``Queue`` (like ``DeadTaskApi``), reading the parts the
queue owns: the scheduler's counts, the executor's running executions, the book's status
of every task the queue holds, and the dead-task store for a task the book does not know.
"""

from __future__ import annotations

import asyncio

from deferq._runtime.book import TaskBook, TaskStatus
from deferq._runtime.clock import Clock
from deferq._runtime.executor import Executor
from deferq._runtime.operator import Operator
from deferq._runtime.scheduler import Scheduler


class Introspection:
    """``backlog_size``, ``running``, ``waiting``, ``delayed``, ``wait_idle`` and ``status``."""

    # Set by Queue.__init__.
    operator: Operator
    clock: Clock
    _book: TaskBook
    _scheduler: Scheduler
    _executor: Executor

    @property
    def backlog_size(self) -> int:
        """Immediate tasks scheduled but not yet picked up (what backpressure counts)."""
        return self._scheduler.backlog

    @property
    def running(self) -> int:
        """Executions in progress."""
        return self._executor.inflight

    @property
    def waiting(self) -> int:
        """Executions due now that wait for a slot (``max_concurrency``, Q-37)."""
        return self._scheduler.waiting

    @property
    def delayed(self) -> int:
        """Tasks waiting for their publish time in this process."""
        return self._scheduler.delayed

    async def wait_idle(self) -> None:
        """Return when no immediate or running work is left (delayed tasks may remain)."""
        await self._scheduler.wait_idle()

    async def status(self, task_id: str) -> TaskStatus:
        """Implements Q-58: PENDING, DELAYED or RUNNING for a task in this queue's WAL (no I/O);
        else DEAD when the shared dead-task store holds it (read in a thread); else UNKNOWN.
        """
        if not isinstance(task_id, str):
            raise ValueError(f"task_id must be a str, got {type(task_id).__name__}")
        known = self._book.status(task_id, self.clock.time())
        if known is not None:
            return known
        dead = await asyncio.to_thread(self.operator.find_dead, task_id)
        return TaskStatus.UNKNOWN if dead is None else TaskStatus.DEAD
