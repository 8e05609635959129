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
- Long reads stream (Q-90): over a store that offers ``iter_dead_tasks`` (the CLI's
  view of the store, S-27), filtered and unfiltered lists, stats and bulk selections
  read it in lock steps, hold one task at a time and stop as soon as they have their
  page; over any other backend they fall back to ``list_dead_tasks``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from deferq._core.types import DeadTask
from deferq.backends.protocol import Backend, DeadTaskAdmin, DeadTaskFilters


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


@runtime_checkable
class DeadTaskStream(Protocol):
    """A dead-task store that can be read as a stream in lock steps (S-27..S-30)."""

    def iter_dead_tasks(self, *, offset: int = 0, limit: int | None = None
                        ) -> Iterator[DeadTask]:
        """Dead tasks newest first, each id at most once; ``offset`` skips ids and
        ``limit`` ends the read after that many more, those that do not decode included
        (S-33, S-34)."""


R = TypeVar("R")


@runtime_checkable
class DeadTaskFold(Protocol):
    """A dead-task store that can fold over all its tasks without holding their ids (S-86)."""

    def fold_dead_tasks(self, fold: Callable[[Iterator[DeadTask]], R]) -> R | None:
        """``fold`` of every dead task, or None when the store must be read in steps."""


class Operator:
    """Dead-task operations over a backend; ``wal`` is needed only by ``retry``."""

    def __init__(self, dead: DeadTaskAdmin, wal: Backend | TaskSink | None = None) -> None:
        self._dead = dead
        self._wal: TaskSink | None = wal

    def list_dead(self, *, limit: int | None = None, offset: int = 0, task_class: str | None = None,
             exception_class: str | None = None) -> list[DeadTask]:
        """Dead tasks newest first, filtered by exact class names, then offset and limit.

        Implements Q-90 over a streaming store: one task at a time, stopping at ``limit``.
        """
        unfiltered = task_class is None and exception_class is None
        if not isinstance(self._dead, DeadTaskStream):
            if unfiltered:
                return self._dead.list_dead_tasks(limit=limit, offset=offset)
            if isinstance(self._dead, DeadTaskFilters):  # P-32: the store filters from an index
                return self._dead.list_dead_tasks_where(limit=limit, offset=offset,
                                                        task_class=task_class,
                                                        exception_class=exception_class)
            selected = [t for t in self._dead.list_dead_tasks()
                        if (task_class is None or t.task_class == task_class)
                        and (exception_class is None or t.exception_class == exception_class)]
            selected = selected[offset:]
            return selected if limit is None else selected[:limit]
        if limit == 0:
            return []
        stream = (self._dead.iter_dead_tasks(offset=offset, limit=limit) if unfiltered
                  else self._dead.iter_dead_tasks())
        try:
            wanted: Iterator[DeadTask] = stream if unfiltered else itertools.islice(
                (t for t in stream
                 if (task_class is None or t.task_class == task_class)
                 and (exception_class is None or t.exception_class == exception_class)),
                offset, None)
            return list(itertools.islice(wanted, limit))
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # ends the read now: its damage is reported once (S-7)

    def select_ids(self, *, task_class: str | None = None,
                   exception_class: str | None = None) -> list[str]:
        """The ids of the dead tasks the filters select, newest first (Q-90: only ids held)."""
        if not isinstance(self._dead, DeadTaskStream):
            return [t.id for t in self.list_dead(task_class=task_class,
                                                 exception_class=exception_class)]
        return [t.id for t in self._dead.iter_dead_tasks()
                if (task_class is None or t.task_class == task_class)
                and (exception_class is None or t.exception_class == exception_class)]

    def dead_stats(self) -> dict[str, object]:
        """Counts of the dead tasks (Q-90: streamed when the store can stream)."""
        if not isinstance(self._dead, DeadTaskStream):
            return dead_stats(self._dead.list_dead_tasks())
        if isinstance(self._dead, DeadTaskFold):  # S-86: through the index cache
            counts = self._dead.fold_dead_tasks(dead_stats)
            if counts is not None:
                return counts
        return dead_stats(self._dead.iter_dead_tasks())

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
        # The context codec (pickle, hmac) only here: the read commands never need it.
        from deferq._runtime.serialize import reset_attempts  # noqa: PLC0415
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


def dead_stats(tasks: Iterable[DeadTask]) -> dict[str, object]:
    """Counts of dead tasks, by task class and by exception class, one task at a time."""
    count = 0
    by_task: Counter[str] = Counter()
    by_exception: Counter[str] = Counter()
    for task in tasks:
        count += 1
        by_task[task.task_class] += 1
        by_exception[task.exception_class] += 1
    return {
        "dead_tasks": count,
        "by_task_class": dict(by_task.most_common()),
        "by_exception_class": dict(by_exception.most_common()),
    }
