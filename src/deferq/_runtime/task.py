"""Task definitions, the task registry and the retry policy (spec/queue.md Q-1..Q-4).

Rules:
- A task is a subclass of ``Task`` with a ``perform`` method (plain or
  ``async``), or a function decorated with ``@task``. Defining it registers it
  under a name: ``name=`` given explicitly, else ``module.QualName``. The queue
  resolves a stored context only through a registry, so loading a task never
  imports a module or runs code that was not registered (Q-1).
- ``max_retries`` is validated when the class is defined, with the reference's
  strict conversion: an int as is, a float truncated, a decimal-digit string
  parsed; anything else, or a negative number, raises ``ValueError`` with the
  message ``max_retries should be a valid non-negative integer`` (Q-2).
- After the n-th failed execution (``attempts`` = n), ``next_retry_in`` gives
  up (None) when n > max_retries; otherwise it asks ``retry_interval``. None
  or False gives up; an int or float is returned as is (0 and negatives mean
  "at once"); any other value logs a warning and the default backoff
  ``attempt**4 + 10 + randint(0, 14) * attempt`` is used (Q-3, Q-4). The
  random source is the instance's ``rng``, which the queue injects.
- ``inline`` (a bool, default False) runs a plain ``perform`` on the event loop instead of
  the queue's thread pool (Q-38); ``timeout`` (None, or seconds in (0, 86400]) bounds an
  execution (Q-39); both are checked when the class is defined, and an inline task cannot
  have a timeout (nothing can interrupt a call running on the loop).
"""

from __future__ import annotations

import contextvars
import datetime
import inspect
import logging
import math
import random
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import (
    TYPE_CHECKING,
    ClassVar,
    Final,
    Generic,
    ParamSpec,
    TypeVar,
    cast,
    overload,
)

from deferq._core.errors import DepsTypeError, NotATaskError
from deferq._core.limits import TASK_TIMEOUT_MAX_S
from deferq._runtime.options import ConfiguredTask, Performs, check_options

log = logging.getLogger("deferq.queue")

DEFAULT_MAX_RETRIES: Final = 20
_MAX_RETRIES_MESSAGE: Final = "max_retries should be a valid non-negative integer"
_NAME_BYTES_MAX: Final = 1024  # the dead-task store's task_class limit

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# The deps of the queue running the current @task function: set by its generated
# ``perform`` around the call, in whatever thread or task runs it.
_NO_DEPS: Final = object()
_CURRENT_DEPS: Final[contextvars.ContextVar[object]] = contextvars.ContextVar(
    "deferq_task_deps", default=_NO_DEPS)


def check_max_retries(value: object) -> int:
    """Strict conversion of a ``max_retries`` value (Q-2)."""
    if isinstance(value, bool):
        raise ValueError(_MAX_RETRIES_MESSAGE)
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(_MAX_RETRIES_MESSAGE)
        number = int(value)
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())
    else:
        raise ValueError(_MAX_RETRIES_MESSAGE)
    if number < 0:
        raise ValueError(_MAX_RETRIES_MESSAGE)
    return number


def check_inline(value: object) -> bool:
    """Implements Q-38: ``inline`` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"inline must be True or False, got {value!r}")
    return value


def check_timeout(value: object) -> float | None:
    """Implements Q-39: ``timeout`` is None or a finite number of seconds in (0, a day]."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= TASK_TIMEOUT_MAX_S):
        raise ValueError(f"timeout must be None or a number of seconds above 0 and at most "
                         f"{TASK_TIMEOUT_MAX_S:g}, got {value!r}")
    return float(value)


def default_backoff(attempt: int, rng: random.Random) -> int:
    """``attempt**4 + 10 + randint(0, 14) * attempt`` seconds (Q-4)."""
    return attempt ** 4 + 10 + rng.randint(0, 14) * attempt


class TaskRegistry:
    """Task names to task classes. Loading resolves names here and nowhere else (Q-1)."""

    def __init__(self) -> None:
        self._tasks: dict[str, type[Task]] = {}
        # ``get`` without its Python frame, for the queue's check on every enqueue.
        self.lookup: Callable[[str], type[Task] | None] = self._tasks.get

    def register(self, cls: type[Task], name: str) -> None:
        """Register ``cls`` as ``name``; a redefinition of the same class (same module and
        qualified name, e.g. a reloaded module) replaces the old one, anything else that
        takes an existing name raises ``ValueError``."""
        if not name or len(name.encode("utf-8", "surrogatepass")) > _NAME_BYTES_MAX:
            raise ValueError(f"task name must be a non-empty str of at most {_NAME_BYTES_MAX} "
                             f"UTF-8 bytes, got {name!r}")
        old = self._tasks.get(name)
        if old is not None and old is not cls and (
                old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"task name {name!r} is already registered by "
                             f"{old.__module__}.{old.__qualname__}")
        self._tasks[name] = cls

    def get(self, name: str) -> type[Task] | None:
        """The class registered as ``name``, or None."""
        return self._tasks.get(name)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._tasks)


REGISTRY: Final = TaskRegistry()


class Task:
    """Base class of deferred tasks.

    Subclass it and define ``perform(self, *args, **kwargs)`` (plain or ``async``).
    Class keywords: ``name=`` (the registered name; default ``module.QualName``),
    ``registry=`` (default: the global one), ``inline=`` and ``timeout=`` (or the class
    attributes of the same names). Set ``max_retries`` (default 20) and override
    ``retry_interval`` to change the retry policy.
    """

    task_name: ClassVar[str] = ""
    max_retries: ClassVar[int] = DEFAULT_MAX_RETRIES
    # a plain perform runs in the queue's thread pool unless the task is inline.
    inline: ClassVar[bool] = False
    # seconds an execution may take before it fails with TaskTimeoutError; None: no limit.
    timeout: ClassVar[float | None] = None

    # Set by the queue on each instance before perform runs.
    rng: random.Random = random.Random()
    deps: object = None  # the queue's ``deps``; typed access: ``deps_as(Kind)``
    task_id: str = ""
    attempt: int = 1  # this execution's number: stored attempts + 1

    def __init_subclass__(cls, *, name: str | None = None,
                          registry: TaskRegistry | None = None, inline: object = None,
                          timeout: object = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.max_retries = check_max_retries(cls.max_retries)
        cls.inline = check_inline(cls.inline if inline is None else inline)
        cls.timeout = check_timeout(cls.timeout if timeout is None else timeout)
        if cls.inline and cls.timeout is not None:
            raise ValueError(f"task {cls.__qualname__}: an inline task cannot have a timeout "
                             "(a call running on the event loop cannot be interrupted)")
        cls.task_name = name if name is not None else f"{cls.__module__}.{cls.__qualname__}"
        (REGISTRY if registry is None else registry).register(cls, cls.task_name)

    if not TYPE_CHECKING:  # declared for readers only: subclasses choose their own signature

        def perform(self, *args: object, **kwargs: object) -> object:
            """The task's work. A raised exception is a failed execution."""
            raise NotImplementedError(f"{type(self).__qualname__} must define perform()")

    @classmethod
    def options(cls: type[Performs[P]], *, delay: float | datetime.timedelta | None = None,
                at: datetime.datetime | None = None, key: str | None = None,
                meta: Mapping[str, str] | None = None) -> ConfiguredTask[P]:
        """This task with enqueue options, for ``Queue.defer`` (Q-50, Q-51, Q-66).

        Args:
            delay: seconds (int or float) or a ``timedelta`` from the enqueue, >= 0.
            at: a timezone-aware ``datetime`` to run at (a past one runs at once).
            key: a unique key: while a task with it is pending, ``defer`` stores no other.
            meta: string metadata stored with the task (e.g. a W3C ``traceparent``); it
                survives restarts and retries and shows on its dead task.

        Raises:
            ValueError: naming the option that is not valid.
        """
        return ConfiguredTask(cls, check_options(delay, at, key, meta))

    def deps_as(self, kind: type[T]) -> T:
        """The queue's ``deps`` object, checked to be a ``kind`` (Q-57).

        Raises:
            DepsTypeError: when the queue was given no ``deps`` or one of another type.
        """
        return _checked_deps(self.deps, kind, type(self).task_name)

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        """Seconds until the next execution after failure number ``attempt``, or None/False
        to give up. The default is the reference backoff."""
        return default_backoff(attempt, self.rng)


def next_retry_in(task: Task, exception: BaseException, attempts: int) -> float | None:
    """Seconds to the next execution after ``attempts`` failures, or None to give up (Q-3)."""
    cls = type(task)
    if attempts > cls.max_retries:
        return None
    interval = task.retry_interval(exception, attempt=attempts)
    if interval is None or interval is False:
        return None
    if isinstance(interval, (int, float)) and not isinstance(interval, bool) and (
            math.isfinite(interval)):
        return interval
    log.warning("%s.retry_interval returned %s, expected Numeric, false, or nil; falling back "
                "to default backoff", cls.task_name, type(interval).__name__)
    return default_backoff(attempts, task.rng)


class TaskFunction(Generic[P, R]):
    """What ``@task`` returns: still callable as the function; ``task_class`` is the Task."""

    def __init__(self, function: Callable[P, R], task_class: type[Task]) -> None:
        self.function = function
        self.task_class = task_class
        self.__name__ = getattr(function, "__name__", "task")
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)
        self.__doc__ = function.__doc__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<deferq task {self.task_class.task_name}>"

    def options(self, *, delay: float | datetime.timedelta | None = None,
                at: datetime.datetime | None = None, key: str | None = None,
                meta: Mapping[str, str] | None = None) -> ConfiguredTask[P]:
        """This task with enqueue options, for ``Queue.defer``: see ``Task.options``."""
        return ConfiguredTask(self, check_options(delay, at, key, meta))


def _task_class_for(function: Callable[P, R], name: str | None, max_retries: object,
                    registry: TaskRegistry | None, inline: object = False,
                    timeout: object = None) -> type[Task]:
    def perform(self: Task, *args: P.args, **kwargs: P.kwargs) -> R:
        token = _CURRENT_DEPS.set(self.deps)
        try:
            return function(*args, **kwargs)
        finally:
            _CURRENT_DEPS.reset(token)

    # An async function's task gets an async ``perform``: the queue runs it as its own
    # asyncio task from the start (a plain ``perform`` runs as a loop callback).
    async def perform_async(self: Task, *args: P.args, **kwargs: P.kwargs) -> object:
        token = _CURRENT_DEPS.set(self.deps)
        try:
            return await cast("Awaitable[object]", function(*args, **kwargs))
        finally:
            _CURRENT_DEPS.reset(token)

    task_name = name if name is not None else f"{function.__module__}.{function.__qualname__}"
    namespace: dict[str, object] = {
        "perform": perform_async if inspect.iscoroutinefunction(function) else perform,
        "max_retries": check_max_retries(max_retries),
        "inline": check_inline(inline),
        "timeout": check_timeout(timeout),
        "__module__": function.__module__,
        "__qualname__": getattr(function, "__qualname__", task_name),
        "__doc__": function.__doc__,
    }

    def fill(ns: dict[str, object]) -> None:
        ns.update(namespace)

    cls = types.new_class(getattr(function, "__name__", "task"), (Task,),
                          {"name": task_name, "registry": registry}, fill)
    assert issubclass(cls, Task)
    return cls


@overload
def task(function: Callable[P, R], /) -> TaskFunction[P, R]: ...


@overload
def task(*, name: str | None = None, max_retries: object = DEFAULT_MAX_RETRIES,
         registry: TaskRegistry | None = None, inline: bool = False,
         timeout: float | None = None
         ) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...


def task(function: Callable[P, R] | None = None, /, *, name: str | None = None,
         max_retries: object = DEFAULT_MAX_RETRIES, registry: TaskRegistry | None = None,
         inline: bool = False, timeout: float | None = None
         ) -> TaskFunction[P, R] | Callable[[Callable[P, R]], TaskFunction[P, R]]:
    """Make a function (plain or ``async``) a task: ``@task`` or ``@task(name=...,
    max_retries=..., inline=..., timeout=...)``."""
    def wrap(fn: Callable[P, R]) -> TaskFunction[P, R]:
        return TaskFunction(fn, _task_class_for(fn, name, max_retries, registry, inline,
                                                timeout))

    return wrap if function is None else wrap(function)


def _checked_deps(deps: object, kind: type[T], task_name: str) -> T:
    if not isinstance(deps, kind):
        raise DepsTypeError(f"{task_name}: the queue's deps is {type(deps).__name__}, not "
                            f"{kind.__qualname__}; pass Queue(..., deps={kind.__qualname__}(...))")
    return deps


def task_deps(kind: type[T]) -> T:
    """Inside a ``@task`` function: the ``deps`` of the queue running it, checked to be a
    ``kind`` (Q-57). (In a ``Task`` subclass use ``self.deps_as(kind)``.)

    Raises:
        DepsTypeError: outside a ``@task`` function's execution, or when the queue's deps is
        not a ``kind``.
    """
    deps = _CURRENT_DEPS.get()
    if deps is _NO_DEPS:
        raise DepsTypeError("deferq.task_deps() is only available while a @deferq.task "
                            "function runs; in a Task subclass use self.deps_as(...)")
    return _checked_deps(deps, kind, "task_deps")


def task_class_of(ref: object) -> type[Task]:
    """The Task class behind a task class or a ``@task`` function (Q-1, Q-60)."""
    if isinstance(ref, TaskFunction):
        return ref.task_class
    if isinstance(ref, type) and issubclass(ref, Task) and ref is not Task:
        return ref
    if isinstance(ref, ConfiguredTask):  # only defer reads options: never drop them silently
        raise NotATaskError(f"{ref!r} carries options, which only Queue.defer and adefer read: "
                            f"call queue.defer(...) instead of enqueue")
    raise NotATaskError(f"{ref!r} is not a deferq task: subclass deferq.Task or decorate a function "
                    f"with @deferq.task")
