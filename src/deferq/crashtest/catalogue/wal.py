"""WAL mutants: tasks WALs that break one rule of spec/wal.md each, and the Mutant entries that
say what catches them."""

from __future__ import annotations

import threading
from collections.abc import Callable

from deferq._core.limits import WAL_SIZE_INCREASE_RATIO
from deferq._core.model import Pending, StorageModel
from deferq._core.types import PendingTask
from deferq._engine.io import repair_tail, write_all
from deferq._engine.wal import TasksWal
from deferq.crashtest import SimDisk, SimEnv
from deferq.crashtest._crashrun import PATH, PREFIX, Engine
from deferq.crashtest._mutants import Mutant, check_disk
from deferq.crashtest._tracing import TracingEnv
from deferq.crashtest._workloads import Step
from deferq.crashtest.catalogue._shared import ADD, disk_with, workload


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
        # Switch files as the real rotation does (the old file's mapping and reserved end
        # must not be used for the new one), so the early unlink below is its only bug.
        self._unmap()
        self._name, self._fd = name, fd
        self._size = env.fstat(fd).size
        self._reserved = self._size
        self._offset_stale = False
        self._limit = max(self._limit, int(self._size * WAL_SIZE_INCREASE_RATIO) + 1)
        self._unlink_quietly(old_name)  # BUG: the copy is not durable yet.
        env.fsync_dir(self._path)
        env.fsync(fd)
        self._close_fds([old_fd])


class UnlinkBeforeSweepSyncWal(TasksWal):
    """The adoption sweep unlinks the orphans (durably) before the copy it appended is fsynced
    (W-32): a power loss in between loses the adopted tasks, in both places at once."""

    def adopt_orphans(self, files_max: int) -> list[PendingTask]:
        claimed = self._claim_orphans(files_max=files_max)
        if not claimed:
            return []
        replay = self._replay(claimed)
        with self._mutex:
            adopted = self._append_adopted(replay)
            self._retire(claimed)  # BUG: the adopted records are not durable yet.
            self._sync_through_locked(self._written)
        return [PendingTask(task_id, context, publish_at)
                for task_id, (publish_at, context) in adopted]


MUTANTS: tuple[Mutant, ...] = (
    Mutant("retry-failed-fsync", "W-12, A-7, D-10: retries a failed WAL fsync and reports success",
           "exploration: FsyncEio at the add's fsync, power loss loses the acked task",
           Engine("retry-failed-fsync", disk_with("RetryFsync", wal=RetryFailedFsyncWal)),
           workloads=(workload(ADD),)),
    Mutant("adopt-in-place", "W-3, A-7, D-2, D-3: appends to an adopted WAL, trusting its fsync",
           "exploration: eio at a restart's closing fsync, the next worker adopts the WAL from "
           "the page cache and syncs, power loss loses the recovered task",
           Engine("adopt-in-place", disk_with("AdoptInPlace", wal=AdoptInPlaceWal)),
           workloads=(workload(ADD, Step("restart", 0), Step("restart", 0), f=0.5),)),
    Mutant("unlink-before-synced-copy", "W-10, D-3: rotation unlinks the old WAL before the copy is synced",
           "exploration with a tiny rotation limit: power loss inside rotation loses t2",
           Engine("unlink-before-synced-copy",
                  disk_with("UnlinkEarly", wal=UnlinkBeforeSyncedCopyWal)),
           workloads=(workload(ADD, ADD, Step("remove", 0, "t1"), rotate=True),)),
    Mutant("sweep-unlinks-before-sync",
           "W-32, D-21: the adoption sweep unlinks the orphans before the adopted tasks are fsynced",
           "exploration: a hand-over (hand-off file, then a sweep); power loss between the "
           "sweep's directory fsync and its file fsync loses t1",
           Engine("sweep-unlinks-before-sync",
                  disk_with("SweepEarly", wal=UnlinkBeforeSweepSyncWal)),
           workloads=(workload(Step("hand_over", 0)), workload(ADD, Step("hand_over", 0), f=0.5))),
)


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
           Engine("group-commit-late-target", disk_with("LateTarget", wal=LateTargetWal)),
           scenario=scenario_add_while_another_threads_fsync_runs),
)


