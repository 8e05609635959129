"""deferq: a durable, in-process deferred-task queue; this package is its storage engine.

Public names only; see spec/ for the format and guarantees, docs/ for usage.
"""

from deferq._config import Config, DiskOptions
from deferq._errors import (
    DeadTasksLockTimeout,
    DeferqError,
    LimitExceededError,
    StorageBrokenError,
    StorageClosedError,
)
from deferq._operator import Operator, Retried
from deferq._queue import Queue
from deferq._queue_parts import Backpressure, Clock, PushTimeout, SystemClock, UnloadableTaskError
from deferq._serialize import ContextCodec, ContextError, SerializationError
from deferq._task import Task, TaskFunction, TaskRegistry, task
from deferq._types import DeadTask, PendingTask

__all__ = [
    "Backpressure",
    "Clock",
    "Config",
    "ContextCodec",
    "ContextError",
    "DeadTask",
    "DeadTasksLockTimeout",
    "DeferqError",
    "DiskOptions",
    "LimitExceededError",
    "Operator",
    "PendingTask",
    "PushTimeout",
    "Queue",
    "Retried",
    "SerializationError",
    "StorageBrokenError",
    "StorageClosedError",
    "SystemClock",
    "Task",
    "TaskFunction",
    "TaskRegistry",
    "UnloadableTaskError",
    "task",
]
__version__ = "0.1.0"
