"""Mutants that change the order in which the dead-task store takes or releases its two locks.

Each keeps both locks (the lock file's flock and the process-local mutex, L-1) and breaks
only their order (L-7, L-8). Neither has a scenario of its own: they are caught by the
generic exploration of interleaved threads and processes (``_interleave.explore_threads``,
M-18), which knows nothing about them. Both bugs need a second thread of the same process
(which shares the lock file's open file description, so its flock "succeeds" or its unlock
releases the other thread's flock) and another process that then gets in beside the
thread still working.
"""

from __future__ import annotations

from deferq._core.errors import DeadTasksLockTimeout
from deferq._core.limits import LOCK_ATTEMPTS_MAX, lock_sleep_s
from deferq._engine.deadlock import DeadLock
from deferq._engine.deadstore import DeadTaskStore
from deferq.crashtest._crashengine import Engine
from deferq.crashtest._mutants import Mutant
from deferq.crashtest.catalogue._shared import disk_with

#: At most this many random plans are explored for each mutant (the first that shows a
#: violation ends it; the real engine then runs the same plans). Each mutant is caught by a
#: few per cent of the plans, so the bound is far above where they are caught.
THREAD_RUNS = 1000


class MutexFirstReleaseLock(DeadLock):
    """Releases the process-local mutex before the flock (breaks L-8)."""

    def release(self) -> None:
        self.local.release()  # BUG: another thread may now take the mutex, and "take" the
        self._env.flock_unlock(self.fd)  # flock this unlock then releases under it.


class MutexFirstReleaseStore(DeadTaskStore):
    _lock_class: type[DeadLock] = MutexFirstReleaseLock


class FlockFirstLock(DeadLock):
    """Takes the flock before the process-local mutex (breaks L-7)."""

    def acquire(self, operation: str) -> None:
        env = self._env
        for attempt in range(1, LOCK_ATTEMPTS_MAX + 1):
            # BUG: the flock "succeeds" while another thread of this process holds it, and
            # the unlock below, when the mutex is busy, releases that thread's flock.
            if env.flock_exclusive_nb(self.fd):
                if self.local.acquire(blocking=False):
                    return
                env.flock_unlock(self.fd)
            if attempt == LOCK_ATTEMPTS_MAX:
                raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
            env.sleep(lock_sleep_s(attempt))


class FlockFirstStore(DeadTaskStore):
    _lock_class: type[DeadLock] = FlockFirstLock


MUTANTS: tuple[Mutant, ...] = (
    Mutant("mutex-released-before-flock",
           "L-8, L-1, D-11: the process-local mutex is released before the flock",
           "generic thread/process interleaving exploration (M-18)",
           Engine("mutex-released-before-flock",
                  disk_with("MutexFirstRelease", dead=MutexFirstReleaseStore)),
           threads=THREAD_RUNS),
    Mutant("flock-before-mutex",
           "L-7, L-1, D-11: the flock is taken before the process-local mutex",
           "generic thread/process interleaving exploration (M-18)",
           Engine("flock-before-mutex", disk_with("FlockFirst", dead=FlockFirstStore)),
           threads=THREAD_RUNS),
)
