"""The dead-task store: one shared, append-only file for all workers (spec/dead-tasks.md).

Theory of operation (the dead-letter design of spec/dead-tasks.md):
- Three names: the data file (renamed over by compaction), the lock file
  (never renamed or unlinked, so every process serializes on one inode, S-2)
  and the compaction staging file ``.tmp``.
- Every operation takes the lock file with LOCK_EX | LOCK_NB *and* a
  process-local mutex in one bounded retry loop (L-1..L-3), then opens the data
  file by path: no data descriptor outlives an operation (S-3), so nobody
  writes to an inode a compaction has replaced.
- add: serialize first, then under the lock cut a torn tail, append, fsync
  (S-4). Threads of one process that add at once are committed as a group: the
  thread holding the locks appends every queued line in one write and one
  fsync (S-14). remove: survivors to ``.tmp``, fsync, rename, fsync the
  directory; with no match the live file is untouched and nothing is fsynced
  (S-5). list/find read backwards from the newest end in bounded chunks (S-6),
  or, once built, through a per-process index of the data file that is checked
  against the file under the lock before each use (S-10..S-13, ``_deadindex``).

Where each job lives: this module is the facade, ``DeadTaskStore``, with what every
operation shares: its files and state, the locks (L-1..L-4), the checks that refuse
work (closed, broken, forked) and ``close``. The operations are mixins it inherits:
``deadadds.DeadAdds`` (group commit and the durable append, S-4, S-14),
``deadreads.DeadReads`` (list, find and the index, S-6, S-7, S-10..S-13) and
``compact.DeadCompaction`` (remove, S-5, S-9, S-15). They are mixins rather than
separate objects because they share this one object's state tightly (the locks, the
index, the compaction mark), because the add path is tuned to microseconds (no extra
call layer or attribute hop), and because the crash catalogue's mutants subclass
``DeadTaskStore`` and override one method of any of them (``add``,
``_append_durably``, ``remove``, ``_locked``, ``_create_data_file``,
``_index_class``); every override point is still a method or attribute of the store.
"""

from __future__ import annotations

import contextlib
import threading

from deferq._core.errors import (
    DeadTasksLockTimeout,
    StorageBrokenError,
    StorageClosedError,
)
from deferq._core.limits import FILE_MODE, LOCK_ATTEMPTS_MAX, lock_sleep_s
from deferq._core.names import dead_data_name, dead_lock_name, dead_tmp_name
from deferq._engine.compact import DeadCompaction
from deferq._engine.deadadds import DeadAdds, _AddRequest
from deferq._engine.deadindex import DeadIndex
from deferq._engine.deadreads import DeadReads
from deferq._engine.env import Env, OpenFlag
from deferq._engine.io import join


def parent_dir(path: str) -> str:
    """The directory holding ``path`` (``.`` for a bare name)."""
    head, sep, _ = path.rstrip("/").rpartition("/")
    return head if head else ("/" if sep else ".")


def ancestors(path: str) -> list[str]:
    """The directories holding ``path``, its parent, ... up to ``/`` or ``.``, nearest first.

    ``..`` components are kept as written: their durability is the user's (A-4).
    """
    out = []
    while True:
        path = parent_dir(path)
        out.append(path)
        if path in ("/", "."):
            return out


class DeadTaskStore(DeadAdds, DeadReads, DeadCompaction):
    """The shared dead-task store of one storage directory and prefix. Thread-safe."""

    _index_class: type[DeadIndex] = DeadIndex  # S-10 (a mutant swaps it for a weaker one)

    def __init__(self, env: Env, path: str, prefix: str) -> None:
        self._env = env
        self._path = path
        self._data = join(path, dead_data_name(prefix))
        self._tmp = join(path, dead_tmp_name(prefix))
        self._local = threading.Lock()
        self._closed = False
        self._broken = False
        self._pid = env.getpid()
        self._init_process_state()
        # Implements S-1: the lock file is opened once and kept; it is never renamed.
        self._lock_fd = env.open(join(path, dead_lock_name(prefix)),
                                 OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE, FILE_MODE)
        try:
            self._create_data_file()
        except BaseException:
            env.close(self._lock_fd)
            raise

    def _create_data_file(self) -> None:
        """Implements S-1 / D-6: create the data file without truncating it and make its
        name durable before any dead task can leave a WAL."""
        self._env.close(self._env.open(self._data, OpenFlag.READ | OpenFlag.WRITE
                                       | OpenFlag.CREATE, FILE_MODE))
        self._env.fsync_dir(self._path)

    def _init_process_state(self) -> None:
        """The group-commit queue (S-14) and the per-process index (S-10), both empty."""
        # The condition's lock, taken directly where no wait or notify is needed: holding it
        # is holding the condition, and Condition.__enter__ is a Python-level call.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._queue: list[_AddRequest] = []
        self._leading = False
        self._waiting = 0  # threads inside cond.wait() (S-14): notify only when some are
        self._index: DeadIndex | None = None
        # Bytes read by scans since the index was last dropped (S-11's build rule).
        self._cold_bytes = 0

    # ------------------------------------------------------------------ locking

    def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]:
        """Implements L-1..L-3: both locks, non-blocking, bounded retries.

        Taken on ``__enter__`` by ``_Held`` (a plain context manager: a generator-based
        one costs a few microseconds more per dead-task call).
        """
        return _Held(self, operation)

    def _acquire(self, operation: str) -> None:
        """Take the process-local mutex and the flock in one bounded retry loop (L-1..L-3)."""
        self._check_usable()
        env = self._env
        for attempt in range(1, LOCK_ATTEMPTS_MAX + 1):
            if self._local.acquire(blocking=False):
                try:
                    taken = env.flock_exclusive_nb(self._lock_fd)
                except BaseException:
                    self._local.release()
                    raise
                if taken:
                    return
                self._local.release()
            if attempt == LOCK_ATTEMPTS_MAX:
                raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
            env.sleep(lock_sleep_s(attempt))

    def _release(self) -> None:
        """Implements L-4: release both locks, the mutex even if the unlock fails."""
        try:
            self._env.flock_unlock(self._lock_fd)
        finally:
            self._local.release()

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageClosedError("the Disk backend is closed")
        if self._broken:
            raise StorageBrokenError("the dead-task store failed to write or fsync earlier and"
                                     " refuses work; restart the worker")
        if self._env.getpid() != self._pid:
            # W-14: a forked child shares the lock file's description, so its flock would
            # succeed while the parent holds it and its unlock would release the parent's.
            raise RuntimeError(
                f"this Disk was opened by process {self._pid}; a forked child must open its own")

    def _fail_stop(self, message: str, exc: OSError) -> StorageBrokenError:
        """Implements D-10: after a failed fsync nothing later may be acknowledged."""
        self._broken = True
        self._index = None
        return StorageBrokenError(message)

    def _open_data(self, flags: OpenFlag) -> int | None:
        """Open the data file by path (S-3); None when it does not exist."""
        try:
            return self._env.open(self._data, flags)
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Release the lock file descriptor. Idempotent."""
        with self._local:
            if self._closed:
                return
            self._closed = True
            self._index = None
            self._env.close(self._lock_fd)


class _Held:
    """The locks of one dead-task operation, held between ``__enter__`` and ``__exit__``."""

    __slots__ = ("_operation", "_store")

    def __init__(self, store: DeadTaskStore, operation: str) -> None:
        self._store = store
        self._operation = operation

    def __enter__(self) -> None:
        self._store._acquire(self._operation)

    def __exit__(self, *exc_info: object) -> None:
        self._store._release()

