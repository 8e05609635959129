"""The ``Disk`` backend: this worker's tasks WAL and the directory's shared dead-task store
(spec/api.md, spec/wal.md, spec/dead-tasks.md).

Rules: this facade validates every public argument precisely (C-7, C-8) and
then delegates to the engine (``wal.TasksWal``, ``deadstore.DeadTaskStore``),
which assumes valid input (one exception: ``remove_task`` leaves the check of
a ``str`` id to the WAL, which needs it only when the id is not pending, since
a pending id was checked when it was added). Storage is opaque bytes:
serializing task arguments belongs to the queue layer.

Group commit: ``add_task``/``remove_task`` with ``sync=False``, then
``written_ticket`` and ``sync_through`` (C-12..C-15, W-20..W-24) let async
callers wait for durability in a worker thread, sharing fsyncs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import TracebackType

from deferq._core.limits import (
    CONTEXT_BYTES_MAX,
    DEFAULT_FSYNC_FREQUENCY_S,
    DEFAULT_PATH,
    DEFAULT_PREFIX,
    DIR_MODE,
    SWEEP_FILES_MAX,
)
from deferq._core.taskid import check_task_id
from deferq._core.types import DeadTask, PendingTask
from deferq._engine.deadstore import DeadTaskStore, ancestors
from deferq._engine.env import Cancel, Env
from deferq._engine.osenv import OS_ENV, DirEnv
from deferq._engine.schedstore import ScheduleStore
from deferq._engine.wal import TasksWal
from deferq.backends._arguments import (
    check_caller_id,
    check_context,
    check_dead_task,
    check_ids,
    check_page,
    check_publish_at,
)
from deferq.backends._deadtask import dead_task_for
from deferq.backends._options import (
    check_files_max,
    check_fsync_frequency,
    check_path,
    check_prefix,
)

__all__ = ["Disk"]


class Disk:
    """Durable storage in a directory: this worker's tasks WAL and the shared dead-task store.

    Args:
        path: the storage directory, created with its parents (default ``storage``).
        prefix: the file-name prefix; ``-`` is appended when missing (default ``deferred-``).
        fsync_frequency: seconds between WAL fsyncs; 0 fsyncs every add and remove.
        env: the I/O seam; the real operating system by default.

    Guarantees: D-1..D-12 of spec/durability.md.
    """

    # The engine classes. Tests substitute deliberately broken subclasses here (the
    # mutant catalogue under tests/) to prove the crash suites catch them; nothing in
    # deferq changes these.
    _wal_class: type[TasksWal] = TasksWal
    _dead_class: type[DeadTaskStore] = DeadTaskStore

    def __init__(
        self,
        *,
        path: str | os.PathLike[str] = DEFAULT_PATH,
        prefix: str = DEFAULT_PREFIX,
        fsync_frequency: float = DEFAULT_FSYNC_FREQUENCY_S,
        env: Env | None = None,
    ) -> None:
        self.path = check_path(path)
        self.prefix = check_prefix(prefix)
        self.fsync_frequency = check_fsync_frequency(fsync_frequency)
        base: Env = OS_ENV if env is None else env
        base.makedirs(self.path, DIR_MODE)
        # Implements D-6: the storage directory's name, and those of any parents makedirs
        # may have just created, are durable before any record is.
        for directory in ancestors(self.path):
            base.fsync_dir(directory)
        # Implements F-25: on the real OS the directory is held open and every name is
        # resolved in it, so a later chdir or rename of the path cannot redirect a write.
        self._dir_env = DirEnv(self.path) if env is None else None
        self._env: Env = base if self._dir_env is None else self._dir_env
        try:
            self._wal = self._wal_class(self._env, self.path, self.prefix, self.fsync_frequency)
            try:
                self._dead = self._dead_class(self._env, self.path, self.prefix)
            except BaseException:
                self._wal.close()
                raise
        except BaseException:
            if self._dir_env is not None:
                self._dir_env.close_directory()
            raise
        self._ticker: Cancel | None = None
        if self.fsync_frequency > 0:
            self._ticker = self._env.call_every(self.fsync_frequency, self._wal.tick)

    @property
    def group_commit(self) -> bool:
        """True when ``fsync_frequency`` is 0: every synced write waits for its own fsync."""
        return self.fsync_frequency == 0

    # --- tasks WAL
    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str:
        """Append a pending task to this worker's WAL and return its id (W-6, D-1, D-2).

        ``sync=False`` never waits for an fsync (C-12): pair it with ``written_ticket``
        and ``sync_through`` to learn when the task is durable (C-13, C-14).
        """
        # The common case first (plain bytes within the limit, no time, no id): this is
        # the hot path of every enqueue, so it avoids the general checks' calls.
        if type(context) is bytes and len(context) <= CONTEXT_BYTES_MAX:
            data = context
        else:
            data = check_context(context)
        when = None if publish_at is None else check_publish_at(publish_at)
        tid = None if task_id is None else check_caller_id(task_id)
        if sync is not True and sync is not False:
            raise ValueError(f"sync must be a bool, not {type(sync).__name__}")
        return self._wal.add(data, when, tid, sync)

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        """Record that a task is done (W-6); ``sync=False`` as for ``add_task`` (C-12)."""
        if sync is not True and sync is not False:
            raise ValueError(f"sync must be a bool, not {type(sync).__name__}")
        # The WAL checks the id in full unless it is pending (then it is valid, C-7).
        self._wal.remove(task_id if type(task_id) is str else check_task_id(task_id), sync)

    def remove_tasks(self, task_ids: Iterable[str], *, sync: bool = True) -> int:
        """``remove_task`` of each id, the records written in one append (W-79); return how
        many of them were pending here. Every id is checked before anything is written (C-37)."""
        if sync is not True and sync is not False:
            raise ValueError(f"sync must be a bool, not {type(sync).__name__}")
        if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Iterable):
            raise ValueError(f"task_ids must be an iterable of task ids, not "
                             f"{type(task_ids).__name__}")
        ids = list(task_ids)
        for task_id in ids:
            if type(task_id) is not str:
                check_task_id(task_id)  # raises: not a str (C-7)
        return self._wal.remove_many(ids, sync)

    def written_ticket(self) -> int:
        """The ticket of the last record written to this worker's WAL (C-13, W-20).

        Every record this thread wrote before the call has a ticket at most this one.
        """
        return self._wal.written_ticket()

    def sync_through(self, ticket: int) -> None:
        """Block until every WAL record up to ``ticket`` is durable (C-14, W-21, W-22).

        Concurrent callers share fsyncs (group commit). Raises ``ValueError`` for a
        ticket that is not an int >= 0 or was never issued, and ``StorageBrokenError``
        when the fsync that had to cover the ticket failed.
        """
        if isinstance(ticket, bool) or not isinstance(ticket, int) or ticket < 0:
            raise ValueError(f"ticket must be an int >= 0 from written_ticket(), got {ticket!r}")
        self._wal.sync_through(ticket)

    def pending_tasks(self) -> list[PendingTask]:
        """Every task pending in this worker's WAL, recovered ones included (W-7)."""
        return self._wal.pending()

    def sync(self) -> None:
        """fsync the tasks WAL now if it has unsynced changes (W-8, D-2)."""
        self._wal.sync()

    def adopt_orphans(self, files_max: int = SWEEP_FILES_MAX) -> list[PendingTask]:
        """Adopt up to ``files_max`` orphaned WAL files into this worker's WAL (C-27, W-30..W-34).

        Returns the tasks adopted: pending in this WAL from now on, and durable (the
        orphans were unlinked only after an fsync covered them, W-32). Raises
        ``ValueError`` for a ``files_max`` that is not an int from 1 to 1024.
        """
        return self._wal.adopt_orphans(check_files_max(files_max))

    def open_schedules(self) -> ScheduleStore:
        """The periodic schedules' leader lock and records in this directory (Q-127, L-9)."""
        return ScheduleStore(self._env, self.path, self.prefix)

    def tick(self) -> None:
        """Run time-driven work that is due (the periodic fsync). Tests call it directly."""
        self._wal.tick()

    # --- dead-task store
    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int, enqueued_at: int | None = None) -> str:
        """Durably record a task that gave up; return its id (S-4, D-7)."""
        tid, data, error, name, count, first = check_dead_task(
            task_id, context, exception, task_class, attempts, enqueued_at)
        task = dead_task_for(tid, data, error, name, count, int(self._env.time()), first)
        return self._dead.add(task)

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        """Dead tasks newest first; ``offset`` skips, ``limit`` caps (S-6)."""
        lim, off = check_page(limit, offset)
        return self._dead.list_tasks(lim, off)

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        """The dead task with this id, or None (S-6)."""
        return self._dead.find(check_task_id(task_id))

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        """Remove dead tasks by id; return how many distinct ids were found (S-5, D-9)."""
        wanted = check_ids(ids)
        return self._dead.remove(wanted)

    # --- lifecycle
    def close(self) -> None:
        """Stop the fsync timer, fsync the WAL and release every lock and file (C-9)."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        try:
            self._wal.close()
        finally:
            try:
                self._dead.close()
            finally:
                if self._dir_env is not None:
                    self._dir_env.close_directory()

    def __enter__(self) -> Disk:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Disk(path={self.path!r}, prefix={self.prefix!r}, "
                f"fsync_frequency={self.fsync_frequency!r})")
