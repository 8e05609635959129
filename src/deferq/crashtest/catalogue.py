"""The mutant catalogue: deliberately broken storage engines the crash suites must catch.

Goal: prove that the crash exploration (``deferq.crashtest._explore``) and the targeted
interleaving scenarios below have teeth: each mutant breaks exactly one rule of
spec/wal.md or spec/dead-tasks.md, and some check must report a violation for it while
the real engine passes the same check. Method: each mutant is a subclass of
``TasksWal`` or ``DeadTaskStore`` plugged into a ``Disk`` subclass through ``_wal_class``
/ ``_dead_class`` (or, for the handoff order, an ``Engine`` whose ``handoff`` swaps the
two calls). Nothing here is a flag in the product: the catalogue ships with the crash-testing
kit so that ``deferq crash-test`` from an installed wheel checks every mutant, and the library
never imports it (tests/unit/test_layering.py). ``MUTANTS`` is the registry read by ``deferq
crash-test`` and by ``tests/mutants/test_mutants_are_caught.py``: each entry names what it
breaks and what catches it.

Concurrency mutants (process-local exclusion, flock on the data file, a cached data
descriptor, a blocking lock) are caught by small deterministic scenarios: two threads
or two simulated processes on one ``SimDisk``, where a hook on one thread's seam call
parks it and runs the other one until that one finishes or sleeps in its lock retry.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from deferq._engine.deadindex import DeadIndex
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import Env, FileStat, OpenFlag
from deferq._core.errors import DeadTasksLockTimeout, StorageBrokenError
from deferq._core.format import encode_dead
from deferq._engine.io import join, lines_forward, repair_tail, write_all
from deferq._core.limits import FILE_MODE, LOCK_ATTEMPTS_MAX, WAL_SIZE_INCREASE_RATIO, lock_sleep_s
from deferq._core.model import Dead, Pending, StorageModel
from deferq._core.types import DeadTask
from deferq._engine.wal import TasksWal
from deferq.backends import Disk
from deferq.crashtest import SimDisk, SimEnv
from deferq.crashtest._crashrun import PATH, PREFIX, Engine, HandoffOps
from deferq.crashtest._mutants import Mutant, check_disk
from deferq.crashtest._tracing import TracingEnv
from deferq.crashtest._workloads import Step, Workload

# ============================================================================ WAL mutants


class RetryFailedFsyncWal(TasksWal):
    """Retries a failed WAL fsync; the retry "succeeds" (A-7) and the write is acknowledged."""

    def _sync_locked(self) -> None:
        target = self._written
        if self._durable >= target:
            return
        try:
            self._env.fsync(self._fd)
        except OSError:
            self._env.fsync(self._fd)  # BUG: W-12 forbids the retry; the pages are gone.
        self._durable = target
        self._sync_due_s = self._env.monotonic() + self._fsync_frequency_s


class AdoptInPlaceWal(TasksWal):
    """Adopts the first claimed WAL in place, trusting its fsync, instead of a fresh copy (W-3).

    It cuts the torn tail, appends the pending tasks of the other claimed files and
    fsyncs; but after a previous owner's failed fsync (A-7) the adopted records are
    only in the page cache, marked clean, and this fsync returns 0 without writing
    them: the tasks it reports as recovered (and everything it syncs later) can be
    lost at a power loss.
    """

    def _adopt(self, claimed: list[tuple[str, int]]) -> tuple[str, int]:
        env = self._env
        (name, fd), orphans = claimed[0], claimed[1:]
        try:
            repair_tail(env, fd)
            if orphans:
                write_all(env, fd, b"".join(self._live.values()))
            env.fsync(fd)  # BUG: W-3 forbids trusting this fsync for the adopted records.
            env.fsync_dir(self._path)
        except BaseException:
            self._close_fds([fd for _, fd in claimed])
            raise
        self._retire(orphans)
        return name, fd


class UnlinkBeforeSyncedCopyWal(TasksWal):
    """Rotation unlinks the old WAL (durably) before the new file's copy is fsynced (W-10)."""

    def _rotate(self) -> None:
        env = self._env
        try:
            name, fd = self._create_file()
        except OSError:
            self._limit = int(self._size * WAL_SIZE_INCREASE_RATIO)
            return
        write_all(env, fd, b"".join(self._live.values()))
        old_name, old_fd = self._name, self._fd
        self._name, self._fd = name, fd
        self._size = env.fstat(fd).size
        self._limit = max(self._limit, int(self._size * WAL_SIZE_INCREASE_RATIO) + 1)
        self._unlink_quietly(old_name)  # BUG: the copy is not durable yet.
        env.fsync_dir(self._path)
        env.fsync(fd)
        self._dirty = False
        self._close_fds([old_fd])


# ============================================================================ dead-store mutants


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
                    task_id = _dead_id(raw.data)
                    if task_id in task_ids:
                        found.add(task_id)
                    else:
                        keep.append(raw.data + b"\n")
                if found:
                    env.ftruncate(fd, 0)  # BUG: the old records are gone before the new are durable.
                    _write_at(env, fd, b"".join(keep))
                    env.fsync(fd)
            finally:
                env.close(fd)
            return len(found)


class RenameUnsyncedTmpStore(DeadTaskStore):
    """Renames the compaction file over the data file without fsyncing it first (S-5)."""

    def remove(self, task_ids: set[str]) -> int:
        return _compact(self, task_ids, fsync_tmp=False, fsync_dir=True)


class NoDirFsyncAfterRenameStore(DeadTaskStore):
    """Acknowledges a compaction before its rename is durable (S-5, D-6, D-9)."""

    def remove(self, task_ids: set[str]) -> int:
        return _compact(self, task_ids, fsync_tmp=True, fsync_dir=False)


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
                if self._local.acquire(blocking=False):
                    if env.flock_exclusive_nb(fd):  # BUG: the data file may be renamed over.
                        break
                    self._local.release()
                if attempt == LOCK_ATTEMPTS_MAX:
                    raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
                env.sleep(lock_sleep_s(attempt))
            self._held = fd
            try:
                yield
            finally:
                self._held = -1
                self._local.release()
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


class NoLocalMutexStore(DeadTaskStore):
    """Serializes only with flock, which a second thread of the same process shares (L-1, A-8)."""

    @contextlib.contextmanager
    def _locked(self, operation: str) -> Iterator[None]:
        self._check_usable()
        env = self._env
        for attempt in range(1, LOCK_ATTEMPTS_MAX + 1):
            if env.flock_exclusive_nb(self._lock_fd):  # BUG: no process-local mutex.
                break
            if attempt == LOCK_ATTEMPTS_MAX:
                raise DeadTasksLockTimeout(f"Could not lock the dead tasks store to {operation} it")
            env.sleep(lock_sleep_s(attempt))
        try:
            yield
        finally:
            env.flock_unlock(self._lock_fd)


class BlockingLockStore(DeadTaskStore):
    """Waits for the lock without bound instead of raising DeadTasksLockTimeout (L-3, D-8)."""

    @contextlib.contextmanager
    def _locked(self, operation: str) -> Iterator[None]:
        self._check_usable()
        env = self._env
        attempt = 0
        while True:  # BUG: no bound.
            attempt += 1
            if self._local.acquire(blocking=False):
                if env.flock_exclusive_nb(self._lock_fd):
                    break
                self._local.release()
            env.sleep(lock_sleep_s(min(attempt, LOCK_ATTEMPTS_MAX)))
        try:
            yield
        finally:
            try:
                env.flock_unlock(self._lock_fd)
            finally:
                self._local.release()


# ============================================================================ helpers


def _dead_id(line: bytes) -> str:
    from deferq._core.format import BadLine, decode_dead_line  # noqa: PLC0415

    framed = decode_dead_line(line)
    return "" if isinstance(framed, BadLine) else framed.task_id


def _write_at(env: Env, fd: int, data: bytes) -> None:
    """Write ``data`` from offset 0 of a non-append descriptor just truncated to 0."""
    write_all(env, fd, data)


def _compact(store: DeadTaskStore, task_ids: set[str], *, fsync_tmp: bool,
             fsync_dir: bool) -> int:
    """The real compaction with one of its two fsyncs left out."""
    if not task_ids:
        return 0
    env = store._env
    with store._locked("delete tasks from"):
        tmp_fd = env.open(store._tmp, OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE,
                          FILE_MODE)
        try:
            found = store._copy_survivors(tmp_fd, task_ids)
            if found and fsync_tmp:
                env.fsync(tmp_fd)
        finally:
            env.close(tmp_fd)
        if not found:
            env.unlink(store._tmp)
            return 0
        env.rename(store._tmp, store._data)
        if fsync_dir:
            env.fsync_dir(store._path)
        return len(found)


def _disk(name: str, *, wal: type[TasksWal] = TasksWal,
          dead: type[DeadTaskStore] = DeadTaskStore) -> type[Disk]:
    return type(name, (Disk,), {"_wal_class": wal, "_dead_class": dead})


def swapped_handoff(ops: HandoffOps, task_id: str) -> None:
    """Removes the task from the WAL before its dead record exists (breaks D-13)."""
    ops.remove_task(task_id)
    ops.add_dead(task_id)


def _w(*steps: Step, f: float = 0.0, start: str = "empty", rotate: bool = False) -> Workload:
    return Workload(tuple(steps), f, start, rotate)


ADD = Step("add", 0)


# ============================================================================ scenarios


class Hooks:
    """Per-thread hooks on seam calls, for deterministic two-thread interleavings."""

    def __init__(self) -> None:
        self.before: dict[tuple[str, str], Callable[[], None]] = {}  # (thread name, op)
        self.on_sleep: dict[str, Callable[[], None]] = {}
        self.slept_s: dict[str, float] = {}


class HookEnv(TracingEnv):
    """A ``TracingEnv`` whose calls first run the hook registered for (thread, op)."""

    def __init__(self, inner: SimEnv, hooks: Hooks) -> None:
        super().__init__(inner, [])
        self.hooks = hooks

    def _rec(self, op: str, path: str, nbytes: int = 0) -> None:
        hook = self.hooks.before.pop((threading.current_thread().name, op), None)
        if hook is not None:
            hook()

    def sleep(self, seconds: float) -> None:
        name = threading.current_thread().name
        self.hooks.slept_s[name] = self.hooks.slept_s.get(name, 0.0) + seconds
        hook = self.hooks.on_sleep.get(name)
        if hook is not None:
            hook()
        super().sleep(seconds)


class LockSpinning(BaseException):
    """Raised by the sleep hook when a lock wait passes the scenario's time bound."""


_DEAD_ARGS = {"task_class": "job.Task", "attempts": 3}


def _dead(task: str) -> Dead:
    return Dead(f"dead-{task}".encode(), "job.Task", 3, f"gave up {task}")


class _Exc(Exception):
    pass


def _add_dead(model: StorageModel, backend: Disk, task: str) -> None:
    """``add_dead_task`` with its model bookkeeping (a failure is recorded as such)."""
    value = _dead(task)
    op = model.add_dead(task, value)
    try:
        backend.add_dead_task(task, value.context, _Exc(value.exception_message),
                              task_class=value.task_class, attempts=value.attempts)
    except (DeadTasksLockTimeout, StorageBrokenError, OSError):
        model.failed(op)
        return
    model.acked(op)


def _remove_dead(model: StorageModel, backend: Disk, task: str) -> None:
    op = model.remove_dead([task])
    try:
        backend.remove_dead_tasks([task])
    except (DeadTasksLockTimeout, StorageBrokenError, OSError):
        model.failed(op)
        return
    model.acked(op)


def _interleave(hooks: Hooks, first: Callable[[], None], at_op: str,
                second: Callable[[], None]) -> None:
    """Run ``first`` in thread A; at its ``at_op`` call, run ``second`` in thread B until
    B returns or sleeps in a lock retry, then let A finish, then let B finish."""
    b_parked = threading.Event()
    a_done = threading.Event()
    errors: list[BaseException] = []

    def park_b() -> None:
        b_parked.set()
        a_done.wait(10)

    def run_b() -> None:
        try:
            second()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            b_parked.set()

    thread_b = threading.Thread(target=run_b, name="B")
    hooks.on_sleep["B"] = park_b

    def start_b() -> None:
        thread_b.start()
        b_parked.wait(10)

    def run_a() -> None:
        try:
            first()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            a_done.set()

    hooks.before[("A", at_op)] = start_b
    thread_a = threading.Thread(target=run_a, name="A")
    thread_a.start()
    thread_a.join(20)
    a_done.set()
    if thread_b.is_alive() or thread_b.ident is not None:
        thread_b.join(20)
    if errors:
        raise errors[0]


def scenario_two_threads_compaction_and_add(engine: Engine) -> list[str]:
    """Thread A compacts away ``a`` while thread B of the same process adds ``b`` (D-11).

    B is started when A is about to rename the compacted file over the data file. A
    correct store makes B wait (its process-local mutex is taken), so ``b`` lands in the
    new file; a store that relies on flock alone lets B append to the old inode, which
    A's rename then discards.
    """
    disk = SimDisk(7)
    hooks = Hooks()
    backend = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0,
                                env=HookEnv(disk.process(), hooks))
    model = StorageModel()
    _add_dead(model, backend, "a")
    _interleave(hooks, lambda: _remove_dead(model, backend, "a"), "rename",
                lambda: _add_dead(model, backend, "b"))
    backend.close()
    return check_disk(engine, disk, model)


def scenario_two_processes_compaction_and_add(engine: Engine) -> list[str]:
    """Process P1 compacts away ``a`` while process P2 adds ``b`` (D-11, the renamed-inode race).

    P2 starts when P1 is about to rename; P2 finds the store locked and sleeps; P1
    finishes; P2 retries. A store locking the data file itself lets P2 lock and write
    the replaced inode.
    """
    disk = SimDisk(8)
    hooks = Hooks()
    p1 = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0,
                           env=HookEnv(disk.process(), hooks))
    p2 = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0,
                           env=HookEnv(disk.process(), hooks))
    model = StorageModel()
    _add_dead(model, p1, "a")
    _interleave(hooks, lambda: _remove_dead(model, p1, "a"), "rename",
                lambda: _add_dead(model, p2, "b"))
    p1.close()
    p2.close()
    return check_disk(engine, disk, model)


def scenario_add_after_other_process_compacted(engine: Engine) -> list[str]:
    """P1 adds ``a``; P2 adds ``b`` and compacts ``a`` away; P1 adds ``c`` (S-3, D-11).

    Sequential: a store that kept P1's data descriptor open writes ``c`` to the inode
    P2's compaction replaced.
    """
    disk = SimDisk(9)
    p1 = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=disk.process())
    p2 = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=disk.process())
    model = StorageModel()
    _add_dead(model, p1, "a")
    _add_dead(model, p2, "b")
    _remove_dead(model, p2, "a")
    _add_dead(model, p1, "c")
    p1.close()
    p2.close()
    return check_disk(engine, disk, model)


SPIN_BOUND_S = 60.0


def scenario_lock_held_by_another_process(engine: Engine) -> list[str]:
    """Another process holds the store's lock: ``add_dead_task`` must give up (L-3, D-8).

    The bound is on simulated time: the lock retries sleep on the simulated clock, and a
    sleep hook raises once more than ``SPIN_BOUND_S`` were slept in one call.
    """
    disk = SimDisk(10)
    hooks = Hooks()
    backend = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0,
                                env=HookEnv(disk.process(), hooks))
    holder = disk.process()
    fd = holder.open(f"{PATH}/{PREFIX}dead_tasks.lock", OpenFlag.READ | OpenFlag.WRITE)
    assert holder.flock_exclusive_nb(fd)
    name = threading.current_thread().name

    def bound() -> None:
        if hooks.slept_s.get(name, 0.0) > SPIN_BOUND_S:
            raise LockSpinning

    hooks.on_sleep[name] = bound
    model = StorageModel()
    out: list[str] = []
    try:
        _add_dead(model, backend, "a")
    except LockSpinning:
        out.append(f"add_dead_task still waiting for the lock after {SPIN_BOUND_S:g}s of "
                   "simulated time instead of raising DeadTasksLockTimeout (L-3, D-8)")
        model = StorageModel()
    hooks.on_sleep.clear()
    holder.close(fd)
    backend.close()
    return out + check_disk(engine, disk, model)


# ============================================================================ the registry

MUTANTS: tuple[Mutant, ...] = (
    Mutant("no-dead-tail-repair", "S-4, D-12: dead-task append without cutting a torn tail",
           "exploration: torn dead-task write, process kill, the recovery probe's add is lost",
           Engine("no-dead-tail-repair", _disk("NoDeadTailRepair", dead=NoDeadTailRepairStore)),
           workloads=(_w(ADD, Step("give_up", 0, "t1")),)),
    Mutant("in-place-remove", "S-5, D-9: compaction truncates and rewrites the data file",
           "exploration: seeded store, power loss inside remove_dead loses d0's neighbour",
           Engine("in-place-remove", _disk("InPlaceRemove", dead=InPlaceRemoveStore)),
           workloads=(_w(Step("give_up", 0, "p0"), Step("remove_dead", 0, "d0"),
                         start="seeded"),)),
    Mutant("rename-unsynced-tmp", "S-5, D-9: rename without fsyncing the compaction file",
           "exploration: power loss after remove_dead returned loses the surviving record",
           Engine("rename-unsynced-tmp", _disk("RenameUnsynced", dead=RenameUnsyncedTmpStore)),
           workloads=(_w(Step("give_up", 0, "p0"), Step("remove_dead", 0, "d0"),
                         start="seeded"),)),
    Mutant("no-dir-fsync-after-rename", "S-5, D-6, D-9: compaction acked before the rename is durable",
           "exploration: power loss after remove_dead returned brings d0 back",
           Engine("no-dir-fsync-after-rename",
                  _disk("NoDirFsyncRename", dead=NoDirFsyncAfterRenameStore)),
           workloads=(_w(Step("remove_dead", 0, "d0"), start="seeded"),)),
    Mutant("no-dir-fsync-after-create", "S-1, D-6: dead-task data file created without a directory fsync",
           "exploration: power loss after add_dead_task returned loses the file's name",
           Engine("no-dir-fsync-after-create",
                  _disk("NoDirFsyncCreate", dead=NoDirFsyncAfterCreateStore)),
           workloads=(_w(ADD, Step("give_up", 0, "t1")),)),
    Mutant("flock-data-file", "L-1, S-2, D-11: locks the data file instead of the lock file",
           "scenario: two processes, add waits for the lock during a compaction's rename",
           Engine("flock-data-file", _disk("FlockDataFile", dead=FlockDataFileStore)),
           scenario=scenario_two_processes_compaction_and_add),
    Mutant("cached-data-fd", "S-3, D-11: keeps the data file descriptor across operations",
           "scenario: two processes, add after the other process compacted",
           Engine("cached-data-fd", _disk("CachedDataFd", dead=CachedDataFdStore)),
           scenario=scenario_add_after_other_process_compacted),
    Mutant("no-local-mutex", "L-1, A-8, D-11: no process-local exclusion (flock only)",
           "scenario: two threads of one process, add during a compaction's rename",
           Engine("no-local-mutex", _disk("NoLocalMutex", dead=NoLocalMutexStore)),
           scenario=scenario_two_threads_compaction_and_add),
    Mutant("blocking-lock", "L-3, D-8: lock wait without bound",
           "scenario: lock held elsewhere; bounded simulated-time check",
           Engine("blocking-lock", _disk("BlockingLock", dead=BlockingLockStore)),
           scenario=scenario_lock_held_by_another_process),
    Mutant("swapped-handoff", "D-13: WAL removal before the dead-task write",
           "exploration: crash between the two calls of give_up loses the task",
           Engine("swapped-handoff", Disk, swapped_handoff),
           workloads=(_w(ADD, Step("give_up", 0, "t1")),)),
    Mutant("retry-failed-fsync", "W-12, A-7, D-10: retries a failed WAL fsync and reports success",
           "exploration: FsyncEio at the add's fsync, power loss loses the acked task",
           Engine("retry-failed-fsync", _disk("RetryFsync", wal=RetryFailedFsyncWal)),
           workloads=(_w(ADD),)),
    Mutant("adopt-in-place", "W-3, A-7, D-2, D-3: appends to an adopted WAL, trusting its fsync",
           "exploration: eio at a restart's closing fsync, the next worker adopts the WAL from "
           "the page cache and syncs, power loss loses the recovered task",
           Engine("adopt-in-place", _disk("AdoptInPlace", wal=AdoptInPlaceWal)),
           workloads=(_w(ADD, Step("restart", 0), Step("restart", 0), f=0.5),)),
    Mutant("unlink-before-synced-copy", "W-10, D-3: rotation unlinks the old WAL before the copy is synced",
           "exploration with a tiny rotation limit: power loss inside rotation loses t2",
           Engine("unlink-before-synced-copy",
                  _disk("UnlinkEarly", wal=UnlinkBeforeSyncedCopyWal)),
           workloads=(_w(ADD, ADD, Step("remove", 0, "t1"), rotate=True),)),
)

__all__ = ["MUTANTS"]


# ============================================================================ group commit (W-21)


class LateTargetWal(TasksWal):
    """Group commit that reads its target when the fsync returns, not before it began (W-21).

    A record another thread wrote while the fsync ran is then marked durable, and its
    writer, waiting for that fsync, is acknowledged with nothing on disk (D-15).
    """

    def _lead_fsync(self) -> None:
        fd = self._fd
        self._syncing = True
        self._mutex.release()
        try:
            self._env.fsync(fd)
        finally:
            self._mutex.acquire()
            self._syncing = False
            self._synced.notify_all()
        self._durable = self._written  # BUG: covers records written during the fsync.
        self._dirty = False


class AfterFsyncEnv(TracingEnv):
    """A ``TracingEnv`` that runs a per-thread hook just after an fsync or a write took effect."""

    def __init__(self, inner: SimEnv, after: dict[tuple[str, str], Callable[[], None]]) -> None:
        super().__init__(inner, [])
        self.after = after

    def _hook(self, op: str) -> None:
        hook = self.after.pop((threading.current_thread().name, op), None)
        if hook is not None:
            hook()

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._hook("fsync")

    def write(self, fd: int, data: bytes) -> int:
        written = super().write(fd, data)
        self._hook("write")
        return written


def scenario_add_while_another_threads_fsync_runs(engine: Engine) -> list[str]:
    """Thread B adds ``b`` while thread A's fsync for ``a`` is running (W-21, D-15).

    A's fsync has taken effect but not returned when B writes and waits; a correct WAL
    makes B lead a second fsync (A's began before B's record existed), a WAL that takes
    A's target late acknowledges B at once. Then the power fails.
    """
    disk = SimDisk(12)
    after: dict[tuple[str, str], Callable[[], None]] = {}
    backend = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0,
                                env=AfterFsyncEnv(disk.process(), after))
    model = StorageModel()
    errors: list[BaseException] = []
    b_wrote = threading.Event()

    def add(task: str) -> None:
        op = model.add_task("w", task, Pending(f"ctx-{task}".encode(), None))
        try:
            backend.add_task(f"ctx-{task}".encode(), task_id=task)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            model.failed(op)
            return
        model.acked(op, durable=True)  # fsync_frequency=0: acknowledged means durable (D-1)

    thread_b = threading.Thread(target=add, args=("b",), name="B")

    def start_b() -> None:
        after[("B", "write")] = b_wrote.set
        thread_b.start()
        b_wrote.wait(10)  # B holds the WAL mutex from its write until it waits or returns

    after[("A", "fsync")] = start_b
    thread_a = threading.Thread(target=add, args=("a",), name="A")
    thread_a.start()
    thread_a.join(20)
    thread_b.join(20)
    if errors:
        return [f"scenario raised {type(errors[0]).__name__}: {errors[0]}"]
    return check_disk(engine, disk, model)


MUTANTS = MUTANTS + (
    Mutant("group-commit-late-target",
           "W-21, D-15: an fsync acknowledges records written after it began",
           "scenario: thread B adds while thread A's fsync runs, then power loss loses b",
           Engine("group-commit-late-target", _disk("LateTarget", wal=LateTargetWal)),
           scenario=scenario_add_while_another_threads_fsync_runs),
)


# ============================================================================ dead-store index mutant


class SizeOnlyIndex(DeadIndex):
    """Trusts an index whenever the data file did not shrink (no identity or bytes check)."""

    def usable(self, env: Env, fd: int, stat: FileStat, lock_ctime_ns: int) -> bool:
        return stat.size >= self.end  # BUG: S-10 also wants inode, lock ctime and checked bytes.


class SizeOnlyIndexStore(DeadTaskStore):
    """Extends a stale index after another process's compaction (S-10, D-11)."""

    _index_class: type[DeadIndex] = SizeOnlyIndex


def scenario_index_after_another_process_compacted(engine: Engine) -> list[str]:
    """P1 indexes ``a b c``; P2 compacts ``a`` away and adds ``d e``; P1 finds and lists (S-10).

    The file is then larger than what P1 indexed, so an index checked by size alone is
    extended from its old end: it misses ``d``, which now lies before that end.
    """
    disk = SimDisk(11)
    p1 = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=disk.process())
    p2 = engine.disk_class(path=PATH, prefix=PREFIX, fsync_frequency=0, env=disk.process())
    model = StorageModel()
    out: list[str] = []
    for task in ("a", "b", "c"):
        _add_dead(model, p1, task)
    p1.list_dead_tasks()  # a list without a limit builds P1's index (S-11)
    _remove_dead(model, p2, "a")
    _add_dead(model, p2, "d")
    _add_dead(model, p2, "e")
    if p1.find_dead_task("d") is None:
        out.append("find_dead_task('d') in P1 returned None after P2 compacted and added d (S-10)")
    listed = [task.id for task in p1.list_dead_tasks()]
    if listed != ["e", "d", "c", "b"]:
        out.append(f"list_dead_tasks() in P1 returned {listed}, not ['e', 'd', 'c', 'b'] (S-10)")
    p1.close()
    p2.close()
    return out + check_disk(engine, disk, model)


MUTANTS = MUTANTS + (
    Mutant("index-trusts-size", "S-10, D-11: a dead-task index trusted while the file did not shrink",
           "scenario: two processes, find after the other process compacted and appended",
           Engine("index-trusts-size", _disk("IndexTrustsSize", dead=SizeOnlyIndexStore)),
           scenario=scenario_index_after_another_process_compacted),
)
