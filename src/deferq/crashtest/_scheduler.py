"""A deterministic scheduler: real threads, one at a time, switching only at seam calls.

Theory of operation. Each task given to ``Scheduler.spawn`` runs in its own real
thread, but never two at once: a thread runs only while it holds the *turn*. The
engine reaches the outside world only through its ``Env`` (``deferq._engine.env``), so
``Scheduler.wrap`` puts a proxy (``ScheduledEnv``) in front of a simulated
process's ``SimEnv``; before every seam call the proxy parks the calling thread
at a *checkpoint* and gives the turn back to the scheduler, which picks the next
thread to run from a choice sequence (a list of ints drawn by Hypothesis, or any
``Chooser``). The picked thread performs its pending seam call and runs on, as
the only running thread, until its next checkpoint or until it finishes. So an
execution is a sequence of atomic steps, one per checkpoint, and the list of
choices reproduces it exactly (``RunResult.trace`` records it).

Nothing ever blocks for real, by construction, under one rule: *each thread
drives its own simulated process* (its own ``Disk`` on its own ``ScheduledEnv``).
The engine's blocking locks (the WAL mutex, the id source's mutex, the dead-task
store's process-local mutex in ``close``) are per process, so only their own
thread ever takes them; the locks shared between processes (``flock``) are
non-blocking seam calls, and the dead-task store's retry loop waits with
``Env.sleep``, which advances the simulated clock and, being a seam call, yields
to the scheduler. If a thread nevertheless blocks for real (the rule was broken),
``run`` raises ``SchedulerStuck`` after ``stuck_timeout_s`` instead of hanging.

A thread that returns or raises is done and never picked again. ``run(max_steps=n)``
stops after n steps: the threads still parked at a checkpoint are *aborted*, i.e.
their pending seam call raises ``SimulatedCrash`` (as if their process had died
just before it), so a test can follow with ``SimDisk.power_loss`` and treat their
operations as in flight. ``run(kills={name: n})`` instead aborts one thread alone
after n steps (a process killed mid-operation) and lets the others run on; its
``on_kill`` callback kills the simulated process so its locks are released first.
Calls through a ``ScheduledEnv`` from a thread the
scheduler does not run (the test's main thread setting up, or anything outside
``run``) pass straight through.

Example::

    disk = SimDisk(seed=1)
    sched = Scheduler([1, 0, 0, 1])
    a = Disk(path="/s", env=sched.wrap(disk.process()), fsync_frequency=0)
    b = Disk(path="/s", env=sched.wrap(disk.process()), fsync_frequency=0)
    sched.spawn("a", lambda: a.add_dead_task("x", b"", RuntimeError(), task_class="J", attempts=1))
    sched.spawn("b", lambda: b.remove_dead_tasks(["x"]))
    result = sched.run()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from deferq._engine.env import Cancel, Env, FileStat, MappedWindow, OpenFlag
from deferq.crashtest._faults import SimulatedCrash
from deferq.crashtest._window import ForwardingWindow

START: Final = "start"  # the checkpoint of a thread that has not run yet
STUCK_TIMEOUT_S: Final = 10.0

Chooser = Callable[[Sequence[str]], int]
"""Given the names of the runnable threads (in spawn order), the index of the one to run."""


class SchedulerStuck(RuntimeError):
    """A scheduled thread blocked for real (outside any checkpoint) for too long."""


class Aborted(SimulatedCrash):
    """Raised at the pending checkpoint of a thread when ``run`` stops early."""


def choices_from(values: Sequence[int]) -> Chooser:
    """A chooser that takes ``values[i] % len(runnable)`` at decision i, then round-robin.

    Round-robin after the list runs out keeps every run finite and fair (a thread
    retrying a lock cannot starve the holder forever), and shrinking the list
    toward zeros shrinks toward "keep running the first runnable thread".
    """
    position = 0
    last: list[str] = []

    def choose(runnable: Sequence[str]) -> int:
        nonlocal position
        index = position
        position += 1
        if index < len(values):
            pick = values[index] % len(runnable)
        elif last and last[0] in runnable:
            pick = (list(runnable).index(last[0]) + 1) % len(runnable)
        else:
            pick = 0
        last[:] = [runnable[pick]]
        return pick

    return choose


@dataclass(frozen=True, slots=True)
class Step:
    """One scheduling decision: ``thread`` was resumed to perform ``op`` (or ``start``)."""

    thread: str
    op: str


@dataclass(slots=True)
class Outcome:
    """How one scheduled thread ended."""

    name: str
    value: object = None
    error: BaseException | None = None
    aborted: bool = False

    @property
    def returned(self) -> bool:
        return self.error is None and not self.aborted


@dataclass(slots=True)
class RunResult:
    """The steps taken (in order) and each thread's outcome."""

    trace: list[Step] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    stopped_early: bool = False


class _Task:
    __slots__ = ("abort", "at", "done", "fn", "ident", "name", "outcome", "parked", "thread")

    def __init__(self, name: str, fn: Callable[[], object]) -> None:
        self.name = name
        self.fn = fn
        self.at = START
        self.done = False
        self.parked = False
        self.abort = False
        self.ident: int | None = None
        self.outcome = Outcome(name)
        self.thread: threading.Thread | None = None


class Scheduler:
    """Runs spawned callables in threads, one at a time, interleaved at seam calls.

    Args:
        chooser: a ``Chooser``, or a list of ints for ``choices_from``.
        stuck_timeout_s: how long a running thread may go without reaching a
            checkpoint or finishing before ``run`` raises ``SchedulerStuck``.
    """

    def __init__(self, chooser: Chooser | Sequence[int] = (),
                 stuck_timeout_s: float = STUCK_TIMEOUT_S) -> None:
        self._choose: Chooser = chooser if callable(chooser) else choices_from(list(chooser))
        self._stuck_timeout_s = stuck_timeout_s
        self._cv = threading.Condition()
        self._tasks: list[_Task] = []
        self._by_ident: dict[int, _Task] = {}
        self._turn: _Task | None = None
        self._running = False
        self._aborting = False
        self._used = False

    # ------------------------------------------------------------------ set-up

    def wrap(self, env: Env) -> ScheduledEnv:
        """A proxy of ``env`` whose every call is a checkpoint of this scheduler."""
        return ScheduledEnv(self, env)

    def spawn(self, name: str, fn: Callable[[], object]) -> None:
        """Register ``fn`` to run in its own thread when ``run`` is called."""
        if self._used:
            raise RuntimeError("a scheduler runs once; spawn before run")
        if any(task.name == name for task in self._tasks):
            raise ValueError(f"a thread named {name!r} was already spawned")
        self._tasks.append(_Task(name, fn))

    # ------------------------------------------------------------------ running

    def run(self, max_steps: int | None = None, *, kills: Mapping[str, int | str] | None = None,
            on_kill: Callable[[str], None] | None = None) -> RunResult:
        """Run every spawned thread to its end (or ``max_steps`` steps, then abort the rest).

        ``kills`` maps a thread's name to a step count or a seam call's name: once that
        many steps were taken, or the first time the thread is parked before that call,
        the thread (if still running) is aborted alone, like a process killed at that
        point, and ``on_kill(name)`` is called (with every other thread parked) before
        the run goes on, e.g. to ``SimDisk.kill`` its process.
        """
        if self._used:
            raise RuntimeError("a scheduler runs once")
        self._used = True
        result = RunResult()
        with self._cv:
            self._running = True
        for task in self._tasks:
            thread = threading.Thread(target=self._body, args=(task,), name=f"sched-{task.name}",
                                      daemon=True)
            task.thread = thread
            thread.start()
        with self._cv:
            # Every thread is registered before any of them may call through a proxy.
            self._cv.wait_for(lambda: all(task.ident is not None for task in self._tasks))
        try:
            self._loop(result, max_steps, dict(kills or {}), on_kill)
        finally:
            self._finish(result)
        return result

    def _loop(self, result: RunResult, max_steps: int | None, kills: dict[str, int | str],
              on_kill: Callable[[str], None] | None) -> None:
        with self._cv:
            while True:
                if not self._cv.wait_for(self._settled, self._stuck_timeout_s):
                    running = self._turn.name if self._turn is not None else "?"
                    raise SchedulerStuck(
                        f"thread {running!r} blocked for real for {self._stuck_timeout_s} s "
                        "outside any checkpoint (does it share a process with another thread?)")
                due = [name for name, when in kills.items() if self._kill_due(name, when, result)]
                for name in due:
                    del kills[name]
                    self._kill(name, on_kill)
                runnable = [task for task in self._tasks if not task.done]
                if not runnable:
                    return
                if max_steps is not None and len(result.trace) >= max_steps:
                    result.stopped_early = True
                    return
                index = self._choose([task.name for task in runnable])
                if not 0 <= index < len(runnable):
                    raise ValueError(f"chooser returned {index} for {len(runnable)} threads")
                task = runnable[index]
                result.trace.append(Step(task.name, task.at))
                self._turn = task
                self._cv.notify_all()

    def _kill_due(self, name: str, when: int | str, result: RunResult) -> bool:
        if isinstance(when, int):
            return when <= len(result.trace)
        task = next((t for t in self._tasks if t.name == name), None)
        return task is not None and not task.done and task.at == when

    def _kill(self, name: str, on_kill: Callable[[str], None] | None) -> None:
        """Abort one parked thread and wait until it has unwound (the lock is held)."""
        task = next((t for t in self._tasks if t.name == name), None)
        if task is None or task.done:
            return
        task.abort = True
        self._turn = task
        self._cv.notify_all()
        if not self._cv.wait_for(lambda: task.done, self._stuck_timeout_s):
            raise SchedulerStuck(f"thread {name!r} did not unwind after being killed")
        if on_kill is not None:
            on_kill(name)

    def _settled(self) -> bool:
        """Nobody holds the turn and every live thread is parked at a checkpoint."""
        return self._turn is None and all(task.done or task.parked for task in self._tasks)

    def _finish(self, result: RunResult) -> None:
        with self._cv:
            self._aborting = True
            self._cv.notify_all()
        for task in self._tasks:
            if task.thread is not None:
                task.thread.join(self._stuck_timeout_s)
        with self._cv:
            self._running = False
        for task in self._tasks:
            result.outcomes[task.name] = task.outcome

    def _body(self, task: _Task) -> None:
        with self._cv:
            task.ident = threading.get_ident()
            self._by_ident[task.ident] = task
            self._cv.notify_all()
        try:
            self._park(task, START)
            task.outcome.value = task.fn()
        except Aborted:
            task.outcome.aborted = True
        except BaseException as exc:  # noqa: BLE001 - a thread's error is its outcome.
            task.outcome.error = exc
        finally:
            with self._cv:
                task.done = True
                if self._turn is task:
                    self._turn = None
                self._cv.notify_all()

    def _park(self, task: _Task, op: str) -> None:
        """Give the turn back and wait to be picked; raise ``Aborted`` when the run stops."""
        with self._cv:
            if self._aborting or task.abort:
                raise Aborted(f"thread {task.name!r} aborted before {op}")
            task.at = op
            task.parked = True
            if self._turn is task:
                self._turn = None
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn is task or self._aborting)
            task.parked = False
            if self._turn is not task or task.abort:
                raise Aborted(f"thread {task.name!r} aborted before {op}")

    def checkpoint(self, op: str) -> None:
        """Called before every seam call; a no-op outside the scheduled threads."""
        task = self._by_ident.get(threading.get_ident())
        if task is None or not self._running or task.done:
            return
        self._park(task, op)


class ScheduledEnv:
    """An ``Env`` proxy: a scheduler checkpoint, then the wrapped call."""

    def __init__(self, scheduler: Scheduler, env: Env) -> None:
        self._scheduler = scheduler
        self.inner = env
        self.reserve_bytes = env.reserve_bytes
        self.map_granularity = env.map_granularity

    def _point(self, op: str) -> None:
        self._scheduler.checkpoint(op)

    # --- files
    def open(self, path: str, flags: OpenFlag, mode: int = 0o600) -> int:
        self._point("open")
        return self.inner.open(path, flags, mode)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._point("pread")
        return self.inner.pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        self._point("write")
        return self.inner.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._point("fsync")
        self.inner.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self._point("ftruncate")
        self.inner.ftruncate(fd, size)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        self._point("allocate")
        self.inner.allocate(fd, offset, length)

    def seek(self, fd: int, offset: int) -> None:
        self._point("seek")
        self.inner.seek(fd, offset)

    def map_shared(self, fd: int, offset: int, length: int) -> MappedWindow:
        self._point("map")
        # Each store is a scheduling point, as a write is (W-26).
        return ForwardingWindow(self.inner.map_shared(fd, offset, length),
                                lambda size: self._point("write"))

    def fstat(self, fd: int) -> FileStat:
        self._point("fstat")
        return self.inner.fstat(fd)

    def close(self, fd: int) -> None:
        self._point("close")
        self.inner.close(fd)

    def flock_exclusive_nb(self, fd: int) -> bool:
        self._point("flock_exclusive_nb")
        return self.inner.flock_exclusive_nb(fd)

    def flock_unlock(self, fd: int) -> None:
        self._point("flock_unlock")
        self.inner.flock_unlock(fd)

    # --- names
    def rename(self, src: str, dst: str) -> None:
        self._point("rename")
        self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        self._point("unlink")
        self.inner.unlink(path)

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        self._point("makedirs")
        self.inner.makedirs(path, mode)

    def listdir(self, path: str) -> list[str]:
        self._point("listdir")
        return self.inner.listdir(path)

    def fsync_dir(self, path: str) -> None:
        self._point("fsync_dir")
        self.inner.fsync_dir(path)

    # --- process facts
    def time(self) -> float:
        self._point("time")
        return self.inner.time()

    def monotonic(self) -> float:
        self._point("monotonic")
        return self.inner.monotonic()

    def sleep(self, seconds: float) -> None:
        self._point("sleep")
        self.inner.sleep(seconds)

    def getpid(self) -> int:
        self._point("getpid")
        return self.inner.getpid()

    def random_u32(self) -> int:
        self._point("random_u32")
        return self.inner.random_u32()

    def local_date(self) -> str:
        self._point("local_date")
        return self.inner.local_date()

    def call_every(self, interval_s: float, callback: Callable[[], None]) -> Cancel:
        self._point("call_every")
        return self.inner.call_every(interval_s, callback)

    def __repr__(self) -> str:
        return f"ScheduledEnv({self.inner!r})"


if TYPE_CHECKING:
    def _implements_env(env: ScheduledEnv) -> Env:
        return env
