"""``stop`` is bounded even when a task swallows its cancellation (spec/queue.md Q-35).

Goal: a task that catches ``CancelledError`` and keeps running must not hold ``stop``
forever: ``stop(timeout)`` returns within ``timeout + STOP_GRACE_S``, logs a warning that
names the task ids that ignored the cancellation, and leaves those tasks in the WAL
(at-least-once) even when they end later. Method: real asyncio tasks that swallow
cancellation, first on a ``DrivenClock`` (exact: not returned just before the grace ends,
returned at its end), then on the real clock, measured with a generous margin. Every
``stop`` is awaited under a real-time ``wait_for`` so that the old behaviour (waiting
forever) fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import deferq
from deferq._runtime.scheduler import STOP_GRACE_S
from tests.queue.helpers import DrivenClock, RecordingBackend, run, settle, started

REG = deferq.TaskRegistry()
LOG: list[tuple[str, str]] = []
# Real seconds an await may take before the test calls it hung (the old stop never returns).
HUNG_S = 10.0


class Stubborn(deferq.Task, name="grace.Stubborn", registry=REG):
    """Catches its cancellation and keeps running until ``release`` is set."""

    release: asyncio.Event

    async def perform(self) -> None:
        LOG.append(("stubborn", self.task_id))
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            LOG.append(("swallowed", self.task_id))
        await Stubborn.release.wait()
        LOG.append(("ended", self.task_id))


class Polite(deferq.Task, name="grace.Polite", registry=REG):
    """Runs until cancelled, and lets the cancellation end it."""

    async def perform(self) -> None:
        await asyncio.Event().wait()


@pytest.fixture(autouse=True)
def _clear() -> None:
    LOG.clear()


@pytest.mark.spec("Q-35", "Q-15")
def test_stop_returns_after_the_grace_names_the_stubborn_task_and_keeps_it_in_the_wal(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        Stubborn.release = asyncio.Event()
        stubborn = queue.enqueue(Stubborn)
        polite = queue.enqueue(Polite)
        await settle()
        assert LOG == [("stubborn", stubborn)]
        stopping = asyncio.ensure_future(queue.stop(timeout=5))
        await clock.advance(5)  # the timeout: both are cancelled
        assert ("swallowed", stubborn) in LOG
        assert not stopping.done()
        await clock.advance(STOP_GRACE_S - 0.01)
        assert not stopping.done()
        await clock.advance(0.01)  # the grace has ended
        assert await asyncio.wait_for(stopping, HUNG_S) is False
        assert polite in backend.wal and stubborn in backend.wal
        assert backend.calls[-1] == ("sync", "")
        warnings = [r.getMessage() for r in caplog.records
                    if r.name == "deferq.queue" and r.levelno == logging.WARNING]
        assert len(warnings) == 1 and stubborn in warnings[0] and polite not in warnings[0]
        # The stubborn task ends after stop returned: its outcome is not recorded.
        Stubborn.release.set()
        await settle()
        assert ("ended", stubborn) in LOG
        assert stubborn in backend.wal
        assert ("remove_task", stubborn) not in backend.calls

    with caplog.at_level(logging.WARNING, logger="deferq"):
        run(main())


@pytest.mark.spec("Q-35", "Q-15")
def test_a_task_that_swallows_cancellation_but_ends_within_the_grace_is_recorded(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        backend, clock = RecordingBackend(), DrivenClock()
        queue = await started(backend, clock, registry=REG)
        Stubborn.release = asyncio.Event()
        stubborn = queue.enqueue(Stubborn)
        await settle()
        stopping = asyncio.ensure_future(queue.stop(timeout=5))
        await clock.advance(5)
        Stubborn.release.set()  # it ends its cleanup within the grace
        assert await asyncio.wait_for(stopping, HUNG_S) is False
        assert ("ended", stubborn) in LOG
        assert stubborn not in backend.wal  # it finished: removed like any success
        assert not [r for r in caplog.records if "swallowed the cancellation" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="deferq"):
        run(main())


@pytest.mark.spec("Q-35")
def test_on_the_real_clock_stop_returns_within_the_timeout_plus_the_grace(
        caplog: pytest.LogCaptureFixture) -> None:
    timeout = 0.2
    margin = 2.0  # generous: the machine may be busy; the old stop never returns at all

    async def main() -> float:
        backend = RecordingBackend()
        queue = deferq.Queue(backend, registry=REG)
        await queue.start()
        Stubborn.release = asyncio.Event()
        ids = [queue.enqueue(Stubborn) for _ in range(2)]
        await settle()
        began = time.monotonic()
        finished = await asyncio.wait_for(queue.stop(timeout=timeout), HUNG_S)
        elapsed = time.monotonic() - began
        assert finished is False
        assert all(task_id in backend.wal for task_id in ids)
        message = next(r.getMessage() for r in caplog.records
                       if "swallowed the cancellation" in r.getMessage())
        assert all(task_id in message for task_id in ids)
        Stubborn.release.set()  # let them end before the loop closes
        await settle()
        return elapsed

    with caplog.at_level(logging.WARNING, logger="deferq"):
        elapsed = run(main())
    assert timeout <= elapsed <= timeout + STOP_GRACE_S + margin
