"""deferq: a durable, in-process deferred-task queue; this package is its storage engine.

Public names only; see spec/ for the format and guarantees, docs/ for usage.
"""

from deferq._version import __version__
from deferq._runtime.config import Config, DiskOptions
from deferq._core.errors import (
    DeadTasksLockTimeout,
    DeferqError,
    DepsTypeError,
    LimitExceededError,
    NotATaskError,
    QueueStateError,
    StorageBrokenError,
    StorageClosedError,
    TaskNotRegisteredError,
)
from deferq._runtime.operator import Operator, Retried
from deferq._runtime.queue import Queue
from deferq._runtime.book import TaskStatus
from deferq._runtime.backpressure import Backpressure
from deferq._runtime.clock import Clock, SystemClock
from deferq._runtime.errors import PushTimeout, TaskTimeoutError, UnloadableTaskError
from deferq._runtime.hooks import (
    Hooks,
    ReplaySource,
    TaskCancelled,
    TaskDeadLettered,
    TaskEnqueued,
    TaskInterrupted,
    TaskReplayed,
    TaskRetryScheduled,
    TaskStarted,
    TaskSucceeded,
)
from deferq._runtime.jsontypes import JsonTypes
from deferq._runtime.options import ConfiguredTask
from deferq._runtime.periodic import Schedule, Schedules
from deferq._runtime.serialize import ContextCodec, ContextError, SerializationError
from deferq._runtime.task import Task, TaskFunction, TaskRegistry, task, task_deps
from deferq._core.types import DeadTask, PendingTask

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
    "__version__",
    "task",
    "task_deps",
]
