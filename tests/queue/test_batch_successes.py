"""The inline successes of one run-soon batch are removed together (spec/queue.md Q-170).

Goal: the removals of a batch's successes go to the backend in one ``remove_tasks`` call
after the batch (or earlier, once the hold passed), each task is still stored until then,
a storage error of that call leaves them all stored and ends each as interrupted, and a
backend without ``remove_tasks`` gets one ``remove_task`` per success. Method: real queues
on a real ``Disk`` (a subclass counts the calls) or ``Memory``, inline tasks enqueued
without awaiting in between, so one event-loop callback runs them all; a task that sleeps
past the hold. The only time read is a lower bound: a sleep of twice the hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import pytest

import deferq
from deferq import Hooks, TaskInterrupted, TaskStarted, TaskSucceeded
from deferq._runtime.successes import SUCCESS_HOLD_S
from deferq.backends import Disk
from deferq.testing import Memory

REG = deferq.TaskRegistry()


class Seen:
    """What the tasks observed of the backend while they ran."""

    disk: ClassVar[Disk | Memory | None] = None
    pending: ClassVar[list[list[str]]] = []


class Quick(deferq.Task, name="batch.Quick", registry=REG, inline=True):
    def perform(self, number: int) -> None:
        pass


class Looks(deferq.Task, name="batch.Looks", registry=REG, inline=True):
    """Records the ids stored as pending when it runs."""

    def perform(self) -> None:
        assert Seen.disk is not None
        Seen.pending.append([t.task_id for t in Seen.disk.pending_tasks()])


class Slow(deferq.Task, name="batch.Slow", registry=REG, inline=True):
    def perform(self) -> None:
        time.sleep(2 * SUCCESS_HOLD_S)


class CountingDisk(Disk):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.batches: list[list[str]] = []
        self.singles: list[str] = []
        self.fail_batches = 0

    def remove_tasks(self, task_ids: Iterable[str], *, sync: bool = True) -> int:
        ids = list(task_ids)
        self.batches.append(ids)
        if self.fail_batches:
            self.fail_batches -= 1
            raise OSError(28, "No space left on device (injected)")
        return super().remove_tasks(ids, sync=sync)

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        self.singles.append(task_id)
        super().remove_task(task_id, sync=sync)


class CountingMemory(Memory):
    def __init__(self) -> None:
        super().__init__()
        self.singles: list[str] = []

    def remove_task(self, task_id: str, *, sync: bool = True) -> None:
        self.singles.append(task_id)
        super().remove_task(task_id, sync=sync)


class Ends(Hooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.durations: dict[str, float] = {}

    def on_started(self, event: TaskStarted) -> None:
        self.events.append(("started", event.task_id))

    def on_succeeded(self, event: TaskSucceeded) -> None:
        self.events.append(("succeeded", event.task_id))
        self.durations[event.task_id] = event.duration_s

    def on_interrupted(self, event: TaskInterrupted) -> None:
        self.events.append(("interrupted", event.task_id))


@pytest.fixture(autouse=True)
def _fresh_seen() -> None:
    Seen.disk, Seen.pending = None, []


async def _run_batch(backend: Disk | Memory, tasks: list[tuple[type[deferq.Task], tuple[int, ...]]],
                     hooks: list[Hooks] | None = None) -> list[str]:
    Seen.disk = backend
    queue = deferq.Queue(backend, registry=REG, hooks=hooks or [])
    await queue.start()
    ids = [queue.enqueue(cls, *args) for cls, args in tasks]  # no await: one batch
    await queue.wait_idle()
    await queue.stop()
    return ids


@pytest.mark.spec("Q-170", "Q-8", "C-38")
def test_the_successes_of_a_batch_are_removed_in_one_call(tmp_path: Path) -> None:
    disk = CountingDisk(path=tmp_path)
    with disk:
        ids = asyncio.run(_run_batch(disk, [(Quick, (n,)) for n in range(20)]))
        assert disk.batches == [ids]
        assert disk.singles == []
        assert disk.pending_tasks() == []


@pytest.mark.spec("Q-170", "C-38")
def test_a_backend_without_remove_tasks_gets_one_remove_task_per_success() -> None:
    memory = CountingMemory()
    ids = asyncio.run(_run_batch(memory, [(Quick, (n,)) for n in range(5)]))
    assert memory.singles == ids
    assert memory.pending_tasks() == []


@pytest.mark.spec("Q-170")
def test_a_held_success_stays_stored_until_its_batch_ends(tmp_path: Path) -> None:
    disk = CountingDisk(path=tmp_path)
    with disk:
        first, looks = asyncio.run(_run_batch(disk, [(Quick, (1,)), (Looks, ())]))
        # Looks ran after Quick succeeded, in the same batch: Quick's removal was not written.
        assert Seen.pending == [[first, looks]]
        assert disk.batches == [[first, looks]]
        assert disk.pending_tasks() == []


@pytest.mark.spec("Q-170")
def test_a_success_held_past_the_hold_is_written_before_the_next_execution(
        tmp_path: Path) -> None:
    disk = CountingDisk(path=tmp_path)
    with disk:
        first, slow, looks = asyncio.run(_run_batch(
            disk, [(Quick, (1,)), (Slow, ()), (Looks, ())]))
        # Slow ran for twice the hold after Quick's success was held: both were written
        # before Looks began; Looks's own removal came at the end of the batch.
        assert Seen.pending == [[looks]]
        assert disk.batches == [[first, slow], [looks]]


@pytest.mark.spec("Q-170", "Q-219", "Q-102")
def test_a_storage_error_leaves_every_success_of_the_write_stored(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ends = Ends()

    async def main(disk: CountingDisk) -> tuple[list[str], list[str]]:
        queue = deferq.Queue(disk, registry=REG, hooks=[ends])
        await queue.start()
        failed = [queue.enqueue(Quick, n) for n in range(7)]
        await queue.wait_idle()
        after = [queue.enqueue(Quick, 9)]  # the queue goes on
        await queue.wait_idle()
        await queue.stop()
        return failed, after

    disk = CountingDisk(path=tmp_path)
    with disk:
        disk.fail_batches = 1
        with caplog.at_level(logging.ERROR, logger="deferq.queue"):
            failed, after = asyncio.run(main(disk))
        assert [t.task_id for t in disk.pending_tasks()] == failed
    lines = [r.getMessage() for r in caplog.records if "storage error" in r.getMessage()]
    assert lines == [f"deferred tasks {', '.join(failed[:5])} and 2 more: storage error; "
                     "they stay in the WAL"]
    endings = {task_id: kind for kind, task_id in ends.events if kind != "started"}
    assert endings == {**{t: "interrupted" for t in failed}, after[0]: "succeeded"}
    with Disk(path=tmp_path) as reopened:  # and they are replayed
        assert [t.task_id for t in reopened.pending_tasks()] == failed


@pytest.mark.spec("Q-215", "Q-170")
def test_a_held_success_measures_its_perform_not_the_wait_for_the_write(tmp_path: Path) -> None:
    ends = Ends()
    disk = CountingDisk(path=tmp_path)
    with disk:
        first, slow = asyncio.run(_run_batch(disk, [(Quick, (1,)), (Slow, ())], [ends]))
        assert disk.batches == [[first, slow]]  # Quick's removal waited for Slow's perform
    assert ends.durations[slow] >= 2 * SUCCESS_HOLD_S
    assert ends.durations[first] < SUCCESS_HOLD_S  # a no-op: microseconds, not the wait
    assert [kind for kind, _ in ends.events] == ["started", "started", "succeeded", "succeeded"]
