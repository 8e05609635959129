"""Misuse of the queue raises deferq's own errors (spec/api.md C-22), and the base class is an
ordinary exception. Method: misuse a real queue and check the class and its builtin base."""

from __future__ import annotations

import asyncio

import pytest

import deferq
from deferq.backends import Nil

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
