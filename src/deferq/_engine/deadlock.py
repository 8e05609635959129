"""The dead-task store's locks: the lock file's flock and a process-local mutex (spec/dead-tasks.md L-1..L-4).

Rules: every dead-task operation holds both locks, taken in one loop of at most
``LOCK_ATTEMPTS_MAX`` non-blocking attempts with ``lock_sleep_s`` between them
(L-1..L-3); past the bound it raises ``DeadTasksLockTimeout`` without waiting
on (L-3, D-8). Both are released on every exit, the mutex even if the unlock
fails (L-4). The flock is taken on the lock file, which is opened once, kept,
and never renamed or unlinked, so every process serializes on one inode (S-1,
S-2); the data file is never locked, since compaction renames over it (D-11).

Theory of operation: flock excludes other processes only; threads of one
process share the lock file's description and would all "hold" the flock at
once, so a process-local mutex excludes them (L-1, A-8). The mutex is tried
first and released when the flock is not free, so a thread never sleeps holding
it. ``DeadLock`` is a small object the store (``deadstore.DeadTaskStore``) owns
and reaches through one attribute; its ``fd`` is also where compaction keeps its
mark (S-9) and whose ctime the index checks (S-10), and ``local`` is what
``close`` takes. The store checks that it may work (closed, broken, forked)
before it asks for the locks. ``Held`` is a plain context manager, not a
generator-based one, which would cost a few microseconds more per dead-task
call. The crash catalogue's lock mutants subclass ``DeadLock`` and plug in
through the store's ``_lock_class``.
"""

from __future__ import annotations

from deferq._core.errors import DeadTasksLockTimeout
from deferq._core.limits import FILE_MODE, LOCK_ATTEMPTS_MAX, lock_sleep_s
from deferq._engine.env import Env, Mutex, OpenFlag


class DeadLock:
    """The two locks of one dead-task store and the lock file that carries the flock."""

    __slots__ = ("_env", "fd", "local")

    def __init__(self, env: Env, lock_path: str, *, read_only: bool = False) -> None:
        self._env = env
        # M-15: through the seam, so the simulator can interleave threads at it (L-7).
        self.local: Mutex = env.mutex()
        # Implements S-1: the lock file is opened once and kept; it is never renamed.
        # A read-only view opens it for reading only and never creates it (S-32): flock
        # needs no write access.
        self.fd = (env.open(lock_path, OpenFlag.READ) if read_only else
                   env.open(lock_path, OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE,
                            FILE_MODE))

    def acquire(self, operation: str) -> None:
        """Implements L-1..L-3: the mutex and the flock in one bounded retry loop.

        Implements L-7: the mutex first; the flock is tried only while it is held.
        """
        env = self._env
        local = self.local
        for attempt in range(1, LOCK_ATTEMPTS_MAX + 1):
            if local.acquire(blocking=False):
                try:
                    taken = env.flock_exclusive_nb(self.fd)
                except BaseException:
                    local.release()
                    raise
                if taken:
                    return
                local.release()
            if attempt == LOCK_ATTEMPTS_MAX:
                raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
            env.sleep(lock_sleep_s(attempt))

    def release(self) -> None:
        """Implements L-4: release both locks, the mutex even if the unlock fails.

        Implements L-8: the flock first, so no other thread of this process can take the mutex
        while the lock file's description still holds the flock this unlock is about to drop.
        """
        try:
            self._env.flock_unlock(self.fd)
        finally:
            self.local.release()

    def close(self) -> None:
        """Close the lock file; the store calls it once, holding ``local`` or never having worked."""
        self._env.close(self.fd)


class Held:
    """The locks of one dead-task operation, held between ``__enter__`` and ``__exit__``."""

    __slots__ = ("_lock", "_operation")

    def __init__(self, lock: DeadLock, operation: str) -> None:
        self._lock = lock
        self._operation = operation

    def __enter__(self) -> None:
        self._lock.acquire(self._operation)

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()
