"""The ``Nil`` backend: stores nothing, every method a no-op (spec/api.md C-10)."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

from deferq._core.types import DeadTask, PendingTask

__all__ = ["Nil"]


class Nil:
    """A backend that stores nothing: every method is a no-op (C-10)."""

    def __init__(self, **_options: object) -> None:
        pass

    @property
    def group_commit(self) -> bool:
        return False

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> None:
        return None

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        return None

    def written_ticket(self) -> int:
        return 0

    def sync_through(self, ticket: int) -> None:
        return None

    def pending_tasks(self) -> list[PendingTask]:
        return []

    def sync(self) -> None:
        return None

    def adopt_orphans(self, files_max: int = 4) -> list[PendingTask]:
        """Nothing is stored, so nothing is orphaned (C-27)."""
        return []

    def tick(self) -> None:
        return None

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int) -> None:
        return None

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        return []

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        return None

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        return 0

    def close(self) -> None:
        return None

    def __enter__(self) -> Nil:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def __repr__(self) -> str:
        return "Nil()"
