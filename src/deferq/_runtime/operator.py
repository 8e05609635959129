"""Operator tools over a backend: dead-task list/show/retry/remove and stats
(spec/queue.md Q-13..Q-15, Q-33); the read-only WAL scan is ``deferq._engine.scan``.

Rules:
- Retry is durable before it is destructive (Q-33): every selected dead task
  is added to a WAL under a NEW id with attempts reset to 0 (a JSON context's
  field rewritten; any other context moved byte for byte: the operator never
  decodes arguments, let alone unpickles them), the WAL is fsynced
  (``sync()``), and only then are the dead records removed. A crash in
  between can run a task twice, never lose it. A new id is required because
  the old id may still be pending in another worker's WAL (W-15).
- Bulk actions act only on what the filters select and return what they
  touched (Q-13).
- Every method here blocks (locks, fsync): the queue calls them in a thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from deferq._core.types import DeadTask
from deferq._runtime.serialize import reset_attempts
from deferq.backends.protocol import Backend, DeadTaskAdmin


class TaskSink(Protocol):
    """Where ``retry_dead`` puts tasks: a ``Backend``, or the CLI's hand-off file (W-34)."""

    def add_task(self, context: bytes) -> str | None: ...

    def sync(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Retried:
    """One retried dead task: its dead-task id, its new WAL id and the context stored."""

    old_id: str
    new_id: str | None
    context: bytes


class Operator:
    """Dead-task operations over a backend; ``wal`` is needed only by ``retry``."""

    def __init__(self, dead: DeadTaskAdmin, wal: Backend | TaskSink | None = None) -> None:
        self._dead = dead
        self._wal: TaskSink | None = wal

    def list_dead(self, *, limit: int | None = None, offset: int = 0, task_class: str | None = None,
             exception_class: str | None = None) -> list[DeadTask]:
        """Dead tasks newest first, filtered by exact class names, then offset and limit."""
        if task_class is None and exception_class is None:
            return self._dead.list_dead_tasks(limit=limit, offset=offset)
        selected = [t for t in self._dead.list_dead_tasks()
                    if (task_class is None or t.task_class == task_class)
                    and (exception_class is None or t.exception_class == exception_class)]
        selected = selected[offset:]
        return selected if limit is None else selected[:limit]

    def find_dead(self, task_id: str) -> DeadTask | None:
        """The dead task with this id, or None."""
        return self._dead.find_dead_task(task_id)

    def retry_dead(self, ids: Iterable[str], on_task: Callable[[], None] | None = None
                   ) -> tuple[list[Retried], list[str]]:
        """Move dead tasks back to the WAL (Q-33). Returns (retried, ids not found).

        ``on_task`` is called once per id looked up and once per task added (for progress).
        """
        if self._wal is None:
            raise RuntimeError("retry needs a WAL backend")
        found: list[DeadTask] = []
        missing: list[str] = []
        for task_id in dict.fromkeys(ids):
            if on_task is not None:
                on_task()
            dead = self._dead.find_dead_task(task_id)
            if dead is None:
                missing.append(task_id)
            else:
                found.append(dead)
        if not found:
            return [], missing
        retried = []
        for dead in found:
            if on_task is not None:
                on_task()
            context = reset_attempts(dead.context)
            retried.append(Retried(dead.id, self._wal.add_task(context), context))
        self._wal.sync()
        self._dead.remove_dead_tasks([dead.id for dead in found])
        return retried, missing

    def remove_dead(self, ids: Iterable[str]) -> int:
        """Remove dead tasks by id; the number found."""
        return self._dead.remove_dead_tasks(list(ids))


def dead_stats(tasks: list[DeadTask]) -> dict[str, object]:
    """Counts of dead tasks, by task class and by exception class."""
    return {
        "dead_tasks": len(tasks),
        "by_task_class": dict(Counter(t.task_class for t in tasks).most_common()),
        "by_exception_class": dict(Counter(t.exception_class for t in tasks).most_common()),
    }
