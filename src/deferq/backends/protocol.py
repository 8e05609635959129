"""What the queue and the operator tools require of a storage backend (spec/api.md, C-16..C-18).

Rules: these are structural ``Protocol``s: a backend does not inherit from them, it has
the methods with these signatures and keeps the promises in their docstrings. ``Disk``
and ``Nil`` implement ``Backend``; a backend for another store (a database, say)
implements the same methods and is then usable by ``Queue`` and ``Operator`` unchanged.
Arguments reach a backend unchecked: each backend validates its own (C-7).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from deferq._core.types import DeadTask, PendingTask

__all__ = ["Backend", "DeadTaskAdmin", "OrphanAdopter"]


class DeadTaskAdmin(Protocol):
    """What the operator tools read and change of the dead tasks."""

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        """Dead tasks newest first, each id once; ``offset`` skips, ``limit`` caps."""

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        """The dead task with this id, or None."""

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        """Remove dead tasks by id (a ``str`` is one id); return how many distinct ids were found."""


class Backend(DeadTaskAdmin, Protocol):
    """A storage backend the ``Queue`` runs on: pending tasks, durability, dead tasks."""

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int) -> str | None:
        """Durably store a task that gave up; return its id (None if nothing is stored).

        When this returns, the dead task survives a crash of this process (and, for a
        durable backend, a power loss): the queue removes the pending task only then.
        """

    @property
    def group_commit(self) -> bool:
        """Whether a ``sync=True`` write waits for its own flush to stable storage.

        When True the queue writes with ``sync=False`` and awaits ``sync_through`` in a
        thread, so that concurrent writers share one flush (C-12..C-14); when False it
        calls ``add_task`` and ``remove_task`` plainly.
        """

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str | None:
        """Store a pending task and return its id (None if nothing is stored).

        ``publish_at`` is the epoch second before which it must not run; ``task_id``
        re-adds (replaces) a task this backend holds, keeping its position. With
        ``sync=True`` the task survives a crash of this process when this returns.
        """

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        """Record that a pending task is done; an id not pending here changes nothing."""

    def pending_tasks(self) -> list[PendingTask]:
        """Every task this backend holds for this worker, including those recovered at open."""

    def written_ticket(self) -> int:
        """The ticket of the last write; with ``sync_through`` it waits for a group commit."""

    def sync_through(self, ticket: int) -> None:
        """Block until every write up to ``ticket`` is durable (C-14)."""

    def sync(self) -> None:
        """Make every write so far durable."""

    def close(self) -> None:
        """Make every write durable and release every resource; idempotent."""


@runtime_checkable
class OrphanAdopter(Protocol):
    """What a backend offers, optionally, for the queue's adoption sweep (C-27, C-28).

    Not part of ``Backend``: a backend without ``adopt_orphans`` keeps working, and the
    queue then runs no sweep (C-28).
    """

    def adopt_orphans(self, files_max: int = 4) -> list[PendingTask]:
        """Take over up to ``files_max`` stores left by dead workers; return their tasks.

        Every task returned is pending in this backend from now on, and as durable as
        what ``add_task`` with ``sync=True`` stores; a task is never returned by two
        backends that run at once, unless a crash left it in two places (D-21).
        """
