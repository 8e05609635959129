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

Several threads may drive one simulated process (``spawn(..., process=...)``): they
share its ``ScheduledEnv``, so its descriptors, open file descriptions and flocks,
and its ``Disk``, as real threads do (M-15). Nothing ever blocks for real: the
engine makes every lock its threads share through the Env (``Env.mutex``,
``Env.condition``), and a ``ScheduledEnv`` hands out ``_schedsync.SchedMutex`` and
``SchedCondition``, whose acquire is a checkpoint and whose waits park the thread as
*blocked* (never picked until the mutex is released or the condition notified);
the locks shared between processes (``flock``) are non-blocking seam calls, and
the dead-task store's retry loop waits with ``Env.sleep``, which advances the
simulated clock and, being a seam call, yields to the scheduler. When threads
remain and every one of them is blocked, ``run`` raises ``SchedulerDeadlock``,
naming each thread and what it waits for (M-16). If a thread nevertheless blocks
for real (on a lock made outside the Env), ``run`` raises ``SchedulerStuck`` after
``stuck_timeout_s`` instead of hanging.

A thread that returns or raises is done and never picked again. ``run(max_steps=n)``
stops after n steps: the threads still parked at a checkpoint are *aborted*, i.e.
their pending seam call raises ``SimulatedCrash`` (as if their process had died
just before it), so a test can follow with ``SimDisk.power_loss`` and treat their
operations as in flight. ``run(kills={name: n})`` instead aborts one thread alone
after n steps (a process killed mid-operation) and lets the others run on; its
``on_kill`` callback kills the simulated process so its locks are released first;
every other thread of the same process is aborted with it (M-17).
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
from typing import Final

from deferq._engine.env import Env
from deferq.crashtest._faults import SimulatedCrash
from deferq.crashtest._schedenv import ScheduledEnv
from deferq.crashtest._schedsync import (
    SchedCondition,
    SchedMutex,
    SchedulerDeadlock,
    SchedulerStuck,
    SyncPoints,
)

START: Final = "start"  # the checkpoint of a thread that has not run yet
STUCK_TIMEOUT_S: Final = 10.0

Chooser = Callable[[Sequence[str]], int]
"""Given the names of the runnable threads (in spawn order), the index of the one to run."""


__all__ = ["START", "Aborted", "Outcome", "RunResult", "ScheduledEnv", "Scheduler",
           "SchedulerDeadlock", "SchedulerStuck", "Step", "choices_from"]


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
    __slots__ = ("abort", "at", "blocked", "done", "fn", "ident", "name", "notified", "outcome",
                 "parked", "process", "thread")

    def __init__(self, name: str, fn: Callable[[], object], process: str) -> None:
        self.name = name
        self.fn = fn
        self.process = process  # the simulated process this thread belongs to
        self.blocked: SchedMutex | SchedCondition | None = None  # what it waits for (M-15)
        self.notified = False
        self.at = START
        self.done = False
        self.parked = False
        self.abort = False
        self.ident: int | None = None
        self.outcome = Outcome(name)
        self.thread: threading.Thread | None = None


class Scheduler(SyncPoints):
    """Runs spawned callables in threads, one at a time, interleaved at seam calls and locks.

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

    def spawn(self, name: str, fn: Callable[[], object], *, process: str | None = None) -> None:
        """Register ``fn`` to run in its own thread when ``run`` is called.

        Threads spawned with the same ``process`` are threads of one simulated process
        (they should share its ``ScheduledEnv``): a kill aborts them together (M-17).
        """
        if self._used:
            raise RuntimeError("a scheduler runs once; spawn before run")
        if any(task.name == name for task in self._tasks):
            raise ValueError(f"a thread named {name!r} was already spawned")
        self._tasks.append(_Task(name, fn, name if process is None else process))

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
                live = self._live()
                if not live:
                    return
                runnable = [task for task in live if task.blocked is None]
                if not runnable:
                    raise self._deadlock(live)  # M-16
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
        """Abort a parked thread and every other thread of its process (M-17), one at a
        time, and wait until each has unwound (the lock is held)."""
        killed = next((t for t in self._tasks if t.name == name), None)
        if killed is None or killed.done:
            return
        for task in [killed, *(t for t in self._tasks if t.process == killed.process)]:
            if task.done:
                continue
            task.abort = True
            self._turn = task
            self._cv.notify_all()
            if not self._cv.wait_for(lambda task=task: task.done,  # type: ignore[misc]
                                     self._stuck_timeout_s):
                raise SchedulerStuck(f"thread {task.name!r} did not unwind after being killed")
        if on_kill is not None:
            on_kill(name)

    def _live(self) -> list[_Task]:
        return [task for task in self._tasks if not task.done]

    def _current(self) -> _Task | None:
        """The scheduled thread calling, during a run; None for any other caller."""
        task = self._by_ident.get(threading.get_ident())
        if task is None or not self._running or task.done:
            return None
        return task

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
        task = self._current()
        if task is not None:
            self._park(task, op)
