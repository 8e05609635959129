"""The queue runtime against a recording backend: enqueue, run, retry, give up, replay, stop.

Goal: every transition of spec/queue.md (Q-6..Q-15) and the give-up handoff
order of D-13, with the reference's retry edge cases (reference-behaviour.md
3.1-3.6, 4.7). Method: a ``RecordingBackend`` logs each backend call in order
and a ``DrivenClock`` makes time explicit (``auto=True`` jumps over retry
delays at once); tasks record what they see. No real sleeps. The plain tasks are
``inline`` (Q-38): these tests step the loop by hand, and a thread of the pool would
finish at a time they do not control (tests/queue/test_sync_pool.py covers the pool).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import json
import threading

import pytest

import deferq
from deferq import DeadTasksLockTimeout, PendingTask, PushTimeout
from deferq._runtime.serialize import Context, decode_context, encode_context
from tests.queue.helpers import START, DrivenClock, RecordingBackend, run, settle, started

REG = deferq.TaskRegistry()
LOG: list[tuple[str, object]] = []


class Ok(deferq.Task, name="q.Ok", registry=REG, inline=True):
    def perform(self, *args: object, **kwargs: object) -> None:
        LOG.append(("ok", (args, kwargs, self.attempt, self.task_id)))


class AsyncOk(deferq.Task, name="q.AsyncOk", registry=REG):
    async def perform(self, value: object) -> None:
        await asyncio.sleep(0)
        LOG.append(("async", value))


class Boom(Exception):
    pass


class AlwaysFails(deferq.Task, name="q.AlwaysFails", registry=REG, inline=True):
    def perform(self) -> None:
        LOG.append(("fail", self.attempt))
        raise Boom(f"attempt {self.attempt}")


class FailsThrice(deferq.Task, name="q.FailsThrice", registry=REG, inline=True):
    max_retries = 3

    def perform(self) -> None:
        LOG.append(("fail3", self.attempt))
        raise Boom("no")


class Immediate(deferq.Task, name="q.Immediate", registry=REG, inline=True):
    max_retries = 2
    interval: object = 0

    def perform(self) -> None:
        LOG.append(("imm", self.attempt))
        raise Boom("again")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return type(self).interval


class Abort(deferq.Task, name="q.Abort", registry=REG, inline=True):
    def perform(self) -> None:
        raise Boom("fatal")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return None


@pytest.fixture(autouse=True)
def _clear_log() -> None:
    LOG.clear()


async def drain(queue: deferq.Queue, clock: DrivenClock) -> None:
    """Run until no work is left, jumping over delays (auto clock)."""
    for _ in range(10_000):
        await queue.wait_idle()
        await settle()
        if not queue.delayed and not queue.running and not queue.backlog_size:
            return
        if not clock.auto:
            await clock.advance(10**7)
    raise AssertionError("queue did not drain")


def ctx(name: str, *args: object, attempts: int = 0) -> bytes:
    return encode_context(Context(name, args, {}, attempts))


# ------------------------------------------------------------------ enqueue
@pytest.mark.spec("Q-7")
def test_enqueue_persists_before_returning_and_success_removes() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(Ok, 1, "two", key=[3])
        assert backend.calls == [("add_task", task_id)]  # persisted, nothing ran yet
        assert decode_context(backend.wal[task_id].context) == Context(
            "q.Ok", (1, "two"), {"key": [3]}, 0, None, int(START))
        assert LOG == []
        await queue.wait_idle()
        assert LOG == [("ok", ((1, "two"), {"key": [3]}, 1, task_id))]
        assert backend.methods(task_id) == ["add_task", "remove_task"]
        assert backend.wal == {}
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-7", "Q-138")
def test_async_perform_and_decorated_functions() -> None:
    seen: list[object] = []

    @deferq.task(name="q.fn", registry=REG)
    async def fn(x: int, *, y: int) -> None:
        seen.append(x + y)

    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        queue.enqueue(AsyncOk, "v")
        queue.enqueue(fn, 1, y=2)
        await queue.wait_idle()
        assert LOG == [("async", "v")] and seen == [3]
        assert backend.wal == {}

    run(main())


@pytest.mark.spec("Q-7", "Q-137")
@pytest.mark.parametrize("delay, delay_until, publish_at", [
    (None, None, None),
    (10, None, int(START) + 10),
    (2.9, None, int(START) + 2),
    (0, START + 50, None),          # delay wins whenever it is not None, even 0
    (-5, None, None),
    (0.9, None, None),              # truncates to 0: immediate
    (None, START + 30.7, int(START) + 30),
    (None, START - 30, None),       # past: immediate
    (None, datetime.datetime.fromtimestamp(START + 60, datetime.timezone.utc), int(START) + 60),
])
def test_enqueue_timing(delay: object, delay_until: object, publish_at: int | None) -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(Ok, delay=delay, delay_until=delay_until)
        assert backend.wal[task_id].publish_at == publish_at
        await queue.wait_idle()
        assert bool(LOG) == (publish_at is None)
        if publish_at is not None:
            await clock.advance(publish_at - START - 1)
            assert LOG == []
            await clock.advance(1)
            await queue.wait_idle()
            assert len(LOG) == 1
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-6")
@pytest.mark.parametrize("args, kwargs", [((1, (2, 3)), {}), ((), {"when": datetime.date(2020, 1, 1)}),
                                          ((float("nan"),), {})])
def test_unserializable_arguments_raise_before_storing(args: tuple[object, ...],
                                                       kwargs: dict[str, object]) -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        with pytest.raises(deferq.SerializationError):
            queue.enqueue(Ok, *args, **kwargs)
        assert backend.calls == []

    run(main())


@pytest.mark.spec("Q-1")
def test_enqueue_rejects_what_the_registry_does_not_resolve() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=deferq.TaskRegistry())
        with pytest.raises(ValueError, match="not registered"):
            queue.enqueue(Ok)
        with pytest.raises(TypeError, match="not a deferq task"):
            queue.enqueue(print)
        with pytest.raises(ValueError, match="delay"):
            deferq.Queue(backend, registry=REG).enqueue(Ok, delay="soon")
        assert backend.calls == []

    run(main())


@pytest.mark.spec("Q-7", "Q-138")
def test_enqueue_from_another_thread_runs_on_the_loop() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        ids: list[str] = []
        thread = threading.Thread(target=lambda: ids.append(queue.enqueue(Ok, "t")))
        thread.start()
        await asyncio.to_thread(thread.join)
        await settle()
        await queue.wait_idle()
        assert [entry[0] for entry in LOG] == ["ok"] and backend.wal == {}

    run(main())


# ------------------------------------------------------------------ retries and give-up
@pytest.mark.spec("Q-3", "Q-8", "D-13", "Q-141")
def test_default_task_runs_21_times_then_dead_letters_before_wal_removal() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock(auto=True)
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(AlwaysFails)
        await drain(queue, clock)
        assert [n for _, n in LOG] == list(range(1, 22))
        calls = backend.methods(task_id)
        assert calls == ["add_task"] * 21 + [
            "add_dead_task:start", "add_dead_task:done", "remove_task"]
        dead = backend.dead[task_id]
        assert dead.attempts == 21 and dead.task_class == "q.AlwaysFails"
        assert dead.exception_class == "Boom" and dead.exception_message == "attempt 21"
        assert decode_context(dead.context).attempts == 21
        assert task_id not in backend.wal

    run(main())


@pytest.mark.spec("Q-3", "Q-8", "Q-140")
def test_retry_readds_same_id_with_attempts_and_backoff_delay() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(FailsThrice)
        await queue.wait_idle()
        pending = backend.wal[task_id]
        assert decode_context(pending.context).attempts == 1
        assert pending.publish_at is not None
        delay = pending.publish_at - int(START)
        assert 11 <= delay <= 25  # attempt 1 backoff
        await clock.advance(delay - 1)
        assert len(LOG) == 1
        await clock.advance(1)
        await queue.wait_idle()
        assert len(LOG) == 2 and decode_context(backend.wal[task_id].context).attempts == 2
        await drain(queue, clock)
        assert [n for _, n in LOG] == [1, 2, 3, 4]  # max_retries(3): 4 executions
        assert backend.dead[task_id].attempts == 4

    run(main())


@pytest.mark.spec("Q-3", "Q-8", "Q-135", "Q-140")
@pytest.mark.parametrize("interval", [0, -5, 0.5])
def test_non_positive_retry_interval_retries_at_once(interval: object) -> None:
    Immediate.interval = interval

    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(Immediate)
        await queue.wait_idle()
        assert [n for _, n in LOG] == [1, 2, 3]
        adds = [c for c in backend.calls if c == ("add_task", task_id)]
        assert len(adds) == 3
        assert backend.dead[task_id].attempts == 3
        assert clock.now == START  # no time passed

    run(main())


@pytest.mark.spec("Q-174", "Q-135")
@pytest.mark.parametrize("interval, delay", [(1.5, 1), (2.999, 2), (3, 3)])
def test_a_fractional_retry_interval_is_truncated_to_whole_seconds(
        interval: float, delay: int) -> None:
    Immediate.interval = interval

    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(Immediate)
        await queue.wait_idle()
        assert [n for _, n in LOG] == [1]
        assert backend.wal[task_id].publish_at == int(START) + delay
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-3", "Q-8", "D-13", "Q-135")
def test_retry_interval_none_gives_up_after_one_attempt() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(Abort)
        await queue.wait_idle()
        assert backend.methods(task_id) == [
            "add_task", "add_dead_task:start", "add_dead_task:done", "remove_task"]
        assert backend.dead[task_id].attempts == 1

    run(main())


@pytest.mark.spec("Q-8", "D-13", "Q-142", "Q-32")
def test_failed_dead_write_keeps_the_task_in_the_wal(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        backend.dead_error = DeadTasksLockTimeout("Could not lock the dead tasks store to add a "
                                                  "task to it")
        queue = await started(backend, clock, registry=REG)
        task_id = queue.enqueue(Abort)
        await queue.wait_idle()
        assert backend.methods(task_id) == ["add_task", "add_dead_task:start",
                                            "add_dead_task:failed"]
        assert task_id in backend.wal and backend.dead == {}
        assert decode_context(backend.wal[task_id].context).attempts == 0  # last persisted
        await queue.stop()

    run(main())
    assert "could not be dead-lettered" in caplog.text and "stays in the WAL" in caplog.text
    # the failure's own line never says a task still in the WAL was dead-lettered.
    failed = [r.getMessage() for r in caplog.records if "attempt 1 of " in r.getMessage()]
    assert len(failed) == 1 and failed[0].endswith("not dead-lettered: it stays in the WAL")


@pytest.mark.spec("Q-8")
def test_success_never_touches_the_dead_store() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        for n in range(5):
            queue.enqueue(Ok, n)
        await queue.wait_idle()
        assert {m for m, _ in backend.calls} == {"add_task", "remove_task"}

    run(main())


@pytest.mark.spec("Q-10")
def test_dead_write_runs_off_the_event_loop_thread() -> None:
    threads: list[int] = []

    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        backend.before_dead_write = lambda: threads.append(threading.get_ident())
        queue = await started(backend, clock, registry=REG)
        queue.enqueue(Abort)
        await queue.wait_idle()

    run(main())
    assert threads and threads[0] != threading.get_ident()


# ------------------------------------------------------------------ replay
@pytest.mark.spec("Q-9")
def test_replay_uses_remaining_delays() -> None:
    now = int(START)
    pending = [PendingTask("a", ctx("q.Ok", "a"), None),
               PendingTask("b", ctx("q.Ok", "b"), now - 100),
               PendingTask("c", ctx("q.Ok", "c"), now),
               PendingTask("d", ctx("q.Ok", "d", attempts=4), now + 30)]

    async def main() -> None:
        backend, clock = RecordingBackend(pending), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        await queue.wait_idle()
        assert sorted(e[1][0][0] for e in LOG) == ["a", "b", "c"]  # type: ignore[index]
        await clock.advance(29)
        assert len(LOG) == 3
        await clock.advance(1)
        await queue.wait_idle()
        assert LOG[-1] == ("ok", (("d",), {}, 5, "d"))
        assert backend.wal == {}

    run(main())


@pytest.mark.spec("Q-9")
@pytest.mark.parametrize("context, task_class, reason", [
    (ctx("q.Missing"), "q.Missing", "task 'q.Missing' is not registered"),
    (b"{not json", "<unknown>", "not valid JSON"),
    (b'{"v":1,"task":"q.Ok","args":"x","kwargs":{},"attempts":2}', "q.Ok", "'args' is not a list"),
])
def test_unloadable_task_is_dead_lettered_with_the_reason(
        context: bytes, task_class: str, reason: str) -> None:
    async def main() -> None:
        backend = RecordingBackend([PendingTask("x", context, None),
                                    PendingTask("ok", ctx("q.Ok"), None)])
        queue = await started(backend, DrivenClock(), registry=REG)
        await queue.wait_idle()
        dead = backend.dead["x"]
        assert dead.task_class == task_class and dead.context == context
        assert dead.exception_class == "UnloadableTaskError" and reason in dead.exception_message
        assert backend.methods("x") == ["add_dead_task:start", "add_dead_task:done",
                                        "remove_task"]
        assert backend.wal == {} and len(LOG) == 1  # the rest still ran

    run(main())


@pytest.mark.spec("Q-9")
def test_unloadable_task_stays_in_wal_when_dead_write_fails() -> None:
    async def main() -> None:
        backend = RecordingBackend([PendingTask("x", b"garbage", None)])
        backend.dead_error = OSError("disk full")
        queue = await started(backend, DrivenClock(), registry=REG)
        assert "x" in backend.wal and backend.dead == {}
        await queue.stop()

    run(main())


# ------------------------------------------------------------------ backpressure
@pytest.mark.spec("Q-11", "Q-143", "Q-144")
def test_sync_enqueue_above_high_water_mark_raises_before_persisting() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        bp = deferq.Backpressure(high_water_mark=2, low_water_mark=1, timeout=0.1)
        queue = await started(backend, clock, registry=REG, backpressure=bp)
        for n in range(3):
            queue.enqueue(Ok, n)  # no yield: none picked up yet
        assert queue.backlog_size == 3
        with pytest.raises(PushTimeout):
            queue.enqueue(Ok, 99)
        assert len(backend.wal) == 3
        await queue.wait_idle()
        assert queue.backlog_size == 0
        queue.enqueue(Ok, 4)

    run(main())


@pytest.mark.spec("Q-11", "Q-144")
def test_aenqueue_times_out_after_timeout_iterations_without_persisting() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock(auto=True)
        bp = deferq.Backpressure(high_water_mark=2, timeout=0.2)
        assert bp.low == 2 and bp.iterations == 4
        queue = await started(backend, clock, registry=REG, backpressure=bp)
        queue._scheduler.backlog = 5  # white box: a backlog the loop cannot drain
        with pytest.raises(PushTimeout, match="within 0.2 seconds"):
            await queue.aenqueue(Ok)
        assert clock.sleeps == [0.05] * 4 and backend.calls == []
        queue._scheduler.backlog = 0

    run(main())


@pytest.mark.spec("Q-11")
def test_aenqueue_proceeds_once_backlog_drops_to_low_water_mark() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock(auto=True)
        bp = deferq.Backpressure(high_water_mark=4, low_water_mark=1, timeout=1)
        queue = await started(backend, clock, registry=REG, backpressure=bp)
        for n in range(5):
            queue.enqueue(Ok, n)
        task_id = await queue.aenqueue(Ok, "late")
        assert task_id in backend.wal or ("remove_task", task_id) in backend.calls
        assert clock.sleeps and len(clock.sleeps) < 20
        await queue.wait_idle()
        assert len(LOG) == 6

    run(main())


@pytest.mark.spec("Q-11")
@pytest.mark.parametrize("kwargs", [{"high_water_mark": 0}, {"high_water_mark": 5, "low_water_mark": 6},
                                    {"timeout": -1}, {"high_water_mark": True}])
def test_backpressure_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        deferq.Backpressure(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ stop
class Blocking(deferq.Task, name="q.Blocking", registry=REG):
    gate: asyncio.Event | None = None

    async def perform(self) -> None:
        LOG.append(("blocking", "started"))
        assert Blocking.gate is not None
        await Blocking.gate.wait()
        LOG.append(("blocking", "finished"))


@pytest.mark.spec("Q-15")
def test_stop_waits_for_running_tasks_and_leaves_unrun_work_in_the_wal() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        Blocking.gate = asyncio.Event()
        running = queue.enqueue(Blocking)
        later = queue.enqueue(Ok, delay=60)
        await settle()
        stopping = asyncio.ensure_future(queue.stop(timeout=5))
        await settle()
        not_started = queue.enqueue(Ok, "after stop")  # persisted, not run
        assert not stopping.done()
        Blocking.gate.set()
        assert await stopping is True
        assert ("blocking", "finished") in LOG
        assert running not in backend.wal
        assert set(backend.wal) == {later, not_started}
        assert backend.calls[-1] == ("sync", "")
        await clock.advance(120)
        assert [e for e in LOG if e[0] == "ok"] == []

    run(main())


@pytest.mark.spec("Q-15")
def test_stop_timeout_cancels_running_tasks_which_stay_in_the_wal() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        Blocking.gate = asyncio.Event()
        task_id = queue.enqueue(Blocking)
        await settle()
        stopping = asyncio.ensure_future(queue.stop(timeout=5))
        await clock.advance(4)
        assert not stopping.done()
        await clock.advance(1)
        assert await stopping is False
        assert LOG == [("blocking", "started")]
        assert task_id in backend.wal and backend.dead == {}
        assert queue.running == 0
        # The cancelled execution left the work set: nothing is waited for any more.
        await asyncio.wait_for(queue.wait_idle(), timeout=5)

    run(main())


@pytest.mark.spec("Q-7")
def test_nil_backend_runs_tasks_without_storing() -> None:
    from deferq.backends import Nil

    async def main() -> None:
        queue = deferq.Queue(Nil(), registry=REG, clock=DrivenClock())
        await queue.start()
        task_id = queue.enqueue(Ok, 1)
        assert task_id.startswith("local-")
        await queue.wait_idle()
        assert len(LOG) == 1
        await queue.stop()

    run(main())


# ------------------------------------------------------------------ operator API on the queue
@pytest.mark.spec("Q-33", "Q-158")
def test_queue_retry_dead_tasks_adds_and_syncs_before_removing_with_new_ids() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        old = queue.enqueue(Abort)
        await queue.wait_idle()
        assert old in backend.dead
        backend.calls.clear()
        retried, missing = await queue.retry_dead_tasks([old, "nope"])
        assert missing == ["nope"] and len(retried) == 1
        new = retried[0].new_id
        assert new is not None and new != old
        assert json.loads(retried[0].context)["attempts"] == 0
        order = [m for m, i in backend.calls if m in ("add_task", "sync", "remove_dead_tasks")]
        assert order == ["add_task", "sync", "remove_dead_tasks"]
        await queue.wait_idle()  # it ran again (and gave up again, under its new id)
        assert new in backend.dead and old not in backend.dead

    run(main())


@pytest.mark.spec("Q-13")
def test_queue_dead_task_listing_filters() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        ids = [queue.enqueue(Abort) for _ in range(3)]
        await queue.wait_idle()
        # The three give-ups write to the backend from concurrent to_thread calls, so they
        # land in the order the threads ran (on 3.13 run alone: 1, 3, 2), not in enqueue
        # order; newest first means the reverse of the order the backend received them.
        assert sorted(backend.dead) == sorted(ids)
        newest_first = list(reversed(backend.dead))
        assert [t.id for t in await queue.dead_tasks()] == newest_first
        assert [t.id for t in await queue.dead_tasks(limit=1, offset=1)] == [newest_first[1]]
        assert await queue.dead_tasks(task_class="q.Ok") == []
        assert len(await queue.dead_tasks(task_class="q.Abort", exception_class="Boom")) == 3
        found = await queue.dead_task(ids[0])
        assert found is not None and found.id == ids[0]
        assert await queue.remove_dead_tasks([ids[0], ids[0], "zz"]) == 1

    run(main())


class FloodsThenFails(deferq.Task, name="q.FloodsThenFails", registry=REG, inline=True):
    queue: deferq.Queue | None = None

    def perform(self) -> None:
        LOG.append(("flood", self.attempt))
        assert FloodsThenFails.queue is not None
        FloodsThenFails.queue._scheduler.backlog = 10  # white box: the loop is flooded right now
        raise Boom("retry me")


@pytest.mark.spec("Q-11", "Q-144")
def test_retry_hitting_push_timeout_stays_in_the_wal_as_last_persisted(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock(auto=True)
        bp = deferq.Backpressure(high_water_mark=2, low_water_mark=1, timeout=0.1)
        queue = await started(backend, clock, registry=REG, backpressure=bp)
        FloodsThenFails.queue = queue
        task_id = queue.enqueue(FloodsThenFails)
        await queue.wait_idle()
        queue._scheduler.backlog = 0
        assert LOG == [("flood", 1)]
        assert backend.methods(task_id) == ["add_task"]  # no re-add: still attempts 0
        assert decode_context(backend.wal[task_id].context).attempts == 0
        assert not queue.delayed
        await queue.stop()

    run(main())
    assert "retry not scheduled" in caplog.text and "stays in the WAL" in caplog.text


@pytest.mark.spec("Q-7", "Q-9", "Q-139")
def test_enqueue_before_start_only_persists_and_start_runs_it() -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = deferq.Queue(backend, registry=REG, clock=clock)
        task_id = queue.enqueue(Ok, "early")
        await settle()
        assert LOG == [] and task_id in backend.wal
        await queue.start()
        await queue.wait_idle()
        assert LOG == [("ok", (("early",), {}, 1, task_id))] and backend.wal == {}

    run(main())


# ----------------------------------------------------------------------------- how executions run
# (docs/queue.md: a plain perform is a loop callback, an async one its own asyncio task)


class WhereAmI(deferq.Task, name="q.WhereAmI", registry=REG, inline=True):
    def perform(self) -> None:
        LOG.append(("plain", asyncio.current_task()))


class WhereAmIAsync(deferq.Task, name="q.WhereAmIAsync", registry=REG):
    async def perform(self) -> None:
        LOG.append(("async", asyncio.current_task()))


@deferq.task(name="q.where_fn", registry=REG)
async def where_fn() -> None:
    LOG.append(("async fn", asyncio.current_task()))


class ReturnsAwaitable(deferq.Task, name="q.ReturnsAwaitable", registry=REG, inline=True):
    max_retries = 0
    fail = False

    def perform(self) -> object:
        async def rest() -> None:
            await asyncio.sleep(0)
            LOG.append(("awaited", self.attempt))
            if ReturnsAwaitable.fail:
                raise Boom("in the awaitable")
        return rest()


@pytest.mark.spec("Q-7", "Q-138")
def test_inline_plain_perform_runs_as_a_loop_callback_and_async_perform_in_its_own_task() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        queue = await started(backend, DrivenClock(), registry=REG)
        ids = [queue.enqueue(WhereAmI), queue.enqueue(WhereAmIAsync), queue.enqueue(where_fn)]
        await asyncio.wait_for(queue.wait_idle(), timeout=5)
        assert [kind for kind, _ in LOG] == ["plain", "async", "async fn"]  # scheduling order
        plain, in_task, fn_task = (where for _, where in LOG)
        assert plain is None
        assert in_task is not None and fn_task is not None and in_task is not fn_task
        assert not any(task_id in backend.wal for task_id in ids)
        assert queue.running == 0
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-7", "Q-8", "Q-165")
@pytest.mark.parametrize("fail", [False, True])
def test_a_plain_perform_returning_an_awaitable_is_awaited_before_its_transition(fail: bool) -> None:
    async def main() -> None:
        ReturnsAwaitable.fail = fail
        backend = RecordingBackend()
        queue = await started(backend, DrivenClock(), registry=REG)
        task_id = queue.enqueue(ReturnsAwaitable)
        await asyncio.wait_for(queue.wait_idle(), timeout=5)
        assert LOG == [("awaited", 1)]
        assert task_id not in backend.wal
        if fail:  # max_retries = 0: the failure inside the awaitable gives up at once
            assert backend.dead[task_id].exception_message == "in the awaitable"
            assert [c[0] for c in backend.calls if c[1] == task_id][-2:] == [
                "add_dead_task:done", "remove_task"]
        else:
            assert backend.dead == {}
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-15")
def test_stop_leaves_plain_executions_that_never_began_in_the_wal() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        queue = await started(backend, DrivenClock(), registry=REG)
        ids = [queue.enqueue(Ok, n) for n in range(3)]  # scheduled: none has run yet
        assert await queue.stop(timeout=0) is True
        assert LOG == []
        assert set(ids) <= set(backend.wal)
        await settle()
        assert LOG == [] and queue.running == 0

    run(main())


@pytest.mark.spec("Q-15")
def test_stop_waits_for_a_failed_plain_execution_to_be_retried() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        queue = await started(backend, DrivenClock(), registry=REG)
        task_id = queue.enqueue(AlwaysFails)
        await asyncio.sleep(0)  # the callback ran; its retry continues in an asyncio task
        assert LOG == [("fail", 1)]
        assert await queue.stop(timeout=5) is True
        assert decode_context(backend.wal[task_id].context).attempts == 1  # re-added, stays
        assert queue.running == 0

    run(main())


REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST", default="none")


class SeesContext(deferq.Task, name="q.SeesContext", registry=REG, inline=True):
    def perform(self, n: int) -> None:
        LOG.append(("sees", (n, REQUEST.get())))
        REQUEST.set(f"changed by {n}")  # must not leak into the next execution


@pytest.mark.spec("Q-7", "Q-164")
def test_a_plain_perform_runs_in_a_copy_of_the_context_it_was_enqueued_in() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        queue = await started(backend, DrivenClock(), registry=REG)
        for n, request in enumerate(("a", "b", "c")):
            REQUEST.set(request)
            queue.enqueue(SeesContext, n)
        await asyncio.wait_for(queue.wait_idle(), timeout=5)
        assert LOG == [("sees", (0, "a")), ("sees", (1, "b")), ("sees", (2, "c"))]
        assert REQUEST.get() == "c"  # the enqueuer's own context is untouched
        await queue.stop()

    run(main())
