"""The queue runtime on asyncio: enqueue, run, retry, dead-letter, replay, stop (spec/queue.md).

Theory of operation (the reference Queue, ../shared/reference/reference-behaviour.md
sections 3 and 4.7):
- ``enqueue`` validates and serializes first, applies backpressure, then
  writes the task to the backend's WAL and only then schedules it on the
  queue's event loop; so when it returns the task is persisted (Q-6, Q-7), and
  a ``PushTimeout`` or ``SerializationError`` leaves nothing behind (Q-6, Q-11).
- Every execution ends in exactly one backend transition: success removes the
  task; a failure re-adds it under the same id (in this WAL only, W-15) with
  attempts + 1 and the retry delay; a give-up writes the dead task and only
  after that write returned removes it from the WAL (D-13, Q-8). If the
  dead-task write fails the WAL entry stays and is replayed at the next start.
- Dead-task store calls block on a cross-process lock, so they run in a worker
  thread (``asyncio.to_thread``); the event loop never waits on a lock (Q-10).
- On a power-safe ``Disk`` (``fsync_frequency=0``) the loop never waits on an
  fsync: ``aenqueue`` writes its record and awaits a group commit, one fsync
  in a worker thread at a time, covering every record written before it
  began (Q-20, W-21); completions, give-up removals and retry re-adds are
  written unsynced and a background group commit covers them (Q-22).
- ``start`` replays the backend's pending tasks with their remaining delays; a
  task that cannot be loaded is dead-lettered with the reason, never dropped
  (Q-9).
- ``stop`` refuses new executions, lets running ones finish up to a timeout
  (then cancels them: they stay in the WAL) and syncs the WAL (Q-15).
- Time comes from a ``Clock`` (wall time for ``publish_at``, ``sleep`` for
  timers and backpressure), so tests drive it deterministically.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import datetime
import enum
import inspect
import itertools
import logging
import math
import random
from collections.abc import Callable, Iterable
from typing import Final

from deferq._core.types import DeadTask, PendingTask
from deferq._core.errors import QueueStateError, TaskNotRegisteredError
from deferq._runtime.backpressure import BACKPRESSURE_SLEEP_S, Backpressure
from deferq._runtime.clock import Clock, SystemClock
from deferq._runtime.committer import Committer
from deferq._runtime.errors import PushTimeout, UnloadableTaskError
from deferq._runtime.operator import Operator, Retried
from deferq._runtime.serialize import JSON_CODEC, Context, ContextCodec, ContextError
from deferq._runtime.task import (
    REGISTRY,
    Task,
    TaskRegistry,
    default_backoff,
    next_retry_in,
    task_class_of,
)
from deferq.backends.protocol import Backend

log = logging.getLogger("deferq.queue")

UNKNOWN_TASK_CLASS: Final = "<unknown>"

# A plain execution waiting for _run_soon: the context it was scheduled in, its arguments.
_Soon = tuple[contextvars.Context, str, Context, "type[Task]", bool]


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    return float(value)


class Queue:
    """An in-process deferred-task queue over a backend (``Disk`` or ``Nil``).

    ``await start()`` on the application's loop, ``enqueue(...)`` from it, ``await stop()``.
    """

    def __init__(self, backend: Backend, *, registry: TaskRegistry | None = None,
                 backpressure: Backpressure | None = None, clock: Clock | None = None,
                 rng: random.Random | None = None, codec: ContextCodec | None = None) -> None:
        self.backend = backend
        # JSON unless the application opts into authenticated pickles.
        self.codec = JSON_CODEC if codec is None else codec
        self.registry = REGISTRY if registry is None else registry
        self.backpressure = backpressure
        self.clock: Clock = SystemClock() if clock is None else clock
        self.rng = random.Random() if rng is None else rng
        self.operator = Operator(backend, backend, codec=self.codec)
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backlog = 0  # immediate tasks scheduled, not yet picked up
        self._inflight = 0  # executions running
        # Immediate and running executions. A plain ``perform`` waits in ``_soon`` (with
        # the context it was scheduled in) for ``_run_soon``, one loop callback that runs
        # every execution queued before it began; an async one, or the rest of a plain one
        # that failed or returned an awaitable, is an asyncio task in ``_work``. An asyncio
        # task, or a loop callback, per execution costs several us more (docs/queue.md).
        self._work: set[asyncio.Task[None]] = set()
        self._soon: collections.deque[_Soon] = collections.deque()
        self._soon_handle: asyncio.Handle | None = None
        self._async_perform: dict[type[Task], bool] = {}
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._timers: set[asyncio.Task[None]] = set()  # delayed tasks waiting for their time
        self._local_ids = itertools.count(1)
        # Group commit (Q-20..Q-23): only for a power-safe Disk; other backends are called
        # exactly as before.
        self._disk: Backend | None = backend if backend.group_commit else None
        self._committed = 0  # the highest WAL ticket a completed group commit covered
        self._commit: asyncio.Future[None] | None = None  # the group commit in flight
        self._wanted = 0  # the highest ticket the background flusher must cover
        self._committer: Committer | None = None  # the thread of every commit's fsync
        self._flusher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ introspection
    @property
    def backlog_size(self) -> int:
        """Immediate tasks scheduled but not yet picked up (what backpressure counts)."""
        return self._backlog

    @property
    def running(self) -> int:
        """Executions in progress."""
        return self._inflight

    @property
    def delayed(self) -> int:
        """Tasks waiting for their publish time in this process."""
        return len(self._timers)

    async def wait_idle(self) -> None:
        """Return when no immediate or running work is left (delayed tasks may remain)."""
        while self._work or self._soon:
            await self._idle_waiter()

    def _idle_waiter(self) -> asyncio.Future[None]:
        """A future resolved the next time no immediate or running work is left."""
        waiter = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        return waiter

    def _maybe_idle(self) -> None:
        """An execution ended: wake the idle waiters if it was the last piece of work."""
        if self._idle_waiters and not self._work and not self._soon:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Bind to the running loop and replay the backend's pending tasks (Q-9)."""
        if self._state is not _State.NEW:
            raise QueueStateError(f"queue cannot start: it is {self._state.value}")
        self._loop = asyncio.get_running_loop()
        self._state = _State.RUNNING
        now = int(self.clock.time())
        for pending in self.backend.pending_tasks():
            await self._replay(pending, now)

    async def stop(self, timeout: float = 10.0) -> bool:
        """Stop taking work, wait up to ``timeout`` s for running tasks, sync the WAL (Q-15).

        Returns True when every running execution finished in time; the ones that did not
        are cancelled and stay in the WAL, like every task that did not run.
        """
        wait_s = _seconds(timeout, "timeout")
        if self._state in (_State.STOPPING, _State.STOPPED):
            return True
        self._state = _State.STOPPING
        for timer in self._timers:
            timer.cancel()
        finished = await self._wait_work(wait_s)
        self._soon.clear()  # plain executions that never began: they stay in the WAL
        leftovers = set(self._work) | set(self._timers)
        for job in leftovers:
            job.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)
            self._work.difference_update(leftovers)  # cancelled before their first step
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        try:
            self.backend.sync()
        finally:
            self._state = _State.STOPPED
            if self._committer is not None:
                self._committer.close()
        return finished

    async def _wait_work(self, timeout_s: float) -> bool:
        if not self._work and not self._soon:
            return True
        deadline = asyncio.ensure_future(self.clock.sleep(timeout_s))
        try:
            while self._work or self._soon:
                idle = self._idle_waiter()
                await asyncio.wait({idle, deadline}, return_when=asyncio.FIRST_COMPLETED)
                if deadline.done():
                    return not self._work and not self._soon
            return True
        finally:
            deadline.cancel()

    # ------------------------------------------------------------------ enqueue
    def enqueue(self, task: object, /, *args: object, delay: object = None,
                delay_until: object = None, **kwargs: object) -> str:
        """Persist a task in the WAL, then schedule it; return its id (Q-6, Q-7).

        ``task`` is a ``Task`` subclass or a ``@task`` function. ``delay`` (seconds,
        truncated) wins over ``delay_until`` (epoch seconds or an aware datetime) when it
        is not None; a non-positive or past time runs at once. With backpressure, this
        synchronous call cannot wait: above the high water mark it raises ``PushTimeout``
        at once; ``await aenqueue(...)`` waits up to the timeout instead.
        """
        data, context, cls = self._prepare(task, args, kwargs)
        bp = self.backpressure
        if bp is not None and self._backlog > bp.high_water_mark:
            raise PushTimeout(f"could not enqueue deferred task: backlog {self._backlog} is above "
                              f"the high water mark {bp.high_water_mark}")
        return self._persist_and_schedule(data, context, cls, delay, delay_until)

    async def aenqueue(self, task: object, /, *args: object, delay: object = None,
                       delay_until: object = None, **kwargs: object) -> str:
        """``enqueue`` that waits for backpressure like the reference (Q-11).

        On a power-safe ``Disk`` it returns once a group commit made the task durable,
        without blocking the event loop on the fsync (Q-20).
        """
        data, context, cls = self._prepare(task, args, kwargs)
        bp = self.backpressure
        if bp is not None and self._backlog > bp.high_water_mark:
            await self._apply_backpressure()  # (tested here first: no coroutine per enqueue)
        disk = self._disk
        if disk is None or asyncio.get_running_loop() is not self._loop:
            # Not started, or awaited on another loop: the inline fsync of ``enqueue``.
            return self._persist_and_schedule(data, context, cls, delay, delay_until)
        publish_at, publish_in = self._timing(delay, delay_until)
        stored = disk.add_task(data, publish_at, None, sync=False)
        task_id = stored if stored is not None else f"local-{next(self._local_ids)}"
        await self._commit_through(disk, disk.written_ticket())
        self._schedule_from_any_thread(task_id, context, cls, publish_in)
        return task_id

    def _prepare(self, task: object, args: tuple[object, ...], kwargs: dict[str, object]
                 ) -> tuple[bytes, Context, type[Task]]:
        cls = task_class_of(task)
        if self.registry.get(cls.task_name) is not cls:
            raise TaskNotRegisteredError(
                f"task {cls.task_name!r} is not registered in this queue's registry")
        context = Context(cls.task_name, args, kwargs, 0)
        return self.codec.encode(context), context, cls

    def _timing(self, delay: object, delay_until: object) -> tuple[int | None, int | None]:
        """(publish_at, publish_in) as in the reference: None, None for immediate."""
        if delay is None and delay_until is None:
            return None, None  # the common case reads no clock
        now = int(self.clock.time())
        if delay is not None:
            seconds = int(_seconds(delay, "delay"))
            return (now + seconds, seconds) if seconds > 0 else (None, None)
        if delay_until is not None:
            if isinstance(delay_until, datetime.datetime):
                if delay_until.tzinfo is None:
                    raise ValueError("delay_until must be an aware datetime (with a tzinfo)")
                when = int(delay_until.timestamp())
            else:
                when = int(_seconds(delay_until, "delay_until"))
            return (when, when - now) if when > now else (None, None)
        return None, None

    def _persist_and_schedule(self, data: bytes, context: Context, cls: type[Task],
                              delay: object, delay_until: object) -> str:
        publish_at, publish_in = self._timing(delay, delay_until)
        task_id = self._add(data, publish_at, None)
        self._schedule_from_any_thread(task_id, context, cls, publish_in)
        return task_id

    def _add(self, data: bytes, publish_at: int | None, task_id: str | None) -> str:
        stored = self.backend.add_task(data, publish_at, task_id)
        if stored is not None:
            return stored
        return task_id if task_id is not None else f"local-{next(self._local_ids)}"  # Nil

    def _readd(self, data: bytes, publish_at: int | None, task_id: str) -> None:
        """A retry's re-add; on a power-safe Disk, unsynced with a background commit (Q-22)."""
        disk = self._disk
        if disk is None:
            self._add(data, publish_at, task_id)
            return
        disk.add_task(data, publish_at, task_id, sync=False)
        self._flush_later(disk)

    def _remove(self, task_id: str) -> None:
        """Record a finished task; on a power-safe Disk, unsynced with a background commit (Q-22)."""
        disk = self._disk
        if disk is None:
            self.backend.remove_task(task_id)
            return
        disk.remove_task(task_id, sync=False)
        self._flush_later(disk)

    # ------------------------------------------------------------------ group commit
    async def _commit_through(self, disk: Backend, ticket: int) -> None:
        """Implements Q-20 and W-21 at the queue: return once ``ticket`` is durable.

        At most one group commit runs at a time: it reads the WAL's latest ticket on
        the loop, so it covers every record the loop wrote before it began, and
        fsyncs in a worker thread. Callers whose ticket it did not cover start the
        next one; a failed commit fails every caller waiting on it (W-22).
        """
        while self._committed < ticket:
            commit = self._commit
            if commit is None:
                commit = self._commit = asyncio.ensure_future(self._commit_once(disk))
                # Its failure reaches every waiter; this only keeps asyncio from warning
                # when all of them were cancelled.
                commit.add_done_callback(_retrieve)
            await asyncio.shield(commit)

    async def _commit_once(self, disk: Backend) -> None:
        target = disk.written_ticket()
        try:
            committer = self._committer
            if committer is None:
                assert self._loop is not None
                committer = self._committer = Committer(self._loop, "deferq-commit")
            await committer.run(lambda: disk.sync_through(target))
        finally:
            self._commit = None
        if target > self._committed:
            self._committed = target

    def _flush_later(self, disk: Backend) -> None:
        """Implements Q-22: a background group commit covers the record just written."""
        ticket = disk.written_ticket()
        if ticket > self._wanted:
            self._wanted = ticket
        if self._flusher is None and self._loop is not None:
            self._flusher = self._loop.create_task(self._flush(disk))

    async def _flush(self, disk: Backend) -> None:
        try:
            while self._committed < self._wanted:
                await self._commit_through(disk, self._wanted)
        except Exception:  # noqa: BLE001 - the WAL is broken; the records stay unsynced
            log.exception("group commit of the tasks WAL failed; unsynced completions and "
                          "retries may be undone by a power loss")
        finally:
            self._flusher = None

    async def _apply_backpressure(self) -> None:
        bp = self.backpressure
        if bp is None or self._backlog <= bp.high_water_mark:
            return
        for _ in range(bp.iterations):
            if self._backlog <= bp.low:
                return
            await self.clock.sleep(BACKPRESSURE_SLEEP_S)
        if self._backlog > bp.low:
            raise PushTimeout(f"could not enqueue deferred task within {bp.timeout} seconds")

    # ------------------------------------------------------------------ scheduling
    def _schedule_from_any_thread(self, task_id: str, context: Context, cls: type[Task],
                                  publish_in: int | None) -> None:
        loop = self._loop
        if loop is None:
            return  # not started: start() replays it from the WAL
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._schedule(task_id, context, cls, publish_in)
        else:
            loop.call_soon_threadsafe(self._schedule, task_id, context, cls, publish_in)

    def _schedule(self, task_id: str, context: Context, cls: type[Task],
                  publish_in: float | None) -> None:
        if self._state is not _State.RUNNING or self._loop is None:
            return  # stays in the WAL for the next start
        if publish_in is not None and publish_in > 0:
            timer = self._loop.create_task(self._wait_then_run(task_id, context, cls, publish_in))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
        else:
            self._backlog += 1
            self._spawn(task_id, context, cls, counted=True)

    def _spawn(self, task_id: str, context: Context, cls: type[Task], *, counted: bool) -> None:
        loop = self._loop
        assert loop is not None
        is_async = self._async_perform.get(cls)
        if is_async is None:
            is_async = self._async_perform[cls] = inspect.iscoroutinefunction(
                getattr(cls, "perform", None))
        if is_async:
            # The job leaves ``_work`` from its own ``finally`` (a done callback would cost
            # a second event-loop turn per execution); ``stop`` drops the ones it cancelled
            # before they ever ran.
            self._work.add(loop.create_task(self._run(task_id, context, cls, counted)))
        else:
            self._soon.append((contextvars.copy_context(), task_id, context, cls, counted))
            if self._soon_handle is None:
                self._soon_handle = loop.call_soon(self._run_soon)

    async def _wait_then_run(self, task_id: str, context: Context, cls: type[Task],
                             publish_in: float) -> None:
        await self.clock.sleep(int(publish_in))
        if self._state is _State.RUNNING:
            self._spawn(task_id, context, cls, counted=False)

    # ------------------------------------------------------------------ execution
    def _run_soon(self) -> None:
        """The loop callback of plain executions: run those queued before it began, in order.

        Each runs in the context it was scheduled in, as its own callback would. Ones
        queued meanwhile wait for the next loop iteration, as new callbacks do.
        """
        self._soon_handle = None
        soon = self._soon
        run = self._run_plain
        try:
            for _ in range(len(soon)):
                if not soon:
                    break  # stop() dropped them
                ctx, task_id, context, cls, counted = soon.popleft()
                ctx.run(run, task_id, context, cls, counted)
        finally:
            if soon and self._soon_handle is None and self._loop is not None:
                self._soon_handle = self._loop.call_soon(self._run_soon)

    def _run_plain(self, task_id: str, context: Context, cls: type[Task],
                   counted: bool) -> None:
        """One execution of a plain ``perform``, in ``_run_soon`` (no asyncio task).

        A success is removed here; a failure, or an awaitable returned by ``perform``,
        continues in an asyncio task (``_finish``) like an async execution.
        """
        begun = self._begin(task_id, context, cls, counted, self._maybe_idle)
        if begun is None:
            return
        instance, result, error = begun
        if error is not None or (result is not None and inspect.isawaitable(result)):
            assert self._loop is not None
            self._work.add(self._loop.create_task(
                self._finish(task_id, context, cls, instance, result, error)))
            return
        try:
            self._remove(task_id)
        except Exception:  # noqa: BLE001 - storage errors must not stop the loop
            log.exception("deferred task %s: storage error; it stays in the WAL", task_id)
        finally:
            self._inflight -= 1
            self._maybe_idle()

    async def _run(self, task_id: str, context: Context, cls: type[Task], counted: bool) -> None:
        """One execution of an async ``perform``, as its own asyncio task."""
        begun = self._begin(task_id, context, cls, counted, self._job_done)
        if begun is not None:
            await self._finish(task_id, context, cls, *begun)

    def _begin(self, task_id: str, context: Context, cls: type[Task], counted: bool,
               ended: Callable[[], None]) -> tuple[Task | None, object, Exception | None] | None:
        """Start an execution: ``_perform``'s outcome, or None when the queue is stopping
        (the task stays in the WAL). ``ended`` runs when the execution ends here."""
        if counted:
            self._backlog -= 1
        if self._state is not _State.RUNNING:
            ended()
            return None
        self._inflight += 1
        try:
            return self._perform(task_id, context, cls)
        except BaseException:  # KeyboardInterrupt, SystemExit: not a failed execution
            self._inflight -= 1
            ended()
            raise

    async def _finish(self, task_id: str, context: Context, cls: type[Task],
                      instance: Task | None, result: object, error: Exception | None) -> None:
        """The rest of an execution in its asyncio task: await the result, then one transition."""
        try:
            try:
                if error is None and result is not None and inspect.isawaitable(result):
                    try:
                        await result
                    except Exception as exc:  # noqa: BLE001 - a failed execution
                        error = exc
                if error is not None:
                    log.error("Deferred task failed with exception: %s (%s)",
                              type(error).__name__, error, exc_info=error)
                    await self._failed(task_id, context, cls, instance, error)
                else:
                    self._remove(task_id)
            except Exception:  # noqa: BLE001 - storage errors must not kill the loop's task
                log.exception("deferred task %s: storage error; it stays in the WAL", task_id)
            finally:
                self._inflight -= 1
        finally:
            self._job_done()

    def _job_done(self) -> None:
        """The current asyncio task's execution ended: it leaves ``_work``."""
        job = asyncio.current_task()
        if job is not None:
            self._work.discard(job)
        self._maybe_idle()

    def _perform(self, task_id: str, context: Context, cls: type[Task]
                 ) -> tuple[Task | None, object, Exception | None]:
        """Instantiate the task and call ``perform``: (instance or None, result, failure)."""
        instance: Task | None = None
        try:
            instance = cls()
            instance.rng, instance.task_id, instance.attempt = (
                self.rng, task_id, context.attempts + 1)
            perform: object = getattr(instance, "perform")
            if not callable(perform):
                raise TypeError(f"{cls.task_name}.perform is not callable")
            return instance, perform(*context.args, **context.kwargs), None
        except Exception as exc:  # noqa: BLE001 - any failure of the task is a failed execution
            return instance, None, exc

    async def _failed(self, task_id: str, context: Context, cls: type[Task],
                      instance: Task | None, exc: Exception) -> None:
        attempts = context.attempts + 1
        retried = context.with_attempts(attempts)
        data = self.codec.encode(retried)
        if instance is None:
            instance = object.__new__(cls)
            instance.rng = self.rng
        try:
            retry_in = next_retry_in(instance, exc, attempts)
        except Exception:  # noqa: BLE001 - a broken policy falls back to the default
            log.exception("%s.retry_interval raised; falling back to default backoff",
                          cls.task_name)
            retry_in = None if attempts > cls.max_retries else default_backoff(attempts, self.rng)
        if retry_in is None:
            await self._give_up(task_id, data, exc, cls.task_name, attempts)
            return
        try:
            await self._apply_backpressure()
        except PushTimeout as push:
            log.error("deferred task %s: retry not scheduled (%s); it stays in the WAL", task_id,
                      push)
            return
        seconds = int(retry_in)
        publish_at = int(self.clock.time()) + seconds if seconds > 0 else None
        self._readd(data, publish_at, task_id)  # same id, this WAL only (W-15)
        self._schedule(task_id, retried, cls, seconds if seconds > 0 else None)

    async def _give_up(self, task_id: str, data: bytes, exc: BaseException, task_class: str,
                       attempts: int) -> None:
        """Implements D-13 / Q-8: dead-task write first, WAL removal only after it returned."""
        try:
            await asyncio.to_thread(self.backend.add_dead_task, task_id, data, exc,
                                    task_class=task_class, attempts=attempts)
        except Exception as dead:  # noqa: BLE001 - the task must stay in the WAL
            log.error("deferred task %s could not be dead-lettered (%s: %s); it stays in the WAL "
                      "and is replayed at the next start", task_id, type(dead).__name__, dead)
            return
        self._remove(task_id)

    # ------------------------------------------------------------------ replay
    async def _replay(self, pending: PendingTask, now: int) -> None:
        try:
            context = self.codec.decode(pending.context)
            cls = self.registry.get(context.task)
            if cls is None:
                raise ContextError(f"task {context.task!r} is not registered")
        except ContextError as reason:
            await self._dead_letter_unloadable(pending, str(reason))
            return
        publish_in = None if pending.publish_at is None else pending.publish_at - now
        self._schedule(pending.task_id, context, cls, publish_in)

    async def _dead_letter_unloadable(self, pending: PendingTask, reason: str) -> None:
        log.error("Failed to load deferred task %s: %s. Moving it to the dead-task store.",
                  pending.task_id, reason)
        name = self.codec.peek_task_name(pending.context) or UNKNOWN_TASK_CLASS
        try:
            attempts = self.codec.decode(pending.context).attempts
        except ContextError:
            attempts = 0
        error = UnloadableTaskError(f"cannot load the task: {reason}")
        await self._give_up(pending.task_id, pending.context, error, name[:1024], attempts)

    # ------------------------------------------------------------------ operator API
    async def dead_tasks(self, *, limit: int | None = None, offset: int = 0,
                         task_class: str | None = None,
                         exception_class: str | None = None) -> list[DeadTask]:
        """Dead tasks newest first, optionally filtered (Q-13)."""
        return await asyncio.to_thread(self.operator.list_dead, limit=limit, offset=offset,
                                       task_class=task_class, exception_class=exception_class)

    async def dead_task(self, task_id: str) -> DeadTask | None:
        """One dead task, or None."""
        return await asyncio.to_thread(self.operator.find_dead, task_id)

    async def retry_dead_tasks(self, ids: Iterable[str]) -> tuple[list[Retried], list[str]]:
        """Put dead tasks back into this worker's WAL under new ids and run them (Q-12)."""
        retried, missing = await asyncio.to_thread(self.operator.retry_dead, list(ids))
        for item in retried:
            if item.new_id is None:
                continue
            try:
                context = self.codec.decode(item.context)
            except ContextError as reason:
                await self._dead_letter_unloadable(
                    PendingTask(item.new_id, item.context, None), str(reason))
                continue
            cls = self.registry.get(context.task)
            if cls is None:
                await self._dead_letter_unloadable(PendingTask(item.new_id, item.context, None),
                                                   f"task {context.task!r} is not registered")
                continue
            self._schedule(item.new_id, context, cls, None)
        return retried, missing

    async def remove_dead_tasks(self, ids: Iterable[str]) -> int:
        """Remove dead tasks by id; the number found."""
        return await asyncio.to_thread(self.operator.remove_dead, list(ids))


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
