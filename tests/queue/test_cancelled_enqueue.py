"""A cancelled ``await aenqueue``/``adefer`` still schedules its written task (spec/queue.md Q-41).

Goal: once the ``add`` record is in the WAL, cancelling the caller while it awaits the
group commit must not leave the task to the next start: it runs in this process.
Method: a real ``Disk`` in pytest's tmp directory with ``fsync_frequency=0``; the commit's
``sync_through`` is held on a ``threading.Event`` so the caller is cancelled mid-commit.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import deferq
from deferq.backends import Disk
from tests.queue.helpers import DrivenClock, run

REG = deferq.TaskRegistry()
RAN: list[str] = []


class Note(deferq.Task, name="ac.Note", registry=REG):
    def perform(self, n: int) -> None:
        RAN.append(self.task_id)


@pytest.mark.spec("Q-41", "Q-20", "Q-50")
@pytest.mark.parametrize("call", ["aenqueue", "adefer"])
def test_cancelled_caller_still_runs_the_written_task(storage: Path, call: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    RAN.clear()

    async def main() -> str:
        with Disk(path=storage, fsync_frequency=0) as disk:
            gate = threading.Event()
            real_sync = disk.sync_through

            def held_sync(ticket: int) -> None:
                gate.wait(10)
                real_sync(ticket)

            monkeypatch.setattr(disk, "sync_through", held_sync)
            queue = deferq.Queue(disk, registry=REG, clock=DrivenClock())
            await queue.start()
            pending = queue.aenqueue(Note, 1) if call == "aenqueue" else queue.adefer(Note, 1)
            caller = asyncio.ensure_future(pending)
            for _ in range(5):
                await asyncio.sleep(0)
            [written] = disk.pending_tasks()  # the record is written, the commit is held
            assert not caller.done()
            caller.cancel()
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await caller
            for _ in range(500):  # no restart: this process must run it
                if RAN:
                    break
                await asyncio.sleep(0.01)
            await queue.wait_idle()
            assert await queue.stop(timeout=1)
            return written.task_id

    task_id = run(main())
    assert RAN == [task_id]
    with Disk(path=storage, fsync_frequency=0) as reopened:
        assert reopened.pending_tasks() == []  # it ran and was removed
