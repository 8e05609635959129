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
from deferq._types import DeadTask, PendingTask

__all__ = [
    "Config",
    "DeadTask",
    "DeadTasksLockTimeout",
    "DeferqError",
    "DiskOptions",
    "LimitExceededError",
    "PendingTask",
    "StorageBrokenError",
    "StorageClosedError",
]
__version__ = "0.1.0"
