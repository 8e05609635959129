"""A shared database's writes, made off the event loop (spec/queue.md Q-179 … Q-183).

Rules:
- Only for a ``ClaimingBackend`` (``Postgres``): there every backend call is a network round
  trip, which a slow or silent server stretches up to its statement timeout, and on the
  event loop that froze the application with it. A local backend (``Disk``, ``Memory``,
  ``Nil``) is written inline as before: its writes are fast and its hot paths are measured.
- A success's removal, a give-up's removal and a retry's re-add (Q-179), the removal of a
  run-soon batch's successes (Q-180) and ``aenqueue``'s add (Q-181) run on the queue's write
  thread while the loop goes on. What follows a write (the book: status and unique key,
  Q-58, Q-54; the hooks; the schedule) runs on the loop once it returned, as it did after
  the inline write.
- A unique key's check and the write stay one step (Q-54): the write thread holds
  ``book.lock`` across both, so the loop never waits on it for a shared ``aenqueue``.
- A caller of ``aenqueue`` cancelled during the write still gets its task scheduled once it
  is written (Q-181, as Q-41 says for a group commit).
- ``writing`` holds the ids whose outcome is being written: ``cancel`` leaves them alone
  (Q-183). A failed write leaves the task pending in the database (Q-182): the backend lets
  its lease run out (P-25) and a worker runs it again.

Theory of operation: one daemon thread per queue (a ``Committer`` named ``deferq-writes``)
runs the writes in the order they were submitted. Not ``asyncio.to_thread``: a stalled
server would hold every thread of the loop's default executor, which the application (and
asyncio's own ``getaddrinfo``) shares; and the backend runs one statement at a time on its
connection, so more threads would only wait on its lock. Before ``start``, or awaited on
another loop, ``aenqueue``'s add runs through ``asyncio.to_thread`` instead (the thread hands
its outcomes to the queue's loop only).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from deferq._core.types import PendingTask
from deferq._runtime.book import TaskBook
from deferq._runtime.committer import Committer
from deferq.backends.protocol import BatchRemover, ClaimingBackend

T = TypeVar("T")
# A write's outcome for each id of a batch: None when its removal was written.
Outcomes = list[Exception | None]


class SharedWrites:
    """The writes of a queue on a shared database, each in the queue's write thread."""

    def __init__(self, backend: ClaimingBackend, book: TaskBook,
                 add: Callable[[bytes, int | None, str | None], str]) -> None:
        self._backend = backend
        self._book = book
        self._add = add  # ``Journal.add``: the backend's ``add_task``
        self._batch = backend if isinstance(backend, BatchRemover) else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: Committer | None = None
        self.writing: set[str] = set()  # ids whose outcome is being written

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The queue started on ``loop``: the write thread hands its outcomes to it."""
        self._loop = loop

    def _run(self, call: Callable[[], T]) -> Awaitable[T]:
        loop = self._loop
        if loop is None or asyncio.get_running_loop() is not loop:
            return asyncio.to_thread(call)  # before start, or on another loop
        thread = self._thread
        if thread is None:
            thread = self._thread = Committer(loop, "deferq-writes")
        return thread.run(call)

    # ------------------------------------------------------------------ outcomes
    async def remove(self, task_id: str) -> None:
        """Implements Q-179: a success's (or a give-up's) removal in the write thread; the
        task is forgotten (Q-58, Q-54) once it returned."""
        writing = self.writing
        writing.add(task_id)
        try:
            await self._run(functools.partial(self._backend.remove_task, task_id))
        finally:
            writing.discard(task_id)
        self._book.forget(task_id)

    async def remove_many(self, task_ids: list[str]) -> Outcomes:
        """Implements Q-180: the removal of a batch's successes in the write thread; each
        task whose removal was written is forgotten, and each outcome returned in order."""
        writing = self.writing
        writing.update(task_ids)
        try:
            outcomes = await self._run(functools.partial(self._remove_each, task_ids))
        finally:
            writing.difference_update(task_ids)
        forget = self._book.forget
        for task_id, error in zip(task_ids, outcomes):
            if error is None:
                forget(task_id)
        return outcomes

    def _remove_each(self, task_ids: list[str]) -> Outcomes:
        """In the write thread: one call for the batch when the backend offers it (C-37),
        else one each; a failed one does not stop the others (each failure lets its task's
        lease run out, P-25)."""
        if self._batch is not None:
            try:
                self._batch.remove_tasks(task_ids)
            except Exception as exc:  # noqa: BLE001 - handed to the loop, which logs it
                return [exc] * len(task_ids)
            return [None] * len(task_ids)
        outcomes: Outcomes = []
        for task_id in task_ids:
            try:
                self._backend.remove_task(task_id)
                outcomes.append(None)
            except Exception as exc:  # noqa: BLE001 - handed to the loop, which logs it
                outcomes.append(exc)
        return outcomes

    async def readd(self, data: bytes, publish_at: int | None, task_id: str) -> None:
        """Implements Q-179: a retry's re-add (same id, W-15) in the write thread; the book
        holds it again once it returned."""
        writing = self.writing
        writing.add(task_id)
        try:
            await self._run(functools.partial(self._add, data, publish_at, task_id))
        finally:
            writing.discard(task_id)
        self._book.added(task_id, publish_at)

    async def remove_held(self, task_id: str) -> bool:
        """Implements Q-186: ``cancel``'s removal (C-36) in the write thread; whether a task
        was removed. The task is forgotten once it returned."""
        removed = await self._run(functools.partial(self._backend.remove_held, task_id))
        self._book.forget(task_id)
        return removed

    async def held(self) -> list[PendingTask]:
        """Implements Q-186: the tasks the backend holds, read in a worker thread (``start``:
        the write thread hands outcomes to a loop only once the queue is bound to it)."""
        return await asyncio.to_thread(self._backend.pending_tasks)

    # ------------------------------------------------------------------ aenqueue
    async def add(self, data: bytes, publish_at: int | None, key: str | None,
                  then: Callable[[str], None]) -> str:
        """Implements Q-181: ``aenqueue``'s write in the write thread; ``then(task_id)`` (its
        hooks and its schedule) runs on the loop once it returned, before the caller resumes,
        and even when the caller was cancelled meanwhile. The id of the task holding ``key``
        when another one does (Q-54), and then nothing is written or scheduled."""
        write = asyncio.ensure_future(self._run(functools.partial(
            self._add_new, data, publish_at, key)))
        write.add_done_callback(functools.partial(_written, then))
        task_id, _ = await asyncio.shield(write)
        return task_id

    def _add_new(self, data: bytes, publish_at: int | None, key: str | None
                 ) -> tuple[str, bool]:
        """In the write thread: (the new task's id, True) once written and booked, or (the
        id of the task holding ``key``, False)."""
        book = self._book
        if key is None:
            task_id = self._add(data, publish_at, None)
            book.tasks[task_id] = publish_at
            return task_id, True
        with book.lock:  # Implements Q-54: the check and the write are one step.
            owner = book.owner(key)
            if owner is not None:
                return owner, False
            task_id = self._add(data, publish_at, None)
            book.added(task_id, publish_at, key)
        return task_id, True

    # ------------------------------------------------------------------ stop
    async def drain(self) -> None:
        """Return once every write submitted to the write thread so far returned (``stop``,
        before the claims are given back)."""
        thread = self._thread
        if thread is not None and asyncio.get_running_loop() is self._loop:
            await asyncio.gather(thread.run(_nothing), return_exceptions=True)

    def close(self) -> None:
        """End the write thread once its writes ran; later ones use ``asyncio.to_thread``."""
        self._loop = None
        if self._thread is not None:
            self._thread.close()
            self._thread = None


def _written(then: Callable[[str], None], write: asyncio.Future[tuple[str, bool]]) -> None:
    """``add``'s write returned: a new task's ``then`` runs (a failure reaches the caller)."""
    if write.cancelled() or write.exception() is not None:
        return
    task_id, new = write.result()
    if new:
        then(task_id)


def _nothing() -> None:
    """A write thread's no-op: ``drain`` waits for it, after the writes before it."""
