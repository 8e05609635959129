"""Lifecycle hooks: which events a queue sends, when, with what, and what a bad hook can do
(spec/queue.md Q-100..Q-106).

Goal: every step of a task's life (stored, replayed, started, succeeded, retried,
dead-lettered, cancelled, interrupted) reaches the hooks once, in order, with the task's id,
name, attempt and read-only metadata; every started execution ends in exactly one ending
event; a hook that raises is logged and changes nothing; ``enqueue_meta`` only adds; a queue
without hooks builds no event. Method: a recording hook on real queues over the ``Memory``
backend (it keeps dead tasks) and a ``ManualClock``; plain tasks are ``inline`` (the clock
is driven); a restart on a real ``Disk``; the adoption sweep over a ``Memory`` that returns
one orphan. No wall-clock timing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

import deferq
from deferq import (
    Hooks,
    ReplaySource,
    TaskCancelled,
    TaskDeadLettered,
    TaskEnqueued,
    TaskInterrupted,
    TaskReplayed,
    TaskRetryScheduled,
    TaskStarted,
    TaskSucceeded,
)
from deferq._core.limits import HOOKS_MAX, META_ITEMS_MAX
from deferq._core.types import PendingTask
from deferq._runtime import executor as executor_module
from deferq._runtime import hooks as hooks_module
from deferq._runtime import queue as queue_module
from deferq._runtime.serialize import Context, decode_context, encode_context
from deferq.backends import Disk
from deferq.testing import ManualClock, Memory
from tests.queue.helpers import run, settle

REG = deferq.TaskRegistry()
HUNG_S = 30.0
Event = (TaskEnqueued | TaskReplayed | TaskStarted | TaskSucceeded | TaskRetryScheduled
         | TaskDeadLettered | TaskCancelled | TaskInterrupted)


class Recorder(Hooks):
    """Records every event as (method, event), and the thread each came on."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Event]] = []
        self.threads: dict[str, set[int]] = {}

    def _add(self, method: str, event: Event) -> None:
        self.events.append((method, event))
        self.threads.setdefault(method, set()).add(threading.get_ident())

    def on_enqueued(self, event: TaskEnqueued) -> None:
        self._add("enqueued", event)

    def on_replayed(self, event: TaskReplayed) -> None:
        self._add("replayed", event)

    def on_started(self, event: TaskStarted) -> None:
        self._add("started", event)

    def on_succeeded(self, event: TaskSucceeded) -> None:
        self._add("succeeded", event)

    def on_retry_scheduled(self, event: TaskRetryScheduled) -> None:
        self._add("retry", event)

    def on_dead_lettered(self, event: TaskDeadLettered) -> None:
        self._add("dead", event)

    def on_cancelled(self, event: TaskCancelled) -> None:
        self._add("cancelled", event)

    def on_interrupted(self, event: TaskInterrupted) -> None:
        self._add("interrupted", event)

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def of(self, name: str) -> list[Event]:
        return [event for method, event in self.events if method == name]


class Fails(deferq.Task, name="hk.Fails", registry=REG, inline=True):
    max_retries = 1

    def perform(self, n: int) -> None:
        raise ValueError(f"bad {n}")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 5


class Works(deferq.Task, name="hk.Works", registry=REG, inline=True):
    def perform(self, n: int) -> None:
        pass


class Waits(deferq.Task, name="hk.Waits", registry=REG):
    release: asyncio.Event

    async def perform(self) -> None:
        await Waits.release.wait()


def _queue(*hooks: Hooks, backend: Memory | None = None, **options: object
           ) -> tuple[deferq.Queue, ManualClock, Memory]:
    clock = ManualClock()
    memory = Memory(now=clock.time) if backend is None else backend
    queue = deferq.Queue(memory, clock=clock, registry=REG, hooks=list(hooks),
                         **options)  # type: ignore[arg-type]
    return queue, clock, memory


def _ending_events_match_started(recorder: Recorder) -> None:
    """Q-102: every started execution has exactly one later ending event."""
    open_ids: dict[str, int] = {}
    for name, event in recorder.events:
        if name == "started":
            assert event.task_id not in open_ids, f"{event.task_id} started twice at once"
            open_ids[event.task_id] = 1
        elif name in ("succeeded", "retry", "dead", "cancelled", "interrupted"):
            if event.task_id in open_ids:
                del open_ids[event.task_id]
    assert open_ids == {}, f"executions without an ending event: {open_ids}"


# -----------------------------------------------------------------------------


@pytest.mark.spec("Q-100")
@pytest.mark.parametrize("bad", [Recorder(), "hooks", [object()], 7])
def test_hooks_that_are_not_an_iterable_of_hooks_are_refused(bad: object) -> None:
    with pytest.raises(TypeError, match="hooks"):
        deferq.Queue(Memory(), hooks=bad)  # type: ignore[arg-type]


@pytest.mark.spec("Q-100")
def test_more_than_the_most_hooks_are_refused() -> None:
    deferq.Queue(Memory(), hooks=[Hooks() for _ in range(HOOKS_MAX)])
    with pytest.raises(TypeError, match=f"at most {HOOKS_MAX}"):
        deferq.Queue(Memory(), hooks=[Hooks() for _ in range(HOOKS_MAX + 1)])


@pytest.mark.spec("Q-210")
def test_an_async_hook_method_is_refused_naming_the_class_and_method() -> None:
    class Slow(Hooks):
        async def on_started(self, event: TaskStarted) -> None:  # type: ignore[override]
            pass

    with pytest.raises(TypeError, match=r"Slow\.on_started is async"):
        deferq.Queue(Memory(), hooks=[Slow()])


@pytest.mark.spec("Q-211")
def test_only_the_methods_a_hook_overrides_are_called(monkeypatch: pytest.MonkeyPatch) -> None:
    base_calls: list[str] = []

    def recording(self: Hooks, event: object) -> None:
        base_calls.append(type(event).__name__)

    # The base class's own methods would record if the queue called them.
    for method in hooks_module.EVENT_METHODS:
        monkeypatch.setattr(Hooks, method, recording)

    class OnlyStarted(Hooks):
        def __init__(self) -> None:
            self.seen: list[int] = []

        def on_started(self, event: TaskStarted) -> None:
            self.seen.append(event.attempt)

    async def main() -> list[int]:
        hook = OnlyStarted()
        queue, _, _ = _queue(hook)
        await queue.start()
        queue.defer(Works, 1)
        await queue.wait_idle()
        await queue.stop()
        return hook.seen

    assert run(main()) == [1]
    assert base_calls == []


# -----------------------------------------------------------------------------


@pytest.mark.spec("Q-101", "Q-102", "Q-212", "Q-214", "Q-216", "Q-217")
def test_a_failing_task_sends_enqueued_started_retry_started_dead() -> None:
    async def main() -> tuple[Recorder, str, list[object]]:
        recorder = Recorder()
        queue, clock, memory = _queue(recorder)
        await queue.start()
        task_id = queue.defer(Fails.options(meta={"tenant": "acme"}), 3)
        await queue.wait_idle()
        await clock.advance(5)
        await queue.wait_idle()
        await settle()
        await queue.stop()
        return recorder, task_id, list(memory.list_dead_tasks())

    recorder, task_id, dead = run(main())
    assert recorder.names() == ["enqueued", "started", "retry", "started", "dead"]
    assert all(e.task_id == task_id and e.task_name == "hk.Fails" for _, e in recorder.events)
    assert all(dict(e.meta) == {"tenant": "acme"} for _, e in recorder.events)
    enqueued, = recorder.of("enqueued")
    assert isinstance(enqueued, TaskEnqueued) and enqueued.attempt == 1
    assert enqueued.publish_at is None
    assert [e.attempt for e in recorder.of("started")] == [1, 2]
    retry, = recorder.of("retry")
    assert isinstance(retry, TaskRetryScheduled)
    assert (retry.attempt, retry.delay_s, retry.max_attempts) == (1, 5, 2)
    assert isinstance(retry.exception, ValueError) and str(retry.exception) == "bad 3"
    assert retry.duration_s >= 0
    dead_event, = recorder.of("dead")
    assert isinstance(dead_event, TaskDeadLettered)
    assert (dead_event.attempt, dead_event.max_attempts) == (2, 2)
    assert dead_event.duration_s is not None and dead_event.duration_s >= 0
    assert len(dead) == 1  # the event came after the dead-task write
    _ending_events_match_started(recorder)


@pytest.mark.spec("Q-101", "Q-104", "Q-222")
def test_events_carry_the_metadata_read_only() -> None:
    async def main() -> Mapping[str, str]:
        recorder = Recorder()
        queue, _, memory = _queue(recorder)
        await queue.start()
        queue.defer(Works.options(meta={"k": "v"}), 1)
        await queue.wait_idle()
        meta = recorder.of("started")[0].meta
        with pytest.raises(TypeError):
            meta["k"] = "changed"  # type: ignore[index]
        await queue.stop()
        return meta

    assert dict(run(main())) == {"k": "v"}


@pytest.mark.spec("Q-101", "Q-102", "Q-212", "Q-215")
def test_a_success_and_a_delayed_task_and_a_keyed_duplicate() -> None:
    async def main() -> Recorder:
        recorder = Recorder()
        queue, clock, _ = _queue(recorder)
        await queue.start()
        first = queue.defer(Works.options(key="once"), 1)
        assert queue.defer(Works.options(key="once"), 2) == first  # stores nothing
        queue.defer(Works.options(delay=60), 3)
        await queue.wait_idle()
        await clock.advance(60)
        await queue.wait_idle()
        await queue.stop()
        return recorder

    recorder = run(main())
    enqueued = recorder.of("enqueued")
    assert len(enqueued) == 2  # the duplicate sent nothing
    assert [e.publish_at for e in enqueued if isinstance(e, TaskEnqueued)] == [
        None, int(ManualClock().time()) + 60]
    assert recorder.names().count("succeeded") == 2
    for event in recorder.of("succeeded"):
        assert isinstance(event, TaskSucceeded) and 0 <= event.duration_s < HUNG_S
    _ending_events_match_started(recorder)


@pytest.mark.spec("Q-101", "Q-213")
def test_a_restart_sends_replayed_from_start(storage: Path) -> None:
    async def main() -> tuple[Recorder, str]:
        with Disk(path=storage) as disk:
            task_id = deferq.Queue(disk, registry=REG).defer(Works.options(meta={"a": "b"}), 1)
        recorder = Recorder()
        with Disk(path=storage) as disk:
            queue = deferq.Queue(disk, registry=REG, hooks=[recorder])
            await queue.start()
            await queue.wait_idle()
            await queue.stop()
        return recorder, task_id

    recorder, task_id = run(main())
    assert recorder.names() == ["replayed", "started", "succeeded"]
    replayed, = recorder.of("replayed")
    assert isinstance(replayed, TaskReplayed)
    assert (replayed.task_id, replayed.source, replayed.attempt) == (task_id, ReplaySource.START, 1)
    assert dict(replayed.meta) == {"a": "b"}


class OneOrphan(Memory):
    """A Memory whose first sweep adopts one task (a sibling's WAL, as Disk would)."""

    def adopt_orphans(self, files_max: int = 4) -> list[PendingTask]:
        if getattr(self, "adopted", False):
            return []
        self.adopted = True
        record = encode_context(Context("hk.Works", (9,), {}, 2))
        task_id = self.add_task(record)
        return [PendingTask(task_id, record, None)]


@pytest.mark.spec("Q-101", "Q-213")
def test_the_sweep_sends_replayed_adopted_with_the_stored_attempts() -> None:
    async def main() -> Recorder:
        recorder = Recorder()
        queue = deferq.Queue(OneOrphan(), registry=REG, hooks=[recorder], sweep_interval=0.01)
        await queue.start()
        deadline = time.monotonic() + HUNG_S
        while "succeeded" not in recorder.names():
            assert time.monotonic() < deadline, "the orphan never ran"
            await asyncio.sleep(0.01)
        await queue.stop()
        return recorder

    recorder = run(main())
    assert recorder.names() == ["replayed", "started", "succeeded"]
    replayed, = recorder.of("replayed")
    assert isinstance(replayed, TaskReplayed)
    assert (replayed.source, replayed.attempt) == (ReplaySource.ADOPTED, 3)


@pytest.mark.spec("Q-101", "Q-102", "Q-217")
def test_a_task_that_cannot_be_loaded_is_dead_lettered_without_starting() -> None:
    async def main() -> Recorder:
        recorder = Recorder()
        memory = Memory()
        memory.add_task(encode_context(Context("hk.Gone", (), {}, 4, meta={"m": "1"})))
        queue = deferq.Queue(memory, registry=REG, hooks=[recorder])
        await queue.start()
        await queue.stop()
        return recorder

    recorder = run(main())
    assert recorder.names() == ["dead"]
    event, = recorder.of("dead")
    assert isinstance(event, TaskDeadLettered)
    assert (event.task_name, event.attempt, event.duration_s, event.max_attempts) == (
        "hk.Gone", 4, None, None)
    assert dict(event.meta) == {"m": "1"}
    assert isinstance(event.exception, deferq.UnloadableTaskError)


@pytest.mark.spec("Q-101", "Q-102", "Q-218", "Q-220")
def test_cancels_send_one_cancelled_event_in_every_state() -> None:
    async def main() -> tuple[Recorder, dict[str, str]]:
        recorder = Recorder()
        queue, _, _ = _queue(recorder)
        Waits.release = asyncio.Event()
        await queue.start()
        ids = {"delayed": queue.defer(Works.options(delay=60), 1),
               "running": queue.defer(Waits),
               "first-step": queue.defer(Waits)}
        assert await queue.cancel(ids["delayed"])
        assert await queue.cancel(ids["first-step"])  # not begun: reported at its step
        await settle()
        assert await queue.cancel(ids["running"])
        await settle()
        await queue.stop()
        return recorder, ids

    recorder, ids = run(main())
    cancelled = {e.task_id: e for e in recorder.of("cancelled") if isinstance(e, TaskCancelled)}
    assert {ids[k]: cancelled[ids[k]].state for k in ids} == {
        ids["delayed"]: "delayed", ids["running"]: "running", ids["first-step"]: "running"}
    assert len(recorder.of("cancelled")) == 3
    assert [e.task_id for e in recorder.of("started")] == [ids["running"]]
    assert "interrupted" not in recorder.names()
    _ending_events_match_started(recorder)


@pytest.mark.spec("Q-102", "Q-219")
def test_stop_interrupts_a_running_execution() -> None:
    async def main() -> Recorder:
        recorder = Recorder()
        queue, _, memory = _queue(recorder)
        Waits.release = asyncio.Event()
        await queue.start()
        task_id = queue.defer(Waits)
        await settle()
        assert queue.running == 1
        await queue.stop(timeout=0)
        assert [p.task_id for p in memory.pending_tasks()] == [task_id]  # stays in the WAL
        return recorder

    recorder = run(main())
    assert recorder.names() == ["enqueued", "started", "interrupted"]
    event, = recorder.of("interrupted")
    assert isinstance(event, TaskInterrupted) and event.duration_s >= 0


# -----------------------------------------------------------------------------


class AddsMeta(Hooks):
    def __init__(self, extra: object) -> None:
        self.extra = extra

    def enqueue_meta(self, task_name: str) -> Mapping[str, str] | None:
        if isinstance(self.extra, Exception):
            raise self.extra
        return self.extra  # type: ignore[return-value]


def _stored_meta(memory: Memory) -> list[dict[str, str] | None]:
    return [decode_context(p.context).meta for p in memory.pending_tasks()]


@pytest.mark.spec("Q-103")
def test_enqueue_meta_adds_keys_and_the_tasks_own_keys_win() -> None:
    queue, _, memory = _queue(AddsMeta({"traceparent": "tp", "tenant": "hook"}),
                              AddsMeta({"traceparent": "other", "extra": "x"}))
    queue.defer(Works.options(meta={"tenant": "own"}), 1)
    queue.enqueue(Works, 2)
    assert _stored_meta(memory) == [
        {"tenant": "own", "traceparent": "tp", "extra": "x"},
        {"traceparent": "tp", "tenant": "hook", "extra": "x"}]


@pytest.mark.spec("Q-103", "Q-104", "Q-221")
@pytest.mark.parametrize("extra", [
    RuntimeError("no tracer"), 42, {"k": 1}, {"": "v"},
    {f"k{i}": "v" for i in range(META_ITEMS_MAX + 1)}])
def test_a_bad_enqueue_meta_is_logged_and_dropped_never_failing_the_enqueue(
        extra: object, caplog: pytest.LogCaptureFixture) -> None:
    queue, _, memory = _queue(AddsMeta(extra), AddsMeta({"good": "yes"}))
    with caplog.at_level(logging.ERROR, logger="deferq.hooks"):
        queue.defer(Works.options(meta={"own": "1"}), 1)
    assert _stored_meta(memory) == [{"own": "1", "good": "yes"}]
    assert [r.getMessage() for r in caplog.records if r.name == "deferq.hooks"] == [
        "hook AddsMeta.enqueue_meta raised or returned bad metadata for a hk.Works task; "
        "its metadata is dropped"]


# -----------------------------------------------------------------------------


class Raises(Hooks):
    def on_enqueued(self, event: TaskEnqueued) -> None:
        raise RuntimeError("enqueued hook")

    def on_started(self, event: TaskStarted) -> None:
        raise RuntimeError("started hook")

    def on_succeeded(self, event: TaskSucceeded) -> None:
        raise KeyError("succeeded hook")

    def on_cancelled(self, event: TaskCancelled) -> None:
        raise RuntimeError("cancelled hook")


@pytest.mark.spec("Q-104", "Q-105")
def test_a_raising_hook_is_logged_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[Recorder, Memory, str, str]:
        recorder = Recorder()
        queue, _, memory = _queue(Raises(), recorder)
        await queue.start()
        done = queue.defer(Works, 1)
        delayed = queue.defer(Works.options(delay=60), 2)
        await queue.wait_idle()
        assert await queue.cancel(delayed) is True
        await queue.stop()
        return recorder, memory, done, delayed

    with caplog.at_level(logging.ERROR, logger="deferq.hooks"):
        recorder, memory, done, delayed = run(main())
    # The task succeeded and the second hook saw every event, in order after the first.
    assert recorder.names() == ["enqueued", "enqueued", "started", "succeeded", "cancelled"]
    assert memory.pending_tasks() == [] and memory.list_dead_tasks() == []
    lines = [r.getMessage() for r in caplog.records if r.name == "deferq.hooks"]
    assert lines == [
        f"hook Raises.on_enqueued raised on task {done}; ignored",
        f"hook Raises.on_enqueued raised on task {delayed}; ignored",
        f"hook Raises.on_started raised on task {done}; ignored",
        f"hook Raises.on_succeeded raised on task {done}; ignored",
        f"hook Raises.on_cancelled raised on task {delayed}; ignored"]
    assert all(r.exc_info is not None for r in caplog.records if r.name == "deferq.hooks")


@pytest.mark.spec("Q-105")
def test_enqueue_hooks_run_in_the_enqueuing_thread_and_the_others_on_the_loop() -> None:
    async def main() -> tuple[Recorder, int, int]:
        recorder = Recorder()
        queue, _, _ = _queue(recorder)
        await queue.start()
        idents: list[int] = []

        def from_thread() -> None:
            idents.append(threading.get_ident())
            queue.defer(Works, 1)

        thread = threading.Thread(target=from_thread)
        thread.start()
        thread.join(HUNG_S)
        deadline = time.monotonic() + HUNG_S
        while "succeeded" not in recorder.names():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        await queue.stop()
        return recorder, idents[0], threading.get_ident()

    recorder, thread_ident, loop_ident = run(main())
    assert recorder.names() == ["enqueued", "started", "succeeded"]
    assert recorder.threads["enqueued"] == {thread_ident}
    assert recorder.threads["started"] == recorder.threads["succeeded"] == {loop_ident}


# -----------------------------------------------------------------------------


@pytest.mark.spec("Q-106")
def test_a_queue_without_hooks_builds_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    def poisoned(*args: object, **kwargs: object) -> None:
        raise AssertionError("a queue without hooks called hook code")

    for name in ("enqueued", "replayed", "perform_ended", "succeeded", "retry_scheduled",
                 "dead_lettered", "unloadable_dead_lettered", "cancelled", "ended", "add_meta"):
        monkeypatch.setattr(hooks_module.HookSet, name, poisoned)
    # Every event class, in each module that builds events (the hot three are built inline
    # by the queue and the executor).
    poisoned_names = 0
    for module in (hooks_module, executor_module, queue_module):
        for event in ("TaskEnqueued", "TaskReplayed", "TaskStarted", "TaskSucceeded",
                      "TaskRetryScheduled", "TaskDeadLettered", "TaskCancelled",
                      "TaskInterrupted"):
            if hasattr(module, event):
                monkeypatch.setattr(module, event, poisoned)
                poisoned_names += 1
    assert poisoned_names == 8 + 3  # hooks.py's eight, the executor's two, the queue's one

    async def main() -> Memory:
        queue, clock, memory = _queue()
        memory.add_task(encode_context(Context("hk.Works", (0,), {}, 0)))  # replayed
        memory.add_task(b"not json")  # dead-lettered unloadable
        Waits.release = asyncio.Event()
        await queue.start()
        queue.defer(Works, 1)
        queue.defer(Fails, 2)  # a retry, then a give-up
        cancelled = queue.defer(Works.options(delay=60), 3)
        running = queue.defer(Waits)
        await settle()
        assert await queue.cancel(cancelled) and await queue.cancel(running)
        await queue.wait_idle()
        await clock.advance(5)
        await queue.wait_idle()
        await settle()
        await queue.stop()
        return memory

    memory = run(main())
    # The poison would have turned the successes into failures: nothing failed but Fails.
    assert memory.pending_tasks() == []
    assert sorted(t.task_class for t in memory.list_dead_tasks()) == ["<unknown>", "hk.Fails"]


@pytest.mark.spec("Q-105")
def test_hooks_are_called_in_the_order_given_each_returning_before_the_next() -> None:
    calls: list[str] = []

    class Named(Hooks):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_enqueued(self, event: TaskEnqueued) -> None:
            calls.append(f"{self.name} enqueued")

        def on_started(self, event: TaskStarted) -> None:
            calls.append(f"{self.name} started")

        def on_succeeded(self, event: TaskSucceeded) -> None:
            calls.append(f"{self.name} succeeded")

    async def main() -> None:
        queue, _, _ = _queue(Named("b"), Named("a"))
        await queue.start()
        queue.defer(Works, 1)
        await queue.wait_idle()
        await queue.stop()

    run(main())
    assert calls == ["b enqueued", "a enqueued", "b started", "a started", "b succeeded",
                     "a succeeded"]


@pytest.mark.spec("Q-101", "Q-41", "Q-212")
def test_a_cancelled_adefer_still_sends_enqueued_once_its_commit_is_done(
        storage: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> tuple[Recorder, str]:
        recorder = Recorder()
        with Disk(path=storage, fsync_frequency=0) as disk:
            gate = threading.Event()
            real_sync = disk.sync_through

            def held_sync(ticket: int) -> None:
                gate.wait(HUNG_S)
                real_sync(ticket)

            monkeypatch.setattr(disk, "sync_through", held_sync)
            queue = deferq.Queue(disk, registry=REG, hooks=[recorder])
            await queue.start()
            caller = asyncio.ensure_future(queue.adefer(Works, 1))
            for _ in range(5):
                await asyncio.sleep(0)
            [written] = disk.pending_tasks()  # written; its commit is held
            caller.cancel()
            assert recorder.events == []  # not before its commit
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await caller
            deadline = time.monotonic() + HUNG_S
            while "succeeded" not in recorder.names():
                assert time.monotonic() < deadline, recorder.names()
                await asyncio.sleep(0.01)
            assert await queue.stop(timeout=1)
            return recorder, written.task_id

    recorder, task_id = run(main())
    assert recorder.names() == ["enqueued", "started", "succeeded"]
    assert {event.task_id for _, event in recorder.events} == {task_id}
