"""Delayed tasks wait in one timer heap with one sleeper (spec/queue.md Q-36).

Goal: however many tasks are delayed, the queue holds one sleeper on its clock (not one
asyncio task each), runs each task when its time comes, in deadline order with ties in the
order scheduled, lets an earlier timer overtake the sleeper's, and drops every timer at once
on ``stop`` (they stay in the WAL). Method: a ``ManualClock`` (it counts its sleepers and
wakes them in order) and the ``Memory`` backend; the asyncio tasks of the loop are counted
directly. No real sleeps.
"""

from __future__ import annotations

import asyncio

import pytest

import deferq
from deferq.testing import ManualClock, Memory, drain
from tests.queue.helpers import run, settle

REG = deferq.TaskRegistry()
RAN: list[tuple[int, float]] = []


class Note(deferq.Task, name="timers.Note", registry=REG, inline=True):
    clock: ManualClock

    def perform(self, number: int) -> None:
        RAN.append((number, Note.clock.time()))


@pytest.fixture(autouse=True)
def _clear() -> None:
    RAN.clear()


async def _queue() -> tuple[deferq.Queue, ManualClock, Memory]:
    clock = ManualClock()
    Note.clock = clock
    backend = Memory(now=clock.time)
    queue = deferq.Queue(backend, clock=clock, registry=REG)
    await queue.start()
    return queue, clock, backend


@pytest.mark.spec("Q-36")
def test_a_thousand_delayed_tasks_hold_one_sleeper_and_no_task_each() -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        tasks_before = len(asyncio.all_tasks())
        for number in range(1000):
            queue.enqueue(Note, number, delay=10 + number % 7)
        await settle()
        assert queue.delayed == 1000
        assert clock.sleepers == 1  # one per delayed task before Q-36
        queue._scheduler.timers.check_invariants()
        assert len(asyncio.all_tasks()) <= tasks_before + 1
        await drain(queue)
        assert sorted(n for n, _ in RAN) == list(range(1000))
        assert queue.delayed == 0 and clock.sleepers == 0
        assert backend.pending_tasks() == []
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-36")
def test_timers_fire_in_deadline_order_with_ties_in_schedule_order() -> None:
    async def main() -> None:
        queue, clock, _ = await _queue()
        start = clock.time()
        for number, delay in enumerate([30, 10, 20, 10, 30, 5]):
            queue.enqueue(Note, number, delay=delay)
        await clock.advance(9)
        assert RAN == [(5, start + 5)]
        await clock.advance(1)
        assert RAN[1:] == [(1, start + 10), (3, start + 10)]
        await clock.advance(20)
        assert [n for n, _ in RAN] == [5, 1, 3, 2, 0, 4]
        assert [t - start for _, t in RAN] == [5, 10, 10, 20, 30, 30]
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-36")
def test_an_earlier_timer_overtakes_the_sleepers_deadline() -> None:
    async def main() -> None:
        queue, clock, _ = await _queue()
        start = clock.time()
        queue.enqueue(Note, 1, delay=100)
        await settle()
        assert clock.next_deadline() == start + 100
        queue.enqueue(Note, 2, delay=3)
        await settle()
        assert clock.next_deadline() == start + 3 and clock.sleepers == 1
        queue._scheduler.timers.check_invariants()
        await clock.advance(3)
        assert RAN == [(2, start + 3)]
        assert clock.next_deadline() == start + 100  # the sleeper went back to the later one
        await clock.advance(97)
        assert RAN == [(2, start + 3), (1, start + 100)]
        await queue.stop()
    run(main())


@pytest.mark.spec("Q-36", "Q-15")
def test_stop_drops_every_timer_at_once_and_the_tasks_stay_in_the_wal() -> None:
    async def main() -> None:
        queue, clock, backend = await _queue()
        ids = {queue.enqueue(Note, number, delay=60 + number) for number in range(500)}
        await settle()
        assert await queue.stop() is True
        await settle()
        assert queue.delayed == 0 and clock.sleepers == 0
        assert {p.task_id for p in backend.pending_tasks()} == ids
        await clock.advance(10_000)
        assert RAN == []  # nothing runs after stop
    run(main())


@pytest.mark.spec("Q-36", "Q-9")
def test_replayed_delayed_tasks_share_the_one_sleeper() -> None:
    async def main() -> None:
        clock = ManualClock()
        Note.clock = clock
        backend = Memory(now=clock.time)
        first = deferq.Queue(backend, clock=clock, registry=REG)
        for number in range(50):
            first.enqueue(Note, number, delay=5 + number)  # before start: only persisted
        queue = deferq.Queue(backend, clock=clock, registry=REG)
        await queue.start()
        await settle()
        assert queue.delayed == 50 and clock.sleepers == 1
        await drain(queue)
        assert [n for n, _ in RAN] == list(range(50))
        await queue.stop()
    run(main())
