"""The queue's group commit on a power-safe Disk (spec/queue.md Q-20..Q-23).

Goal: ``await aenqueue`` from many coroutines returns only once the task is durable,
with one fsync covering every enqueue written before it began and none on the event
loop's thread; completions are covered by a background group commit; a failed
commit fails every waiting enqueue. Method: a real ``Queue`` over a ``Disk`` with
``fsync_frequency=0`` on a ``SimDisk`` whose env records which thread ran each fsync;
a power loss is a fresh ``SimDisk`` booted from ``durable_image()``.
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

import deferq
from deferq._core.errors import StorageBrokenError
from deferq.backends import Disk
from deferq.crashtest import FaultRule, FsyncEio, SimDisk, SimEnv
from deferq.crashtest._tracing import TracingEnv
from tests.queue.helpers import DrivenClock, recovered_after_power_loss, run

REG = deferq.TaskRegistry()
GATE: list[asyncio.Event] = []
DONE: list[str] = []


class Parked(deferq.Task, name="gc.Parked", registry=REG):
    async def perform(self, n: int) -> None:
        await GATE[0].wait()


class Quick(deferq.Task, name="gc.Quick", registry=REG):
    def perform(self, n: int) -> None:
        DONE.append(self.task_id)


class Flaky(deferq.Task, name="gc.Flaky", registry=REG):
    """Fails its first attempt (retried at once), succeeds on the second."""

    def perform(self, n: int) -> None:
        DONE.append(f"{self.task_id}/{self.attempt}")
        if self.attempt == 1:
            raise RuntimeError("first attempt fails")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0


class Doomed(deferq.Task, name="gc.Doomed", registry=REG):
    max_retries = 0

    def perform(self, n: int) -> None:
        raise RuntimeError("always fails")


class ThreadEnv(TracingEnv):
    """Records the thread of every WAL fsync."""

    def __init__(self, inner: SimEnv) -> None:
        super().__init__(inner, [])
        self.fsync_threads: list[str] = []

    def fsync(self, fd: int) -> None:
        self.fsync_threads.append(threading.current_thread().name)
        super().fsync(fd)


@pytest.mark.spec("Q-20", "Q-23", "D-15", "W-21", "W-55", "W-56", "Q-145")
def test_sixteen_concurrent_aenqueues_share_one_fsync_and_survive_a_power_loss() -> None:
    sim = SimDisk(0)
    env = ThreadEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0, env=env)

    async def main() -> list[str]:
        GATE[:] = [asyncio.Event()]
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(), rng=random.Random(1))
        await queue.start()
        env.fsync_threads.clear()
        ids = await asyncio.gather(*(queue.aenqueue(Parked, n) for n in range(16)))
        assert len(env.fsync_threads) == 1, env.fsync_threads  # one group commit for all 16
        assert threading.current_thread().name not in env.fsync_threads
        assert recovered_after_power_loss(sim) == sorted(ids)  # power loss right after they returned
        GATE[0].set()
        await queue.wait_idle()
        await queue.stop()
        return ids

    ids = run(main())
    assert len(set(ids)) == 16
    assert recovered_after_power_loss(sim) == []  # every completion was made durable by stop at the latest
    disk.close()


@pytest.mark.spec("Q-22", "Q-23", "Q-148")
def test_completions_are_covered_by_a_background_group_commit_off_the_loop() -> None:
    sim = SimDisk(0)
    env = ThreadEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0, env=env)
    DONE.clear()

    async def main() -> None:
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(), rng=random.Random(1))
        await queue.start()
        env.fsync_threads.clear()
        ids = await asyncio.gather(*(queue.aenqueue(Quick, n) for n in range(8)))
        await queue.wait_idle()
        assert sorted(DONE) == sorted(ids)
        assert disk.pending_tasks() == []  # the removals are written...
        flusher = queue._journal._flusher
        if flusher is not None:
            await flusher
        assert recovered_after_power_loss(sim) == []  # ...and durable without stop()
        assert threading.current_thread().name not in env.fsync_threads
        assert len(env.fsync_threads) < 16  # shared: 8 adds and 8 removals
        await queue.stop()

    run(main())
    disk.close()


@pytest.mark.spec("Q-21", "D-1")
def test_the_synchronous_enqueue_on_a_power_safe_disk_still_fsyncs_inline() -> None:
    sim = SimDisk(0)
    disk = Disk(path="/s", fsync_frequency=0, env=sim.process())

    async def main() -> str:
        GATE[:] = [asyncio.Event()]
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(), rng=random.Random(1))
        await queue.start()
        task_id = queue.enqueue(Parked, 1)
        assert recovered_after_power_loss(sim) == [task_id]  # durable before enqueue returned
        GATE[0].set()
        await queue.stop()
        return task_id

    run(main())
    disk.close()


@pytest.mark.spec("Q-20", "D-16", "W-22", "Q-146")
def test_a_failed_group_commit_fails_every_waiting_aenqueue() -> None:
    sim = SimDisk(0)
    disk = Disk(path="/s", fsync_frequency=0, env=sim.process())
    DONE.clear()

    async def main() -> None:
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(), rng=random.Random(1))
        await queue.start()
        sim.inject(FaultRule(op="fsync", fault=FsyncEio(), path="/s/deferred-0-*"))
        results = await asyncio.gather(*(queue.aenqueue(Quick, n) for n in range(16)),
                                       return_exceptions=True)
        assert all(isinstance(r, StorageBrokenError) for r in results), results
        await queue.wait_idle()
        assert DONE == [] and queue.backlog_size == 0  # nothing acknowledged was scheduled
        with pytest.raises(StorageBrokenError):
            await queue.aenqueue(Quick, 99)
        with pytest.raises(StorageBrokenError):
            await queue.stop()

    run(main())
    disk.close()


@pytest.mark.spec("Q-22", "Q-23", "D-13", "Q-8", "Q-148")
def test_retries_and_give_ups_are_written_unsynced_and_made_durable_in_the_background() -> None:
    sim = SimDisk(0)
    env = ThreadEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0, env=env)
    DONE.clear()

    async def main() -> tuple[str, str]:
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(auto=True),
                             rng=random.Random(1))
        await queue.start()
        env.fsync_threads.clear()
        flaky = await queue.aenqueue(Flaky, 1)
        doomed = await queue.aenqueue(Doomed, 2)
        await queue.wait_idle()
        assert DONE == [f"{flaky}/1", f"{flaky}/2"]
        assert disk.pending_tasks() == []
        assert [t.id for t in disk.list_dead_tasks()] == [doomed]  # written before the removal
        flusher = queue._journal._flusher
        if flusher is not None:
            await flusher
        assert threading.current_thread().name not in env.fsync_threads
        assert recovered_after_power_loss(sim) == []  # the re-add, removals: durable without stop()
        await queue.stop()
        return flaky, doomed

    run(main())
    disk.close()


@pytest.mark.spec("Q-147")
def test_an_aenqueue_before_start_is_durable_when_it_returns() -> None:
    sim = SimDisk(0)
    disk = Disk(path="/s", fsync_frequency=0, env=sim.process())

    async def main() -> str:
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(), rng=random.Random(1))
        return await queue.aenqueue(Quick, 1)  # no committer yet: fsynced inline

    task_id = run(main())
    assert recovered_after_power_loss(sim) == [task_id]
    disk.close()


@pytest.mark.spec("Q-149", "W-22")
def test_a_failed_background_commit_is_logged_and_the_next_enqueue_and_stop_raise(
        caplog: pytest.LogCaptureFixture) -> None:
    sim = SimDisk(0)
    disk = Disk(path="/s", fsync_frequency=0, env=sim.process())
    DONE.clear()

    async def main() -> None:
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(), rng=random.Random(1))
        await queue.start()
        task_id = await queue.aenqueue(Quick, 1)  # durable before the fault
        sim.inject(FaultRule(op="fsync", fault=FsyncEio(), path="/s/deferred-0-*"))
        await queue.wait_idle()  # the success's removal: written unsynced, then the commit fails
        flusher = queue._journal._flusher
        if flusher is not None:
            await asyncio.gather(flusher, return_exceptions=True)
        assert DONE == [task_id]
        assert disk._wal.broken
        with pytest.raises(StorageBrokenError):
            await queue.aenqueue(Quick, 2)
        with pytest.raises(StorageBrokenError):
            await queue.stop()

    with caplog.at_level("ERROR", logger="deferq"):
        run(main())
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(m.startswith("group commit of the tasks WAL failed") for m in errors), errors
    disk.close()
