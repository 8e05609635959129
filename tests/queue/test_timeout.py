"""A per-task ``timeout``: a failure like any other, recorded as ``TaskTimeoutError`` (spec/queue.md Q-39).

Goal: an execution that runs past its task's timeout (async, or plain in the pool) fails
with ``TaskTimeoutError``, goes through the retry policy and, given up, is a dead task that
names it; the async one is cancelled, the thread of a plain one is not (it cannot be) and
what it does later is ignored; a task that ends in time succeeds and leaves no timer; bad
values are refused when the task is defined. Method: ``ManualClock`` (the timeout sleeps on
the queue's clock, so it fires when the test advances it) and the ``Memory`` backend, which
keeps dead tasks. No wall-clock timing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import ClassVar

import pytest

import deferq
from deferq.testing import ManualClock, Memory
from tests.queue.helpers import run, settle

REG = deferq.TaskRegistry()
EVENTS: list[str] = []
HUNG_S = 30.0
TIMEOUT_CLASS = "deferq.TaskTimeoutError"  # as a dead task records it


class Hangs(deferq.Task, name="timeout.Hangs", registry=REG, timeout=5):
    max_retries = 0

    async def perform(self) -> None:
        EVENTS.append("started")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            EVENTS.append("cancelled")
            raise


class HangsTwice(deferq.Task, name="timeout.HangsTwice", registry=REG, timeout=5):
    max_retries = 1

    async def perform(self) -> None:
        EVENTS.append(f"attempt {self.attempt}")
        await asyncio.Event().wait()

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        EVENTS.append(f"retry after {type(exception).__name__}")
        return 30


class BlocksThread(deferq.Task, name="timeout.BlocksThread", registry=REG):
    max_retries = 0
    timeout: ClassVar[float | None] = 2.5  # the class attribute form
    release = threading.Event()

    def perform(self) -> None:
        EVENTS.append("thread started")
        BlocksThread.release.wait(HUNG_S)
        EVENTS.append("thread ended")
        raise RuntimeError("late failure that must be ignored")


class Quick(deferq.Task, name="timeout.Quick", registry=REG, timeout=60):
    async def perform(self) -> None:
        EVENTS.append("quick")


@pytest.fixture(autouse=True)
def _reset() -> None:
    EVENTS.clear()
    BlocksThread.release = threading.Event()


async def _queue() -> tuple[deferq.Queue, ManualClock, Memory]:
    clock = ManualClock()
    backend = Memory(now=clock.time)
    queue = deferq.Queue(backend, clock=clock, registry=REG)
    await queue.start()
    return queue, clock, backend


async def _dead(backend: Memory, task_id: str) -> deferq.DeadTask:
    for _ in range(1000):  # the dead-task write runs in a worker thread
        dead = backend.find_dead_task(task_id)
        if dead is not None:
            return dead
        await asyncio.sleep(0.002)
    raise AssertionError(f"{task_id} was not dead-lettered")


@pytest.mark.spec("Q-39", "Q-167", "Q-168")
def test_an_async_execution_past_its_timeout_is_cancelled_and_dead_lettered_as_a_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        task_id = queue.enqueue(Hangs)
        await settle()
        await clock.advance(4.9)
        assert EVENTS == ["started"] and queue.running == 1
        await clock.advance(0.1)
        dead = await _dead(backend, task_id)
        assert dead.exception_class == TIMEOUT_CLASS
        assert dead.exception_message == "timeout.Hangs timed out after 5 s"
        assert EVENTS == ["started", "cancelled"]
        assert backend.pending_tasks() == []
        await queue.stop()
    with caplog.at_level(logging.ERROR, logger="deferq.queue"):
        run(main())
    assert any("TaskTimeoutError" in r.getMessage() and "dead-lettered" in r.getMessage()
               for r in caplog.records)


@pytest.mark.spec("Q-39", "Q-3", "Q-167")
def test_a_timeout_goes_through_the_retry_policy() -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        task_id = queue.enqueue(HangsTwice)
        await settle()
        await clock.advance(5)
        assert EVENTS == ["attempt 1", "retry after TaskTimeoutError"]
        pending = backend.pending_tasks()
        assert [p.task_id for p in pending] == [task_id]
        assert pending[0].publish_at == int(clock.time()) + 30
        await clock.advance(30)
        assert EVENTS[-1] == "attempt 2"
        await clock.advance(5)
        dead = await _dead(backend, task_id)
        assert dead.exception_class == TIMEOUT_CLASS and dead.attempts == 2
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-39", "Q-38", "Q-168")
def test_a_plain_perform_past_its_timeout_fails_and_its_thread_outcome_is_ignored() -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        task_id = queue.enqueue(BlocksThread)
        for _ in range(1000):
            if EVENTS:
                break
            await asyncio.sleep(0.002)
        assert EVENTS == ["thread started"]
        await clock.advance(2.5)
        dead = await _dead(backend, task_id)
        assert dead.exception_class == TIMEOUT_CLASS
        assert queue.running == 0  # the execution ended; its thread has not
        BlocksThread.release.set()
        for _ in range(1000):
            if "thread ended" in EVENTS:
                break
            await asyncio.sleep(0.002)
        await settle()
        assert EVENTS == ["thread started", "thread ended"]
        assert backend.find_dead_task(task_id) == dead  # the late failure changed nothing
        assert backend.pending_tasks() == []
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-39")
def test_a_task_that_ends_in_time_succeeds_and_leaves_no_timer() -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        queue.enqueue(Quick)
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        await settle()
        assert EVENTS == ["quick"] and backend.pending_tasks() == []
        assert clock.sleepers == 0  # the timeout's sleep was cancelled
        assert backend.list_dead_tasks() == []
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-39")
def test_task_timeout_error_is_a_deferq_error_and_a_timeout_error() -> None:
    assert issubclass(deferq.TaskTimeoutError, deferq.DeferqError)
    assert issubclass(deferq.TaskTimeoutError, TimeoutError)


@pytest.mark.spec("Q-39")
@pytest.mark.parametrize("value", [0, -1, 86_400.5, float("nan"), float("inf"), True, "5"])
def test_timeout_must_be_seconds_above_zero_and_at_most_a_day(value: object) -> None:
    registry = deferq.TaskRegistry()
    with pytest.raises(ValueError, match="timeout must be None or a number of seconds"):
        class Bad(deferq.Task, registry=registry, timeout=value):
            async def perform(self) -> None:
                pass
    with pytest.raises(ValueError, match="timeout must be None or a number of seconds"):
        deferq.task(registry=registry, timeout=value)(  # type: ignore[call-overload]
            lambda: None)


@pytest.mark.spec("Q-39", "Q-38")
def test_an_inline_task_cannot_have_a_timeout() -> None:
    registry = deferq.TaskRegistry()
    with pytest.raises(ValueError, match="an inline task cannot have a timeout"):
        class Bad(deferq.Task, registry=registry, inline=True, timeout=3):
            def perform(self) -> None:
                pass
    fn = deferq.task(registry=registry, timeout=3)(lambda: None)
    assert fn.task_class.timeout == 3.0 and fn.task_class.inline is False
