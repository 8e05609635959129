"""Log lines an operator greps (spec/queue.md Q-32): each failed attempt names the task id, the
task name, the attempt out of the most there can be and the next delay; a give-up says
"dead-lettered" with the id; a start says what it replayed; a worker says which WAL files it
adopted. Method: run real queues on a real directory and read the records.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import deferq
from deferq.backends import Disk
from deferq.testing import ManualClock, drain

REGISTRY = deferq.TaskRegistry()


class Flaky(deferq.Task, name="logs.Flaky", registry=REGISTRY):
    max_retries = 2

    def perform(self) -> None:
        raise ConnectionError("gateway timeout")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 5 * attempt


class Later(deferq.Task, name="logs.Later", registry=REGISTRY):
    def perform(self) -> None: ...


@pytest.mark.spec("Q-32", "Q-155", "Q-156", "Q-157")
def test_each_attempt_a_give_up_and_a_start_are_one_greppable_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    clock = ManualClock()

    async def run() -> str:
        with Disk(path=path) as disk:  # closed: the next start adopts its WAL file
            queue = deferq.Queue(disk, registry=REGISTRY, clock=clock)
            await queue.start()
            task_id = queue.enqueue(Flaky)
            queue.enqueue(Later, delay=3600)
            await drain(queue, until=clock.time() + 60)
            await queue.stop(timeout=1)
        return task_id

    with caplog.at_level(logging.INFO, logger="deferq"):
        task_id = asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("deferq")]
    failed = [line for line in lines if line.startswith(f"deferred task {task_id} (logs.Flaky)")]
    assert failed == [
        f"deferred task {task_id} (logs.Flaky) attempt 1 of 3 failed: ConnectionError: "
        "gateway timeout; retrying in 5 s",
        f"deferred task {task_id} (logs.Flaky) attempt 2 of 3 failed: ConnectionError: "
        "gateway timeout; retrying in 10 s",
        f"deferred task {task_id} (logs.Flaky) attempt 3 of 3 failed: ConnectionError: "
        "gateway timeout; dead-lettered",
    ]
    give_up = next(r for r in caplog.records if r.getMessage() == failed[-1])
    assert give_up.levelno == logging.ERROR and give_up.exc_info is not None
    assert "queue started: 0 task(s) replayed (0 delayed), 0 unloadable one(s) dead-lettered" in lines

    caplog.clear()

    async def restart() -> None:
        with Disk(path=path) as disk:
            queue = deferq.Queue(disk, registry=REGISTRY, clock=clock)
            await queue.start()
            await queue.stop(timeout=1)

    with caplog.at_level(logging.INFO, logger="deferq"):
        asyncio.run(restart())
    lines = [r.getMessage() for r in caplog.records]
    assert "queue started: 1 task(s) replayed (1 delayed), 0 unloadable one(s) dead-lettered" in lines
    assert any(line.startswith("adopted 1 WAL file(s) holding 1 pending task(s): deferred-0-")
               for line in lines)
