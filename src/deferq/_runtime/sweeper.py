"""The adoption sweep of a running queue (spec/queue.md Q-70..Q-72, spec/wal.md W-30..W-34).

Theory of operation: a worker adopts orphaned WAL files at open (W-27); a service that runs
for days would leave the files of a sibling that died, and the hand-off files of ``deferq
dead retry`` (W-34), to its next restart. So while the queue runs, a ``Sweeper`` calls the
backend's optional ``adopt_orphans`` (C-28) every ``interval_s`` seconds in a worker thread
(it locks, reads and fsyncs files), at most ``files_max`` files each time so that siblings
share the work, and hands every task adopted to ``Replayer.replay``, the path of a start
(Q-9): its remaining delay and its attempts are honoured, an unloadable one is
dead-lettered. ``stop`` never interrupts a sweep in flight (its tasks would be in this
worker's WAL but not scheduled until the next start): it waits for it, bounded by
``files_max`` files, and cancels only a sleep. A failed sweep is logged and retried at the
next interval; a backend that is broken or closed ends the sweeping. The interval is real
time (``asyncio.sleep``); the queue's clock gives only the ``now`` of the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from deferq._core.errors import StorageBrokenError, StorageClosedError
from deferq._core.types import PendingTask
from deferq._runtime.clock import Clock
from deferq.backends.protocol import OrphanAdopter

log = logging.getLogger("deferq.queue")

Adopt = Callable[[int], list[PendingTask]]
Replay = Callable[[PendingTask, int], Awaitable[bool]]


def adopter_of(backend: object) -> Adopt | None:
    """Implements C-28: the backend's ``adopt_orphans`` if it has one, else None (no sweep)."""
    return backend.adopt_orphans if isinstance(backend, OrphanAdopter) else None


class Sweeper:
    """Calls ``adopt`` every ``interval_s`` seconds and replays what it adopted (Q-70, Q-71)."""

    def __init__(self, adopt: Adopt, replay: Replay, clock: Clock, *, interval_s: float,
                 files_max: int) -> None:
        self._adopt = adopt
        self._replay = replay
        self._clock = clock
        self.interval_s = interval_s
        self.files_max = files_max
        self._task: asyncio.Task[None] | None = None
        self._sweeping = False
        self._stopping = False
        self.sweeps = 0  # completed sweeps (for tests and operators)
        self.adopted = 0  # tasks adopted so far
        # One sweep at a time: a caller of ``sweep_once`` (a new schedules' leader, Q-131) waits
        # for a sweep in flight, whose adopted tasks are then scheduled, keys and all.
        self._one_at_a_time = asyncio.Lock()

    def start(self) -> None:
        """Start sweeping on the running loop."""
        assert self._task is None
        self._task = asyncio.get_running_loop().create_task(self._run(), name="deferq-sweeper")

    async def stop(self) -> None:
        """Implements Q-71: wait for a sweep in flight, cancel the sleep, start no other."""
        self._stopping = True
        task = self._task
        if task is None:
            return
        if not self._sweeping:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while not self._stopping:
            # The event loop's own time, not the queue's injectable clock: the sweep waits
            # for other processes' files, in real time, and a test clock that advances on
            # every sleep must not be driven by it.
            await asyncio.sleep(self.interval_s)
            if self._stopping:
                return
            self._sweeping = True
            try:
                if not await self.sweep_once():
                    return
            finally:
                self._sweeping = False

    async def sweep_once(self) -> bool:
        """One sweep; False when the backend can no longer sweep (broken or closed)."""
        async with self._one_at_a_time:
            return await self._sweep()

    async def _sweep(self) -> bool:
        try:
            adopted = await asyncio.to_thread(self._adopt, self.files_max)
        except (StorageBrokenError, StorageClosedError) as exc:
            log.error("adoption sweep stopped: %s", exc)
            return False
        except Exception as exc:  # noqa: BLE001 - logged; the next interval tries again
            log.error("adoption sweep failed (%s: %s); trying again in %g s",
                      type(exc).__name__, exc, self.interval_s)
            return True
        self.sweeps += 1
        if adopted:
            now = int(self._clock.time())
            for pending in adopted:
                await self._replay(pending, now)
            self.adopted += len(adopted)
            log.info("adoption sweep: %d task(s) adopted from orphaned WAL files", len(adopted))
        return True
