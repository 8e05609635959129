"""deferq: a durable, in-process deferred-task queue; this package is its storage engine.

Public names only; see spec/ for the format and guarantees, docs/ for usage.

Why the names are loaded on first use (PEP 562 ``__getattr__``) rather than imported
here: every ``deferq`` command is a fresh interpreter, and Python imports this package
before any of its submodules, so whatever it imports every operator command pays at
start-up (the queue runtime, asyncio, the PostgreSQL backend: most of a ``deferq dead
list``). ``from deferq import Queue`` and ``deferq.Queue`` work as before; mypy sees the
names through the ``TYPE_CHECKING`` imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

from deferq._version import __version__

if TYPE_CHECKING:
    from deferq._runtime.config import Config
    from deferq._runtime.config import DiskOptions
    from deferq._core.errors import DeadTasksLockTimeout
    from deferq._core.errors import DeferqError
    from deferq._core.errors import DepsTypeError
    from deferq._core.errors import LimitExceededError
    from deferq._core.errors import NotATaskError
    from deferq._core.errors import QueueStateError
    from deferq._core.errors import StorageBrokenError
    from deferq._core.errors import StorageClosedError
    from deferq._core.errors import TaskNotRegisteredError
    from deferq._core.errors import UnsafeEntryError
    from deferq._runtime.operator import Operator
    from deferq._runtime.operator import Retried
    from deferq._runtime.queue import Queue
    from deferq._runtime.book import TaskStatus
    from deferq._runtime.backpressure import Backpressure
    from deferq._runtime.clock import Clock
    from deferq._runtime.clock import SystemClock
    from deferq._runtime.errors import PushTimeout
    from deferq._runtime.errors import TaskTimeoutError
    from deferq._runtime.errors import UnloadableTaskError
    from deferq._runtime.hooks import Hooks
    from deferq._runtime.hooks import ReplaySource
    from deferq._runtime.hooks import TaskCancelled
    from deferq._runtime.hooks import TaskDeadLettered
    from deferq._runtime.hooks import TaskEnqueued
    from deferq._runtime.hooks import TaskInterrupted
    from deferq._runtime.hooks import TaskReplayed
    from deferq._runtime.hooks import TaskRetryScheduled
    from deferq._runtime.hooks import TaskStarted
    from deferq._runtime.hooks import TaskSucceeded
    from deferq._runtime.jsontypes import JsonTypes
    from deferq._runtime.options import ConfiguredTask
    from deferq._runtime.periodic import Schedule
    from deferq._runtime.periodic import Schedules
    from deferq._runtime.serialize import ContextCodec
    from deferq._runtime.serialize import ContextError
    from deferq._runtime.serialize import SerializationError
    from deferq._runtime.task import Task
    from deferq._runtime.task import TaskFunction
    from deferq._runtime.task import TaskRegistry
    from deferq._runtime.task import task
    from deferq._runtime.task import task_deps
    from deferq._core.types import DeadTask
    from deferq._core.types import PendingTask

# Where each public name lives (a name: its module).
_MODULE_OF: Final = {
    "Backpressure": "deferq._runtime.backpressure",
    "Clock": "deferq._runtime.clock",
    "Config": "deferq._runtime.config",
    "ConfiguredTask": "deferq._runtime.options",
    "ContextCodec": "deferq._runtime.serialize",
    "ContextError": "deferq._runtime.serialize",
    "DeadTask": "deferq._core.types",
    "DeadTasksLockTimeout": "deferq._core.errors",
    "DeferqError": "deferq._core.errors",
    "DepsTypeError": "deferq._core.errors",
    "DiskOptions": "deferq._runtime.config",
    "Hooks": "deferq._runtime.hooks",
    "JsonTypes": "deferq._runtime.jsontypes",
    "LimitExceededError": "deferq._core.errors",
    "NotATaskError": "deferq._core.errors",
    "Operator": "deferq._runtime.operator",
    "PendingTask": "deferq._core.types",
    "PushTimeout": "deferq._runtime.errors",
    "Queue": "deferq._runtime.queue",
    "QueueStateError": "deferq._core.errors",
    "ReplaySource": "deferq._runtime.hooks",
    "Retried": "deferq._runtime.operator",
    "Schedule": "deferq._runtime.periodic",
    "Schedules": "deferq._runtime.periodic",
    "SerializationError": "deferq._runtime.serialize",
    "StorageBrokenError": "deferq._core.errors",
    "StorageClosedError": "deferq._core.errors",
    "SystemClock": "deferq._runtime.clock",
    "Task": "deferq._runtime.task",
    "TaskCancelled": "deferq._runtime.hooks",
    "TaskDeadLettered": "deferq._runtime.hooks",
    "TaskEnqueued": "deferq._runtime.hooks",
    "TaskFunction": "deferq._runtime.task",
    "TaskInterrupted": "deferq._runtime.hooks",
    "TaskNotRegisteredError": "deferq._core.errors",
    "TaskRegistry": "deferq._runtime.task",
    "TaskReplayed": "deferq._runtime.hooks",
    "TaskRetryScheduled": "deferq._runtime.hooks",
    "TaskStarted": "deferq._runtime.hooks",
    "TaskStatus": "deferq._runtime.book",
    "TaskSucceeded": "deferq._runtime.hooks",
    "TaskTimeoutError": "deferq._runtime.errors",
    "UnsafeEntryError": "deferq._core.errors",
    "UnloadableTaskError": "deferq._runtime.errors",
    "task": "deferq._runtime.task",
    "task_deps": "deferq._runtime.task",
}


def __getattr__(name: str) -> object:
    """Import a public name on its first use and keep it in this module."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'deferq' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, the subpackages loaded so far (``backends``, ``testing``...) and
    the dunders; not the helpers this file imports (``importlib``, ``Final``...)."""
    here = globals()
    shown = {name for name in here if name.startswith("__") or (
        not name.startswith("_") and getattr(here[name], "__name__", "") == f"deferq.{name}")}
    return sorted(shown | set(__all__))


__all__ = [
    "Backpressure",
    "Clock",
    "Config",
    "ConfiguredTask",
    "ContextCodec",
    "ContextError",
    "DeadTask",
    "DeadTasksLockTimeout",
    "DeferqError",
    "DepsTypeError",
    "DiskOptions",
    "Hooks",
    "JsonTypes",
    "LimitExceededError",
    "NotATaskError",
    "Operator",
    "PendingTask",
    "PushTimeout",
    "QueueStateError",
    "Queue",
    "ReplaySource",
    "Retried",
    "Schedule",
    "Schedules",
    "SerializationError",
    "StorageBrokenError",
    "StorageClosedError",
    "SystemClock",
    "Task",
    "TaskCancelled",
    "TaskDeadLettered",
    "TaskEnqueued",
    "TaskFunction",
    "TaskInterrupted",
    "TaskNotRegisteredError",
    "TaskRegistry",
    "TaskReplayed",
    "TaskRetryScheduled",
    "TaskStarted",
    "TaskSucceeded",
    "TaskTimeoutError",
    "TaskStatus",
    "UnloadableTaskError",
    "UnsafeEntryError",
    "__version__",
    "task",
    "task_deps",
]
