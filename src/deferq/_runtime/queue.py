"""The queue: a facade that starts and stops the runtime and takes tasks (spec/queue.md).

Theory of operation (the reference's queue semantics, restated in spec/queue.md). A
``Queue`` owns six parts, each with one job:
- ``Journal`` (journal.py): every transition written to the backend, and the group
  commit of a power-safe ``Disk`` (Q-20..Q-23, D-13, Q-8).
- ``Scheduler`` (scheduler.py): when a persisted task begins (timers of delayed tasks,
  the run-soon batch of plain performs), the backlog and backpressure (Q-11), and the
  work ``wait_idle`` and ``stop`` wait for.
- ``Executor`` (executor.py): one execution and its outcome (success, retry, give-up);
  ``Replayer`` (replay.py): the replay of the WAL at start (Q-9), claims and adoptions.
- ``Operator`` (operator.py): the dead-task store's operator commands (Q-33, Q-13).
- ``Sweeper`` (sweeper.py): the periodic adoption of orphaned WAL files (Q-70..Q-72).
This module keeps the lifecycle, the enqueue API and the introspection:
- ``enqueue`` validates and serializes first, applies backpressure, then
  writes the task to the backend's WAL and only then schedules it on the
  queue's event loop; so when it returns the task is persisted (Q-6, Q-7), and
  a ``PushTimeout`` or ``SerializationError`` leaves nothing behind (Q-6, Q-11).
- On a power-safe ``Disk`` (``fsync_frequency=0``) the loop never waits on an
  fsync: ``aenqueue`` writes its record and awaits a group commit (Q-20, W-21); a caller
  cancelled meanwhile still leaves the task scheduled once that commit is done (Q-41).
- On a shared database (a ``ClaimingBackend``) ``aenqueue`` writes in the queue's write
  thread and schedules the task on the loop once it is written (Q-181, sharedwrites.py).
- ``start`` replays the backend's pending tasks with their remaining delays (Q-9).
- ``stop`` refuses new executions, lets running ones finish up to a timeout
  (then cancels them: they stay in the WAL) and syncs the WAL (Q-15); a task that
  swallows its cancellation delays it by at most ``STOP_GRACE_S`` (Q-35).
- Time comes from a ``Clock`` (wall time for ``publish_at``, ``sleep`` for
  timers and backpressure), so tests drive it deterministically.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import random
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, ParamSpec, TypeVar

from deferq._core.errors import QueueStateError, TaskNotRegisteredError
from deferq._core.limits import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_SWEEP_INTERVAL_S,
    DEFAULT_SYNC_THREADS,
    MAX_CONCURRENCY_MAX,
    SWEEP_FILES_MAX,
    SYNC_THREADS_MAX,
)
from deferq._runtime.backpressure import Backpressure
from deferq._runtime.cancel import Canceller
from deferq._runtime.deadapi import DeadTaskApi
from deferq._runtime.enqueued import schedule_once_committed, schedule_written
from deferq._runtime.claimer import Claimer
from deferq._runtime.book import TaskBook
from deferq._runtime.clock import Clock, SystemClock
from deferq._runtime.ctxfields import check_meta, enqueue_time
from deferq._runtime.errors import PushTimeout
from deferq._runtime.executor import Executor
from deferq._runtime.hooks import NO_META, Hooks, HookSet, TaskEnqueued, check_hooks, log_failure
from deferq._runtime.introspect import Introspection
from deferq._runtime.journal import Journal
from deferq._runtime.operator import Operator
from deferq._runtime.periodic import Schedule, periodic_for
from deferq._runtime.replay import Replayer
from deferq._runtime.options import (
    NO_OPTIONS,
    ConfiguredTask,
    DeferOptions,
    Performs,
    enqueue_timing,
    seconds_value,
)
from deferq._runtime.scheduler import Scheduler
from deferq._runtime.sweeper import Sweeper, adopter_of
from deferq._runtime.serialize import JSON_CODEC, Context, ContextCodec
from deferq._runtime.syncpool import SyncPool
from deferq._runtime.task import REGISTRY, Task, TaskFunction, TaskRegistry, task_class_of
from deferq.backends._options import check_sweep_interval
from deferq.backends.protocol import Backend, ClaimingBackend

log = logging.getLogger("deferq.queue")
# The hot path of every enqueue, bound once: the C constructor of a named tuple (its own
# ``__new__`` is a Python frame), the running loop or None (no exception to catch), and
# the timing of a task with neither option.
_build: Final = tuple.__new__
_running_loop: Final = asyncio.events._get_running_loop
_NOW: Final[tuple[None, None]] = (None, None)

P = ParamSpec("P")
R = TypeVar("R")
# What ``defer`` takes: a task, checked by mypy against its signature.
Deferrable = TaskFunction[P, R] | type[Performs[P]] | ConfiguredTask[P]


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


def _count(value: object, name: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(f"{name} must be an int from 1 to {most:,}, got {value!r}")
    return value


class Queue(DeadTaskApi, Introspection):
    """An in-process deferred-task queue over a backend (``Disk`` or ``Nil``).

    ``await start()`` on the application's loop, ``enqueue(...)`` from it, ``await stop()``.
    """

    def __init__(self, backend: Backend, *, registry: TaskRegistry | None = None,
                 backpressure: Backpressure | None = None, clock: Clock | None = None,
                 rng: random.Random | None = None, codec: ContextCodec | None = None,
                 sweep_interval: float = DEFAULT_SWEEP_INTERVAL_S,
                 max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
                 sync_threads: int = DEFAULT_SYNC_THREADS, deps: object = None,
                 hooks: Iterable[Hooks] = (), schedules: Iterable[Schedule] = ()) -> None:
        self.backend = backend
        self._hooks = HookSet(check_hooks(hooks))  # lifecycle hooks
        # executions that run at once; the others wait in memory for a slot.
        self.max_concurrency = _count(max_concurrency, "max_concurrency", MAX_CONCURRENCY_MAX)
        # the threads plain performs run in (unless their task is inline).
        self._pool = SyncPool(_count(sync_threads, "sync_threads", SYNC_THREADS_MAX))
        # JSON unless the application opts into authenticated pickles.
        self.codec = JSON_CODEC if codec is None else codec
        self.registry = REGISTRY if registry is None else registry
        self.backpressure = backpressure
        self.clock: Clock = SystemClock() if clock is None else clock
        self.rng = random.Random() if rng is None else rng
        self.operator = Operator(backend, backend)
        self._state = _State.NEW
        self._book = TaskBook()
        self._journal = Journal(backend, self._book)
        self._late: set[asyncio.Task[None]] = set()  # Q-41: cancelled callers' tasks
        self._scheduler = Scheduler(self.clock, backpressure,
                                    max_concurrency=self.max_concurrency)
        self._executor = Executor(self._scheduler, self._journal, codec=self.codec,
                                  clock=self.clock, rng=self.rng, pool=self._pool, deps=deps,
                                  hooks=self._hooks)
        self._replayer = Replayer(self._scheduler, self._journal, registry=self.registry,
                                  codec=self.codec, hooks=self._hooks)
        self._canceller = Canceller(self._scheduler, self._executor, self._journal, self.clock,
                                    self._hooks)
        # what tasks get as ``self.deps`` / ``task_deps(...)``; never stored.
        self.deps = deps
        # Q-70..Q-72: the adoption sweep, when the backend has one (C-28).
        adopt, interval_s = adopter_of(backend), check_sweep_interval(sweep_interval)
        self._sweeper = None if adopt is None else Sweeper(
            adopt, self._replayer.replay_adopted, self.clock, interval_s=interval_s,
            files_max=SWEEP_FILES_MAX)
        # on a shared backend (Postgres) the queue also runs the due tasks it claims.
        self._claimer = (Claimer(backend, self._scheduler, self._replayer, self.clock)
                         if isinstance(backend, ClaimingBackend) else None)
        self._periodic = periodic_for(schedules, backend, self._prepare, self._apersist,
                                      self.clock, self._sweeper)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Queue:
        """``async with queue:`` starts it (Q-59)."""
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stops it with the default timeout, whatever ended the block (Q-59)."""
        await self.stop()

    async def start(self) -> None:
        """Bind to the running loop and replay the backend's pending tasks (Q-9)."""
        if self._state is not _State.NEW:
            raise QueueStateError(f"queue cannot start: it is {self._state.value}")
        loop = asyncio.get_running_loop()
        self._journal.bind(loop)
        self._scheduler.bind(loop)
        self._state = _State.RUNNING
        now = int(self.clock.time())
        replay = self._replayer.replay
        replayed = delayed = unloadable = 0
        shared = self._journal.shared  # a shared database is read off the loop
        for pending in self.backend.pending_tasks() if shared is None else await shared.held():
            if await replay(pending, now):
                replayed += 1
                delayed += pending.publish_at is not None and pending.publish_at > now
            else:
                unloadable += 1
        if self._claimer is not None:
            self._claimer.start(loop)
        # Implements Q-32: what a start found.
        log.info("queue started: %d task(s) replayed (%d delayed), %d unloadable one(s) "
                 "dead-lettered", replayed, delayed, unloadable)
        if self._sweeper is not None:
            self._sweeper.start()
        self._periodic.start()

    async def stop(self, timeout: float = 10.0) -> bool:
        """Stop taking work, wait up to ``timeout`` s for running tasks, sync the WAL (Q-15).

        Returns True when every running execution finished in time; the ones that did not
        are cancelled and stay in the WAL, like every task that did not run. One that
        swallows its cancellation is waited for at most ``STOP_GRACE_S`` more, then named
        in a warning and left running; its outcome is not recorded (Q-35).
        """
        wait_s = seconds_value(timeout, "timeout")
        if self._state in (_State.STOPPING, _State.STOPPED):
            return True
        self._state = _State.STOPPING
        if self._sweeper is not None:
            await self._sweeper.stop()  # before the scheduler stops
        await self._periodic.stop()  # before the scheduler stops
        if self._claimer is not None:
            await self._claimer.stop()
        finished = await self._scheduler.stop(wait_s)
        self._pool.shutdown()  # Implements Q-38: no thread is waited for
        await self._journal.settle()
        try:
            self._journal.close()
        finally:
            self._state = _State.STOPPED
            if self._claimer is not None:
                await self._claimer.release()
        return finished

    async def cancel(self, task_id: str) -> bool:
        """Cancel a task this running queue holds: delayed, waiting for a slot, or running (Q-40).

        It never runs (again), is removed from the WAL and logged; a plain perform in the pool
        cannot be stopped (what it does is not recorded). False for an id it does not hold.
        """
        return await self._canceller.cancel(task_id)
    # ------------------------------------------------------------------ defer
    def defer(self, task: Deferrable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> str:
        """Persist a task in the WAL, then schedule it; return its id (Q-50, Q-7).

        Every argument after ``task`` goes to the task, keywords included; options are
        given on the task: ``queue.defer(send.options(delay=60, key="k"), "a@example.com")``.
        mypy checks the arguments against the task's signature (``perform``'s for a
        ``Task`` subclass). Backpressure as ``enqueue``: ``PushTimeout`` at once.

        Raises:
            NotATaskError: ``task`` is not a task; TaskNotRegisteredError: not in this
            queue's registry; SerializationError: an argument cannot be stored.
        """
        cls, options = self._resolve(task)
        data, context, cls = self._prepare(cls, args, kwargs, options.key, meta=options.meta)
        if self.backpressure is not None:
            _refuse_above_high_water(self.backpressure, self._scheduler)
        publish_at, publish_in = self._publish(options)
        return self._persist_and_schedule(data, context, cls, publish_at, publish_in)

    async def adefer(self, task: Deferrable[P, R], /, *args: P.args,
                     **kwargs: P.kwargs) -> str:
        """``defer`` that waits for backpressure, and on a power-safe ``Disk`` returns once
        a group commit made the task durable, as ``aenqueue`` does (Q-50, Q-11, Q-20)."""
        cls, options = self._resolve(task)
        data, context, cls = self._prepare(cls, args, kwargs, options.key, meta=options.meta)
        return await self._apersist(data, context, cls, self._publish(options))

    def _resolve(self, task: object) -> tuple[type[Task], DeferOptions]:
        # An exact type check: isinstance of a Generic class costs ~400 instructions.
        if type(task) is ConfiguredTask:
            return task_class_of(task.task), task.settings
        return task_class_of(task), NO_OPTIONS

    def _publish(self, options: DeferOptions) -> tuple[int | None, int | None]:
        if options.delay_s is None and options.at_s is None:
            return None, None  # the common case reads no clock
        return options.timing(int(self.clock.time()))

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
        data, context, cls = self._prepare(task_class_of(task), args, kwargs)
        if self.backpressure is not None:
            _refuse_above_high_water(self.backpressure, self._scheduler)
        publish_at, publish_in = _timing(self.clock, delay, delay_until)
        return self._persist_and_schedule(data, context, cls, publish_at, publish_in)

    async def aenqueue(self, task: object, /, *args: object, delay: object = None,
                       delay_until: object = None, **kwargs: object) -> str:
        """``enqueue`` that waits for backpressure like the reference (Q-11); on a power-safe
        ``Disk`` it returns once a group commit made the task durable, without blocking the
        event loop on the fsync (Q-20)."""
        data, context, cls = self._prepare(task_class_of(task), args, kwargs)
        return await self._apersist(data, context, cls, _NOW if delay is None and delay_until
                                    is None else _timing(self.clock, delay, delay_until))

    async def _apersist(self, data: bytes, context: Context, cls: type[Task],
                        timing: tuple[int | None, int | None]) -> str:
        bp = self.backpressure
        if bp is not None and self._scheduler.backlog > bp.high_water_mark:
            await self._scheduler.make_room()  # (tested here first: no coroutine per enqueue)
        journal = self._journal
        publish_at, publish_in = timing
        if not journal.commits_here():
            if journal.shared is not None:  # Implements Q-181: a shared database, off the loop
                return await journal.shared.add(data, publish_at, context.key, functools.partial(
                    schedule_written, self._hooks, self._scheduler, context, cls, publish_at,
                    publish_in))
            # Not a power-safe Disk, not started, or on another loop: ``enqueue``'s write.
            return self._persist_and_schedule(data, context, cls, publish_at, publish_in)
        key, book = context.key, self._book
        if key is None:
            task_id = journal.add_unsynced(data, publish_at)
            book.tasks[task_id] = publish_at
        else:
            with book.lock:  # Implements Q-54: the check and the write are one step.
                owner = book.owner(key)
                if owner is None:
                    task_id = journal.add_unsynced(data, publish_at)
                    book.added(task_id, publish_at, key)
            if owner is not None:
                await journal.commit_written()
                return owner
        try:
            await journal.commit_written()
        except asyncio.CancelledError:
            schedule_once_committed(journal, self._scheduler, self._late, task_id, context,
                                     cls, publish_in, self._hooks, publish_at)
            raise
        if self._hooks.enqueues:
            # Implements Q-101, before it can start: the event built here (hooks.py's docstring).
            meta = context.meta
            event = _build(TaskEnqueued, (task_id, context.task, context.attempts + 1,
                                          NO_META if meta is None else MappingProxyType(meta),
                                          publish_at))
            for call in self._hooks.enqueued_calls:
                try:
                    call(event)
                except Exception:  # noqa: BLE001 - Implements Q-104.
                    log_failure(call, "on_enqueued", task_id)
        self._scheduler.schedule_from_any_thread(task_id, context, cls, publish_in)
        return task_id

    def _prepare(self, cls: type[Task], args: tuple[object, ...], kwargs: dict[str, object],
                 key: str | None = None, *, meta: Mapping[str, str] | None = None
                 ) -> tuple[bytes, Context, type[Task]]:
        if self.registry.lookup(cls.task_name) is not cls:
            raise TaskNotRegisteredError(
                f"task {cls.task_name!r} is not registered in this queue's registry")
        # Implements Q-65: the record keeps when the task was first enqueued.
        # Implements Q-66: ``meta`` is checked before anything is stored; users give it as
        # the task's ``options(meta=...)``.
        checked = None if meta is None else check_meta(meta)  # (no call in the common case)
        if self._hooks.meta:
            checked = self._hooks.add_meta(cls.task_name, checked)
        context = _build(Context, (cls.task_name, args, kwargs, 0, key,  # (no Python frame)
                                   enqueue_time(self.clock.time()), checked))
        return self.codec.encoder(context), context, cls

    def _persist_and_schedule(self, data: bytes, context: Context, cls: type[Task],
                              publish_at: int | None, publish_in: int | None) -> str:
        key, book = context.key, self._book
        if key is None:
            task_id = self._journal.add(data, publish_at, None)
            book.tasks[task_id] = publish_at  # (no call: this is every enqueue's path)
        else:
            with book.lock:  # Implements Q-54: the check and the write are one step.
                owner = book.owner(key)
                if owner is None:
                    task_id = self._journal.add(data, publish_at, None)
                    book.added(task_id, publish_at, key)
            if owner is not None:
                self._journal.sync_written()
                return owner
        if self._hooks.enqueues:
            # Implements Q-101, before it can start: the event built here (hooks.py's docstring).
            meta = context.meta
            event = _build(TaskEnqueued, (task_id, context.task, context.attempts + 1,
                                          NO_META if meta is None else MappingProxyType(meta),
                                          publish_at))
            for call in self._hooks.enqueued_calls:
                try:
                    call(event)
                except Exception:  # noqa: BLE001 - Implements Q-104.
                    log_failure(call, "on_enqueued", task_id)
        scheduler = self._scheduler
        if _running_loop() is scheduler.loop:  # (one call less on the loop: every aenqueue)
            scheduler.schedule(task_id, context, cls, publish_in)
        else:
            scheduler.schedule_from_any_thread(task_id, context, cls, publish_in)
        return task_id


def _timing(clock: Clock, delay: object, delay_until: object) -> tuple[int | None, int | None]:
    """(publish_at, publish_in) of ``enqueue``'s options (Q-7)."""
    if delay is None and delay_until is None:
        return _NOW  # the common case reads no clock
    return enqueue_timing(delay, delay_until, int(clock.time()))


def _refuse_above_high_water(bp: Backpressure | None, scheduler: Scheduler) -> None:
    """Implements Q-11 for ``enqueue`` and ``defer``: ``PushTimeout`` at once above the mark."""
    if bp is not None and scheduler.backlog > bp.high_water_mark:
        raise PushTimeout(f"could not enqueue deferred task: backlog {scheduler.backlog} is above "
                          f"the high water mark {bp.high_water_mark}")
