"""The queue's adoption sweep in one process (spec/queue.md Q-70..Q-72, spec/api.md C-28).

Goal: a running queue adopts orphaned WAL files every ``sweep_interval`` seconds and runs
their tasks as a start would (remaining delay, stored attempts, unloadable ones
dead-lettered); ``stop`` waits for a sweep in flight and starts no other; failures are
logged and retried, a broken backend ends the sweeping; a backend without
``adopt_orphans`` runs without a sweep. Method: a real ``Disk`` in ``tmp_path`` with a short
interval, orphans written by ``HandoffWal`` (the file ``deferq dead retry`` writes); for the
lifecycle, small backends over ``Memory`` whose ``adopt_orphans`` blocks or fails on cue.
Waits are on events with a deadline, never bare sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest

import deferq
from deferq._core.errors import StorageBrokenError
from deferq._core.types import PendingTask
from deferq._engine.osenv import OS_ENV
from deferq._engine.walorphan import HandoffWal
from deferq._runtime.serialize import Context, encode_context
from deferq.backends import Disk
from deferq.testing import Memory
from tests.queue.helpers import RecordingBackend, run

REG = deferq.TaskRegistry()
RAN: list[tuple[str, int, int]] = []
RAN_EVENT: asyncio.Event | None = None


class Job(deferq.Task, name="sw.Job", registry=REG):
    def perform(self, n: int) -> None:
        RAN.append((self.task_id, self.attempt, n))
        if RAN_EVENT is not None:
            RAN_EVENT.set()


def context(n: int, attempts: int = 0, task: str = "sw.Job") -> bytes:
    return encode_context(Context(task, (n,), {}, attempts))


async def wait_until(predicate: object, timeout_s: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.slow
@pytest.mark.spec("Q-70", "W-34", "C-28")
def test_a_running_queue_adopts_a_handoff_file_and_runs_it_as_a_start_would(
        storage: Path) -> None:
    RAN.clear()

    async def main() -> tuple[list[PendingTask], int, list[str]]:
        with Disk(path=storage, fsync_frequency=0) as disk:
            queue = deferq.Queue(disk, registry=REG, sweep_interval=0.05)
            await queue.start()
            with HandoffWal(OS_ENV, str(storage), disk.prefix) as handoff:
                now = int(time.time())
                ready = handoff.add_task(context(1, attempts=2))
                later = handoff.add_task(context(2), now + 600)
                lost = handoff.add_task(context(3, task="sw.Unknown"))
                handoff.sync()
            started = time.monotonic()
            await wait_until(lambda: RAN and queue.delayed == 1)
            # The unloadable one is dead-lettered, then removed from the WAL (Q-9, D-13).
            await wait_until(lambda: [t.task_id for t in disk.pending_tasks()] == [later])
            elapsed = time.monotonic() - started
            await queue.wait_idle()
            assert RAN == [(ready, 3, 1)]  # attempts stored 2: this is the third attempt
            assert disk.find_dead_task(lost) is not None
            pending = disk.pending_tasks()  # the delayed one waits: its delay is honoured
            await queue.stop(timeout=1)
            dead = [t.id for t in disk.list_dead_tasks()]
            return pending, int(elapsed * 1000), dead

    pending, elapsed_ms, dead = run(main())
    assert elapsed_ms < 5000
    assert len(dead) == 1
    files = sorted(p.name for p in storage.iterdir() if p.name.startswith("deferred-0-"))
    assert len(files) == 1  # the hand-off file was adopted and unlinked (W-32)
    assert pending[0].publish_at is not None


class BlockingMemory(Memory):
    """A Memory whose sweep blocks until released, then returns one task."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def adopt_orphans(self, files_max: int = 4) -> list[PendingTask]:
        self.calls += 1
        if self.calls > 1:
            return []
        self.entered.set()
        assert self.release.wait(10)
        task_id = self.add_task(context(7))
        return [PendingTask(task_id, context(7), None)]


@pytest.mark.spec("Q-71", "Q-70")
def test_stop_waits_for_a_sweep_in_flight_and_starts_no_other() -> None:
    RAN.clear()
    backend = BlockingMemory()

    async def main() -> None:
        queue = deferq.Queue(backend, registry=REG, sweep_interval=0.01)
        await queue.start()
        await asyncio.to_thread(backend.entered.wait, 10)
        stopping = asyncio.ensure_future(queue.stop(timeout=5))
        await asyncio.sleep(0.05)
        assert not stopping.done()  # waits for the sweep in flight
        backend.release.set()
        await stopping
        calls = backend.calls
        await asyncio.sleep(0.05)
        assert backend.calls == calls == 1  # no sweep after stop

    run(main())
    # The task adopted by the sweep in flight was scheduled and ran before stop finished.
    assert [n for _, _, n in RAN] == [7]


class FailingMemory(Memory):
    def __init__(self, errors: list[BaseException]) -> None:
        super().__init__()
        self.errors = errors
        self.calls = 0

    def adopt_orphans(self, files_max: int = 4) -> list[PendingTask]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return []


@pytest.mark.spec("Q-71", "Q-206")
def test_a_failed_sweep_is_logged_and_retried_and_a_broken_backend_ends_sweeping(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="deferq.queue")
    retried = FailingMemory([OSError(5, "Input/output error")])
    broken = FailingMemory([StorageBrokenError("fsync of the tasks WAL failed")])

    async def main() -> None:
        for backend in (retried, broken):
            queue = deferq.Queue(backend, registry=REG, sweep_interval=0.01)
            await queue.start()
            await wait_until(lambda: backend.calls >= 3 or (backend is broken and backend.calls))
            await asyncio.sleep(0.1)
            await queue.stop(timeout=1)

    run(main())
    assert retried.calls >= 3
    assert broken.calls == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("adoption sweep failed (OSError" in m for m in messages)
    assert sum("adoption sweep stopped: fsync of the tasks WAL failed" in m for m in messages) == 1


@pytest.mark.spec("Q-72")
@pytest.mark.parametrize("bad", [0, 0.001, -1, 3601, float("nan"), float("inf"), True, "2", None])
def test_a_bad_sweep_interval_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="sweep_interval"):
        deferq.Queue(Memory(), registry=REG, sweep_interval=bad)  # type: ignore[arg-type]


@pytest.mark.spec("Q-72")
@pytest.mark.parametrize("good", [0.01, 2, 3600.0])
def test_a_good_sweep_interval_is_accepted(good: float) -> None:
    deferq.Queue(Memory(), registry=REG, sweep_interval=good)


@pytest.mark.spec("C-28")
def test_a_backend_without_adopt_orphans_runs_without_a_sweep() -> None:
    RAN.clear()
    backend = RecordingBackend()
    assert not hasattr(backend, "adopt_orphans")

    async def main() -> None:
        queue = deferq.Queue(backend, registry=REG, sweep_interval=0.01)
        assert queue._sweeper is None  # nothing to call: no sweep task is started
        await queue.start()
        queue.enqueue(Job, 5)
        await queue.wait_idle()
        await asyncio.sleep(0.05)
        await queue.stop(timeout=1)

    run(main())
    assert [n for _, _, n in RAN] == [5]
