"""The queue's errors (spec/queue.md); each a ``DeferqError``."""

from __future__ import annotations

from deferq._core.errors import DeferqError


class PushTimeout(DeferqError, TimeoutError):
    """The backlog stayed above the low water mark for the whole backpressure timeout."""


class UnloadableTaskError(DeferqError):
    """Recorded as the exception of a task that could not be loaded at replay (Q-9)."""


class SerializationError(DeferqError, TypeError):
    """Task arguments that cannot be stored as JSON unchanged (raised at enqueue)."""


class ContextError(DeferqError, ValueError):
    """A stored context that cannot be decoded into a runnable task record."""


class TaskTimeoutError(DeferqError, TimeoutError):
    """Raised into an execution's outcome when it ran longer than its task's ``timeout``.

    A failed execution like any other: it goes through the retry policy, and a dead task
    records it as its exception (Q-39).
    """


# A dead task records its exception's class as module.QualName (F-17): these are raised into
# tasks (a timeout, an unloadable record, a nested enqueue), so they carry the name users
# import them by, deferq.TaskTimeoutError, not this private module's.
for _error in (PushTimeout, UnloadableTaskError, SerializationError, ContextError, TaskTimeoutError):
    _error.__module__ = "deferq"
