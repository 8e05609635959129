"""Hooks of a queue on PostgreSQL: a claimed task is reported as replayed from ``CLAIMED``
(spec/queue.md Q-101).

Goal: a due task another process added, which this queue claims, reaches the hooks as
``on_replayed`` with ``source`` ``CLAIMED``, then started and succeeded. Method: a real server
(``tests/postgres/cluster.py``), a producer that runs no queue, a bounded wait.
"""

from __future__ import annotations

import asyncio

import pytest

import deferq
from deferq import Hooks, ReplaySource, TaskReplayed, TaskStarted, TaskSucceeded
from deferq._runtime.serialize import JSON_CODEC, Context
from deferq.backends import Postgres
from tests.postgres.conftest import PgSchema

REG = deferq.TaskRegistry()


class Noop(deferq.Task, name="pgh.Noop", registry=REG):
    def perform(self, n: int) -> None:
        pass


class Recorder(Hooks):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, object]] = []

    def on_replayed(self, event: TaskReplayed) -> None:
        self.events.append(("replayed", event.task_id, event.source))

    def on_started(self, event: TaskStarted) -> None:
        self.events.append(("started", event.task_id, event.attempt))

    def on_succeeded(self, event: TaskSucceeded) -> None:
        self.events.append(("succeeded", event.task_id, None))


@pytest.mark.spec("Q-101", "Q-213")
def test_a_claimed_task_is_replayed_from_claimed(pg: PgSchema) -> None:
    recorder = Recorder()

    async def scenario() -> str:
        options: dict[str, object] = {"poll_seconds": 0.05}
        with Postgres(dsn=pg.dsn, schema=pg.schema, create_schema=True,
                      **options) as db, Postgres(  # type: ignore[arg-type]
                dsn=pg.dsn, schema=pg.schema, **options) as producer:  # type: ignore[arg-type]
            queue = deferq.Queue(db, registry=REG, hooks=[recorder])
            await queue.start()
            task_id = producer.add_task(JSON_CODEC.encode(Context("pgh.Noop", (1,), {}, 0)))
            assert task_id is not None
            deadline = asyncio.get_running_loop().time() + 20
            while len(recorder.events) < 3:
                assert asyncio.get_running_loop().time() < deadline, recorder.events
                await asyncio.sleep(0.02)
            assert await queue.stop(5)
            return task_id

    task_id = asyncio.run(scenario())
    assert recorder.events == [("replayed", task_id, ReplaySource.CLAIMED),
                               ("started", task_id, 1), ("succeeded", task_id, None)]
