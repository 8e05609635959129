"""The queue's scheduler: when each persisted task begins, and the bookkeeping of pending work.

Rules (spec/queue.md):
- Only a task already written to the backend is scheduled (Q-6, Q-7); one not scheduled
  (the queue not started, or stopping) stays in the WAL and the next start replays it.
- An immediate task counts in the backlog from ``schedule`` until its execution begins;
  backpressure (Q-11) waits on that count, in ``make_room``.
- A delayed task waits for its time in the timer heap (``timers.py``: one heap and one
  sleeper on the ``Clock`` for all of them, Q-36); then it runs, without counting in the
  backlog.
- At most ``max_concurrency`` executions run at once (Q-37): one that would exceed it waits
  in ``_waiting`` (in memory: the task is in the WAL already) and begins, in arrival order,
  when a running one ends. An immediate task waiting for a slot still counts in the backlog.
- ``stop`` (Q-15) cancels the timers, waits up to a timeout for the work that was
  scheduled or running, then drops or cancels the rest: it all stays in the WAL.
- A cancelled execution that swallows its cancellation is waited for at most
  ``STOP_GRACE_S`` more (Q-35): ``stop`` logs its task id and returns without it; the
  executor writes no outcome for it, so it stays in the WAL (at-least-once).

Theory of operation: a plain (sync) ``perform`` waits in ``_soon`` with the context it was
scheduled in; ``_run_soon``, one loop callback, runs every execution queued before it
began. An async ``perform`` is an asyncio task in ``work``, as is the rest of a plain one
that failed or returned an awaitable (the executor adds it). An asyncio task, or a loop
callback, per execution costs several us more (docs/queue.md), so the batch stays. The
executions themselves are the executor's (``attach`` hands over its two entry points,
bound once); this module only decides when they begin and tracks what is left, so that
``wait_idle`` and ``stop`` can wait for it.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Final

from deferq._runtime.backpressure import Backpressure, wait_for_room
from deferq._runtime.clock import Clock
from deferq._runtime.serialize import Context
from deferq._runtime.task import Task
from deferq._runtime.timers import TimerHeap

log = logging.getLogger("deferq.queue")

# Implements Q-35: how long ``stop`` waits, after its timeout, for the executions it cancelled.
# Bounded so that a task that catches CancelledError and keeps running cannot hold ``stop``
# (and the process shutdown behind it) forever; long enough for a well-behaved task's
# cleanup (``finally`` blocks, an awaited close) to run.
STOP_GRACE_S: Final = 0.5

# A plain execution waiting for _run_soon: the context it was scheduled in, its arguments.
_Soon = tuple[contextvars.Context, str, Context, "type[Task]", bool]
# The executor's entry points: (task_id, context, cls, counted in the backlog).
RunPlain = Callable[[str, Context, "type[Task]", bool], None]
RunAsync = Callable[[str, Context, "type[Task]", bool], Coroutine[object, object, None]]


class Scheduler:
    """Timers of delayed tasks, the run-soon batch, the backlog and the work still pending."""

    def __init__(self, clock: Clock, backpressure: Backpressure | None, *,
                 max_concurrency: int) -> None:
        self.clock = clock
        self.max_concurrency = max_concurrency
        self.active = 0  # executions holding a slot: begun (or about to) and not ended
        # Executions waiting for a slot, in arrival order.
        self._waiting: collections.deque[_Soon] = collections.deque()
        self.backpressure = backpressure
        self.loop: asyncio.AbstractEventLoop | None = None
        self.running = False  # executions may be scheduled and begin (the queue is RUNNING)
        self.backlog = 0  # immediate tasks scheduled, not yet picked up
        self.work: set[asyncio.Task[None]] = set()  # executions that are asyncio tasks
        self._soon: collections.deque[_Soon] = collections.deque()
        self._soon_handle: asyncio.Handle | None = None
        self._as_task: dict[type[Task], bool] = {}
        self._idle_waiters: list[asyncio.Future[None]] = []
        # Set when an execution gives its slot back: a claimer with no room waits on it.
        self.slot_freed: asyncio.Event | None = None
        # Delayed tasks waiting for their time.
        self.timers = TimerHeap(clock, self._timer_fired)
        self._run_plain: RunPlain | None = None
        self._run: RunAsync | None = None
        self._batch_ended: Callable[[], None] | None = None
        # Task ids of executions ``stop`` gave up on: their outcome is never written.
        self.abandoned: set[str] = set()
        # Task ids ``cancel`` took: they never begin, and no outcome is written.
        self.cancelled: set[str] = set()

    def attach(self, run_plain: RunPlain, run: RunAsync, batch_ended: Callable[[], None]
               ) -> None:
        """The executor's entry points: a plain execution, an async one as a coroutine, and
        the end of a run-soon batch (its successes' removal is written then, Q-170)."""
        self._run_plain, self._run, self._batch_ended = run_plain, run, batch_ended

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The queue started on ``loop``: executions are scheduled on it from now on."""
        self.loop = loop
        self.running = True
        self.slot_freed = None  # made on this loop by the first to wait on it

    @property
    def waiting(self) -> int:
        """Executions waiting for a slot (Q-37)."""
        return len(self._waiting)

    @property
    def delayed(self) -> int:
        """Tasks waiting for their publish time in this process."""
        return len(self.timers)

    # ------------------------------------------------------------------ scheduling
    def schedule_from_any_thread(self, task_id: str, context: Context, cls: type[Task],
                                 publish_in: int | None) -> None:
        loop = self.loop
        if loop is None:
            return  # not started: start() replays it from the WAL
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.schedule(task_id, context, cls, publish_in)
        else:
            loop.call_soon_threadsafe(self.schedule, task_id, context, cls, publish_in)

    def schedule(self, task_id: str, context: Context, cls: type[Task],
                 publish_in: float | None) -> None:
        if not self.running or self.loop is None:
            return  # stays in the WAL for the next start
        if publish_in is not None and publish_in > 0:
            self.timers.add(self.loop, task_id, context, cls, publish_in)
        elif self.active >= self.max_concurrency:  # ``_spawn``, inlined: every enqueue
            self.backlog += 1
            self._waiting.append((contextvars.copy_context(), task_id, context, cls, True))
        else:
            self.backlog += 1
            self.active += 1
            self._begin_soon(None, task_id, context, cls, True)

    def _spawn(self, task_id: str, context: Context, cls: type[Task], *, counted: bool) -> None:
        if self.active >= self.max_concurrency:
            # Implements Q-37: no slot; it begins when a running execution ends.
            self._waiting.append((contextvars.copy_context(), task_id, context, cls, counted))
            return
        self.active += 1
        self._begin_soon(None, task_id, context, cls, counted)

    def _begin_soon(self, ctx: contextvars.Context | None, task_id: str, context: Context,
                    cls: type[Task], counted: bool) -> None:
        """An execution that holds a slot: an asyncio task, or a place in the run-soon batch.

        ``ctx`` is the context it was scheduled in when it waited for its slot.
        """
        loop = self.loop
        assert loop is not None and self._run is not None
        as_task = self._as_task.get(cls)
        if as_task is None:
            # An async perform, and a plain one that runs in the thread pool, are
            # asyncio tasks; an inline plain perform runs in the run-soon batch.
            as_task = self._as_task[cls] = not cls.inline or inspect.iscoroutinefunction(
                getattr(cls, "perform", None))
        if as_task:
            # The job leaves ``work`` from its own ``finally`` (``job_done``: a done callback
            # would cost a second event-loop turn per execution); ``stop`` drops the ones it
            # cancelled before they ever ran.
            # Named by its task id, so that ``stop`` can say which one ignored cancellation.
            self.work.add(loop.create_task(self._run(task_id, context, cls, counted),
                                           name=task_id, context=ctx))
        else:
            self._soon.append((contextvars.copy_context() if ctx is None else ctx, task_id,
                               context, cls, counted))
            if self._soon_handle is None:
                self._soon_handle = loop.call_soon(self._run_soon)

    def _timer_fired(self, task_id: str, context: Context, cls: type[Task]) -> None:
        """A delayed task's time came (the timer heap's sleeper calls it)."""
        if self.running:
            self._spawn(task_id, context, cls, counted=False)

    def _run_soon(self) -> None:
        """The loop callback of plain executions: run those queued before it began, in order.

        Each runs in the context it was scheduled in, as its own callback would. Ones
        queued meanwhile wait for the next loop iteration, as new callbacks do.
        """
        self._soon_handle = None
        soon = self._soon
        run = self._run_plain
        assert run is not None
        try:
            for _ in range(len(soon)):
                if not soon:
                    break  # stop() dropped them
                ctx, task_id, context, cls, counted = soon.popleft()
                ctx.run(run, task_id, context, cls, counted)
        finally:
            if self._batch_ended is not None:
                self._batch_ended()  # Implements Q-170: before the next batch is scheduled
            if soon and self._soon_handle is None and self.loop is not None:
                self._soon_handle = self.loop.call_soon(self._run_soon)

    # ------------------------------------------------------------------ cancel
    def withdraw(self, task_id: str) -> tuple[str, Context] | None:
        """Implements Q-40 for work not begun: drop ``task_id`` from the timers, the tasks
        waiting for a slot or the run-soon batch; where it was and its context, or None."""
        timer = self.timers.cancel(task_id)
        if timer is not None:
            return "delayed", timer[0]
        for line, where in ((self._waiting, "waiting for a slot"), (self._soon, "due")):
            for index, entry in enumerate(line):
                if entry[1] == task_id:
                    del line[index]
                    if entry[4]:
                        self.backlog -= 1  # counted in the backlog until it began
                    self.maybe_idle(holds_slot=line is self._soon)
                    return where, entry[2]
        return None

    def job_of(self, task_id: str) -> asyncio.Task[None] | None:
        """The asyncio task of ``task_id``'s execution, or None (at most
        ``max_concurrency`` to look through)."""
        for job in self.work:
            if job.get_name() == task_id:
                return job
        return None

    # ------------------------------------------------------------------ backpressure
    async def make_room(self) -> None:
        """Implements Q-11, Q-185: wait until the backlog is at the low water mark, or
        PushTimeout (``backpressure.wait_for_room``)."""
        bp = self.backpressure
        if bp is None or self.backlog <= bp.high_water_mark:
            return
        freed = self.slot_freed = self.slot_freed or asyncio.Event()
        await wait_for_room(bp, self.clock, freed, lambda: self.backlog)

    # ------------------------------------------------------------------ pending work
    async def wait_idle(self) -> None:
        """Return when no immediate or running work is left (delayed tasks may remain)."""
        while self.work or self._soon or self._waiting:
            await self._idle_waiter()

    def _idle_waiter(self) -> asyncio.Future[None]:
        """A future resolved the next time no immediate or running work is left."""
        waiter = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        return waiter

    def maybe_idle(self, *, holds_slot: bool = True, count: int = 1) -> None:
        """``count`` executions ended: their slots go to the next waiting ones (Q-37); wake
        the idle waiters if they were the last piece of work."""
        if holds_slot:
            self.release_slot(count)
        if self._idle_waiters and not self.work and not self._soon and not self._waiting:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def job_done(self, *, holds_slot: bool = True) -> None:
        """The current asyncio task's execution ended: it leaves ``work``."""
        job = asyncio.current_task()
        if job is not None:
            self.work.discard(job)
        self.maybe_idle(holds_slot=holds_slot)

    @property
    def load(self) -> int:
        """Executions holding a slot or waiting for one (a claimer's room is what is left)."""
        return self.active + len(self._waiting)

    def release_slot(self, count: int = 1) -> None:
        """Implements Q-37: ``count`` executions give their slots back; the first waiting
        ones begin."""
        self.active -= count
        if self.slot_freed is not None:
            self.slot_freed.set()
        waiting, soon = self._waiting, self._soon
        while waiting and self.running and self.active < self.max_concurrency:
            self.active += 1
            begins = waiting.popleft()
            if self._as_task.get(begins[3]) is False:  # an inline one: its entry moves as is
                soon.append(begins)
                if self._soon_handle is None and self.loop is not None:
                    self._soon_handle = self.loop.call_soon(self._run_soon)
            else:
                self._begin_soon(*begins)

    async def stop(self, timeout_s: float) -> bool:
        """Implements Q-15 for the work: refuse new executions, cancel the timers, wait up to
        ``timeout_s`` for the rest, then drop or cancel what is left (it stays in the WAL).

        True when every execution finished in time.
        """
        self.running = False
        self.timers.clear()  # Implements Q-36: one cancellation, however many timers
        # Executions waiting for a slot never begin: they stay in the WAL.
        self.backlog -= sum(1 for *_, counted in self._waiting if counted)
        self._waiting.clear()
        if self.slot_freed is not None:
            self.slot_freed.set()  # a wait for room sees the smaller backlog
        finished = await self._wait_work(timeout_s)
        self._soon.clear()  # plain executions that never began: they stay in the WAL
        leftovers = set(self.work)
        for job in leftovers:
            job.cancel()
        stuck: set[asyncio.Task[None]] = set()
        if leftovers:
            stuck = await self._wait_cancelled(leftovers)
            self.work.difference_update(leftovers)  # cancelled before their first step
            if stuck:
                # Implements Q-35: name them; their outcome is never written, so they stay
                # in the WAL and the next start runs them again (at-least-once).
                ids = sorted(job.get_name() for job in stuck)
                self.abandoned.update(ids)
                log.warning("stop: %d task(s) still running %.1f s after being cancelled "
                            "(they swallowed the cancellation); left running, they stay in "
                            "the WAL: %s", len(ids), STOP_GRACE_S, ", ".join(ids))
        # Jobs cancelled before their first step never gave their slot back; the stuck
        # ones give theirs back when they end.
        self.active = len(stuck)
        return finished

    async def _wait_cancelled(self, jobs: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """Implements Q-35: wait at most ``STOP_GRACE_S`` for cancelled jobs; those still running.

        The grace is a sleep on the ``Clock``, so tests drive it like every other wait.
        """
        pending: set[asyncio.Future[None]] = set(jobs)
        grace = asyncio.ensure_future(self.clock.sleep(STOP_GRACE_S))
        try:
            while pending:
                done, _ = await asyncio.wait(pending | {grace},
                                             return_when=asyncio.FIRST_COMPLETED)
                pending -= done
                for job in done:
                    if job is not grace and not job.cancelled():
                        job.exception()  # retrieved, as gather(return_exceptions=True) did
                if grace in done:
                    break
        finally:
            grace.cancel()
        return {job for job in jobs if not job.done()}

    async def _wait_work(self, timeout_s: float) -> bool:
        if not self.work and not self._soon and not self._waiting:
            return True
        deadline = asyncio.ensure_future(self.clock.sleep(timeout_s))
        try:
            while self.work or self._soon or self._waiting:
                idle = self._idle_waiter()
                await asyncio.wait({idle, deadline}, return_when=asyncio.FIRST_COMPLETED)
                if deadline.done():
                    return not self.work and not self._soon and not self._waiting
            return True
        finally:
            deadline.cancel()
