"""A plain ``perform`` runs in a bounded thread pool; ``inline`` opts into the loop (spec/queue.md Q-38).

Goal: a blocking plain task never blocks the event loop; the pool never runs more than
``sync_threads`` at once; the ``contextvars`` context reaches the thread; an ``inline``
task runs on the loop's thread; ``stop`` shuts the pool down without waiting for a thread,
and a perform still running then has its outcome ignored (its task stays in the WAL); bad
options are refused with an error that names them. Method: a real ``Disk`` in a temporary
directory, tasks that block on ``threading.Event``s the test sets; waits on the loop are
bounded by ``asyncio.wait_for`` so a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from pathlib import Path

import pytest

import deferq
from deferq.backends import Disk, Nil
from tests.queue.helpers import DrivenClock, run, settle

REG = deferq.TaskRegistry()
REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="-")
HUNG_S = 30.0


class Blocking(deferq.Task, name="pool.Blocking", registry=REG):
    """Blocks its thread until ``release`` is set; records where and how many at once."""

    lock = threading.Lock()
    release = threading.Event()
    running = 0
    most = 0
    threads: list[str] = []
    seen: list[str] = []

    def perform(self, number: int) -> None:
        with Blocking.lock:
            Blocking.running += 1
            Blocking.most = max(Blocking.most, Blocking.running)
            Blocking.threads.append(threading.current_thread().name)
            Blocking.seen.append(REQUEST.get())
        try:
            if not Blocking.release.wait(HUNG_S):
                raise AssertionError("never released")
        finally:
            with Blocking.lock:
                Blocking.running -= 1


class OnLoop(deferq.Task, name="pool.OnLoop", registry=REG, inline=True):
    threads: list[int] = []

    def perform(self) -> None:
        OnLoop.threads.append(threading.get_ident())


class FailsInThread(deferq.Task, name="pool.FailsInThread", registry=REG):
    max_retries = 0

    def perform(self) -> None:
        raise KeyError("from the thread")


@pytest.fixture(autouse=True)
def _reset() -> None:
    Blocking.release = threading.Event()
    Blocking.running = Blocking.most = 0
    Blocking.threads, Blocking.seen, OnLoop.threads = [], [], []


async def _until(predicate: object, what: str) -> None:
    """Let the loop run until ``predicate()`` holds (threads report asynchronously)."""
    assert callable(predicate)
    for _ in range(3000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.spec("Q-38")
def test_a_blocking_plain_perform_runs_in_the_pool_and_the_loop_keeps_running(
        tmp_path: Path) -> None:
    async def main() -> None:
        disk = Disk(path=str(tmp_path))
        queue = deferq.Queue(disk, registry=REG)
        await queue.start()
        REQUEST.set("req-1")
        task_id = queue.enqueue(Blocking, 1)
        await _until(lambda: Blocking.running == 1, "the perform to start")
        ticks = 0
        for _ in range(50):  # the loop turns while the perform blocks its thread
            await asyncio.sleep(0)
            ticks += 1
        assert ticks == 50 and queue.running == 1
        assert Blocking.threads[0].startswith("deferq-sync")
        assert Blocking.seen == ["req-1"]  # the context it was enqueued in
        assert [p.task_id for p in disk.pending_tasks()] == [task_id]
        Blocking.release.set()
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        assert disk.pending_tasks() == []
        await queue.stop()
        disk.close()
    run(main())


@pytest.mark.spec("Q-38", "Q-164")
def test_the_pool_runs_at_most_sync_threads_performs_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        disk = Disk(path=str(tmp_path))
        queue = deferq.Queue(disk, registry=REG, sync_threads=2)
        await queue.start()
        for number in range(6):
            queue.enqueue(Blocking, number)
        await _until(lambda: Blocking.running == 2, "two performs to start")
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert Blocking.running == 2 and len(Blocking.threads) == 2
        Blocking.release.set()
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        assert Blocking.most == 2 and len(Blocking.threads) == 6
        assert len(set(Blocking.threads)) <= 2
        await queue.stop()
        disk.close()
    run(main())


@pytest.mark.spec("Q-38")
def test_an_inline_task_runs_on_the_loops_thread(tmp_path: Path) -> None:
    async def main() -> None:
        disk = Disk(path=str(tmp_path))
        queue = deferq.Queue(disk, registry=REG)
        await queue.start()
        queue.enqueue(OnLoop)
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        assert OnLoop.threads == [threading.get_ident()]
        await queue.stop()
        disk.close()
    run(main())


@pytest.mark.spec("Q-38", "Q-8", "Q-140", "Q-165")
def test_a_plain_perform_failing_in_the_pool_goes_through_the_retry_policy() -> None:
    async def main() -> None:
        from deferq.testing import Memory
        backend = Memory()
        queue = deferq.Queue(backend, registry=REG)
        await queue.start()
        task_id = queue.enqueue(FailsInThread)
        await asyncio.wait_for(queue.wait_idle(), HUNG_S)
        for _ in range(200):  # the dead-task write runs in a worker thread
            if backend.find_dead_task(task_id) is not None:
                break
            await asyncio.sleep(0.005)
        dead = backend.find_dead_task(task_id)
        assert dead is not None and dead.exception_class == "KeyError"
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-38", "Q-15", "Q-166")
def test_stop_shuts_the_pool_down_and_ignores_a_perform_still_running(tmp_path: Path) -> None:
    async def main() -> None:
        disk = Disk(path=str(tmp_path))
        clock = DrivenClock()
        queue = deferq.Queue(disk, registry=REG, clock=clock, sync_threads=1)
        await queue.start()
        running = queue.enqueue(Blocking, 1)
        never = queue.enqueue(Blocking, 2)  # waits for the one thread
        await _until(lambda: Blocking.running == 1, "the perform to start")
        stopping = asyncio.ensure_future(queue.stop(timeout=5))
        await settle()
        await clock.advance(5)  # the timeout: the execution is cancelled, its thread is not
        assert await asyncio.wait_for(stopping, HUNG_S) is False
        assert {p.task_id for p in disk.pending_tasks()} == {running, never}
        Blocking.release.set()  # the thread ends after stop returned
        await _until(lambda: Blocking.running == 0, "the thread to end")
        await settle()
        assert Blocking.threads == [Blocking.threads[0]]  # the second never began
        assert {p.task_id for p in disk.pending_tasks()} == {running, never}
        disk.close()
    run(main())


@pytest.mark.spec("Q-38", "Q-164")
@pytest.mark.parametrize("value", [0, -1, 1025, 2.0, "8", True, None])
def test_sync_threads_must_be_an_int_within_bounds(value: object) -> None:
    with pytest.raises(ValueError, match="sync_threads must be an int from 1 to 1,024"):
        deferq.Queue(Nil(), registry=REG, sync_threads=value)  # type: ignore[arg-type]


@pytest.mark.spec("Q-38")
@pytest.mark.parametrize("value", [1, 0, "yes", 1.0])
def test_inline_must_be_a_bool(value: object) -> None:
    registry = deferq.TaskRegistry()
    with pytest.raises(ValueError, match="inline must be True or False"):
        class Bad(deferq.Task, registry=registry, inline=value):
            def perform(self) -> None:
                pass
    with pytest.raises(ValueError, match="inline must be True or False"):
        deferq.task(registry=registry, inline=value)(  # type: ignore[call-overload]
            lambda: None)
