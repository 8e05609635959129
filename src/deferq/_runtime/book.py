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

Theory of operation: one dict, ``tasks``, task id -> ``publish_at`` (None for "due") or
``RUNNING``; two small dicts for keys, used only by tasks that have one. Per task that is
one dict entry beside what the scheduler already holds, and one ``pop`` when it ends. The
hot paths (an enqueue, an execution's start, a removal) write ``tasks`` directly instead
of calling a method: a Python call per step cost about 1,300 instructions, 13 % of an
enqueue+complete on ``Nil`` in all (callgrind); ``key_of`` is read only when it is not
empty.
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
RUNNING: Final = -1


class TaskBook:
    """The status and unique key of every task this queue holds in its WAL."""

    def __init__(self) -> None:
        self.tasks: dict[str, int | None] = {}  # task id -> publish_at, or RUNNING
        self._owners: dict[str, str] = {}  # key -> task id
        self.key_of: dict[str, str] = {}  # task id -> key
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.tasks)

    def added(self, task_id: str, publish_at: int | None, key: str | None = None) -> None:
        """A task is in the WAL, waiting for ``publish_at`` (None: due now)."""
        self.tasks[task_id] = publish_at
        if key is not None and key not in self._owners:
            self._owners[key] = task_id
            self.key_of[task_id] = key

    def forget(self, task_id: str) -> None:
        """The task left the WAL: its key, if it held one, is free again."""
        self.tasks.pop(task_id, None)
        if self.key_of:
            self.forget_key(task_id)

    def forget_key(self, task_id: str) -> None:
        """The task left the WAL: free its key if it held one."""
        key = self.key_of.pop(task_id, None)
        if key is not None:
            del self._owners[key]

    def owner(self, key: str) -> str | None:
        """The id of the pending task holding ``key``, or None."""
        return self._owners.get(key)

    def status(self, task_id: str, now_s: float) -> TaskStatus | None:
        """PENDING, DELAYED or RUNNING, or None when the book does not hold the task."""
        if task_id not in self.tasks:
            return None
        publish_at = self.tasks[task_id]
        if publish_at == RUNNING:
            return TaskStatus.RUNNING
        if publish_at is not None and publish_at > now_s:
            return TaskStatus.DELAYED
        return TaskStatus.PENDING

    def check_invariants(self) -> None:
        """Every key belongs to a task the book holds, both ways."""
        assert len(self._owners) == len(self.key_of)
        for key, task_id in self._owners.items():
            assert self.key_of[task_id] == key and task_id in self.tasks
