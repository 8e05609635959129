"""``queue.cancel(task_id)``: a delayed, waiting, due or running task is taken back (spec/queue.md Q-40).

Goal: whatever state a task is in here (a timer, waiting for a slot, due in the run-soon
batch, an asyncio task before its first step, an async or pooled perform running), a cancel
removes it from the WAL, logs it, returns True, and the task never runs again, is never
retried and never dead-lettered, even when its perform ignores the cancellation or its
thread ends later; an id the queue does not hold is False and changes nothing. Method: the
``Memory`` backend (it keeps dead tasks) on a ``ManualClock``, one case on a real ``Disk``;
tasks block on events the test sets. No wall-clock timing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest

import deferq
from deferq._runtime.scheduler import STOP_GRACE_S
from deferq.backends import Disk
from deferq.testing import ManualClock, Memory
from tests.queue.helpers import run, settle

REG = deferq.TaskRegistry()
EVENTS: list[str] = []
HUNG_S = 30.0


class Waits(deferq.Task, name="cancel.Waits", registry=REG):
    release: asyncio.Event

    async def perform(self, label: str) -> None:
        EVENTS.append(f"start {label}")
        try:
            await Waits.release.wait()
        except asyncio.CancelledError:
            EVENTS.append(f"cancelled {label}")
            raise
        EVENTS.append(f"end {label}")
        raise RuntimeError("fails, so that a retry would show")


class Stubborn(deferq.Task, name="cancel.Stubborn", registry=REG):
    release: asyncio.Event

    async def perform(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            EVENTS.append("swallowed")
        await Stubborn.release.wait()
        EVENTS.append("stubborn ended")
        raise RuntimeError("fails late: a retry or a give-up would show")


class InThread(deferq.Task, name="cancel.InThread", registry=REG):
    release = threading.Event()

    def perform(self) -> None:
        EVENTS.append("thread started")
        InThread.release.wait(HUNG_S)
        EVENTS.append("thread ended")
        raise RuntimeError("a late failure that must be ignored")


class Inline(deferq.Task, name="cancel.Inline", registry=REG, inline=True):
    def perform(self, label: str) -> None:
        EVENTS.append(f"inline {label}")


@pytest.fixture(autouse=True)
def _reset() -> None:
    EVENTS.clear()
    InThread.release = threading.Event()


async def _queue(**options: int) -> tuple[deferq.Queue, ManualClock, Memory]:
    clock = ManualClock()
    backend = Memory(now=clock.time)
    Waits.release = asyncio.Event()
    Stubborn.release = asyncio.Event()
    queue = deferq.Queue(backend, clock=clock, registry=REG, **options)  # type: ignore[arg-type]
    await queue.start()
    return queue, clock, backend


def _ids(backend: Memory) -> set[str]:
    return {p.task_id for p in backend.pending_tasks()}


@pytest.mark.spec("Q-40", "Q-36", "Q-169")
def test_cancel_a_delayed_task(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        keep = queue.enqueue(Inline, "kept", delay=60)
        gone = queue.enqueue(Inline, "gone", delay=60)
        assert await queue.cancel(gone) is True
        assert queue.delayed == 1 and _ids(backend) == {keep}
        await clock.advance(60)
        assert EVENTS == ["inline kept"]
        assert await queue.cancel(gone) is False  # already cancelled
        await queue.stop()
    with caplog.at_level(logging.INFO, logger="deferq.queue"):
        run(main())
    assert any("cancelled (it was delayed); removed from the WAL" in r.getMessage()
               for r in caplog.records)


@pytest.mark.spec("Q-40", "Q-37", "Q-160")
def test_cancel_a_task_waiting_for_a_slot() -> None:
    async def main() -> None:
        queue, _, backend = await _queue(max_concurrency=1)
        first = queue.enqueue(Waits, "a")
        second = queue.enqueue(Waits, "b")
        third = queue.enqueue(Waits, "c")
        await settle()
        assert queue.waiting == 2 and queue.backlog_size == 2
        assert await queue.cancel(second) is True
        assert queue.waiting == 1 and queue.backlog_size == 1
        assert _ids(backend) == {first, third}
        assert await queue.cancel(first) is True  # running: its slot goes to the third
        await settle()
        assert EVENTS == ["start a", "cancelled a", "start c"]
        await queue.stop(timeout=0)
    run(main())


@pytest.mark.spec("Q-40", "Q-169")
def test_cancel_a_running_async_task_is_not_retried_nor_dead_lettered() -> None:
    async def main() -> None:
        queue, _, backend = await _queue()
        task_id = queue.enqueue(Waits, "a")
        await settle()
        assert queue.running == 1
        assert await queue.cancel(task_id) is True
        assert EVENTS == ["start a", "cancelled a"]
        assert queue.running == 0 and backend.pending_tasks() == []
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        await settle()
        assert backend.pending_tasks() == [] and backend.list_dead_tasks() == []
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-40")
def test_cancel_before_the_first_step_means_it_never_runs() -> None:
    async def main() -> None:
        queue, _, backend = await _queue()
        task_id = queue.enqueue(Waits, "a")  # an asyncio task that has not started yet
        inline_id = queue.enqueue(Inline, "b")  # due in the run-soon batch
        assert await queue.cancel(task_id) is True
        assert await queue.cancel(inline_id) is True
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        await settle()
        assert EVENTS == [] and backend.pending_tasks() == []
        assert queue.running == 0 and queue.backlog_size == 0
        queue.enqueue(Inline, "c")  # the slots were given back
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        assert EVENTS == ["inline c"]
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-40", "Q-38", "Q-169")
def test_cancel_a_plain_perform_in_the_pool_ignores_what_its_thread_does_later(
        tmp_path: Path) -> None:
    async def main() -> None:
        disk = Disk(path=str(tmp_path))
        queue = deferq.Queue(disk, registry=REG)
        await queue.start()
        task_id = queue.enqueue(InThread)
        for _ in range(1000):
            if EVENTS:
                break
            await asyncio.sleep(0.002)
        assert EVENTS == ["thread started"]
        assert await queue.cancel(task_id) is True
        assert disk.pending_tasks() == [] and queue.running == 0
        InThread.release.set()
        for _ in range(1000):
            if "thread ended" in EVENTS:
                break
            await asyncio.sleep(0.002)
        await settle()
        assert disk.pending_tasks() == [] and disk.list_dead_tasks() == []
        await queue.stop()
        disk.close()
    run(main())


@pytest.mark.spec("Q-40", "Q-35")
def test_cancel_waits_at_most_the_grace_for_a_task_that_swallows_it() -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        task_id = queue.enqueue(Stubborn)
        await settle()
        cancelling = asyncio.ensure_future(queue.cancel(task_id))
        await settle()
        assert EVENTS == ["swallowed"] and not cancelling.done()
        await clock.advance(STOP_GRACE_S)
        assert await asyncio.wait_for(cancelling, HUNG_S) is True
        assert backend.pending_tasks() == []
        Stubborn.release.set()  # it ends later: nothing is recorded
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        await settle()
        assert EVENTS == ["swallowed", "stubborn ended"]
        assert backend.pending_tasks() == [] and backend.list_dead_tasks() == []
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-113")
def test_an_id_the_queue_does_not_hold_is_false_and_changes_nothing() -> None:
    async def main() -> None:
        clock = ManualClock()
        backend = Memory(now=clock.time)
        queue = deferq.Queue(backend, clock=clock, registry=REG)
        before = queue.enqueue(Inline, "x", delay=10)  # not started: only persisted
        assert await queue.cancel(before) is False
        await queue.start()
        assert await queue.cancel("no-such-id") is False
        done = queue.enqueue(Inline, "y")
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        assert await queue.cancel(done) is False  # finished
        with pytest.raises(TypeError, match="task_id must be a str, got int"):
            await queue.cancel(7)  # type: ignore[arg-type]
        assert _ids(backend) == {before} and queue.delayed == 1
        await queue.stop()
        assert await queue.cancel(before) is False  # stopped
        assert _ids(backend) == {before}
    run(main())


@deferq.task(name="cancel.keyed", registry=REG, inline=True)
def keyed(label: str) -> None:
    EVENTS.append(f"ran {label}")


@pytest.mark.spec("Q-40", "Q-54", "Q-58")
def test_a_cancelled_keyed_task_frees_its_key_and_its_status_is_unknown() -> None:
    """A cancel goes through the journal's removal: the unique key is free again and the
    status lookup no longer reports the task (the book forgets it)."""
    async def main() -> None:
        EVENTS.clear()
        clock = ManualClock(1_900_000_000)
        with Memory() as backend:
            queue = deferq.Queue(backend, clock=clock, registry=REG)
            await queue.start()
            first = queue.defer(keyed.options(key="k", delay=60), "first")
            assert queue.defer(keyed.options(key="k", delay=60), "again") == first
            assert await queue.status(first) is deferq.TaskStatus.DELAYED
            assert await queue.cancel(first) is True
            assert await queue.status(first) is deferq.TaskStatus.UNKNOWN
            second = queue.defer(keyed.options(key="k"), "second")
            assert second != first
            await settle()
            assert EVENTS == ["ran second"]
            await queue.stop()
    run(main())
