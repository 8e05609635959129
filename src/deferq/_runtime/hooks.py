"""Lifecycle hooks: what a queue tells observers about its tasks (spec/queue.md Q-100..Q-106).

Rules:
- A hook is an instance of a ``Hooks`` subclass that overrides the methods of the events it
  wants; the queue calls only the methods a hook overrides, so an event nobody listens to
  costs one truth test, and a queue without hooks one per step (Q-100, Q-106).
- Hook methods are plain functions, called synchronously: ``on_enqueued`` and
  ``enqueue_meta`` in the thread that enqueued, every other one on the queue's event loop.
  A coroutine function is refused when the queue is built (Q-100): an awaited hook would
  hold the task's transition, and one not awaited would never run.
- A hook that raises is logged on ``deferq.hooks`` naming the hook, the method and the task,
  and changes nothing else: the task's outcome, the other hooks' calls and the caller's
  call go on as if it had returned (Q-104). ``enqueue_meta`` may only add metadata; what
  it returns that is not a valid addition is logged and dropped, never an enqueue's error.
- Every execution that started ends in exactly one of succeeded, retry scheduled,
  dead-lettered, cancelled or interrupted (Q-102), so a running gauge or a span per
  execution never leaks.

Theory of operation: ``HookSet`` holds one tuple of bound methods per event, and one flag
per place that calls it (``enqueues``, ``replays``, ``executions``): the queue calls in only
behind that one test, so a hook that overrides nothing costs nothing. While some hook
listens to an ending event, ``open`` maps each execution that started to (its start time,
its context, its class, its started event): the duration of its ending event, what
``cancel`` reports for a running task, and what ``ended`` finds when no outcome was written.
Events are named tuples, like ``Context`` (a frozen dataclass costs three times as much to
build, and one is built per event); the three of every task's path are built with the
tuple's C constructor (docs/benchmarks.md, the ``hooks`` row). Those three are built and
delivered where they happen: ``TaskEnqueued`` by the queue's enqueue, ``TaskStarted`` and an
async success's ``TaskSucceeded`` by the executor, which read ``enqueued_calls``,
``started_calls``, ``succeeded_calls``, ``tracks`` and ``open``; a call into this class for
each cost about 1 % of a no-op task. Every rarer event is built and delivered here.
"""

from __future__ import annotations

import enum
import inspect
import logging
import time
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Final, NamedTuple, TypeVar

from deferq._core.ctxmeta import meta_problem
from deferq._core.limits import HOOKS_MAX
from deferq._runtime.serialize import Context
from deferq._runtime.task import Task

log = logging.getLogger("deferq.hooks")
_now: Final = time.perf_counter  # bound once: read twice per execution with hooks
# The hot events are built with the C constructor of their tuple: a named tuple's own
# ``__new__`` is a Python frame that cost 110 ns more per event (benchmarks: hooks row).
_build: Final = tuple.__new__

Meta = Mapping[str, str]
NO_META: Final[Meta] = types.MappingProxyType({})  # the metadata view of a task with none


class ReplaySource(enum.Enum):
    """Where a replayed task came from (``TaskReplayed.source``)."""

    START = "start"  # the WAL ``start()`` read
    ADOPTED = "adopted"  # an orphaned WAL file the sweep adopted
    CLAIMED = "claimed"  # a due task claimed from a shared store


class TaskEnqueued(NamedTuple):
    """A task was stored (``enqueue``, ``defer``, ...): it is in the WAL."""

    task_id: str
    task_name: str
    attempt: int  # the number of its next execution: 1
    meta: Meta
    publish_at: int | None  # epoch second it is delayed to; None: due now


class TaskReplayed(NamedTuple):
    """A stored task was taken up: at start, from an adopted WAL file, or claimed."""

    task_id: str
    task_name: str
    attempt: int  # the number of its next execution
    meta: Meta
    publish_at: int | None
    source: ReplaySource


class TaskStarted(NamedTuple):
    """An execution began (just before ``perform`` is called)."""

    task_id: str
    task_name: str
    attempt: int  # this execution's number, 1 for the first
    meta: Meta


class TaskSucceeded(NamedTuple):
    """An execution succeeded and its removal from the WAL was written."""

    task_id: str
    task_name: str
    attempt: int
    meta: Meta
    duration_s: float  # from just before ``perform`` to its end


class TaskRetryScheduled(NamedTuple):
    """An execution failed and the task's retry was written to the WAL."""

    task_id: str
    task_name: str
    attempt: int  # the execution that failed
    meta: Meta
    duration_s: float
    exception: BaseException
    delay_s: int  # until the retry runs; 0: at once
    max_attempts: int  # max_retries + 1


class TaskDeadLettered(NamedTuple):
    """A task gave up: it is in the dead-task store and out of the WAL."""

    task_id: str
    task_name: str
    attempt: int  # the last execution; the stored count for a task that could not be loaded
    meta: Meta
    duration_s: float | None  # None for a task that could not be loaded (it never ran)
    exception: BaseException
    max_attempts: int | None  # None for a task that could not be loaded


class TaskCancelled(NamedTuple):
    """``Queue.cancel`` took the task: removed from the WAL, never run again."""

    task_id: str
    task_name: str
    attempt: int  # the execution interrupted, or the one that will now never begin
    meta: Meta
    state: str  # "delayed", "waiting for a slot", "due" or "running"


class TaskInterrupted(NamedTuple):
    """An execution ended without an outcome written: the task stays in the WAL as last
    persisted (``stop`` cancelled or gave up on it, a storage error, a retry refused by
    backpressure, a dead-task write that failed) and runs again later."""

    task_id: str
    task_name: str
    attempt: int
    meta: Meta
    duration_s: float


class Hooks:
    """Base class of lifecycle hooks: override the methods of the events you want (Q-100).

    Every method here does nothing, and the queue never calls one a subclass leaves as is.
    Methods must be plain (not ``async``) and fast: they run synchronously on the queue's
    event loop (``on_enqueued`` and ``enqueue_meta``: in the thread that enqueued), so a slow
    hook delays every task (Q-105). A hook that raises is logged and ignored (Q-104).
    """

    def enqueue_meta(self, task_name: str) -> Mapping[str, str] | None:
        """Metadata to add to a task about to be stored; keys it already has win (Q-103)."""
        return None

    def on_enqueued(self, event: TaskEnqueued) -> None:
        """A task was stored."""

    def on_replayed(self, event: TaskReplayed) -> None:
        """A stored task was taken up at start, from an adopted WAL file, or claimed."""

    def on_started(self, event: TaskStarted) -> None:
        """An execution began."""

    def on_succeeded(self, event: TaskSucceeded) -> None:
        """An execution succeeded."""

    def on_retry_scheduled(self, event: TaskRetryScheduled) -> None:
        """An execution failed; its retry is stored."""

    def on_dead_lettered(self, event: TaskDeadLettered) -> None:
        """A task gave up and is in the dead-task store."""

    def on_cancelled(self, event: TaskCancelled) -> None:
        """A task was cancelled."""

    def on_interrupted(self, event: TaskInterrupted) -> None:
        """An execution ended without an outcome; the task stays in the WAL."""


EVENT_METHODS: Final = ("on_enqueued", "on_replayed", "on_started", "on_succeeded",
                        "on_retry_scheduled", "on_dead_lettered", "on_cancelled",
                        "on_interrupted")
E = TypeVar("E")


def check_hooks(hooks: object) -> tuple[Hooks, ...]:
    """Implements Q-100: the hooks a queue was given, checked; raise ``TypeError`` naming
    what is wrong (not an iterable of ``Hooks``, too many, an ``async`` method)."""
    if isinstance(hooks, (Hooks, str, bytes)) or not isinstance(hooks, Iterable):
        raise TypeError(f"hooks must be an iterable of deferq.Hooks, got {type(hooks).__name__}")
    checked = tuple(hooks)
    if len(checked) > HOOKS_MAX:
        raise TypeError(f"hooks: at most {HOOKS_MAX} hooks, got {len(checked)}")
    for hook in checked:
        if not isinstance(hook, Hooks):
            raise TypeError(f"hooks must be deferq.Hooks instances, got {type(hook).__name__}")
        for name in (*EVENT_METHODS, "enqueue_meta"):
            if _overrides(hook, name) and inspect.iscoroutinefunction(getattr(hook, name)):
                raise TypeError(f"hook {_name_of(hook)}.{name} is async; hooks must be plain "
                                "methods (hand slow work to a task or a thread)")
    return checked


def _overrides(hook: Hooks, name: str) -> bool:
    return getattr(type(hook), name) is not getattr(Hooks, name)


def _name_of(hook: Hooks) -> str:
    return type(hook).__qualname__


def _calls(hooks: tuple[Hooks, ...], name: str) -> tuple[Callable[[E], None], ...]:
    bound: list[Callable[[E], None]] = [getattr(h, name) for h in hooks if _overrides(h, name)]
    return tuple(bound)


def _meta(context: Context) -> Meta:
    # A read-only view: a hook must not change what the task carries.
    return NO_META if context.meta is None else types.MappingProxyType(context.meta)


class HookSet:
    """The hooks of one queue, by event, and the executions that started (their clocks)."""

    def __init__(self, hooks: tuple[Hooks, ...]) -> None:
        self.hooks = hooks
        self.meta = tuple((h, h.enqueue_meta) for h in hooks if _overrides(h, "enqueue_meta"))
        # The listeners of the three events of every task's path, read where those events
        # are built (the queue, the executor) as well as here.
        self.enqueued_calls: tuple[Callable[[TaskEnqueued], None], ...] = _calls(
            hooks, "on_enqueued")
        self.started_calls: tuple[Callable[[TaskStarted], None], ...] = _calls(hooks, "on_started")
        self.succeeded_calls: tuple[Callable[[TaskSucceeded], None], ...] = _calls(
            hooks, "on_succeeded")
        self._replayed: tuple[Callable[[TaskReplayed], None], ...] = _calls(hooks, "on_replayed")
        self._retry: tuple[Callable[[TaskRetryScheduled], None], ...] = _calls(
            hooks, "on_retry_scheduled")
        self._dead: tuple[Callable[[TaskDeadLettered], None], ...] = _calls(
            hooks, "on_dead_lettered")
        self._cancelled: tuple[Callable[[TaskCancelled], None], ...] = _calls(
            hooks, "on_cancelled")
        self._interrupted: tuple[Callable[[TaskInterrupted], None], ...] = _calls(
            hooks, "on_interrupted")
        # The one test each hot path makes: a queue calls in only for events some
        # hook listens to.
        self.enqueues = bool(self.enqueued_calls)
        self.replays = bool(self._replayed)
        ending = (self.succeeded_calls, self._retry, self._dead, self._cancelled, self._interrupted)
        self.tracks = any(ending)  # executions are timed and held in ``open``
        self.executions = self.tracks or bool(self.started_calls)
        # Executions that started and have no ending event yet: (start, context, class,
        # started event), added by the executor when ``tracks``.
        self.open: dict[str, tuple[float, Context, type[Task], TaskStarted | None]] = {}
        self._done: dict[str, float] = {}  # durations of performs that ended (perform_ended)

    # ------------------------------------------------------------------ enqueue side
    def add_meta(self, task_name: str, meta: dict[str, str] | None) -> dict[str, str] | None:
        """Implements Q-103: the task's metadata (checked, Q-66) with every hook's additions
        it has room for; None when it has none."""
        merged = {} if meta is None else meta
        for hook, provide in self.meta:
            try:
                extra = provide(task_name)
                if extra is None:
                    continue
                candidate = {**extra, **merged}  # the task's own keys win
                problem = meta_problem(candidate)
                if problem is not None:
                    raise ValueError(f"meta {problem}")
            except Exception:  # noqa: BLE001 - a hook never fails an enqueue (Q-104)
                log.exception("hook %s.enqueue_meta raised or returned bad metadata for a "
                              "%s task; its metadata is dropped", _name_of(hook), task_name)
                continue
            merged = candidate
        return merged or None

    # These two serve the rarer paths (a task written off the loop or after its caller was
    # cancelled; a plain success); the common ones are built inline (the module's docstring).
    # Each builds its event and calls the hooks itself: no helper call per step.
    def enqueued(self, task_id: str, context: Context, publish_at: int | None) -> None:
        calls = self.enqueued_calls
        if calls:
            meta = context.meta
            event = _build(TaskEnqueued, (task_id, context.task, context.attempts + 1, NO_META
                           if meta is None else types.MappingProxyType(meta), publish_at))
            for call in calls:
                try:
                    call(event)
                except Exception:  # noqa: BLE001 - Implements Q-104.
                    log_failure(call, "on_enqueued", task_id)

    def replayed(self, task_id: str, context: Context, publish_at: int | None,
                 source: ReplaySource) -> None:
        if self._replayed:
            self._fire(self._replayed, "on_replayed", task_id, TaskReplayed(
                task_id, context.task, context.attempts + 1, _meta(context), publish_at, source))

    # ------------------------------------------------------------------ executions
    def perform_ended(self, task_id: str) -> None:
        """The perform of an open execution returned or raised: its duration stops here."""
        opened = self.open.get(task_id)
        if opened is not None and task_id not in self._done:
            self._done[task_id] = _now() - opened[0]

    def _close(self, task_id: str) -> tuple[float, Context, type[Task]] | None:
        """The open execution of ``task_id``, now closed, with its duration first."""
        opened = self.open.pop(task_id, None)
        done = self._done.pop(task_id, None) if self._done else None
        if opened is None:
            return None
        return (_now() - opened[0] if done is None else done), opened[1], opened[2]

    def succeeded(self, task_id: str) -> None:
        """A success's removal was written; its duration ends now unless ``perform_ended``
        stopped it (the removal in between is an unsynced write, microseconds)."""
        opened = self.open.pop(task_id, None)
        if opened is None:
            return
        done = self._done.pop(task_id, None) if self._done else None
        calls = self.succeeded_calls
        if calls:
            duration = _now() - opened[0] if done is None else done
            started = opened[3]
            if started is not None:
                # The started event's fields, then the duration: TaskSucceeded's layout.
                event = _build(TaskSucceeded, started + (duration,))
            else:
                context = opened[1]
                meta = context.meta
                event = _build(TaskSucceeded, (task_id, context.task, context.attempts + 1,
                                               NO_META if meta is None
                                               else types.MappingProxyType(meta), duration))
            for call in calls:
                try:
                    call(event)
                except Exception:  # noqa: BLE001 - Implements Q-104.
                    log_failure(call, "on_succeeded", task_id)

    def retry_scheduled(self, task_id: str, exc: BaseException, delay_s: int) -> None:
        closed = self._close(task_id)
        if closed is not None and self._retry:
            duration, context, cls = closed
            self._fire(self._retry, "on_retry_scheduled", task_id, TaskRetryScheduled(
                task_id, context.task, context.attempts + 1, _meta(context), duration, exc,
                delay_s, cls.max_retries + 1))

    def dead_lettered(self, task_id: str, exc: BaseException) -> None:
        closed = self._close(task_id)
        if closed is not None and self._dead:
            duration, context, cls = closed
            self._fire(self._dead, "on_dead_lettered", task_id, TaskDeadLettered(
                task_id, context.task, context.attempts + 1, _meta(context), duration, exc,
                cls.max_retries + 1))

    def unloadable_dead_lettered(self, task_id: str, task_name: str, attempts: int,
                                 meta: Mapping[str, str] | None, exc: BaseException) -> None:
        if self._dead:
            view = NO_META if not meta else types.MappingProxyType(dict(meta))
            self._fire(self._dead, "on_dead_lettered", task_id, TaskDeadLettered(
                task_id, task_name, attempts, view, None, exc, None))

    def cancelled(self, task_id: str, state: str, context: Context | None = None) -> None:
        """A cancelled task: one not begun (its context given), or a running execution."""
        closed = self._close(task_id)
        if context is None:
            if closed is None:
                return  # (it had not begun: the executor reports it at its first step)
            context = closed[1]
        if self._cancelled:
            self._fire(self._cancelled, "on_cancelled", task_id, TaskCancelled(
                task_id, context.task, context.attempts + 1, _meta(context), state))

    def ended(self, task_id: str) -> None:
        """An execution's asyncio task or batch step ended: if no ending event was sent,
        it was interrupted (Q-102)."""
        closed = self._close(task_id)
        if closed is not None and self._interrupted:
            duration, context, _ = closed
            self._fire(self._interrupted, "on_interrupted", task_id, TaskInterrupted(
                task_id, context.task, context.attempts + 1, _meta(context), duration))

    # ------------------------------------------------------------------ dispatch
    @staticmethod
    def _fire(calls: tuple[Callable[[E], None], ...], method: str, task_id: str,
              event: E) -> None:
        """Implements Q-104: call each hook; one that raises is logged and skipped."""
        for call in calls:
            try:
                call(event)
            except Exception:  # noqa: BLE001 - a hook never changes a task's outcome
                log_failure(call, method, task_id)


def log_failure(call: Callable[[E], None], method: str, task_id: str) -> None:
    """Implements Q-104: one error line naming the hook, the method and the task, with
    the traceback of the exception being handled."""
    owner = getattr(call, "__self__", call)
    log.exception("hook %s.%s raised on task %s; ignored", type(owner).__qualname__, method,
                  task_id)

