"""Deterministic interleavings of two threads or two simulated processes, for the mutants that
only an interleaving shows (process-local exclusion, flock on the data file, a cached data
descriptor, a blocking lock, a stale index): a hook on one thread's seam call parks it and
runs the other one until that one finishes or sleeps in its lock retry."""

from __future__ import annotations

import threading
from collections.abc import Callable

from deferq._core.errors import DeadTasksLockTimeout, StorageBrokenError
from deferq._core.model import Dead, StorageModel
from deferq._engine.env import OpenFlag
from deferq.backends import Disk
from deferq.crashtest import SimDisk, SimEnv
from deferq.crashtest._crashrun import PATH, PREFIX, Engine
from deferq.crashtest._mutants import check_disk
from deferq.crashtest._tracing import TracingEnv


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
