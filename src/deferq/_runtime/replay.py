"""Replay: pending tasks handed to the scheduler, and those that cannot be loaded.

Rules (spec/queue.md):
- At start every pending task is replayed with its remaining delay; one that cannot be
  loaded (undecodable, or its task not registered) is dead-lettered with the reason,
  never dropped (Q-9). A task a shared backend's claim hands over (Q-227) and one the
  adoption sweep found (Q-70) take the same path, and hooks hear where it came from
  (``ReplaySource``, Q-101).
- A replayed task's unique key is held again (Q-55).

Theory of operation: ``Replayer`` decodes the record, finds its class in the registry and
schedules it; what it cannot load goes to the journal's give-up as an
``UnloadableTaskError``. It shares nothing with an execution but the scheduler, the
journal and the hooks, which is why it is not the executor's.
"""

from __future__ import annotations

import logging
from typing import Final

from deferq._core.types import PendingTask
from deferq._runtime.errors import UnloadableTaskError
from deferq._runtime.hooks import HookSet, ReplaySource
from deferq._runtime.journal import NOT_DEAD, Journal
from deferq._runtime.scheduler import Scheduler
from deferq._runtime.serialize import ContextCodec, ContextError
from deferq._runtime.task import TaskRegistry
from deferq.backends._deadtask import task_class_name

log = logging.getLogger("deferq.queue")
UNKNOWN_TASK_CLASS: Final = "<unknown>"  # the name of a record whose task name is unreadable


class Replayer:
    """Hands pending tasks to the scheduler (Q-9), or dead-letters those it cannot load."""

    def __init__(self, scheduler: Scheduler, journal: Journal, *, registry: TaskRegistry,
                 codec: ContextCodec, hooks: HookSet) -> None:
        self._scheduler = scheduler
        self._journal = journal
        self._registry = registry
        self._codec = codec
        self._hooks = hooks

    async def replay(self, pending: PendingTask, now: int,
                     source: ReplaySource = ReplaySource.START) -> bool:
        """Implements Q-9 for one pending task: schedule it with its remaining delay.

        Returns False when the task could not be loaded (it was dead-lettered instead).
        """
        try:
            context = self._codec.decode(pending.context)
            cls = self._registry.get(context.task)
            if cls is None:
                raise ContextError(f"task {context.task!r} is not registered")
        except ContextError as reason:
            await self.dead_letter_unloadable(pending, str(reason))
            return False
        publish_in = None if pending.publish_at is None else pending.publish_at - now
        self._journal.book.added(pending.task_id, pending.publish_at, context.key)
        self._scheduler.schedule(pending.task_id, context, cls, publish_in)
        if self._hooks.replays:
            self._hooks.replayed(pending.task_id, context, pending.publish_at, source)
        return True

    async def replay_adopted(self, pending: PendingTask, now: int) -> bool:
        """``replay`` of a task the adoption sweep found (Q-70)."""
        return await self.replay(pending, now, ReplaySource.ADOPTED)

    async def dead_letter_unloadable(self, pending: PendingTask, reason: str) -> None:
        """Implements Q-9: a task that cannot be loaded is dead-lettered with the reason."""
        name = self._codec.peek_task_name(pending.context) or UNKNOWN_TASK_CLASS
        try:
            loaded = self._codec.decode(pending.context)
            attempts, enqueued_at, meta = loaded.attempts, loaded.enqueued_at, loaded.meta
        except ContextError:
            attempts, enqueued_at, meta = 0, None, None
        error = UnloadableTaskError(f"cannot load the task: {reason}")
        # Implements Q-31: whatever the record holds, the name fits a dead-task record.
        dead = await self._journal.give_up(pending.task_id, pending.context, error,
                                           task_class_name(name), attempts, enqueued_at)
        log.error("deferred task %s (%s) cannot be loaded: %s; %s", pending.task_id,
                  task_class_name(name), reason, "dead-lettered" if dead else NOT_DEAD)
        if dead and self._hooks.executions:
            self._hooks.unloadable_dead_lettered(pending.task_id, task_class_name(name),
                                                 attempts, meta, error)
