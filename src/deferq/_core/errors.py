"""The exception hierarchy of deferq.

Rules: expected outcomes (a corrupt line, a missing id) are return values, not
exceptions. Exceptions are for misuse (``ValueError`` with a message naming the
bad argument) and for failures of the environment (``OSError`` from the
filesystem propagates unchanged, except where a class below wraps it).
"""

from __future__ import annotations


class DeferqError(Exception):
    """Base class of every exception deferq defines: ``except DeferqError`` catches them all.

    deferq raises its subclasses; like any exception class it can be instantiated (C-22),
    e.g. by a test double of a backend.
    """


class TaskNotRegisteredError(DeferqError, ValueError):
    """A task whose name is not in the queue's registry was enqueued (C-22, Q-1)."""


class NotATaskError(DeferqError, TypeError):
    """Something other than a ``Task`` subclass or a ``@task`` function was enqueued (C-22)."""


class QueueStateError(DeferqError, RuntimeError):
    """A queue was used in a state that does not allow it, e.g. ``start()`` twice (C-22)."""


class DepsTypeError(DeferqError, TypeError):
    """A task asked for the queue's ``deps`` as a type it is not, or outside an execution (Q-57).

    Raised inside ``perform`` by ``Task.deps_as`` or ``deferq.task_deps``, so it is a failed
    execution like any other.
    """


class DeadTasksLockTimeout(DeferqError, TimeoutError):
    """The dead-task store's lock could not be taken within the bounded retries.

    Raised by every dead-task store operation (add, list, find, remove) after
    ``LOCK_ATTEMPTS_MAX`` failed attempts. Nothing was changed (L-3, D-8): an
    add that raises this leaves the task in the WAL.
    """


class StorageBrokenError(DeferqError):
    """The tasks WAL failed to write or fsync and refuses further work (W-12, D-10).

    After a failed fsync the kernel may have dropped the unsynced pages and will
    report success on a retry, so deferq never retries: the backend fail-stops.
    Every later WAL call raises this error; restart the worker to recover from
    what is durable. The original ``OSError`` is the ``__cause__``.
    """


class StorageClosedError(DeferqError):
    """A method of a closed ``Disk`` backend was called (C-9)."""


class LimitExceededError(DeferqError, ValueError):
    """An argument is larger than a limit of the on-disk format (F-17).

    A ``ValueError``: nothing was written.
    """


class UnsafeEntryError(DeferqError, OSError):
    """A name in the storage directory is not a regular file: a symbolic link (never followed),
    a FIFO or socket (never waited on), a directory or a device (F-16).

    Raised by the OS adapter's ``open``; the engine skips such an entry where it scans for
    files (an orphan WAL, the operators' scans) and refuses to use it where it needs that
    file (the dead-task store's files). The ``errno`` is the one ``open`` would have met.
    """


# Named as users import them, deferq.<Name>, where a dead task records an exception's class
# (F-17, Q-173).
for _error in (DeferqError, TaskNotRegisteredError, NotATaskError, QueueStateError, DepsTypeError,
               DeadTasksLockTimeout, StorageBrokenError, StorageClosedError, LimitExceededError,
               UnsafeEntryError):
    _error.__module__ = "deferq"
