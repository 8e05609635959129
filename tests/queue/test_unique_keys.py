"""Unique keys: one pending task per key and queue, across a restart (spec/queue.md Q-54..Q-56).

Goal: a second ``defer`` with a pending task's key stores nothing and returns its id, for as
long as the task is in the WAL (delayed, running, waiting for a retry), and stores a new task
once it left; the key is rebuilt at replay; queues do not share keys; a duplicate returns
only once the first task is durable. Method: real queues over the recording backend and a
driven clock, over real ``Disk``s in a temporary directory, and over a ``Disk`` on a
simulated machine whose power is cut.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest

import deferq
from deferq._engine.osenv import OS_ENV
from deferq._engine.walorphan import HandoffWal
from deferq._runtime.serialize import Context, encode_context
from deferq.backends import Disk
from deferq.crashtest import SimDisk, SimEnv
from deferq.crashtest._tracing import TracingEnv
from tests.queue.helpers import (
    DrivenClock,
    RecordingBackend,
    recovered_after_power_loss,
    run,
    settle,
    started,
)

REG = deferq.TaskRegistry()
GATE: list[asyncio.Event] = []
RAN: list[str] = []


@deferq.task(name="keys.note", registry=REG, inline=True)  # the driven clock steps the loop
def note(text: str) -> None:
    RAN.append(text)


class Parked(deferq.Task, name="keys.Parked", registry=REG):
    async def perform(self, text: str) -> None:
        await GATE[0].wait()
        RAN.append(text)


class Flaky(deferq.Task, name="keys.Flaky", registry=REG, inline=True):
    max_retries = 1

    def perform(self, text: str) -> None:
        raise RuntimeError(text)

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 60


@pytest.mark.spec("Q-54")
def test_a_key_holds_while_its_task_is_delayed_running_or_retrying_and_frees_after() -> None:
    async def main() -> None:
        RAN.clear()
        GATE[:] = [asyncio.Event()]
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        later = note.options(delay=30, key="k1")
        first = queue.defer(later, "first")
        assert queue.defer(later, "second") == first
        assert await queue.adefer(note.options(key="k1"), "third") == first  # options may differ
        other = queue.defer(note.options(key="k2"), "other")
        assert other != first and len(backend.wal) == 2
        await clock.advance(30)
        assert sorted(RAN) == ["first", "other"] and backend.wal == {}
        again = queue.defer(later, "again")  # succeeded: the key is free
        assert again != first and list(backend.wal) == [again]

        running = queue.defer(Parked.options(key="p"), "parked")
        await settle()
        assert queue.running == 1 and queue.defer(Parked.options(key="p"), "x") == running
        GATE[0].set()
        await queue.wait_idle()
        assert queue.defer(Parked.options(key="p"), "y") != running

        flaky = queue.defer(Flaky.options(key="f"), "boom")
        await queue.wait_idle()
        assert backend.wal[flaky].publish_at is not None  # waiting for its retry
        assert queue.defer(Flaky.options(key="f"), "boom") == flaky
        await clock.advance(60)
        await queue.wait_idle()
        await settle()
        assert flaky in backend.dead and flaky not in backend.wal  # dead-lettered: key free
        assert queue.defer(Flaky.options(key="f"), "boom") != flaky
        queue._book.check_invariants()
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-54", "Q-193")
def test_concurrent_defers_with_one_key_from_threads_and_coroutines_store_one_task() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        keyed = note.options(delay=60, key="same")
        barrier = threading.Barrier(4)  # the default executor has at least 5 threads

        def from_thread() -> str:
            barrier.wait()
            return queue.defer(keyed, "t")

        ids = await asyncio.gather(*(asyncio.to_thread(from_thread) for _ in range(4)),
                                   *(queue.adefer(keyed, "c") for _ in range(8)))
        assert len(set(ids)) == 1 and list(backend.wal) == [ids[0]]
        assert [m for m, _ in backend.calls].count("add_task") == 1
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-55", "Q-53", "Q-194", "Q-195")
def test_keys_survive_a_restart_and_are_per_queue(tmp_path: Path) -> None:
    async def first_run() -> tuple[str, str]:
        with Disk(path=tmp_path) as one, Disk(path=tmp_path) as two:
            q1 = deferq.Queue(one, registry=REG)
            q2 = deferq.Queue(two, registry=REG)
            await q1.start()
            await q2.start()
            a = q1.defer(note.options(delay=3600, key="order-7"), "from q1")
            b = await q2.adefer(note.options(delay=3600, key="order-7"), "from q2")
            assert a != b  # two workers, two WALs: keys are not shared
            assert q1.defer(note.options(key="order-7"), "again") == a
            await q1.stop()
            await q2.stop()
            return a, b

    async def restart(held: str) -> tuple[str, list[str]]:
        with Disk(path=tmp_path) as disk:  # adopts both WALs: two pending tasks, one key
            queue = deferq.Queue(disk, registry=REG)
            await queue.start()
            assert queue.delayed == 2  # neither is dropped
            again = queue.defer(note.options(key="order-7"), "after restart")
            await queue.stop()
            return again, sorted(t.task_id for t in disk.pending_tasks())

    a, b = run(first_run())
    again, pending = run(restart(a))
    assert again in (a, b) and pending == sorted([a, b])


class BlockingEnv(TracingEnv):
    """Holds the group-commit thread's fsync until released."""

    def __init__(self, inner: SimEnv) -> None:
        super().__init__(inner, [])
        self.entered = threading.Event()
        self.release = threading.Event()

    def fsync(self, fd: int) -> None:
        if threading.current_thread().name == "deferq-commit":
            self.entered.set()
            self.release.wait(10)
        super().fsync(fd)


@pytest.mark.slow
@pytest.mark.spec("Q-56")
def test_a_duplicate_returns_only_once_the_first_task_is_durable() -> None:
    sim = SimDisk(0)
    env = BlockingEnv(sim.process())
    disk = Disk(path="/s", fsync_frequency=0, env=env)

    async def main() -> None:
        queue = deferq.Queue(disk, registry=REG, clock=DrivenClock(), rng=random.Random(1))
        await queue.start()
        keyed = note.options(delay=600, key="durable")
        first = asyncio.ensure_future(queue.adefer(keyed, "first"))
        await asyncio.to_thread(env.entered.wait, 10)  # its group commit is stuck in fsync
        assert recovered_after_power_loss(sim) == []  # a power loss now would lose it
        threading.Timer(0.2, env.release.set).start()
        duplicate = queue.defer(keyed, "second")  # waits for the fsync that covers the first
        assert recovered_after_power_loss(sim) == [duplicate]
        assert await first == duplicate
        assert await queue.adefer(keyed, "third") == duplicate
        await queue.stop()

    run(main())
    disk.close()


@pytest.mark.slow
@pytest.mark.spec("Q-55", "Q-58")
def test_a_running_queue_takes_the_keys_of_a_wal_file_it_adopts(tmp_path: Path) -> None:
    async def main() -> None:
        with Disk(path=tmp_path, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, registry=REG, sweep_interval=0.05)
            await queue.start()
            with HandoffWal(OS_ENV, str(tmp_path), disk.prefix) as handoff:
                record = Context("keys.note", ("handed off",), {}, 0, "adopted-key")
                adopted = handoff.add_task(encode_context(record), int(time.time()) + 600)
                handoff.sync()
            for _ in range(500):  # the sweep runs every 0.05 s on the real clock
                if queue.delayed == 1:
                    break
                await asyncio.sleep(0.01)
            assert queue.delayed == 1
            assert queue.defer(note.options(key="adopted-key"), "again") == adopted
            assert await queue.status(adopted) is deferq.TaskStatus.DELAYED
            assert [t.task_id for t in disk.pending_tasks()] == [adopted]
            await queue.stop(timeout=1)

    run(main())
