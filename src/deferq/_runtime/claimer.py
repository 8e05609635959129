"""The claimer: a queue on a shared backend also runs the due tasks it claims from it
(spec/queue.md Q-76, Q-77, Q-227, Q-228, spec/postgres.md P-20..P-27, P-72).

Rules:
- Only for a ``ClaimingBackend`` (``Postgres``); a queue on any other backend has none and
  behaves exactly as before.
- At start the backend is told to hold what it adds (``start_claiming``, C-29): a task this
  queue enqueues is scheduled here and no other worker takes it while this one lives.
- Two loops on the queue's event loop, each backend call in a worker thread (the loop never
  waits on the database, Q-10): the claim loop claims only what the queue can begin now, up
  to ``min(CLAIM_BATCH, max_concurrency)`` minus the executions holding or waiting for a slot
  (Q-227), so that a worker never hoards due tasks another idle worker could run; it
  schedules each as a replayed task (Q-9: one that cannot be loaded is dead-lettered). When
  there was less to claim than room it waits for a NOTIFY or ``poll_seconds`` (P-27); when
  there is no room it waits until an execution gives its slot back (Q-228). The heartbeat
  renews every lease a third of ``lease_seconds`` apart, independently of the claims (P-25).
- A failing backend call is logged and retried after ``poll_seconds``; it never stops the
  loops or the queue (Q-76).
- ``stop`` (before the scheduler stops) ends both loops; ``release`` (after the journal's
  last write) gives back every task still held, so other workers take them at once (Q-77,
  P-26).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from deferq._runtime.clock import Clock
from deferq._runtime.replay import Replayer
from deferq._runtime.hooks import ReplaySource
from deferq._runtime.scheduler import Scheduler
from deferq.backends.protocol import ClaimingBackend

log = logging.getLogger("deferq.queue")

CLAIM_BATCH: Final = 64


class Claimer:
    """Claims due tasks from a shared backend, renews their leases, and gives them back."""

    def __init__(self, backend: ClaimingBackend, scheduler: Scheduler, replayer: Replayer,
                 clock: Clock) -> None:
        self._backend = backend
        self._scheduler = scheduler
        self._replayer = replayer
        self._clock = clock
        self._jobs: list[asyncio.Task[None]] = []
        self._stopping = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Implements Q-227: hold what this queue adds, then claim and renew until ``stop``."""
        self._backend.start_claiming()
        self._jobs = [loop.create_task(self._claim_loop(), name="deferq-claims"),
                      loop.create_task(self._heartbeat(), name="deferq-heartbeat")]

    async def _claim_loop(self) -> None:
        backend, scheduler = self._backend, self._scheduler
        limit = min(CLAIM_BATCH, scheduler.max_concurrency)
        if scheduler.slot_freed is None:  # (a wait for room, Q-185, may have made it)
            scheduler.slot_freed = asyncio.Event()
        freed = scheduler.slot_freed
        while not self._stopping:
            # Implements Q-227: only what can begin now (a claimed task that waited for a slot
            # would be held, its lease renewed, while another worker sat idle).
            room = limit - max(scheduler.load, scheduler.backlog)
            try:
                if room <= 0:
                    # Implements Q-228: claim again as soon as an execution ends.
                    freed.clear()
                    try:
                        await asyncio.wait_for(freed.wait(), backend.poll_seconds)
                    except asyncio.TimeoutError:
                        pass
                    continue
                tasks = await asyncio.to_thread(backend.claim_due, room)
                now = int(self._clock.time())
                for pending in tasks:
                    await self._replayer.replay(pending, now, ReplaySource.CLAIMED)
                if len(tasks) < room:
                    # Nothing more is due now: wait for a NOTIFY, or look again after
                    # poll_seconds at most.
                    await asyncio.to_thread(backend.wait_for_tasks, backend.poll_seconds)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Q-76: log, wait, go on
                log.error("claiming due tasks failed (%s: %s); trying again in %.1f s",
                          type(exc).__name__, exc, backend.poll_seconds)
                await asyncio.sleep(backend.poll_seconds)

    async def _heartbeat(self) -> None:
        backend = self._backend
        every = backend.lease_seconds / 3
        while not self._stopping:
            await asyncio.sleep(every)
            try:
                await asyncio.to_thread(backend.renew_claims)
            except Exception as exc:  # noqa: BLE001 - Q-76: log, go on
                log.error("renewing the leases of held tasks failed (%s: %s); they expire "
                          "%.0f s after the last renewal and other workers may take them",
                          type(exc).__name__, exc, backend.lease_seconds)

    async def stop(self) -> None:
        """End both loops: nothing more is claimed (``Queue.stop``, before the scheduler)."""
        self._stopping = True
        self._backend.wake()
        for job in self._jobs:
            job.cancel()
        await asyncio.gather(*self._jobs, return_exceptions=True)
        self._jobs = []

    async def release(self) -> None:
        """Implements Q-77: give back every task still held (after the last write)."""
        try:
            await asyncio.to_thread(self._backend.release_claims)
        except Exception as exc:  # noqa: BLE001 - the leases then expire on their own
            log.error("giving back the held tasks failed (%s: %s); other workers take them "
                      "when their leases expire", type(exc).__name__, exc)
