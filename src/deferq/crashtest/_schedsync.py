"""The scheduler's mutexes and condition variables: process-local locks as scheduling points.

Rules (spec/simulator.md M-15..M-17, M-25..M-28). The engine makes every lock it shares between the
threads of one process through its ``Env`` (``Env.mutex``, ``Env.condition``). Through a
``ScheduledEnv`` these are a ``SchedMutex`` and a ``SchedCondition``, which never block for
real: their state (held or not, by which thread; who waits on what) lives here, under the
scheduler's condition, and a thread that would block is *parked as blocked* instead, so the
scheduler never picks it until the mutex is released or the condition notified.

- ``acquire`` is a scheduling point: the thread parks first (any other thread may run, and
  take the mutex), then takes the mutex if it is free; if not, ``blocking=False`` returns
  False, and a blocking acquire parks as blocked and retries when woken (a timed acquire is
  treated as non-blocking: simulated time does not pass while waiting).
- ``release`` frees the mutex and makes every thread blocked on it runnable again; it is not a
  scheduling point itself (the thread's next seam call or acquire is).
- ``wait`` frees the mutex, parks blocked on the condition until ``notify_all`` (a timed wait
  is runnable at once, as a spurious wake-up or a timeout), then takes the mutex again,
  parking as blocked while another thread holds it.

A thread aborted while blocked (its process was killed, or the run stopped) raises
``Aborted`` from the wait; the locks its unwinding code then releases without holding them
are ignored, as a killed process's threads leave nothing behind that matters. Outside a run
(the test's main thread setting up or checking) a mutex is a plain lock, which would only
block for ever if a thread of the run had left it held: that raises ``SchedulerStuck``.

Theory of operation: ``SyncPoints`` is a mixin of ``Scheduler`` holding the four operations,
which read and change the scheduler's threads (``_Task.blocked``, ``.notified``) under its
condition ``_cv``; the scheduler's loop picks only threads that are not blocked, and reports a
*deadlock* (``SchedulerDeadlock``, naming every thread and what it waits for) when threads
remain and none can run.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deferq.crashtest._scheduler import _Task


class SchedulerStuck(RuntimeError):
    """A scheduled thread blocked for real (outside any checkpoint) for too long."""


class SchedulerDeadlock(SchedulerStuck):
    """Every live thread of a run is blocked on a mutex or a condition (M-16).

    ``waits`` maps each blocked thread's name to what it waits for.
    """

    def __init__(self, waits: dict[str, str]) -> None:
        self.waits = waits
        super().__init__("deadlock: every live thread is blocked: "
                         + "; ".join(f"thread {name!r} waits {what}"
                                     for name, what in waits.items()))


class SchedMutex:
    """A ``Mutex`` (``deferq._engine.env``) whose waits are scheduling decisions."""

    __slots__ = ("_points", "held", "label", "owner")

    def __init__(self, points: SyncPoints, label: str) -> None:
        self._points = points
        self.label = label  # where the engine made it, for a deadlock's message
        self.held = False
        self.owner: str | None = None  # the name of the thread holding it

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._points.acquire(self, blocking and timeout < 0)

    def release(self) -> None:
        self._points.release(self)

    def locked(self) -> bool:
        return self.held

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc_value: BaseException | None,
                 traceback: TracebackType | None, /) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<SchedMutex {self.label} held by {self.owner!r}>"


class SchedCondition:
    """A ``Condition`` over a ``SchedMutex`` whose waits are scheduling decisions."""

    __slots__ = ("_points", "label", "mutex")

    def __init__(self, points: SyncPoints, mutex: SchedMutex, label: str) -> None:
        self._points = points
        self.mutex = mutex
        self.label = label

    def wait(self, timeout: float | None = None) -> bool:
        return self._points.wait(self, timeout)

    def notify_all(self) -> None:
        self._points.notify_all(self)

    def __enter__(self) -> bool:
        return self.mutex.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc_value: BaseException | None,
                 traceback: TracebackType | None, /) -> None:
        self.mutex.release()

    def __repr__(self) -> str:
        return f"<SchedCondition {self.label} over {self.mutex.label}>"


class SyncPoints:
    """``Scheduler``'s side of ``SchedMutex`` and ``SchedCondition`` (see the module doc)."""

    _cv: threading.Condition
    _aborting: bool

    if TYPE_CHECKING:  # defined by Scheduler
        def _current(self) -> _Task | None: ...
        def _park(self, task: _Task, op: str) -> None: ...
        def _live(self) -> list[_Task]: ...

    def acquire(self, mutex: SchedMutex, blocking: bool) -> bool:
        """Implements M-25, M-26: a scheduling point, then take ``mutex`` or park blocked on it."""
        task = self._current()
        if task is None:
            return self._acquire_outside(mutex, blocking)
        self._park(task, "acquire")
        while True:
            with self._cv:
                if not mutex.held:
                    mutex.held = True
                    mutex.owner = task.name
                    return True
                if not blocking:
                    return False
                task.blocked = mutex
            self._park(task, "blocked")

    def _acquire_outside(self, mutex: SchedMutex, blocking: bool) -> bool:
        with self._cv:
            if mutex.held:
                if not blocking:
                    return False
                raise SchedulerStuck(f"{mutex!r}: a thread of the run left it held, so acquiring "
                                     "it outside the run would block for ever")
            mutex.held = True
            mutex.owner = threading.current_thread().name
            return True

    def release(self, mutex: SchedMutex) -> None:
        """Implements M-15: free ``mutex``; every thread blocked on it may run again."""
        task = self._current()
        with self._cv:
            owner = threading.current_thread().name if task is None else task.name
            if not mutex.held or mutex.owner != owner:
                if task is not None and (task.abort or self._aborting):
                    return  # an aborted thread unwinding: its process is dead (see module doc)
                raise RuntimeError(f"release of {mutex!r} by {owner!r}, which does not hold it")
            mutex.held = False
            mutex.owner = None
            self._wake(mutex)

    def wait(self, cond: SchedCondition, timeout: float | None) -> bool:
        """Implements M-26: free the mutex, park until notified, take the mutex again."""
        task = self._current()
        mutex = cond.mutex
        if task is None:
            raise SchedulerStuck(f"{cond!r}: a wait outside the run would block for ever")
        with self._cv:
            if mutex.owner != task.name:
                raise RuntimeError(f"wait on {cond!r} by {task.name!r}, which does not hold "
                                   "its mutex")
            mutex.held = False
            mutex.owner = None
            self._wake(mutex)
            task.notified = False
            task.blocked = cond if timeout is None else None
        self._park(task, "wait")
        notified = task.notified
        while True:
            with self._cv:
                if not mutex.held:
                    mutex.held = True
                    mutex.owner = task.name
                    return notified or timeout is None
                task.blocked = mutex
            self._park(task, "blocked")

    def notify_all(self, cond: SchedCondition) -> None:
        """Implements M-15: every thread waiting on ``cond`` may run again."""
        with self._cv:
            for task in self._live():
                if task.blocked is cond:
                    task.blocked = None
                    task.notified = True

    def _wake(self, mutex: SchedMutex) -> None:
        for task in self._live():
            if task.blocked is mutex:
                task.blocked = None

    def _deadlock(self, blocked: list[_Task]) -> SchedulerDeadlock:
        """Implements M-16: name every blocked thread and what it waits for."""
        waits = {}
        for task in blocked:
            on = task.blocked
            if isinstance(on, SchedMutex):
                waits[task.name] = f"for mutex {on.label}, held by {on.owner!r}"
            elif isinstance(on, SchedCondition):
                waits[task.name] = (f"on condition {on.label} (over mutex {on.mutex.label}), "
                                    "which no running thread is left to notify")
        return SchedulerDeadlock(waits)
