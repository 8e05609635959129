"""The queue's book of the tasks it holds: their status and unique keys (spec/queue.md Q-54, Q-55, Q-58).

Rules:
- The book knows the tasks in this queue's WAL that this queue wrote or replayed: added
  by ``enqueue``/``defer`` (after the backend write returned), by a retry's re-add, by
  ``start``'s replay and by a dead task's retry; forgotten when the journal removes the
  task (a success, the removal after a give-up, a cancel).
- A task is RUNNING from the moment its execution begins until its outcome is written;
  otherwise DELAYED while its ``publish_at`` is after the queue clock's now, else PENDING.
- A unique key belongs to the first task added with it and is released when that task is
  forgotten (Q-54). ``lock`` makes "is the key taken? write the task, take the key" one
  step for enqueues from several threads; only keyed enqueues take it.

Theory of operation: one dict, task id -> ``publish_at`` (None for "due") or ``_RUNNING``;
two small dicts for keys, used only by tasks that have one. Per task that is one dict
entry beside what the scheduler already holds, and one ``pop`` when it ends.
"""

from __future__ import annotations

import enum
import threading
from typing import Final


class TaskStatus(enum.Enum):
    """What ``Queue.status(task_id)`` says about a task (Q-58)."""

    PENDING = "pending"
    DELAYED = "delayed"
    RUNNING = "running"
    DEAD = "dead"
    UNKNOWN = "unknown"


# publish_at values are > 0 (C-7): -1 cannot be one.
_RUNNING: Final = -1


class TaskBook:
    """The status and unique key of every task this queue holds in its WAL."""

    def __init__(self) -> None:
        self._tasks: dict[str, int | None] = {}
        self._owners: dict[str, str] = {}  # key -> task id
        self._keys: dict[str, str] = {}  # task id -> key
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tasks)

    def added(self, task_id: str, publish_at: int | None, key: str | None = None) -> None:
        """A task is in the WAL, waiting for ``publish_at`` (None: due now)."""
        self._tasks[task_id] = publish_at
        if key is not None and key not in self._owners:
            self._owners[key] = task_id
            self._keys[task_id] = key

    def begun(self, task_id: str) -> None:
        """An execution of the task began."""
        self._tasks[task_id] = _RUNNING

    def forget(self, task_id: str) -> None:
        """The task left the WAL: its key, if it held one, is free again."""
        self._tasks.pop(task_id, None)
        if self._keys:
            key = self._keys.pop(task_id, None)
            if key is not None:
                del self._owners[key]

    def owner(self, key: str) -> str | None:
        """The id of the pending task holding ``key``, or None."""
        return self._owners.get(key)

    def status(self, task_id: str, now_s: float) -> TaskStatus | None:
        """PENDING, DELAYED or RUNNING, or None when the book does not hold the task."""
        if task_id not in self._tasks:
            return None
        publish_at = self._tasks[task_id]
        if publish_at == _RUNNING:
            return TaskStatus.RUNNING
        if publish_at is not None and publish_at > now_s:
            return TaskStatus.DELAYED
        return TaskStatus.PENDING

    def check_invariants(self) -> None:
        """Every key belongs to a task the book holds, both ways."""
        assert len(self._owners) == len(self._keys)
        for key, task_id in self._owners.items():
            assert self._keys[task_id] == key and task_id in self._tasks
