"""Dependencies reach tasks through the queue, not module globals (spec/queue.md Q-57).

Goal: each queue's ``deps`` object is what its tasks see, typed, in class tasks and in
``@task`` functions (plain, async, and run in another thread), never stored, and a wrong
type is a clear failed execution. Method: two real queues with different deps over the
recording backend run the same tasks; the stored contexts are read back.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

import deferq
from tests.queue.helpers import DrivenClock, RecordingBackend, run, started

REG = deferq.TaskRegistry()


@dataclass
class AppDeps:
    name: str
    sent: list[str] = field(default_factory=list)


class Mail(deferq.Task, name="deps.Mail", registry=REG):
    async def perform(self, to: str) -> None:
        self.deps_as(AppDeps).sent.append(f"class:{to}")


@deferq.task(name="deps.plain", registry=REG)
def plain(to: str) -> None:
    deferq.task_deps(AppDeps).sent.append(f"plain:{to}")


@deferq.task(name="deps.coroutine", registry=REG)
async def coroutine(to: str) -> None:
    await asyncio.sleep(0)
    deferq.task_deps(AppDeps).sent.append(f"async:{to}")


class Strict(deferq.Task, name="deps.Strict", registry=REG):
    max_retries = 0

    def perform(self) -> None:
        self.deps_as(AppDeps)


@pytest.mark.spec("Q-57")
def test_each_queue_gives_its_own_deps_to_class_and_function_tasks() -> None:
    async def main() -> None:
        one, two = AppDeps("one"), AppDeps("two")
        b1, b2 = RecordingBackend(), RecordingBackend()
        q1 = deferq.Queue(b1, registry=REG, clock=DrivenClock(), deps=one)
        q2 = deferq.Queue(b2, registry=REG, clock=DrivenClock(), deps=two)
        await q1.start()
        await q2.start()
        for queue, to in ((q1, "a"), (q2, "b")):
            queue.defer(Mail, to)
            queue.defer(plain, to)
            await queue.adefer(coroutine, to)
        await q1.wait_idle()
        await q2.wait_idle()
        assert sorted(one.sent) == ["async:a", "class:a", "plain:a"]
        assert sorted(two.sent) == ["async:b", "class:b", "plain:b"]
        assert b1.wal == {} and b2.wal == {}
        assert all(b"one" not in t.context for t in b1.dead.values())
        await q1.stop()
        await q2.stop()

    run(main())


@pytest.mark.spec("Q-57", "Q-196", "Q-198")
def test_deps_are_never_stored_and_a_wrong_type_is_a_failed_execution() -> None:
    async def main() -> None:
        backend = RecordingBackend()
        marker = AppDeps("marker-7f3a")
        queue = await started(backend, DrivenClock(auto=True), registry=REG)  # no deps
        task_id = queue.defer(Strict)
        other = deferq.Queue(backend, registry=REG, clock=DrivenClock(), deps=marker)
        kept = other.defer(Mail, "y")  # not started: only stored
        assert all(b"marker-7f3a" not in t.context for t in backend.wal.values())
        await queue.wait_idle()
        for _ in range(20):
            await asyncio.sleep(0)
        dead = backend.dead[task_id]
        assert dead.exception_class == "DepsTypeError"
        assert "the queue's deps is NoneType, not AppDeps" in dead.exception_message
        assert kept in backend.wal
        await queue.stop()

    run(main())


@pytest.mark.spec("Q-57", "Q-197")
def test_a_function_task_sees_the_deps_in_the_thread_that_runs_it() -> None:
    deps = AppDeps("threaded")
    instance = plain.task_class()
    instance.deps = deps
    worker = threading.Thread(target=getattr(instance, "perform"), args=("z",))
    worker.start()
    worker.join()
    assert deps.sent == ["plain:z"]


@pytest.mark.spec("Q-57", "Q-197")
def test_task_deps_outside_an_execution_is_a_clear_error() -> None:
    with pytest.raises(deferq.DepsTypeError, match="only available while a @deferq.task"):
        deferq.task_deps(AppDeps)
    instance = Mail()
    instance.deps = AppDeps("direct")
    assert instance.deps_as(AppDeps).name == "direct"
    with pytest.raises(deferq.DepsTypeError, match="not int") as error:
        instance.deps_as(int)
    assert isinstance(error.value, TypeError) and isinstance(error.value, deferq.DeferqError)
