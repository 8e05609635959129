"""The queue's dead-task API: the operator commands, awaited off the event loop (Q-13, Q-33).

A mixin of ``Queue`` (queue.py), kept apart so that each class stays one screenful of jobs:
the store reads and writes run in a worker thread (Q-10), and a retried task is put back
on this queue's scheduler under its new id, as a replayed one would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from deferq._core.types import DeadTask, PendingTask
from deferq._runtime.book import TaskBook
from deferq._runtime.errors import ContextError
from deferq._runtime.replay import Replayer
from deferq._runtime.operator import Operator, Retried
from deferq._runtime.scheduler import Scheduler
from deferq._runtime.serialize import ContextCodec
from deferq._runtime.task import TaskRegistry


class DeadTaskApi:
    """``dead_tasks``, ``dead_task``, ``retry_dead_tasks`` and ``remove_dead_tasks``."""

    # Set by Queue.__init__.
    operator: Operator
    codec: ContextCodec
    registry: TaskRegistry
    _replayer: Replayer
    _book: TaskBook
    _scheduler: Scheduler

    async def dead_tasks(self, *, limit: int | None = None, offset: int = 0,
                         task_class: str | None = None,
                         exception_class: str | None = None) -> list[DeadTask]:
        """Dead tasks newest first, optionally filtered (Q-13)."""
        return await asyncio.to_thread(self.operator.list_dead, limit=limit, offset=offset,
                                       task_class=task_class, exception_class=exception_class)

    async def dead_task(self, task_id: str) -> DeadTask | None:
        """One dead task, or None."""
        return await asyncio.to_thread(self.operator.find_dead, task_id)

    async def retry_dead_tasks(self, ids: Iterable[str]) -> tuple[list[Retried], list[str]]:
        """Put dead tasks back into this worker's WAL under new ids and run them (Q-33)."""
        retried, missing = await asyncio.to_thread(self.operator.retry_dead, list(ids))
        for item in retried:
            if item.new_id is None:
                continue
            try:
                context = self.codec.decode(item.context)
            except ContextError as reason:
                await self._replayer.dead_letter_unloadable(
                    PendingTask(item.new_id, item.context, None), str(reason))
                continue
            cls = self.registry.get(context.task)
            if cls is None:
                await self._replayer.dead_letter_unloadable(
                    PendingTask(item.new_id, item.context, None),
                    f"task {context.task!r} is not registered")
                continue
            self._book.added(item.new_id, None, context.key)
            self._scheduler.schedule(item.new_id, context, cls, None)
        return retried, missing

    async def remove_dead_tasks(self, ids: Iterable[str]) -> int:
        """Remove dead tasks by id; the number found."""
        return await asyncio.to_thread(self.operator.remove_dead, list(ids))
