"""Dead-task store mutants: stores that break one rule of spec/dead-tasks.md each, and the Mutant
entries that say what catches them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from deferq._core.deadcodec import encode_dead
from deferq._core.errors import DeadTasksLockTimeout
from deferq._core.limits import FILE_MODE, LOCK_ATTEMPTS_MAX, lock_sleep_s
from deferq._core.types import DeadTask
from deferq._engine.deadindex import DeadIndex
from deferq._engine.deadlock import DeadLock
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import Env, FileStat, OpenFlag
from deferq._engine.io import lines_forward, write_all
from deferq.backends import Disk
from deferq.crashtest._crashrun import Engine
from deferq.crashtest._mutants import Mutant
from deferq.crashtest._workloads import Step
from deferq.crashtest.catalogue._scenarios import (
    scenario_add_after_other_process_compacted,
    scenario_index_after_another_process_compacted,
    scenario_lock_held_by_another_process,
    scenario_two_processes_compaction_and_add,
    scenario_two_threads_compaction_and_add,
)
from deferq.crashtest.catalogue._shared import (
    ADD,
    compact,
    dead_id,
    disk_with,
    swapped_handoff,
    workload,
    write_at,
)


class NoDeadTailRepairStore(DeadTaskStore):
    """Appends a dead task without cutting a torn tail first (S-4, D-12)."""

    def _append_durably(self, fd: int, line: bytes) -> None:
        env = self._env
        size = env.fstat(fd).size  # BUG: no repair_tail().
        try:
            write_all(env, fd, line)
        except OSError:
            self._cut_back(fd, size)
            raise
        try:
            env.fsync(fd)
        except OSError as exc:
            self._cut_back(fd, size)
            raise self._fail_stop("fsync of the dead-task data file failed", exc) from exc


class InPlaceRemoveStore(DeadTaskStore):
    """Compacts by truncating and rewriting the live data file in place (S-5, D-9)."""

    def remove(self, task_ids: set[str]) -> int:
        if not task_ids:
            return 0
        env = self._env
        with self._locked("delete tasks from"):
            fd = self._open_data(OpenFlag.READ | OpenFlag.WRITE)
            if fd is None:
                return 0
            try:
                keep: list[bytes] = []
                found: set[str] = set()
                for raw in lines_forward(env, fd, env.fstat(fd).size):
                    if raw.data is None or not raw.complete:
                        continue
                    task_id = dead_id(raw.data)
                    if task_id in task_ids:
                        found.add(task_id)
                    else:
                        keep.append(raw.data + b"\n")
                if found:
                    env.ftruncate(fd, 0)  # BUG: the old records are gone before the new are durable.
                    write_at(env, fd, b"".join(keep))
                    env.fsync(fd)
            finally:
                env.close(fd)
            return len(found)


class RenameUnsyncedTmpStore(DeadTaskStore):
    """Renames the compaction file over the data file without fsyncing it first (S-5)."""

    def remove(self, task_ids: set[str]) -> int:
        return compact(self, task_ids, fsync_tmp=False, fsync_dir=True)


class NoDirFsyncAfterRenameStore(DeadTaskStore):
    """Acknowledges a compaction before its rename is durable (S-5, D-6, D-9)."""

    def remove(self, task_ids: set[str]) -> int:
        return compact(self, task_ids, fsync_tmp=True, fsync_dir=False)


class NoDirFsyncAfterCreateStore(DeadTaskStore):
    """Creates the data file without fsyncing the directory (S-1, D-6)."""

    def _create_data_file(self) -> None:
        self._env.close(self._env.open(self._data, OpenFlag.READ | OpenFlag.WRITE
                                       | OpenFlag.CREATE, FILE_MODE))
        # BUG: no fsync_dir(self._path): the data file's name is not durable.


class FlockDataFileStore(DeadTaskStore):
    """Locks the data file itself (opened once, then flock retried) and writes through it.

    The renamed-inode race of the reference design (D-11): a compaction renames a new
    inode over the name while an adder waits for the old inode's lock.
    """

    _held: int = -1

    @contextlib.contextmanager
    def _locked(self, operation: str) -> Iterator[None]:
        self._check_usable()
        env = self._env
        fd = env.open(self._data, OpenFlag.READ | OpenFlag.WRITE | OpenFlag.APPEND
                      | OpenFlag.CREATE, FILE_MODE)
        try:
            for attempt in range(1, LOCK_ATTEMPTS_MAX + 1):
                if self._lock.local.acquire(blocking=False):
                    if env.flock_exclusive_nb(fd):  # BUG: the data file may be renamed over.
                        break
                    self._lock.local.release()
                if attempt == LOCK_ATTEMPTS_MAX:
                    raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
                env.sleep(lock_sleep_s(attempt))
            self._held = fd
            try:
                yield
            finally:
                self._held = -1
                self._lock.local.release()
        finally:
            env.close(fd)

    def add(self, task: DeadTask) -> str:
        line = encode_dead(task)
        with self._locked("add a task to"):
            self._append_durably(self._held, line)
        return task.id


class CachedDataFdStore(DeadTaskStore):
    """Keeps the data file open across operations: writes can go to a replaced inode (S-3)."""

    _cached: int | None = None

    def add(self, task: DeadTask) -> str:
        line = encode_dead(task)
        with self._locked("add a task to"):
            if self._cached is None:
                self._cached = self._env.open(self._data, OpenFlag.READ | OpenFlag.WRITE
                                              | OpenFlag.APPEND | OpenFlag.CREATE, FILE_MODE)
            self._append_durably(self._cached, line)  # BUG: may be a ghost after compaction.
        return task.id


class NoLocalMutexLock(DeadLock):
    """Takes only the flock, which a second thread of the same process shares (L-1, A-8)."""

    def acquire(self, operation: str) -> None:
        env = self._env
        for attempt in range(1, LOCK_ATTEMPTS_MAX + 1):
            if env.flock_exclusive_nb(self.fd):  # BUG: no process-local mutex.
                return
            if attempt == LOCK_ATTEMPTS_MAX:
                raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
            env.sleep(lock_sleep_s(attempt))

    def release(self) -> None:
        self._env.flock_unlock(self.fd)


class NoLocalMutexStore(DeadTaskStore):
    """Serializes only with flock, which a second thread of the same process shares (L-1, A-8)."""

    _lock_class: type[DeadLock] = NoLocalMutexLock


class BlockingLock(DeadLock):
    """Waits for the locks without bound instead of raising DeadTasksLockTimeout (L-3, D-8)."""

    def acquire(self, operation: str) -> None:
        env = self._env
        attempt = 0
        while True:  # BUG: no bound.
            attempt += 1
            if self.local.acquire(blocking=False):
                if env.flock_exclusive_nb(self.fd):
                    return
                self.local.release()
            env.sleep(lock_sleep_s(min(attempt, LOCK_ATTEMPTS_MAX)))


class BlockingLockStore(DeadTaskStore):
    """Waits for the lock without bound instead of raising DeadTasksLockTimeout (L-3, D-8)."""

    _lock_class: type[DeadLock] = BlockingLock


class SizeOnlyIndex(DeadIndex):
    """Trusts an index whenever the data file did not shrink (no identity or bytes check)."""

    def usable(self, env: Env, fd: int, stat: FileStat, lock_ctime_ns: int) -> bool:
        return stat.size >= self.end  # BUG: S-10 also wants inode, lock ctime and checked bytes.


class SizeOnlyIndexStore(DeadTaskStore):
    """Extends a stale index after another process's compaction (S-10, D-11)."""

    _index_class: type[DeadIndex] = SizeOnlyIndex


# ============================================================================ the registry

MUTANTS: tuple[Mutant, ...] = (
    Mutant("no-dead-tail-repair", "S-4, D-12: dead-task append without cutting a torn tail",
           "exploration: torn dead-task write, process kill, the recovery probe's add is lost",
           Engine("no-dead-tail-repair", disk_with("NoDeadTailRepair", dead=NoDeadTailRepairStore)),
           workloads=(workload(ADD, Step("give_up", 0, "t1")),)),
    Mutant("in-place-remove", "S-5, D-9: compaction truncates and rewrites the data file",
           "exploration: seeded store, power loss inside remove_dead loses d0's neighbour",
           Engine("in-place-remove", disk_with("InPlaceRemove", dead=InPlaceRemoveStore)),
           workloads=(workload(Step("give_up", 0, "p0"), Step("remove_dead", 0, "d0"),
                         start="seeded"),)),
    Mutant("rename-unsynced-tmp", "S-39, D-9: rename without fsyncing the compaction file",
           "exploration: power loss after remove_dead returned loses the surviving record",
           Engine("rename-unsynced-tmp", disk_with("RenameUnsynced", dead=RenameUnsyncedTmpStore)),
           workloads=(workload(Step("give_up", 0, "p0"), Step("remove_dead", 0, "d0"),
                         start="seeded"),)),
    Mutant("no-dir-fsync-after-rename", "S-39, D-6, D-9: compaction acked before the rename is durable",
           "exploration: power loss after remove_dead returned brings d0 back",
           Engine("no-dir-fsync-after-rename",
                  disk_with("NoDirFsyncRename", dead=NoDirFsyncAfterRenameStore)),
           workloads=(workload(Step("remove_dead", 0, "d0"), start="seeded"),)),
    Mutant("no-dir-fsync-after-create", "S-1, D-6: dead-task data file created without a directory fsync",
           "exploration: power loss after add_dead_task returned loses the file's name",
           Engine("no-dir-fsync-after-create",
                  disk_with("NoDirFsyncCreate", dead=NoDirFsyncAfterCreateStore)),
           workloads=(workload(ADD, Step("give_up", 0, "t1")),)),
    Mutant("flock-data-file", "L-1, S-2, D-11: locks the data file instead of the lock file",
           "scenario: two processes, add waits for the lock during a compaction's rename",
           Engine("flock-data-file", disk_with("FlockDataFile", dead=FlockDataFileStore)),
           scenario=scenario_two_processes_compaction_and_add),
    Mutant("cached-data-fd", "S-3, D-11: keeps the data file descriptor across operations",
           "scenario: two processes, add after the other process compacted",
           Engine("cached-data-fd", disk_with("CachedDataFd", dead=CachedDataFdStore)),
           scenario=scenario_add_after_other_process_compacted),
    Mutant("no-local-mutex", "L-1, A-8, D-11: no process-local exclusion (flock only)",
           "scenario: two threads of one process, add during a compaction's rename",
           Engine("no-local-mutex", disk_with("NoLocalMutex", dead=NoLocalMutexStore)),
           scenario=scenario_two_threads_compaction_and_add),
    Mutant("blocking-lock", "L-3, D-8: lock wait without bound",
           "scenario: lock held elsewhere; bounded simulated-time check",
           Engine("blocking-lock", disk_with("BlockingLock", dead=BlockingLockStore)),
           scenario=scenario_lock_held_by_another_process),
    Mutant("swapped-handoff", "D-13: WAL removal before the dead-task write",
           "exploration: crash between the two calls of give_up loses the task",
           Engine("swapped-handoff", Disk, swapped_handoff),
           workloads=(workload(ADD, Step("give_up", 0, "t1")),)),
)


MUTANTS = MUTANTS + (
    Mutant("index-trusts-size", "S-10, D-11: a dead-task index trusted while the file did not shrink",
           "scenario: two processes, find after the other process compacted and appended",
           Engine("index-trusts-size", disk_with("IndexTrustsSize", dead=SizeOnlyIndexStore)),
           scenario=scenario_index_after_another_process_compacted),
)
