"""The ``Memory`` backend: ``Disk``'s semantics in a process's memory, for tests (spec/api.md C-21).

Rules:
- It validates every argument as ``Disk`` does (C-7, C-8), so a test that passes on
  ``Memory`` does not hide an argument ``Disk`` would refuse.
- Pending tasks: an id is added once and keeps its position when re-added with the same
  id (W-7, R-@J); a remove of an id not held changes nothing; ids are generated in the
  same shape as ``Disk``'s (``{seed}-{pid}-{n}``).
- Dead tasks are kept, unlike ``Nil``: listed newest first, each id once at its latest
  record; find, remove, and the record's fields (exception class, message, backtrace,
  clipped) are exactly what ``Disk`` would store (F-10, F-12).
- Nothing survives the process; everything survives a ``Queue`` restart on the same
  instance, which is how a test checks replay. ``close`` makes every later call raise
  ``StorageClosedError``; reopen with ``reopen()``.
- Thread-safe: the queue calls the dead-task methods in a worker thread.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from deferq._core.errors import StorageClosedError
from deferq._core.limits import SWEEP_FILES_MAX
from deferq._core.taskid import check_task_id
from deferq._core.types import DeadTask, PendingTask
from deferq.backends._arguments import (
    check_context,
    check_dead_task,
    check_ids,
    check_page,
    check_publish_at,
)
from deferq.backends._deadtask import dead_task_for
from deferq.backends._options import check_files_max

__all__ = ["Memory"]


class Memory:
    """Pending and dead tasks in memory, with ``Disk``'s checks and semantics (C-21).

    Args:
        now: a callable giving the wall time in epoch seconds (default ``time.time``);
            pass a test clock's ``time`` so that dead tasks' ``failed_at`` follows it.
    """

    def __init__(self, *, now: Callable[[], float] | None = None) -> None:
        if now is not None and not callable(now):
            raise ValueError(f"now must be a callable returning epoch seconds, not "
                             f"{type(now).__name__}")
        self._now: Callable[[], float] = time.time if now is None else now
        self._lock = threading.Lock()
        self._pending: dict[str, PendingTask] = {}
        self._dead: dict[str, DeadTask] = {}  # insertion order = age; a re-add moves to the end
        self._seed = int(time.time())
        self._counter = itertools.count(1)
        self._closed = False
        self._written = 0

    @property
    def group_commit(self) -> bool:
        return False

    # --- pending tasks
    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str:
        data = check_context(context)
        when = check_publish_at(publish_at)
        tid = None if task_id is None else check_task_id(task_id)
        if sync is not True and sync is not False:
            raise ValueError(f"sync must be a bool, not {type(sync).__name__}")
        with self._lock:
            self._check_open()
            if tid is None:
                tid = f"{self._seed}-{os.getpid()}-{next(self._counter)}"
            # W-7, R-@J: a re-added id replaces the task and keeps its position.
            self._pending[tid] = PendingTask(tid, data, when)
            self._written += 1
            return tid

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        tid = check_task_id(task_id)
        if sync is not True and sync is not False:
            raise ValueError(f"sync must be a bool, not {type(sync).__name__}")
        with self._lock:
            self._check_open()
            if self._pending.pop(tid, None) is not None:
                self._written += 1

    def pending_tasks(self) -> list[PendingTask]:
        with self._lock:
            self._check_open()
            return list(self._pending.values())

    def written_ticket(self) -> int:
        with self._lock:
            self._check_open()
            return self._written

    def sync_through(self, ticket: int) -> None:
        if isinstance(ticket, bool) or not isinstance(ticket, int) or ticket < 0:
            raise ValueError(f"ticket must be an int >= 0 from written_ticket(), got {ticket!r}")
        with self._lock:
            self._check_open()
            if ticket > self._written:
                raise ValueError(f"ticket {ticket} was never issued (the latest is "
                                 f"{self._written})")

    def sync(self) -> None:
        with self._lock:
            self._check_open()

    def adopt_orphans(self, files_max: int = SWEEP_FILES_MAX) -> list[PendingTask]:
        """One process's memory has no orphans: validate as ``Disk`` does, adopt nothing (C-27)."""
        check_files_max(files_max)
        with self._lock:
            self._check_open()
        return []

    # --- dead tasks
    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int) -> str:
        tid, data, error, name, count = check_dead_task(task_id, context, exception, task_class,
                                                        attempts)
        task = dead_task_for(tid, data, error, name, count, int(self._now()))
        with self._lock:
            self._check_open()
            self._dead.pop(tid, None)  # the latest record of an id is the one that counts
            self._dead[tid] = task
        return tid

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        lim, off = check_page(limit, offset)
        with self._lock:
            self._check_open()
            newest = list(reversed(self._dead.values()))[off:]
        return newest if lim is None else newest[:lim]

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        tid = check_task_id(task_id)
        with self._lock:
            self._check_open()
            return self._dead.get(tid)

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        wanted = check_ids(ids)
        with self._lock:
            self._check_open()
            return sum(1 for tid in wanted if self._dead.pop(tid, None) is not None)

    # --- lifecycle
    def close(self) -> None:
        with self._lock:
            self._closed = True

    def reopen(self) -> None:
        """Open again after ``close``, with everything held before (a process restart that
        kept its memory: what a test of replay needs)."""
        with self._lock:
            self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("the Memory backend is closed")

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Memory(pending={len(self._pending)}, dead={len(self._dead)})"
