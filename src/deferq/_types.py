"""Value types returned by the public API.

Rules: values are immutable. ``PendingTask`` is a NamedTuple (the issue fixes its
shape); ``DeadTask`` is a frozen, slotted, keyword-only dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class PendingTask(NamedTuple):
    """A task in a worker's WAL that has not been removed (W-7)."""

    task_id: str
    context: bytes
    publish_at: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadTask:
    """A task that gave up, as stored in the dead-task store (F-10).

    ``enqueued_at`` is the leading integer of a generated task id (its seed
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
