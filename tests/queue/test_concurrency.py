"""``max_concurrency``: at most N executions at once, the rest wait in memory (spec/queue.md Q-37).

Goal: 5,000 async tasks enqueued (or replayed at start) never run as 5,000 at once: the
default bound (100) holds, the others wait for a slot in arrival order and all run; the bound
is validated; ``wait_idle`` waits for the waiting ones, ``stop`` leaves them in the WAL; the
backlog counts them for backpressure (Q-11), and a retry waiting for backpressure gives its
slot back so the queue cannot wedge. Method: a real ``Disk`` in a temporary directory, tasks
that block on an ``asyncio.Event`` and count how many run at once; the real clock, no sleeps
(events only), except the backpressure case on a ``DrivenClock``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import deferq
from deferq.backends import Disk
from tests.queue.helpers import DrivenClock, run, settle

REG = deferq.TaskRegistry()


class Gate:
    """How many ``Held`` executions run now, the most at once, and the order they began."""

    running = 0
    most = 0
    began: list[int] = []
    release: asyncio.Event


class Held(deferq.Task, name="conc.Held", registry=REG):
    async def perform(self, number: int) -> None:
        Gate.running += 1
        Gate.most = max(Gate.most, Gate.running)
        Gate.began.append(number)
        try:
            await Gate.release.wait()
        finally:
            Gate.running -= 1


class FailsOnce(deferq.Task, name="conc.FailsOnce", registry=REG):
    succeeded: list[int] = []

    async def perform(self, number: int) -> None:
        await asyncio.sleep(0)
        if self.attempt == 1:
            raise RuntimeError("first attempt fails")
        FailsOnce.succeeded.append(number)

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0  # at once: the retry counts in the backlog


@pytest.fixture(autouse=True)
def _reset() -> None:
    Gate.running = Gate.most = 0
    Gate.began = []
    FailsOnce.succeeded = []


def _disk(tmp_path: Path) -> Disk:
    return Disk(path=str(tmp_path / "store"))


@pytest.mark.spec("Q-37", "Q-160")
def test_five_thousand_async_tasks_run_at_most_the_default_hundred_at_once(
        tmp_path: Path) -> None:
    async def main() -> None:
        Gate.release = asyncio.Event()
        disk = _disk(tmp_path)
        queue = deferq.Queue(disk, registry=REG)
        assert queue.max_concurrency == 100
        await queue.start()
        for number in range(5000):
            await queue.aenqueue(Held, number)
        await settle()
        assert Gate.running == 100 and queue.running == 100
        assert queue.waiting == 4900
        assert len(asyncio.all_tasks()) < 200  # not one asyncio task per enqueued task
        Gate.release.set()
        await asyncio.wait_for(queue.wait_idle(), 60)
        assert Gate.most == 100
        assert Gate.began == list(range(5000))  # slots go to waiting tasks in arrival order
        assert queue.waiting == 0 and disk.pending_tasks() == []
        assert await queue.stop() is True
        disk.close()
    run(main())


@pytest.mark.spec("Q-37", "Q-9", "Q-160")
def test_a_replay_at_start_does_not_flood_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        Gate.release = asyncio.Event()
        disk = _disk(tmp_path)
        for number in range(5000):
            deferq.Queue(disk, registry=REG).enqueue(Held, number)  # not started: persisted
        queue = deferq.Queue(disk, registry=REG, max_concurrency=20)
        tasks_before = len(asyncio.all_tasks())
        await queue.start()
        await settle()
        assert Gate.running == 20 and queue.waiting == 4980
        # The executions plus the queue's own named background tasks (the adoption sweeper).
        executions = [t for t in asyncio.all_tasks() if not t.get_name().startswith("deferq-")]
        assert len(executions) <= tasks_before + 20
        Gate.release.set()
        await asyncio.wait_for(queue.wait_idle(), 60)
        assert Gate.most == 20 and sorted(Gate.began) == list(range(5000))
        assert disk.pending_tasks() == []
        await queue.stop()
        disk.close()
    run(main())


@pytest.mark.spec("Q-37", "Q-15", "Q-162")
def test_stop_leaves_the_tasks_waiting_for_a_slot_in_the_wal(tmp_path: Path) -> None:
    async def main() -> None:
        Gate.release = asyncio.Event()
        disk = _disk(tmp_path)
        queue = deferq.Queue(disk, registry=REG, max_concurrency=2)
        await queue.start()
        ids = [queue.enqueue(Held, number) for number in range(10)]
        await settle()
        assert Gate.began == [0, 1] and queue.waiting == 8
        stopping = asyncio.ensure_future(queue.stop(timeout=30))
        await settle()
        assert not stopping.done()  # it waits for the two running ones
        Gate.release.set()
        assert await asyncio.wait_for(stopping, 30) is True
        assert Gate.began == [0, 1]  # no waiting task began once stop was called
        assert {p.task_id for p in disk.pending_tasks()} == set(ids[2:])
        assert queue.waiting == 0 and queue.backlog_size == 0
        disk.close()
    run(main())


@pytest.mark.spec("Q-37", "Q-162")
def test_wait_idle_waits_for_the_tasks_waiting_for_a_slot(tmp_path: Path) -> None:
    async def main() -> None:
        Gate.release = asyncio.Event()
        disk = _disk(tmp_path)
        queue = deferq.Queue(disk, registry=REG, max_concurrency=1)
        await queue.start()
        for number in range(3):
            queue.enqueue(Held, number)
        idle = asyncio.ensure_future(queue.wait_idle())
        await settle()
        assert not idle.done() and queue.waiting == 2
        Gate.release.set()
        await asyncio.wait_for(idle, 30)
        assert Gate.began == [0, 1, 2] and Gate.most == 1
        await queue.stop()
        disk.close()
    run(main())


@pytest.mark.spec("Q-37", "Q-11", "Q-161")
def test_tasks_waiting_for_a_slot_count_in_the_backlog_for_backpressure(tmp_path: Path) -> None:
    async def main() -> None:
        Gate.release = asyncio.Event()
        disk = _disk(tmp_path)
        queue = deferq.Queue(disk, registry=REG, max_concurrency=2,
                             backpressure=deferq.Backpressure(high_water_mark=5))
        await queue.start()
        for number in range(7):
            queue.enqueue(Held, number)
            await settle()  # the first two begin: they leave the backlog
        assert queue.running == 2 and queue.backlog_size == 5 and queue.waiting == 5
        queue.enqueue(Held, 7)  # the backlog was at the mark, not above it
        with pytest.raises(deferq.PushTimeout):
            queue.enqueue(Held, 8)
        assert len(disk.pending_tasks()) == 8  # the refused one was not stored
        Gate.release.set()
        await asyncio.wait_for(queue.wait_idle(), 30)
        assert queue.backlog_size == 0
        await queue.stop()
        disk.close()
    run(main())


@pytest.mark.spec("Q-37", "Q-11", "Q-163")
def test_a_retry_waiting_for_backpressure_gives_its_slot_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        disk = _disk(tmp_path)
        for number in range(50):
            deferq.Queue(disk, registry=REG).enqueue(FailsOnce, number)
        clock = DrivenClock()
        queue = deferq.Queue(disk, registry=REG, clock=clock, max_concurrency=2,
                             backpressure=deferq.Backpressure(high_water_mark=10, timeout=2))
        await queue.start()  # a backlog of 50, above the mark, two slots
        # Backpressure's 0.05 s steps, with the loop run to a standstill between them: a
        # retry that kept its slot while it waited would wedge both slots until the timeout.
        for _ in range(400):
            await settle()
            if len(FailsOnce.succeeded) == 50:
                break
            await clock.advance(0.05)
        assert sorted(FailsOnce.succeeded) == list(range(50))
        assert disk.pending_tasks() == []
        await queue.stop()
        disk.close()
    with caplog.at_level(logging.ERROR, logger="deferq.queue"):
        run(main())
    assert not [r for r in caplog.records if "retry not scheduled" in r.getMessage()]


@pytest.mark.spec("Q-37")
@pytest.mark.parametrize("value", [0, -1, 1_000_001, 2.0, "10", True, None])
def test_max_concurrency_must_be_an_int_within_bounds(value: object) -> None:
    with pytest.raises(ValueError, match="max_concurrency must be an int from 1 to 1,000,000"):
        deferq.Queue(deferq.backends.Nil(), registry=REG,
                     max_concurrency=value)  # type: ignore[arg-type]
