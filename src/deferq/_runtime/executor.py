"""The queue's executor: one execution of a task and its outcome (replay.py: the replay).

Rules (spec/queue.md):
- Every execution ends in exactly one transition, written by the journal: success
  removes the task; a failure re-adds it under the same id (W-15) with attempts + 1 and
  the retry delay, after backpressure (Q-11); a give-up dead-letters it (D-13, Q-8).
  A storage error is logged and leaves the task in the WAL; it never stops the loop. On a
  shared database those writes run in the queue's write thread, and what follows them on
  the loop once they returned (Q-179, ``Journal.shared``).
- An execution begins only while the queue runs; one that does not begin stays in the
  WAL. ``KeyboardInterrupt`` and ``SystemExit`` are not failed executions: they propagate.
- A broken retry policy falls back to the default backoff.
- The three events of every task's path with hooks (started here, an async success's
  succeeded here, enqueued in the queue) are built and delivered inline (hooks.py).

Theory of operation: the scheduler calls ``run_plain`` for a plain ``perform`` inside its
run-soon batch (no asyncio task): ``_begin`` calls ``perform``, a success is removed with
the batch's others (``Successes``, Q-170), and only a failure or a returned awaitable
continues in an asyncio task (``_finish``). ``run`` is the whole execution of an async ``perform`` as its own asyncio
task. ``_begin`` and ``_finish`` keep the backlog and ``inflight`` counts and tell the
scheduler when an execution ended, so ``wait_idle`` and ``stop`` see it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Final, Protocol

from deferq._runtime.book import RUNNING
from deferq._runtime.clock import Clock
from deferq._runtime.errors import PushTimeout, TaskTimeoutError
from deferq._runtime.hooks import NO_META, HookSet, TaskStarted, TaskSucceeded, log_failure
from deferq._runtime.journal import NOT_DEAD, Journal
from deferq._runtime.scheduler import Scheduler
from deferq._runtime.serialize import Context, ContextCodec
from deferq._runtime.successes import SUCCESS_HOLD_S, successes_for
from deferq._runtime.syncpool import SyncPool
from deferq._runtime.task import Task, default_backoff, next_retry_in

log = logging.getLogger("deferq.queue")
_now: Final = time.perf_counter  # Q-170's hold, read before each plain execution; durations
_build: Final = tuple.__new__  # the C constructor of the started and succeeded events


class _Perform(Protocol):
    """A task's ``perform``, bound to its instance."""

    def __call__(self, *args: object, **kwargs: object) -> object: ...


class Executor:
    """Runs executions the scheduler began, and writes each one's outcome to the journal."""

    def __init__(self, scheduler: Scheduler, journal: Journal, *, codec: ContextCodec,
                 clock: Clock, rng: random.Random, pool: SyncPool,
                 deps: object = None, hooks: HookSet | None = None) -> None:
        self._scheduler = scheduler
        # Lifecycle hooks (Q-100..Q-106); every call behind one bool test.
        self._hooks = HookSet(()) if hooks is None else hooks
        self._hooked = self._hooks.executions
        self._journal = journal
        self._codec = codec
        self._clock = clock
        self._rng = rng
        self._deps = deps  # given to every task instance
        self.inflight = 0  # executions running
        self._pool = pool
        self._pooled: dict[type[Task], bool] = {}  # whose perform runs in the pool
        self.jobs: dict[str, asyncio.Task[None]] = {}  # begun executions' tasks, by id (Q-40)
        # Bound once: called per execution.
        self._maybe_idle = scheduler.maybe_idle
        self._job_done = scheduler.job_done
        self._remove = journal.remove
        self._shared = journal.shared  # a shared database's writes, off the loop
        self._book_tasks = journal.book.tasks  # RUNNING until its outcome is written
        self.successes = successes_for(journal, self._hooks, self._plain_ended, scheduler)
        scheduler.attach(self.run_plain, self.run, self.successes.flush)

    # ------------------------------------------------------------------ one execution
    def run_plain(self, task_id: str, context: Context, cls: type[Task], counted: bool) -> None:
        """One execution of a plain ``perform``, in the scheduler's run-soon batch.

        A success is held and removed with its batch (Q-170); a failure, or an awaitable
        returned by ``perform``, continues in an asyncio task (``_finish``) like an async
        execution.
        """
        successes = self.successes
        if successes.ids and _now() - successes.since >= SUCCESS_HOLD_S:
            successes.flush()  # Implements Q-170: the hold passed, before the next execution
        begun = self._begin(task_id, context, cls, counted, self._maybe_idle)
        if begun is None:
            return
        instance, result, error = begun
        if error is not None or (result is not None and inspect.isawaitable(result)):
            if error is not None and self._hooked:
                self._hooks.perform_ended(task_id)
            scheduler = self._scheduler
            assert scheduler.loop is not None
            scheduler.work.add(scheduler.loop.create_task(
                self._finish(task_id, context, cls, instance, result, error), name=task_id))
            return
        # Implements Q-170: held, removed with its batch (``Successes.ids``: the hot path).
        held = successes.ids
        held.append(task_id)
        if len(held) == 1:
            successes.since = _now()
        if self._hooked:
            self._hooks.perform_ended(task_id)  # its duration ends here

    def _plain_ended(self, task_ids: list[str]) -> None:
        """Plain executions whose removal was written, or failed (``Successes.flush``)."""
        self.inflight -= len(task_ids)
        if self._hooked:
            hooks = self._hooks
            for task_id in task_ids:
                if task_id in hooks.open:
                    hooks.ended(task_id)  # Implements Q-102: after a storage error
        self._maybe_idle(count=len(task_ids))

    async def run(self, task_id: str, context: Context, cls: type[Task], counted: bool) -> None:
        """One execution of an async ``perform``, as its own asyncio task."""
        begun = self._begin(task_id, context, cls, counted, self._job_done)
        if begun is not None:
            await self._finish(task_id, context, cls, *begun)

    def _begin(self, task_id: str, context: Context, cls: type[Task], counted: bool,
               ended: Callable[[], None]) -> tuple[Task | None, object, Exception | None] | None:
        """Start an execution: ``_perform``'s outcome, or None when the queue is stopping
        (the task stays in the WAL). ``ended`` runs when the execution ends here."""
        scheduler = self._scheduler
        if counted:
            scheduler.backlog -= 1
        cancelled = scheduler.cancelled
        if not scheduler.running or (cancelled and task_id in cancelled):
            if self._hooked and task_id in cancelled:
                self._hooks.cancelled(task_id, "running", context)
            cancelled.discard(task_id)  # Implements Q-40: cancelled before it began
            ended()
            return None
        self.inflight += 1
        try:
            return self._perform(task_id, context, cls)
        except BaseException:  # KeyboardInterrupt, SystemExit: not a failed execution
            self.inflight -= 1
            if self._hooked:
                self._hooks.ended(task_id)
            ended()
            raise

    async def _finish(self, task_id: str, context: Context, cls: type[Task],
                      instance: Task | None, result: object, error: Exception | None) -> None:
        """The rest of an execution in its asyncio task: await the result, then one transition."""
        released = False  # whether a retry gave the slot back early
        reported = False  # an ending event went out, or cancel reports it
        job = asyncio.current_task()
        if job is not None:
            self.jobs[task_id] = job  # cancel interrupts it from here on
        try:
            try:
                if error is None and result is not None and inspect.isawaitable(result):
                    try:
                        if cls.timeout is None:
                            await result
                        else:
                            await _within(self._clock, cls, cls.timeout, result)
                    except Exception as exc:  # noqa: BLE001 - a failed execution
                        error = exc
                if error is not None and self._hooked:
                    self._hooks.perform_ended(task_id)  # (a success's ends at its event)
                abandoned = self._scheduler.abandoned
                if abandoned and task_id in abandoned:
                    # Implements Q-35: stop() returned without this execution (it swallowed its
                    # cancellation); an outcome written now could race the WAL's last sync.
                    log.warning("deferred task %s ended after stop gave up on it; its outcome "
                                "is not recorded and it stays in the WAL", task_id)
                elif self._scheduler.cancelled and task_id in self._scheduler.cancelled:
                    # Implements Q-40: cancel removed it; what it did is not recorded.
                    self._scheduler.cancelled.discard(task_id)
                    reported = True
                    log.info("deferred task %s ended after it was cancelled; its outcome is "
                             "not recorded", task_id)
                elif error is not None:
                    released = await self._failed(task_id, context, cls, instance, error)
                else:
                    if self._shared is None:
                        self._remove(task_id)
                    else:  # Implements Q-179: a shared database's removal, off the loop
                        await self._shared.remove(task_id)
                    if self._hooked:
                        # Implements Q-101: the success's event, built here (hooks.py's
                        # docstring); its duration ends now (Q-215: an async success has
                        # no ``perform_ended``).
                        reported = True
                        opened = self._hooks.open.pop(task_id, None)
                        calls = self._hooks.succeeded_calls
                        if opened is not None and calls:
                            duration, started = _now() - opened[0], opened[3]
                            if started is not None:  # its fields, then the duration
                                event = _build(TaskSucceeded, started + (duration,))
                            else:  # no hook listens to the started event
                                meta = context.meta
                                event = _build(TaskSucceeded, (
                                    task_id, context.task, context.attempts + 1,
                                    NO_META if meta is None else MappingProxyType(meta),
                                    duration))
                            for call in calls:
                                try:
                                    call(event)
                                except Exception:  # noqa: BLE001 - Implements Q-104.
                                    log_failure(call, "on_succeeded", task_id)
            except Exception:  # noqa: BLE001 - storage errors must not kill the loop's task
                log.exception("deferred task %s: storage error; %s", task_id, self._journal.stays)
            finally:
                self.inflight -= 1
        finally:
            if self._hooked and not reported and task_id in self._hooks.open and (
                    task_id not in self._scheduler.cancelled):
                self._hooks.ended(task_id)  # Implements Q-102: no outcome was written
            if self.jobs.get(task_id) is job:
                del self.jobs[task_id]
            self._job_done(holds_slot=not released)

    def _perform(self, task_id: str, context: Context, cls: type[Task]
                 ) -> tuple[Task | None, object, Exception | None]:
        """Instantiate the task and call ``perform``: (instance or None, result, failure)."""
        instance: Task | None = None
        try:
            instance = cls()
            instance.rng, instance.task_id, instance.attempt, instance.deps = (
                self._rng, task_id, context.attempts + 1, self._deps)
            self._book_tasks[task_id] = RUNNING
            if self._hooked:
                # Implements Q-101: the started event, built here (hooks.py's docstring),
                # then the execution's open record, after the hooks: their time is not its.
                hooks = self._hooks
                event: TaskStarted | None = None
                if hooks.started_calls:
                    meta = context.meta
                    event = _build(TaskStarted, (task_id, context.task, context.attempts + 1,
                                                 NO_META if meta is None
                                                 else MappingProxyType(meta)))
                    for call in hooks.started_calls:
                        try:
                            call(event)
                        except Exception:  # noqa: BLE001 - Implements Q-104.
                            log_failure(call, "on_started", task_id)
                if hooks.tracks:
                    hooks.open[task_id] = (_now(), context, cls, event)
            perform: _Perform = getattr(instance, "perform")  # callable: checked below, once
            pooled = self._pooled.get(cls)
            if pooled is None:  # the first execution of the class: checked once
                if not callable(perform):
                    raise TypeError(f"{cls.task_name}.perform is not callable")
                pooled = self._pooled[cls] = not cls.inline and not (
                    inspect.iscoroutinefunction(perform))
            if pooled:
                # Implements Q-38: a plain perform runs in the pool, never on the loop.
                loop = self._scheduler.loop
                assert loop is not None
                return instance, _pooled_call(
                    self._pool.submit(loop, functools.partial(
                        perform, *context.args, **context.kwargs))), None
            return instance, perform(*context.args, **context.kwargs), None
        except Exception as exc:  # noqa: BLE001 - any failure of the task is a failed execution
            return instance, None, exc

    async def _failed(self, task_id: str, context: Context, cls: type[Task],
                      instance: Task | None, exc: Exception) -> bool:
        """A failed execution: a retry under the same id (W-15), or a give-up (D-13, Q-8).

        True when it gave its slot back early (Q-37): a retry that waits for backpressure
        must not hold a slot, or executions holding every slot could wait for a backlog
        that only they would drain.
        """
        attempts = context.attempts + 1
        retried = context.with_attempts(attempts)
        data = self._codec.encode(retried)
        if instance is None:
            instance = object.__new__(cls)
            instance.rng = self._rng
        try:
            retry_in = next_retry_in(instance, exc, attempts)
        except Exception:  # noqa: BLE001 - a broken policy falls back to the default
            log.exception("%s.retry_interval raised; falling back to default backoff",
                          cls.task_name)
            retry_in = None if attempts > cls.max_retries else default_backoff(attempts, self._rng)
        if retry_in is None:
            dead = await self._journal.give_up(task_id, data, exc, cls.task_name, attempts,
                                               context.enqueued_at)
            # Implements Q-32: one line an operator can grep, with the traceback, written once
            # the dead-task write returned, so that it never says so of a task still pending.
            log.error("deferred task %s (%s) attempt %d of %d failed: %s: %s; %s", task_id,
                      cls.task_name, attempts, cls.max_retries + 1, type(exc).__name__, exc,
                      "dead-lettered" if dead else NOT_DEAD, exc_info=exc)
            if dead and self._hooked:
                self._hooks.dead_lettered(task_id, exc)
            return False
        scheduler = self._scheduler
        bp = scheduler.backpressure
        released = bp is not None and scheduler.backlog > bp.high_water_mark
        if released:
            scheduler.release_slot()
        try:
            await scheduler.make_room()
        except PushTimeout as push:
            log.error("deferred task %s: retry not scheduled (%s); it stays in the WAL", task_id,
                      push)
            return released
        seconds = int(retry_in)
        log.warning("deferred task %s (%s) attempt %d of %d failed: %s: %s; retrying in %d s",
                    task_id, cls.task_name, attempts, cls.max_retries + 1, type(exc).__name__,
                    exc, max(seconds, 0))
        publish_at = int(self._clock.time()) + seconds if seconds > 0 else None
        # Same id, this WAL only (W-15); on a shared database off the loop.
        await self._journal.readd_anywhere(data, publish_at, task_id)
        self._scheduler.schedule(task_id, retried, cls, seconds if seconds > 0 else None)
        if self._hooked:
            self._hooks.retry_scheduled(task_id, exc, max(seconds, 0))
        return released


async def _within(clock: Clock, cls: type[Task], timeout_s: float,
                  work: Awaitable[object]) -> None:
    """Implements Q-39: await ``work`` for at most ``timeout_s`` on the queue's clock.

    Past it, the work is cancelled (an async perform) or abandoned (a thread of the pool
    cannot be stopped: whatever it returns or raises later is ignored), and the
    execution fails with ``TaskTimeoutError``.
    """
    job = asyncio.ensure_future(work)
    timer = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        await asyncio.wait((job, timer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not job.done():
            job.cancel()
            job.add_done_callback(_retrieve)
    if job.cancelled() or not job.done():
        raise TaskTimeoutError(f"{cls.task_name} timed out after {timeout_s:g} s")
    job.result()


async def _pooled_call(future: Awaitable[object]) -> None:
    """A pooled perform's outcome; an awaitable it returned is awaited on the loop, as an
    inline perform's is."""
    value = await future
    if value is not None and inspect.isawaitable(value):
        await value


def _retrieve(future: asyncio.Future[object]) -> None:
    """Retrieve an abandoned job's outcome, so that asyncio does not warn about it."""
    if not future.cancelled():
        future.exception()
