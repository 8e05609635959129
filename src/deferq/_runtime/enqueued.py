"""A written task's way to the scheduler when the enqueue's own call cannot take it there.

Rules (spec/queue.md): a task is scheduled only once its record is written (Q-6), and its
``enqueued`` hooks are told before it can start (Q-101). Two enqueues end here instead of
in the call that wrote the record:
- the caller of ``aenqueue`` was cancelled after its record was written on a power-safe
  ``Disk``: the task is scheduled once a group commit covers it, not if that commit fails
  (Q-41, D-16);
- ``aenqueue`` on a shared database wrote off the loop: the task is scheduled on the loop
  once the write thread returned (Q-181).
The common enqueue builds its event inline instead (queue.py, hooks.py's docstring).
"""

from __future__ import annotations

import asyncio

from deferq._runtime.hooks import HookSet
from deferq._runtime.journal import Journal
from deferq._runtime.scheduler import Scheduler
from deferq._runtime.serialize import Context
from deferq._runtime.task import Task


def schedule_once_committed(journal: Journal, scheduler: Scheduler,
                            late: set[asyncio.Task[None]], task_id: str, context: Context,
                            cls: type[Task], publish_in: int | None, hooks: HookSet,
                            publish_at: int | None) -> None:
    """Implements Q-41: the caller was cancelled after the record was written; the task is
    still scheduled here once a group commit covers it (not if it fails, D-16), and its hooks
    told (Q-101)."""
    async def once_committed() -> None:
        try:
            await journal.commit_written()
        except Exception:  # noqa: BLE001 - the WAL is broken (W-22); not scheduled (D-16)
            return
        if hooks.enqueues:
            hooks.enqueued(task_id, context, publish_at)
        scheduler.schedule(task_id, context, cls, publish_in)

    job = asyncio.ensure_future(once_committed())
    late.add(job)  # a strong reference until it is done
    job.add_done_callback(late.discard)


def schedule_written(hooks: HookSet, scheduler: Scheduler, context: Context,
                     cls: type[Task], publish_at: int | None, publish_in: int | None,
                     task_id: str) -> None:
    """Implements Q-181: a task ``aenqueue`` wrote off the loop, on the loop once written: its
    hooks told (Q-101: before it can start), then scheduled."""
    if hooks.enqueues:
        hooks.enqueued(task_id, context, publish_at)
    scheduler.schedule_from_any_thread(task_id, context, cls, publish_in)
