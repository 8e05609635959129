"""Status by id, ``async with``, and misuse of the new API (spec/queue.md Q-58..Q-60).

Goal: ``status`` follows a task through every state it can be in for this queue, and says
DEAD from the shared dead-task store and UNKNOWN for what the queue does not hold;
``async with`` starts and stops the queue even when its block raises; misuse raises the
library's errors and stores nothing. Method: real queues over the recording backend and a
driven clock, and over a real ``Disk`` whose dead-task store another queue fills.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import deferq
from deferq import TaskStatus
from deferq.backends import Disk, Nil
from tests.queue.helpers import DrivenClock, RecordingBackend, run, settle, started

REG = deferq.TaskRegistry()
OTHER = deferq.TaskRegistry()
GATE: list[asyncio.Event] = []


class Parked(deferq.Task, name="status.Parked", registry=REG):
    async def perform(self) -> None:
        await GATE[0].wait()


class Failing(deferq.Task, name="status.Failing", registry=REG, inline=True):
    max_retries = 1

    def perform(self) -> None:
        raise RuntimeError("no")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 30


class Doomed(deferq.Task, name="status.Doomed", registry=REG, inline=True):
    max_retries = 0

    def perform(self) -> None:
        raise RuntimeError("never works")


@deferq.task(name="status.quick", registry=REG, inline=True)  # the driven clock steps the loop
def quick() -> None: ...


@deferq.task(name="status.elsewhere", registry=OTHER)
def elsewhere() -> None: ...


@pytest.mark.spec("Q-58", "Q-199")
def test_status_follows_a_task_through_pending_delayed_running_retry_dead_and_done() -> None:
    async def main() -> None:
        GATE[:] = [asyncio.Event()]
        backend, clock = RecordingBackend(), DrivenClock()
        queue = deferq.Queue(backend, registry=REG, clock=clock)
        before = queue.defer(quick)
        later = queue.defer(quick.options(delay=60))
        assert await queue.status(before) is TaskStatus.PENDING  # stored, not started yet
        assert await queue.status(later) is TaskStatus.DELAYED
        await queue.start()
        parked = queue.defer(Parked)
        failing = queue.defer(Failing)
        await settle()
        assert await queue.status(parked) is TaskStatus.RUNNING
        assert await queue.status(before) is TaskStatus.UNKNOWN  # succeeded: nothing kept
        assert await queue.status(failing) is TaskStatus.DELAYED  # waiting for its retry
        assert await queue.status(later) is TaskStatus.DELAYED
        await clock.advance(30)
        GATE[0].set()
        await queue.wait_idle()  # the give-up's dead-task write included
        assert await queue.status(failing) is TaskStatus.DEAD
        assert await queue.status(parked) is TaskStatus.UNKNOWN
        assert await queue.status(later) is TaskStatus.DELAYED
        await clock.advance(30)
        await queue.wait_idle()
        assert await queue.status(later) is TaskStatus.UNKNOWN
        assert await queue.status("1800000000-1-999") is TaskStatus.UNKNOWN
        with pytest.raises(ValueError, match="task_id must be a str"):
            await queue.status(42)  # type: ignore[arg-type]
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-58", "Q-10")
def test_status_reads_dead_tasks_of_other_workers_and_pending_ones_after_a_restart(
        tmp_path: Path) -> None:
    async def main() -> None:
        with Disk(path=tmp_path) as one:
            queue = deferq.Queue(one, registry=REG, clock=DrivenClock())
            await queue.start()
            dead = queue.defer(Doomed)
            await queue.wait_idle()
            assert await queue.status(dead) is TaskStatus.DEAD
            waiting = queue.defer(quick.options(delay=3600))
            await queue.stop()
        with Disk(path=tmp_path) as two, Disk(path=tmp_path) as three:
            replaying = deferq.Queue(two, registry=REG)
            await replaying.start()
            assert await replaying.status(waiting) is TaskStatus.DELAYED  # replayed
            bystander = deferq.Queue(three, registry=REG)
            assert await bystander.status(dead) is TaskStatus.DEAD  # the store is shared
            assert await bystander.status(waiting) is TaskStatus.UNKNOWN  # another WAL
            await replaying.stop()

    run(main())


@pytest.mark.spec("Q-59")
def test_async_with_starts_and_stops_the_queue_even_when_the_block_raises() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        queue = deferq.Queue(backend, registry=REG, clock=DrivenClock())
        async with queue as entered:
            assert entered is queue
            task_id = queue.defer(quick)
            await queue.wait_idle()
            assert task_id not in backend.wal  # it ran: the queue was started
        assert backend.calls[-1] == ("sync", "")  # stop() synced the WAL
        with pytest.raises(deferq.QueueStateError, match="cannot start"):
            async with queue:
                pass
        failing = deferq.Queue(RecordingBackend(), registry=REG, clock=DrivenClock())
        with pytest.raises(KeyError, match="from the block"):
            async with failing:
                raise KeyError("from the block")
        with pytest.raises(deferq.QueueStateError, match="cannot start: it is stopped"):
            await failing.start()

    run(main())


@pytest.mark.spec("Q-60", "C-22")
def test_misuse_of_defer_and_options_raises_deferq_errors_and_stores_nothing() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        queue = await started(backend, DrivenClock(), registry=REG)
        with pytest.raises(deferq.TaskNotRegisteredError, match="status.elsewhere"):
            queue.defer(elsewhere)
        with pytest.raises(deferq.TaskNotRegisteredError, match="status.elsewhere"):
            await queue.adefer(elsewhere.options(key="k"))
        for not_a_task in (print, "quick", deferq.Task, None):
            with pytest.raises(deferq.NotATaskError, match="is not a deferq task"):
                queue.defer(not_a_task)  # type: ignore[arg-type]
            with pytest.raises(deferq.NotATaskError):
                await queue.adefer(not_a_task)  # type: ignore[arg-type]
        with pytest.raises(deferq.NotATaskError, match="only Queue.defer and adefer read"):
            queue.enqueue(quick.options(key="dropped"))
        assert backend.wal == {} and backend.calls == []
        await queue.stop()
        errors = (deferq.TaskNotRegisteredError, deferq.NotATaskError, deferq.QueueStateError,
                  deferq.DepsTypeError)
        assert all(issubclass(error, deferq.DeferqError) for error in errors)
        assert isinstance(deferq.DeferqError("base"), Exception)

    run(main())


@pytest.mark.spec("Q-58")
def test_status_with_a_nil_backend_knows_its_own_tasks_only() -> None:
    async def main() -> None:
        async with deferq.Queue(Nil(), registry=REG, clock=DrivenClock()) as queue:
            task_id = queue.defer(quick.options(delay=10))
            assert await queue.status(task_id) is TaskStatus.DELAYED
            assert await queue.status("1800000000-1-1") is TaskStatus.UNKNOWN

    run(main())
