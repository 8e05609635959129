"""Misuse of the queue raises deferq's own errors (spec/api.md C-22), and the base class is an
ordinary exception; a dead task names them as `deferq.<Name>` (Q-173). Method: misuse a real
queue and check the class and its builtin base; dead-letter each on a real Disk."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

import deferq
from deferq.backends import Disk, Nil

REGISTRY = deferq.TaskRegistry()
OTHER = deferq.TaskRegistry()


class Known(deferq.Task, name="misuse.Known", registry=REGISTRY):
    def perform(self) -> None: ...


class Elsewhere(deferq.Task, name="misuse.Elsewhere", registry=OTHER):
    def perform(self) -> None: ...


@pytest.mark.spec("C-22")
def test_the_base_class_is_an_ordinary_exception() -> None:
    error = deferq.DeferqError("anything")
    assert str(error) == "anything" and isinstance(error, Exception)
    with pytest.raises(deferq.DeferqError):
        raise error


@pytest.mark.spec("C-22")
def test_misuse_raises_deferq_errors_that_keep_their_builtin_kind() -> None:
    async def main() -> None:
        queue = deferq.Queue(Nil(), registry=REGISTRY)
        with pytest.raises(deferq.TaskNotRegisteredError, match="misuse.Elsewhere") as unknown:
            queue.enqueue(Elsewhere)
        assert isinstance(unknown.value, ValueError)
        with pytest.raises(deferq.NotATaskError, match="is not a deferq task") as not_task:
            queue.enqueue(print)
        assert isinstance(not_task.value, TypeError)
        await queue.start()
        with pytest.raises(deferq.QueueStateError, match="cannot start") as twice:
            await queue.start()
        assert isinstance(twice.value, RuntimeError)
        await queue.stop()
        for error in (unknown.value, not_task.value, twice.value):
            assert isinstance(error, deferq.DeferqError)

    asyncio.run(main())


@pytest.mark.spec("Q-173")
def test_a_dead_task_names_deferqs_own_exceptions_by_their_public_name(tmp_path: Path) -> None:
    # docs/queue.md says a timed-out task dies with TaskTimeoutError and an unloadable one with
    # UnloadableTaskError, and `deferq dead list --exception-class` matches exactly: the record
    # said deferq._runtime.errors.TaskTimeoutError, a private path no operator would type and
    # that a refactoring would change under stored records.
    public = {name: value for name in deferq.__all__
              if isinstance(value := getattr(deferq, name), type)
              and issubclass(value, BaseException)}
    assert {"DeferqError", "TaskTimeoutError", "UnloadableTaskError", "DepsTypeError"} <= set(public)
    with Disk(path=tmp_path) as disk:
        for index, (name, cls) in enumerate(public.items(), 1):
            error = cls("why")
            assert pickle.loads(pickle.dumps(error)).args == ("why",), name
            task_id = disk.add_dead_task(f"1-1-{index}", b"{}", error, task_class="app.T",
                                         attempts=1)
            dead = disk.find_dead_task(task_id)
            assert dead is not None and dead.exception_class == f"deferq.{name}", dead
