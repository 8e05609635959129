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
operation shares: its files and state, the checks that refuse work (closed, broken,
forked) and ``close``. The locks (L-1..L-4) are a small object it owns,
``deadlock.DeadLock``, reached through ``_locked``. The operations are mixins it
inherits: ``deadadds.DeadAdds`` (group commit and the durable append, S-4, S-14),
``deadreads.DeadReads`` (list, find and the index, S-6, S-7, S-10..S-13) and
``compact.DeadCompaction`` (remove, S-5, S-9, S-15).

Why the operations are mixins and the locks an object: the operations share this
one object's state tightly (the index that adds extend, reads check and compaction
drops; the compaction mark every add settles), the add path is tuned to
microseconds (attribute reads on one object, no extra call layer between ``add``
and the append), and the crash catalogue's mutants subclass ``DeadTaskStore`` and
override one method of any of them (``add``, ``_append_durably``, ``remove``,
``_locked``, ``_create_data_file``); every such override point is still a method of
the store. The locks share nothing but the lock file's descriptor, which the store
keeps a copy of (``_lock_fd``: the compaction mark, S-9, and the index's check,
S-10), so they stand alone, and a mutant that breaks only the locking swaps the
component (``_lock_class``) as one that breaks the index swaps ``_index_class``.
"""

from __future__ import annotations

import contextlib

from deferq._core.errors import StorageBrokenError, StorageClosedError
from deferq._core.limits import FILE_MODE
from deferq._core.names import dead_cache_name, dead_data_name, dead_lock_name, dead_tmp_name
from deferq._engine.compact import DeadCompaction
from deferq._engine.deadadds import DeadAdds, _AddRequest
from deferq._engine.deadindex import DeadIndex
from deferq._engine.deadlock import DeadLock, Held
from deferq._engine.deadfold import DeadFold
from deferq._engine.deadpages import DeadDeepPages
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


class DeadTaskStore(DeadAdds, DeadReads, DeadDeepPages, DeadFold, DeadCompaction):
    """The shared dead-task store of one storage directory and prefix. Thread-safe."""

    _index_class: type[DeadIndex] = DeadIndex  # S-10 (a mutant swaps it for a weaker one)
    _lock_class: type[DeadLock] = DeadLock  # L-1..L-4 (mutants swap it for broken ones)

    def __init__(self, env: Env, path: str, prefix: str, *, read_only: bool = False) -> None:
        self._env = env
        self._read_only = read_only  # S-32: an operator's view that only reads
        self._path = path
        self._data = join(path, dead_data_name(prefix))
        self._tmp = join(path, dead_tmp_name(prefix))
        self._cache = join(path, dead_cache_name(prefix))
        self._closed = False
        self._broken = False
        self._broken_reason = ""  # why it broke, repeated by every call it refuses (D-10)
        self._pid = env.getpid()
        self._init_process_state()
        lock_path = join(path, dead_lock_name(prefix))
        self._lock = (self._lock_class(env, lock_path, read_only=True) if read_only
                      else self._lock_class(env, lock_path))  # S-1, S-32
        # The lock file also carries the compaction mark (S-9) and the ctime the index is
        # checked against (S-10): a copy of its descriptor saves the add path one hop.
        self._lock_fd = self._lock.fd
        if read_only:
            return  # S-32: nothing created, nothing fsynced
        try:
            if not read_only:
                self._create_data_file()
        except BaseException:
            self._lock.close()
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
        # M-15: made by the seam, so the simulator can interleave threads at them.
        self._mutex = self._env.mutex()
        self._cond = self._env.condition(self._mutex)
        self._queue: list[_AddRequest] = []
        self._leading = False
        self._waiting = 0  # threads inside cond.wait() (S-14): notify only when some are
        self._index: DeadIndex | None = None
        # Bytes read by scans since the index was last dropped (S-11's build rule).
        self._cold_bytes = 0

    # ------------------------------------------------------------------ the locks and the checks

    def _locked(self, operation: str) -> contextlib.AbstractContextManager[None]:
        """Implements L-1..L-3 once the store may work: both locks, taken on ``__enter__``.

        Refusing here (C-9, W-14) rather than on ``__enter__`` is the same for every
        caller, each of which enters at once (``with self._locked(...)``).
        """
        self._check_usable()
        if self._read_only and operation != "read tasks from":
            raise RuntimeError(f"a read-only view of the dead-task store cannot {operation} it")
        return Held(self._lock, operation)

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageClosedError("the Disk backend is closed")
        if self._broken:
            raise StorageBrokenError("the dead-task store refuses work since an earlier failure"
                                     f" ({self._broken_reason}); restart the worker")
        if self._env.getpid() != self._pid:
            # W-14: a forked child shares the lock file's description, so its flock would
            # succeed while the parent holds it and its unlock would release the parent's.
            raise RuntimeError(
                f"this Disk was opened by process {self._pid}; a forked child must open its own")

    def _fail_stop(self, message: str, exc: OSError) -> StorageBrokenError:
        """Implements D-10: after a failed fsync nothing later may be acknowledged.

        The error says what failed, and ``exc`` why (naming the file, ``name_file``).
        """
        self._broken = True
        self._index = None
        self._broken_reason = f"{message}: {exc}"
        return StorageBrokenError(self._broken_reason)

    def _open_data(self, flags: OpenFlag) -> int | None:
        """Open the data file by path (S-3); None when it does not exist."""
        try:
            return self._env.open(self._data, flags)
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Release the lock file descriptor. Idempotent."""
        with self._lock.local:
            if self._closed:
                return
            self._closed = True
            self._index = None
            self._lock.close()

