"""The user-facing testing kit (deferq.testing): Memory, ManualClock, drain, the pytest fixtures.

Goal: a user's test of code that enqueues tasks runs every delay and retry in no wall time,
sees dead tasks, and checks replay, with a backend that behaves like Disk. Method: drive
real queues on the kit; compare Memory with Disk under the same random operations (C-21);
run the pytest plugin's fixtures in a separate pytest run (pytester).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import deferq
from deferq.backends import Disk
from deferq.testing import DrainError, ManualClock, Memory, TestKit, drain

REGISTRY = deferq.TaskRegistry()
RAN: list[tuple[str, float]] = []


class Remind(deferq.Task, name="kit.Remind", registry=REGISTRY):
    def perform(self, who: str) -> None:
        RAN.append((who, self.clock_now()))

    def clock_now(self) -> float:
        return KIT_CLOCK[0].time()


class Flaky(deferq.Task, name="kit.Flaky", registry=REGISTRY):
    max_retries = 3

    async def perform(self) -> None:
        raise ConnectionError("down")


class Forever(deferq.Task, name="kit.Forever", registry=REGISTRY):
    async def perform(self) -> None:
        QUEUE[0].enqueue(Forever, delay=60)


KIT_CLOCK: list[ManualClock] = []
QUEUE: list[deferq.Queue] = []


def _kit() -> TestKit:
    kit = TestKit(registry=REGISTRY)
    KIT_CLOCK[:] = [kit.clock]
    RAN.clear()
    return kit


@pytest.mark.spec("C-21")
def test_drain_runs_delayed_tasks_and_retries_to_the_end_in_no_wall_time() -> None:
    kit = _kit()

    async def main() -> None:
        queue = kit.queue()
        await queue.start()
        start = kit.clock.time()
        queue.enqueue(Remind, "later", delay=3600)
        queue.enqueue(Remind, "now")
        flaky = queue.enqueue(Flaky)
        steps = await kit.drain(queue)
        assert steps >= 4  # one advance for the delayed task, at least one per retry
        assert RAN == [("now", start), ("later", start + 3600)]
        [dead] = kit.backend.list_dead_tasks()
        assert dead.id == flaky and dead.attempts == 4 and dead.exception_class == "ConnectionError"
        assert dead.failed_at >= start + 3  # retries waited on the clock, not the wall
        assert kit.backend.pending_tasks() == []
        await queue.stop(timeout=1)

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 5  # an hour of delays and four retries, run dry


class _Outcomes(deferq.Hooks):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_succeeded(self, event: deferq.TaskSucceeded) -> None:
        self.seen.append(f"ok {event.task_name}")

    def on_dead_lettered(self, event: deferq.TaskDeadLettered) -> None:
        self.seen.append(f"dead {event.task_name} after {event.attempt}")


@pytest.mark.spec("C-21", "Q-100", "Q-212")
def test_a_kit_queue_takes_hooks_and_drain_delivers_their_events() -> None:
    kit = _kit()
    outcomes = _Outcomes()

    async def main() -> None:
        queue = kit.queue(hooks=[outcomes])
        await queue.start()
        queue.enqueue(Remind, "now")
        queue.enqueue(Flaky)
        await kit.drain(queue)
        await queue.stop(timeout=1)

    asyncio.run(main())
    assert sorted(outcomes.seen) == ["dead kit.Flaky after 4", "ok kit.Remind"]


class Slow(deferq.Task, name="kit.Slow", registry=REGISTRY):
    async def perform(self, who: str) -> None:
        await asyncio.sleep(0.001)  # real time: the manual clock never moves in this test
        RAN.append((who, 0.0))


@pytest.mark.spec("Q-185", "Q-11")
@pytest.mark.parametrize("task", [Remind, Slow])
def test_a_wait_for_room_ends_when_executions_make_room_though_the_clock_stands_still(
        task: type[deferq.Task]) -> None:
    kit = _kit()

    async def main() -> None:
        queue = kit.queue(backpressure=deferq.Backpressure(high_water_mark=2, timeout=2))
        await queue.start()

        async def enqueue_all() -> int:
            waited = 0
            for n in range(40):  # no yield between them unless one waits for room
                waited += queue.backlog_size > 2
                await queue.aenqueue(task, f"w{n}")
            return waited

        assert await asyncio.wait_for(enqueue_all(), timeout=10) > 0
        await queue.wait_idle()
        assert kit.clock.time() == KIT_CLOCK[0].time()  # nothing advanced it
        await queue.stop(timeout=1)

    asyncio.run(main())
    assert sorted(who for who, _ in RAN) == sorted(f"w{n}" for n in range(40))


class Blocked(deferq.Task, name="kit.Blocked", registry=REGISTRY):
    async def perform(self) -> None:
        await GATE[0].wait()


GATE: list[asyncio.Event] = []


@pytest.mark.spec("Q-185", "Q-11")
def test_a_wait_for_room_still_times_out_on_the_clock_when_nothing_makes_room() -> None:
    kit = _kit()

    async def main() -> None:
        GATE[:] = [asyncio.Event()]
        queue = deferq.Queue(kit.backend, registry=REGISTRY, clock=kit.clock,
                             max_concurrency=1,
                             backpressure=deferq.Backpressure(high_water_mark=1, timeout=1))
        await queue.start()
        for _ in range(3):  # one runs and holds the only slot; two wait: a backlog of 2
            await asyncio.wait_for(queue.aenqueue(Blocked), timeout=5)
            await asyncio.sleep(0.01)
        assert queue.backlog_size == 2
        waiting = asyncio.ensure_future(queue.aenqueue(Remind, "c"))
        await kit.clock.advance(0.5)
        assert not waiting.done()
        await kit.clock.advance(0.6)  # 20 sleeps of 0.05 s: PushTimeout
        with pytest.raises(deferq.PushTimeout):
            await asyncio.wait_for(waiting, timeout=5)
        assert len(kit.backend.pending_tasks()) == 3  # the one refused stored nothing
        GATE[0].set()
        await queue.stop(timeout=1)

    asyncio.run(main())


@pytest.mark.spec("C-21")
def test_a_second_queue_on_the_kit_replays_what_the_first_left_pending() -> None:
    kit = _kit()

    async def main() -> None:
        first = kit.queue()
        await first.start()
        first.enqueue(Remind, "after-restart", delay=600)
        await first.stop(timeout=1)
        assert len(kit.backend.pending_tasks()) == 1 and RAN == []
        second = kit.queue()
        await second.start()
        await kit.drain(second)
        assert [who for who, _ in RAN] == ["after-restart"]
        await second.stop(timeout=1)

    asyncio.run(main())


def test_drain_refuses_a_real_clock_and_a_queue_that_never_settles() -> None:
    async def main() -> None:
        real = deferq.Queue(Memory(), registry=REGISTRY)
        await real.start()
        with pytest.raises(DrainError, match="ManualClock"):
            await drain(real)
        await real.stop(timeout=1)
        kit = _kit()
        queue = kit.queue()
        QUEUE[:] = [queue]
        await queue.start()
        queue.enqueue(Forever)
        with pytest.raises(DrainError, match="after 5 advances"):
            await drain(queue, max_steps=5)
        # until= bounds the clock instead: what is due later stays pending.
        steps = await drain(queue, until=kit.clock.time() + 120)
        assert steps == 2 and len(kit.backend.pending_tasks()) == 1
        await queue.stop(timeout=1)

    asyncio.run(main())


def test_manual_clock_wakes_sleepers_in_deadline_order() -> None:
    async def main() -> None:
        clock = ManualClock(100)
        woke: list[tuple[str, float]] = []

        async def sleeper(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append((name, clock.time()))

        tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("b", 20), ("a", 10), ("c", 20))]
        await clock.advance(15)
        assert woke == [("a", 110.0)] and clock.time() == 115 and clock.sleepers == 2
        await clock.advance_to(200)
        assert woke == [("a", 110.0), ("b", 120.0), ("c", 120.0)] and clock.time() == 200
        await asyncio.gather(*tasks)
        with pytest.raises(ValueError):
            await clock.advance(-1)

    asyncio.run(main())


# Operations on a backend: add (explicit id), re-add, remove, dead add, dead remove.
_IDS = st.sampled_from(["1-1-1", "1-1-2", "1-1-3", "7-2-1"])
_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), _IDS, st.binary(max_size=8), st.one_of(st.none(), st.integers(1, 10**9))),
    st.tuples(st.just("remove"), _IDS),
    st.tuples(st.just("dead"), _IDS, st.binary(max_size=8), st.integers(0, 30)),
    st.tuples(st.just("undead"), st.lists(_IDS, max_size=3)),
), max_size=25)


def _apply(backend: Disk | Memory, ops: list[tuple[object, ...]]) -> list[object]:
    results: list[object] = []
    for op in ops:
        if op[0] == "add":
            _, tid, ctx, when = op
            assert isinstance(tid, str) and isinstance(ctx, bytes)
            results.append(backend.add_task(ctx, when if isinstance(when, int) else None, tid))
        elif op[0] == "remove":
            assert isinstance(op[1], str)
            results.append(backend.remove_task(op[1]))
        elif op[0] == "dead":
            _, tid, ctx, attempts = op
            assert isinstance(tid, str) and isinstance(ctx, bytes) and isinstance(attempts, int)
            results.append(backend.add_dead_task(tid, ctx, KeyError(tid), task_class="t",
                                                 attempts=attempts))
        else:
            ids = op[1]
            assert isinstance(ids, list)
            results.append(backend.remove_dead_tasks(ids))
    return results


@pytest.mark.slow
@pytest.mark.spec("C-21")
@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_memory_behaves_like_disk(tmp_path_factory: pytest.TempPathFactory,
                                  ops: list[tuple[object, ...]]) -> None:
    path = tmp_path_factory.mktemp("disk") / "s"
    with Disk(path=path, fsync_frequency=0.5) as disk:
        memory = Memory(now=time.time)
        assert _apply(disk, ops) == _apply(memory, ops)
        assert disk.pending_tasks() == memory.pending_tasks()

        def dead_view(backend: Disk | Memory) -> list[tuple[object, ...]]:
            return [(t.id, t.task_class, t.attempts, t.exception_class, t.exception_message,
                     t.context, t.enqueued_at) for t in backend.list_dead_tasks()]

        assert dead_view(disk) == dead_view(memory)
        for limit, offset in ((1, 0), (2, 1), (None, 2)):
            assert [t.id for t in disk.list_dead_tasks(limit=limit, offset=offset)] == \
                [t.id for t in memory.list_dead_tasks(limit=limit, offset=offset)]
    with Disk(path=path) as reopened:  # what survives a restart: the pending tasks
        assert reopened.pending_tasks() == memory.pending_tasks()


@pytest.mark.spec("C-21")
def test_memory_checks_arguments_like_disk_and_refuses_work_when_closed() -> None:
    memory = Memory()
    for call in (lambda: memory.add_task("text"),  # type: ignore[arg-type]
                 lambda: memory.add_task(b"x", publish_at=0),
                 lambda: memory.add_task(b"x", task_id="bad:id"),
                 lambda: memory.list_dead_tasks(limit=-1),
                 lambda: memory.remove_dead_tasks(b"abc")):  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            call()
    memory.add_task(b"x", task_id="1-1-1")
    memory.close()
    with pytest.raises(deferq.StorageClosedError):
        memory.pending_tasks()
    memory.reopen()
    assert [t.task_id for t in memory.pending_tasks()] == ["1-1-1"]


PLUGIN_TEST = '''
import asyncio
import deferq
from deferq.testing import ManualClock, Memory, TestKit

REG = deferq.TaskRegistry()
DONE = []

class Job(deferq.Task, name="plugin.Job", registry=REG):
    def perform(self, n):
        DONE.append(n)

def test_fixtures(deferq_clock, deferq_backend, deferq_kit):
    assert isinstance(deferq_clock, ManualClock) and isinstance(deferq_backend, Memory)
    assert isinstance(deferq_kit, TestKit)
    deferq_kit.registry = REG

    async def main():
        queue = deferq_kit.queue()
        await queue.start()
        queue.enqueue(Job, 1, delay=86400)
        await deferq_kit.drain(queue)
        await queue.stop(timeout=1)

    asyncio.run(main())
    assert DONE == [1]
'''


@pytest.mark.slow
def test_the_pytest_plugin_provides_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["deferq.testing.pytest_plugin"]\n')
    pytester.makepyfile(test_user=PLUGIN_TEST)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
