"""Value types returned by the public API.

Rules: values are immutable. ``PendingTask`` is a NamedTuple (the issue fixes its
shape); ``DeadTask`` is a frozen, slotted, keyword-only dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

from deferq._core.ctxmeta import context_meta


class PendingTask(NamedTuple):
    """A task in a worker's WAL that has not been removed (W-7)."""

    task_id: str
    context: bytes
    publish_at: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadTask:
    """A task that gave up, as stored in the dead-task store (F-10).

    ``enqueued_at`` is the epoch second the task was first enqueued when its writer
    knew it (F-51, Q-65), else the leading integer of a generated task id (its seed
    second), or 0 when the id does not start with one. ``failed_at`` is the
    epoch second when the record was written. ``context`` is opaque bytes.
    """

    id: str
    task_class: str
    attempts: int
    enqueued_at: int
    failed_at: int
    exception_class: str
    exception_message: str
    backtrace: tuple[str, ...]
    context: bytes

    @property
    def meta(self) -> dict[str, str]:
        """The task's metadata (Q-66): read from its context, ``{}`` when it has none."""
        return context_meta(self.context)


_DEAD_TASK_FIELDS = ("id", "task_class", "attempts", "enqueued_at", "failed_at",
                     "exception_class", "exception_message", "backtrace", "context")


class _DeadTaskSlots:
    """DeadTask's slot layout without its frozen ``__setattr__``: ``dead_task_of`` fills one."""

    __slots__ = _DEAD_TASK_FIELDS
    id: str
    task_class: str
    attempts: int
    enqueued_at: int
    failed_at: int
    exception_class: str
    exception_message: str
    backtrace: tuple[str, ...]
    context: bytes


assert DeadTask.__slots__ == _DEAD_TASK_FIELDS == tuple(f.name for f in fields(DeadTask))


def dead_task_of(task_id: str, task_class: str, attempts: int, enqueued_at: int,
                 failed_at: int, exception_class: str, exception_message: str,
                 backtrace: tuple[str, ...], context: bytes) -> DeadTask:
    """``DeadTask(id=task_id, ...)``, built for readers that make one per record (F-11).

    The keyword constructor of a frozen dataclass spends most of its ~2 us on
    ``object.__setattr__``; this fills an object of the same slot layout with plain
    stores and then gives it the class ``DeadTask`` (``__class__`` assignment between
    layout-compatible classes, which Python checks), measured ~0.3 us. The result is a
    ``DeadTask`` like any other: the same value, equality, hash and repr, frozen;
    DeadTask has no ``__post_init__``, so only the generated ``__init__``'s calls are
    skipped.
    """
    task = _DeadTaskSlots()
    task.id = task_id
    task.task_class = task_class
    task.attempts = attempts
    task.enqueued_at = enqueued_at
    task.failed_at = failed_at
    task.exception_class = exception_class
    task.exception_message = exception_message
    task.backtrace = backtrace
    task.context = context
    task.__class__ = DeadTask  # type: ignore[assignment]
    return task  # type: ignore[return-value]
