"""The queue's journal: every transition the queue writes to its backend, and the group commit.

Rules (spec/queue.md):
- A task is written before it is scheduled (Q-6, Q-7); every execution ends in exactly one
  transition here: ``remove`` (success), ``readd`` (a retry, same id, this WAL only, W-15)
  or ``give_up`` (D-13, Q-8: the dead-task write first, the WAL removal only after it
  returned; when the dead-task write fails the WAL entry stays and is replayed at the
  next start).
- Dead-task store calls block on a cross-process lock, so they run in a worker thread
  (``asyncio.to_thread``); the event loop never waits on a lock (Q-10).
- Only a power-safe ``Disk`` (``group_commit`` true) is written unsynced; every other
  backend is called exactly as the Backend protocol describes, with its default ``sync``.
- On a shared database (a ``ClaimingBackend``) the writes of an execution's outcome and of
  ``aenqueue`` run in the queue's write thread (``shared``, sharedwrites.py, Q-179..Q-183);
  the callers await them there instead of calling ``remove``, ``remove_many`` or ``readd``.

Theory of operation (group commit, Q-20..Q-23): ``add_durable`` (``aenqueue``) writes its
record unsynced and awaits ``_commit_through`` its ticket. At most one commit runs at a
time; it reads the WAL's latest ticket on the loop, so it covers every record the loop
wrote before it began, and runs the fsync on the queue's commit thread (``Committer``,
Q-23). Completions and retry re-adds are written unsynced and ``_flush_later`` starts a
background flusher that commits until it caught up with them (Q-22). ``close`` waits for
that flusher, syncs the WAL and ends the commit thread (Q-15).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Final

from deferq._runtime.book import TaskBook
from deferq._runtime.committer import Committer
from deferq._runtime.sharedwrites import SharedWrites
from deferq.backends.protocol import Backend, BatchRemover, ClaimingBackend

log = logging.getLogger("deferq.queue")
# The end of a give-up's log line when the dead-task write failed (the journal said why).
NOT_DEAD: Final = "not dead-lettered: it stays in the WAL"


class Journal:
    """The queue's writer of backend transitions (add, re-add, remove, give up) and commits."""

    def __init__(self, backend: Backend, book: TaskBook) -> None:
        self.backend = backend
        self.book = book  # told of every re-add and removal
        self._book_tasks = book.tasks  # bound once: written per removal
        self._key_of = book.key_of
        self._loop: asyncio.AbstractEventLoop | None = None
        self._local_ids = itertools.count(1)  # ids of tasks a backend does not store (Nil)
        # Group commit (Q-20..Q-23): only for a power-safe Disk; other backends are called
        # exactly as before.
        self._disk: Backend | None = backend if backend.group_commit else None
        self._committed = 0  # the highest WAL ticket a completed group commit covered
        self._commit: asyncio.Future[None] | None = None  # the group commit in flight
        self._wanted = 0  # the highest ticket the background flusher must cover
        self._committer: Committer | None = None  # the thread of every commit's fsync
        self._flusher: asyncio.Task[None] | None = None
        # Removes a batch's successes in one call (C-37, Q-170); None: one call each.
        self._batch = backend if isinstance(backend, BatchRemover) else None
        # Implements Q-179: a shared database's writes, off the loop; None: a local backend.
        self.shared = (SharedWrites(backend, book, self.add)
                       if isinstance(backend, ClaimingBackend) else None)
        # Where a task whose write failed stays, for the log lines.
        self.stays = "it stays in the WAL" if self.shared is None else (
            "it stays pending in the database")

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The queue started on ``loop``: group commits and the flusher run on it."""
        self._loop = loop
        if self.shared is not None:
            self.shared.bind(loop)

    def commits_here(self) -> bool:
        """Whether ``add_durable`` may be awaited here: a power-safe Disk, bound to this loop."""
        return self._disk is not None and asyncio.get_running_loop() is self._loop

    # ------------------------------------------------------------------ transitions
    def add(self, data: bytes, publish_at: int | None, task_id: str | None) -> str:
        """Write a task with the backend's own durability (``enqueue``: an inline fsync)."""
        stored = self.backend.add_task(data, publish_at, task_id)
        if stored is not None:
            return stored
        return task_id if task_id is not None else f"local-{next(self._local_ids)}"  # Nil

    async def add_durable(self, data: bytes, publish_at: int | None) -> str:
        """Implements Q-20: write a new task unsynced, return once a group commit covered it.

        Only when ``commits_here`` is true.
        """
        task_id = self.add_unsynced(data, publish_at)
        await self.commit_written()
        return task_id

    def add_unsynced(self, data: bytes, publish_at: int | None) -> str:
        """Write a new task without an fsync; ``commit_written`` makes it durable (Q-20)."""
        disk = self._disk
        assert disk is not None
        stored = disk.add_task(data, publish_at, None, sync=False)
        return stored if stored is not None else f"local-{next(self._local_ids)}"

    async def commit_written(self) -> None:
        """Return once a group commit covered every record written so far (Q-20, Q-56)."""
        disk = self._disk
        assert disk is not None
        await self._commit_through(disk, disk.written_ticket())

    def sync_written(self) -> None:
        """Implements Q-56 for a synchronous caller: every record written so far is durable
        when this returns (on a power-safe Disk; other backends keep their own cadence)."""
        disk = self._disk
        if disk is not None:
            disk.sync_through(disk.written_ticket())

    def readd(self, data: bytes, publish_at: int | None, task_id: str) -> None:
        """A retry's re-add; on a power-safe Disk, unsynced with a background commit (Q-22)."""
        disk = self._disk
        if disk is None:
            self.add(data, publish_at, task_id)
        else:
            disk.add_task(data, publish_at, task_id, sync=False)
            self._flush_later(disk)
        self.book.added(task_id, publish_at)

    async def readd_anywhere(self, data: bytes, publish_at: int | None, task_id: str) -> None:
        """``readd``: inline on a local backend, in the write thread on a shared one (Q-179)."""
        if self.shared is None:
            self.readd(data, publish_at, task_id)
        else:
            await self.shared.readd(data, publish_at, task_id)

    def remove(self, task_id: str) -> None:
        """Record a finished task; on a power-safe Disk, unsynced with a background commit (Q-22)."""
        disk = self._disk
        if disk is None:
            self.backend.remove_task(task_id)
        else:
            disk.remove_task(task_id, sync=False)
            self._flush_later(disk)
        # ``_forget``, inline: this runs once per completed task (the Queue's hot path).
        self._book_tasks.pop(task_id, None)
        if self._key_of:
            self.book.forget_key(task_id)  # its unique key is free again

    def remove_many(self, task_ids: list[str]) -> None:
        """``remove`` of each success of a batch (Q-170): one backend call when it offers
        ``remove_tasks`` (C-37), else one ``remove_task`` each."""
        batch = self._batch
        if batch is None:
            for task_id in task_ids:
                self.remove(task_id)
            return
        disk = self._disk
        if disk is None:
            batch.remove_tasks(task_ids)
        else:
            batch.remove_tasks(task_ids, sync=False)
            self._flush_later(disk)
        book_tasks = self._book_tasks
        for task_id in task_ids:
            book_tasks.pop(task_id, None)
        if self._key_of:
            for task_id in task_ids:
                self.book.forget_key(task_id)

    def remove_checked(self, task_id: str) -> bool:
        """``remove``, saying whether the task was removed: on a shared backend, False when
        another worker holds it under a live lease or it is gone (C-36, Q-229)."""
        backend = self.backend
        if not isinstance(backend, ClaimingBackend):
            self.remove(task_id)
            return True
        removed = backend.remove_held(task_id)
        self._forget(task_id)
        return removed

    def _forget(self, task_id: str) -> None:
        """The task left this queue: no status to answer (Q-58), its unique key free (Q-54)."""
        self._book_tasks.pop(task_id, None)
        if self._key_of:
            self.book.forget_key(task_id)

    async def give_up(self, task_id: str, data: bytes, exc: BaseException, task_class: str,
                      attempts: int, enqueued_at: int | None = None) -> bool:
        """Implements D-13 / Q-8: dead-task write first, WAL removal only after it returned.

        ``enqueued_at`` is the record's first enqueue time (Q-65), None when it has none.
        True when the task is dead-lettered; False when it stays in the WAL.
        """
        try:
            await asyncio.to_thread(self.backend.add_dead_task, task_id, data, exc,
                                    task_class=task_class, attempts=attempts,
                                    enqueued_at=enqueued_at)
        except Exception as dead:  # noqa: BLE001 - the task must stay in the WAL
            log.error("deferred task %s could not be dead-lettered (%s: %s); %s", task_id,
                      type(dead).__name__, dead, "it stays in the WAL and is replayed at the next "
                      "start" if self.shared is None else f"{self.stays} and runs again once "
                      "its lease runs out")
            return False
        if self.shared is None:
            self.remove(task_id)
        else:
            await self.shared.remove(task_id)
        return True

    async def settle(self) -> None:
        """Wait for the background group commit, and a shared database's writes, to finish
        (``stop``, before ``close``)."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        if self.shared is not None:
            await self.shared.drain()

    def close(self) -> None:
        """Implements Q-15 for the WAL: sync it, then end the commit thread."""
        try:
            self.backend.sync()
        finally:
            if self._committer is not None:
                self._committer.close()
            if self.shared is not None:
                self.shared.close()

    # ------------------------------------------------------------------ group commit
    async def _commit_through(self, disk: Backend, ticket: int) -> None:
        """Implements Q-20 and W-21 at the queue: return once ``ticket`` is durable.

        At most one group commit runs at a time: it reads the WAL's latest ticket on
        the loop, so it covers every record the loop wrote before it began, and
        fsyncs in a worker thread. Callers whose ticket it did not cover start the
        next one; a failed commit fails every caller waiting on it (W-22).
        """
        while self._committed < ticket:
            commit = self._commit
            if commit is None:
                commit = self._commit = asyncio.ensure_future(self._commit_once(disk))
                # Its failure reaches every waiter; this only keeps asyncio from warning
                # when all of them were cancelled.
                commit.add_done_callback(_retrieve)
            await asyncio.shield(commit)

    async def _commit_once(self, disk: Backend) -> None:
        target = disk.written_ticket()
        try:
            committer = self._committer
            if committer is None:
                assert self._loop is not None
                committer = self._committer = Committer(self._loop, "deferq-commit")
            await committer.run(lambda: disk.sync_through(target))
        finally:
            self._commit = None
        if target > self._committed:
            self._committed = target

    def _flush_later(self, disk: Backend) -> None:
        """Implements Q-22: a background group commit covers the record just written."""
        ticket = disk.written_ticket()
        if ticket > self._wanted:
            self._wanted = ticket
        if self._flusher is None and self._loop is not None:
            self._flusher = self._loop.create_task(self._flush(disk))

    async def _flush(self, disk: Backend) -> None:
        try:
            while self._committed < self._wanted:
                await self._commit_through(disk, self._wanted)
        except Exception:  # noqa: BLE001 - the WAL is broken; the records stay unsynced
            log.exception("group commit of the tasks WAL failed; unsynced completions and "
                          "retries may be undone by a power loss")
        finally:
            self._flusher = None


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
