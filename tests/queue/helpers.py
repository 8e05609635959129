"""Test doubles for the queue tests: a driven clock and a recording in-memory backend.

Goal: make every queue test deterministic and able to see the exact order of
backend calls. Method: ``DrivenClock`` parks ``sleep`` callers until the test
calls ``advance`` (or, with ``auto=True``, advances itself on each sleep);
``RecordingBackend`` keeps the WAL and the dead-task store in dicts and logs
every call, in order, under a lock (some calls come from worker threads).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import TypeVar

from deferq import Backpressure, DeadTask, PendingTask, Queue, TaskRegistry
from deferq.backends import Disk
from deferq.crashtest import SimDisk

T = TypeVar("T")

START = 1_800_000_000.0


def run(coro: Coroutine[object, object, T]) -> T:
    """Run a coroutine on a fresh event loop."""
    return asyncio.run(coro)


async def settle(rounds: int = 20) -> None:
    """Let every ready callback and task on the loop run."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class DrivenClock:
    """Wall time the test controls; ``sleep`` waits until ``advance`` passes its deadline."""

    def __init__(self, now: float = START, *, auto: bool = False) -> None:
        self.now = now
        self.auto = auto
        self.sleeps: list[float] = []
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        if self.auto:
            self.now += seconds
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self.now + seconds, next(self._seq), future))
        await future

    async def advance(self, seconds: float) -> None:
        target = self.now + seconds
        await settle()
        while self._waiters and self._waiters[0][0] <= target:
            when, _, future = heapq.heappop(self._waiters)
            self.now = max(self.now, when)
            if not future.done():
                future.set_result(None)
            await settle()
        self.now = target
        await settle()


class RecordingBackend:
    """An in-memory backend that records every call as ``(method, task_id)``."""

    def __init__(self, pending: Iterable[PendingTask] = ()) -> None:
        self.calls: list[tuple[str, str]] = []
        self.wal: dict[str, PendingTask] = {t.task_id: t for t in pending}
        self.dead: dict[str, DeadTask] = {}
        self.dead_error: BaseException | None = None
        self.before_dead_write: Callable[[], None] | None = None
        self.now = int(START)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _log(self, method: str, task_id: str = "") -> None:
        with self._lock:
            self.calls.append((method, task_id))

    group_commit = False  # the Backend protocol: a plain backend, called as it is

    def add_task(self, context: bytes, publish_at: int | None = None,
                 task_id: str | None = None, *, sync: bool = True) -> str:
        tid = task_id if task_id is not None else f"{self.now}-1-{next(self._ids)}"
        self._log("add_task", tid)
        self.wal[tid] = PendingTask(tid, bytes(context), publish_at)
        return tid

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        self._log("remove_task", task_id)
        self.wal.pop(task_id, None)

    def written_ticket(self) -> int:
        return 0

    def sync_through(self, ticket: int) -> None:
        return None

    def close(self) -> None:
        return None

    def pending_tasks(self) -> list[PendingTask]:
        return list(self.wal.values())

    def sync(self) -> None:
        self._log("sync")

    def add_dead_task(self, task_id: str, context: bytes, exception: BaseException, *,
                      task_class: str, attempts: int,
                      enqueued_at: int | None = None) -> str:
        self._log("add_dead_task:start", task_id)
        if self.before_dead_write is not None:
            self.before_dead_write()
        if self.dead_error is not None:
            self._log("add_dead_task:failed", task_id)
            raise self.dead_error
        self.dead[task_id] = DeadTask(
            id=task_id, task_class=task_class, attempts=attempts,
            enqueued_at=0 if enqueued_at is None else enqueued_at,
            failed_at=self.now, exception_class=type(exception).__name__,
            exception_message=str(exception), backtrace=(), context=bytes(context))
        self._log("add_dead_task:done", task_id)
        return task_id

    def list_dead_tasks(self, *, limit: int | None = None, offset: int = 0) -> list[DeadTask]:
        self._log("list_dead_tasks")
        tasks = list(reversed(self.dead.values()))[offset:]
        return tasks if limit is None else tasks[:limit]

    def find_dead_task(self, task_id: str) -> DeadTask | None:
        self._log("find_dead_task", task_id)
        return self.dead.get(task_id)

    def remove_dead_tasks(self, ids: str | Iterable[str] | None) -> int:
        wanted = [] if ids is None else [ids] if isinstance(ids, str) else list(ids)
        for task_id in wanted:
            self._log("remove_dead_tasks", task_id)
        return sum(1 for i in set(wanted) if self.dead.pop(i, None) is not None)

    def methods(self, task_id: str) -> list[str]:
        """The calls about one task id, in order."""
        return [m for m, i in self.calls if i == task_id]


async def started(backend: RecordingBackend, clock: DrivenClock, *,
                  backpressure: Backpressure | None = None,
                  registry: TaskRegistry | None = None) -> Queue:
    """A started queue over ``backend`` with a seeded random source."""
    queue = Queue(backend, clock=clock, rng=random.Random(7), backpressure=backpressure,
                  registry=registry)
    await queue.start()
    return queue


def recovered_after_power_loss(sim: SimDisk) -> list[str]:
    """The pending task ids a worker finds after a power loss now (storage at ``/s``)."""
    disk = Disk(path="/s", fsync_frequency=0, env=SimDisk(0, image=sim.durable_image()).process())
    try:
        return sorted(t.task_id for t in disk.pending_tasks())
    finally:
        disk.close()
