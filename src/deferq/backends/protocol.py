"""What the queue and the operator tools require of a storage backend (spec/api.md, C-16..C-18).

Rules: these are structural ``Protocol``s: a backend does not inherit from them, it has
the methods with these signatures and keeps the promises in their docstrings. ``Disk``
and ``Nil`` implement ``Backend``; a backend for another store (a database, say)
implements the same methods and is then usable by ``Queue`` and ``Operator`` unchanged.
Arguments reach a backend unchecked: each backend validates its own (C-7).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from deferq._core.types import DeadTask, PendingTask

__all__ = ["Backend", "BatchRemover", "ClaimingBackend", "DeadTaskAdmin", "DeadTaskFilters",
           "OrphanAdopter"]


class DeadTaskAdmin(Protocol):
    """What the operator tools read and change of the dead tasks."""

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        """Dead tasks newest first, each id once; ``offset`` skips, ``limit`` caps."""

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        """The dead task with this id, or None."""

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        """Remove dead tasks by id (a ``str`` is one id); return how many distinct ids were found."""


@runtime_checkable
class DeadTaskFilters(Protocol):
    """A dead-task store that filters by itself, from an index (``Postgres``, P-32): the
    operator uses it, when present, instead of listing everything and filtering here."""

    def list_dead_tasks_where(self, *, limit: int | None, offset: int, task_class: str | None,
                              exception_class: str | None) -> list[DeadTask]:
        """``list_dead_tasks`` of only the tasks of this task class and exception class."""


class Backend(DeadTaskAdmin, Protocol):
    """A storage backend the ``Queue`` runs on: pending tasks, durability, dead tasks."""

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int, enqueued_at: int | None = None
                      ) -> str | None:
        """Durably store a task that gave up; return its id (None if nothing is stored).

        ``enqueued_at`` is the epoch second the task was first enqueued, kept in the dead
        task's ``enqueued_at``; None when the caller does not know it (C-23, F-17).

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


@runtime_checkable
class BatchRemover(Protocol):
    """What a backend offers, optionally, to remove several tasks in one call (C-37).

    Not part of ``Backend``: without it the queue calls ``remove_task`` once per success
    of a batch (Q-170).
    """

    def remove_tasks(self, task_ids: Iterable[str], *, sync: bool = True) -> int:
        """``remove_task`` of each id, every id checked before anything is written; return
        how many of them were pending here."""


class ScheduleRecords(Protocol):
    """The leader lock and last fired due times of a directory's schedules (L-9..L-12, F-42)."""

    leading: bool

    def try_lead(self) -> bool:
        """Take the leader lock if it is free, without waiting; True while this one holds it."""

    def read(self) -> dict[str, int]:
        """Each schedule's last fired due time, as durably recorded."""

    def write(self, fired: Mapping[str, int]) -> None:
        """Replace the records durably; only the leader calls it."""

    def close(self) -> None:
        """Release the lock and the files; idempotent."""


@runtime_checkable
class ScheduleKeeper(Protocol):
    """What a backend offers, optionally, for periodic tasks shared by workers (Q-127).

    Not part of ``Backend``: on a backend without it a queue keeps its schedules' records
    in memory, in one process only.
    """

    def open_schedules(self) -> ScheduleRecords:
        """The schedules' lock and records of this backend's storage directory."""


@runtime_checkable
class ClaimingBackend(Backend, Protocol):
    """A backend whose pending tasks several workers share (``Postgres``, C-29..C-32).

    A ``Queue`` on such a backend also runs the due tasks it claims (``_runtime/claimer.py``):
    it calls ``start_claiming`` at start, then ``claim_due``, ``renew_claims`` and
    ``wait_for_tasks`` in worker threads until it stops, and ``release_claims`` last.
    """

    lease_seconds: float
    poll_seconds: float

    def start_claiming(self) -> None:
        """From now on every task this backend adds is held by it: no other worker runs it."""

    def claim_due(self, limit: int) -> list[PendingTask]:
        """Claim up to ``limit`` due tasks that no live worker holds; this backend holds them."""

    def renew_claims(self) -> int:
        """Extend the lease of every task this backend holds; the number it still holds."""

    def release_claims(self) -> int:
        """Stop claiming and give back every task held, so other workers take them at once."""

    def wait_for_tasks(self, timeout: float) -> bool:
        """Block until new work may be due, ``wake`` is called or ``timeout`` s passed."""

    def wake(self) -> None:
        """Make a ``wait_for_tasks`` in progress return at once (thread-safe)."""

    def remove_held(self, task_id: str) -> bool:
        """Remove a task unless another worker holds it under a live lease; whether it was."""
